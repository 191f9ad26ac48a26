//! The two KV caches of the model: the GPU's block pool with its local prefix cache,
//! and the external store (Mooncake Store) behind the lookup server.
//!
//! Both count blocks of 512 tokens, the trace's hash granularity, and both keep only
//! full blocks under a hash: vLLM hashes full blocks only. The GPU's cache hashes
//! generated blocks too (as vLLM V1 does); the external store holds prompt blocks,
//! written at the end of a prefill.

use std::collections::{BTreeSet, HashMap};

/// The GPU KV-cache block pool, with vLLM's prefix cache.
///
/// A block is either *hashed* (a full block of prompt or generated tokens, shareable,
/// found by later requests through its hash) or *anonymous* (a partial block, or a
/// block still being loaded). Hashed blocks nobody references stay
/// cached until evicted; eviction takes the least recently freed first, and a
/// request frees its blocks tail first, so a chain's prefix outlives its tail
/// (vLLM `FreeKVCacheBlockQueue`).
#[derive(Debug)]
pub(crate) struct LocalCache {
    capacity: u64,
    anonymous: u64,
    entries: HashMap<u64, Entry>,
    evictable: BTreeSet<(u64, u64)>,
    clock: u64,
}

#[derive(Debug)]
struct Entry {
    refs: u32,
    /// Position in `evictable` while `refs == 0`.
    freed_at: u64,
}

impl LocalCache {
    /// An empty pool of `capacity` blocks.
    pub(crate) fn new(capacity: u64) -> Self {
        Self {
            capacity,
            anonymous: 0,
            entries: HashMap::new(),
            evictable: BTreeSet::new(),
            clock: 0,
        }
    }

    /// Leading blocks of `hashes` (at most `max_blocks`) cached on the GPU: the local
    /// prefix-cache hit, in blocks (vLLM `get_computed_blocks`).
    pub(crate) fn hit_blocks(&self, hashes: &[u64], max_blocks: usize) -> usize {
        hashes
            .iter()
            .take(max_blocks)
            .take_while(|h| self.entries.contains_key(h))
            .count()
    }

    fn free(&self) -> u64 {
        self.capacity - self.anonymous - self.entries.len() as u64
    }

    /// True when `new_blocks` more blocks fit after reusing the cached `hits`
    /// (which must not be evicted to make room for them).
    pub(crate) fn can_allocate(&self, hits: &[u64], new_blocks: u64) -> bool {
        let pinned_free = hits
            .iter()
            .filter(|h| self.entries.get(h).is_some_and(|e| e.refs == 0))
            .count() as u64;
        self.free() + self.evictable.len() as u64 - pinned_free >= new_blocks
    }

    /// Takes a reference on each cached block of `hits` (a local prefix hit).
    pub(crate) fn reference(&mut self, hits: &[u64]) {
        for h in hits {
            let e = self.entries.get_mut(h).expect("hits are cached blocks");
            if e.refs == 0 {
                self.evictable.remove(&(e.freed_at, *h));
            }
            e.refs += 1;
        }
    }

    /// Allocates `n` anonymous blocks, evicting cached blocks as needed. False (and
    /// nothing changed) when they do not fit.
    pub(crate) fn allocate(&mut self, n: u64) -> bool {
        if self.free() + (self.evictable.len() as u64) < n {
            return false;
        }
        while self.free() < n {
            let (_, h) = self.evictable.pop_first().expect("checked above");
            self.entries.remove(&h);
        }
        self.anonymous += n;
        true
    }

    /// One anonymous block of a request became the full prompt block `hash`: it joins
    /// the prefix cache, or, when another request cached the same block meanwhile,
    /// references that one and frees its own.
    pub(crate) fn promote(&mut self, hash: u64) {
        self.anonymous -= 1;
        if let Some(e) = self.entries.get_mut(&hash) {
            if e.refs == 0 {
                self.evictable.remove(&(e.freed_at, hash));
            }
            e.refs += 1;
        } else {
            self.entries.insert(
                hash,
                Entry {
                    refs: 1,
                    freed_at: 0,
                },
            );
        }
    }

    /// A request released its blocks: `hashed` (in prompt order) are dereferenced,
    /// tail first; `anonymous` are freed.
    pub(crate) fn release(&mut self, hashed: &[u64], anonymous: u64) {
        self.anonymous -= anonymous;
        for h in hashed.iter().rev() {
            let e = self.entries.get_mut(h).expect("held blocks are cached");
            e.refs -= 1;
            if e.refs == 0 {
                self.clock += 1;
                e.freed_at = self.clock;
                self.evictable.insert((self.clock, *h));
            }
        }
    }

    /// Blocks held by requests (neither free nor only cached): the KV occupancy.
    pub(crate) fn held(&self) -> u64 {
        self.anonymous + self.entries.len() as u64 - self.evictable.len() as u64
    }

    /// Capacity in blocks.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Blocks in use or cached.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.anonymous + self.entries.len() as u64
    }
}

/// The external store (Mooncake Store): full prompt blocks by hash id, a capacity
/// in blocks, least recently used evicted first.
///
/// Blocks are written when a request's prefill ends and touched when loaded. A write
/// or load touches a chain tail first, so its prefix is the most recent: a chain is
/// only useful from its start (`spec/wire.md`, leading run), so evicting a prefix
/// before its tail would strand the tail.
#[derive(Debug)]
pub(crate) struct ExternalStore {
    capacity: u64,
    stamps: HashMap<u64, u64>,
    lru: BTreeSet<(u64, u64)>,
    clock: u64,
}

impl ExternalStore {
    /// An empty store of `capacity` blocks.
    pub(crate) fn new(capacity: u64) -> Self {
        Self {
            capacity,
            stamps: HashMap::new(),
            lru: BTreeSet::new(),
            clock: 0,
        }
    }

    /// Whether block `hash` is stored (existence check: no touch).
    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.stamps.contains_key(&hash)
    }

    /// Length of the leading run of `hashes` present (existence check: no touch).
    pub(crate) fn leading_run(&self, hashes: impl Iterator<Item = u64>) -> usize {
        let mut n = 0;
        for h in hashes {
            if !self.stamps.contains_key(&h) {
                break;
            }
            n += 1;
        }
        n
    }

    /// Writes (or touches) `hashes`, tail first, evicting the least recently used
    /// blocks beyond capacity.
    pub(crate) fn put(&mut self, hashes: &[u64]) {
        if self.capacity == 0 {
            return;
        }
        for h in hashes.iter().rev() {
            self.clock += 1;
            if let Some(old) = self.stamps.insert(*h, self.clock) {
                self.lru.remove(&(old, *h));
            }
            self.lru.insert((self.clock, *h));
        }
        while self.stamps.len() as u64 > self.capacity {
            let (_, h) = self.lru.pop_first().expect("non-empty above capacity");
            self.stamps.remove(&h);
        }
    }

    /// Touches `hashes` that are present (a load reads them), tail first.
    pub(crate) fn touch(&mut self, hashes: &[u64]) {
        for h in hashes.iter().rev() {
            if let Some(old) = self.stamps.get_mut(h) {
                self.clock += 1;
                self.lru.remove(&(*old, *h));
                *old = self.clock;
                self.lru.insert((self.clock, *h));
            }
        }
    }

    /// Blocks stored.
    pub(crate) fn len(&self) -> usize {
        self.stamps.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_cache_reuses_evicts_tail_first_and_refuses_when_full() {
        let mut c = LocalCache::new(4);
        assert!(c.allocate(3));
        for h in [10, 11, 12] {
            c.promote(h);
        }
        assert_eq!(c.hit_blocks(&[10, 11, 12, 13], 9), 3);
        assert_eq!(c.hit_blocks(&[10, 11, 12, 13], 2), 2);
        c.release(&[10, 11, 12], 0);
        assert_eq!(c.used(), 3);
        // Two new blocks: one free, then the least recently freed (the tail, 12).
        assert!(c.allocate(2));
        assert_eq!(c.hit_blocks(&[10, 11, 12], 9), 2);
        // Pinning the remaining hits leaves no room for one more block.
        assert!(!c.can_allocate(&[10, 11], 1));
        c.reference(&[10, 11]);
        assert!(!c.allocate(1));
        c.release(&[], 2);
        c.release(&[10, 11], 0);
        assert_eq!(c.used(), 2);
    }

    #[test]
    fn promote_of_a_block_cached_meanwhile_shares_it() {
        let mut c = LocalCache::new(4);
        assert!(c.allocate(2));
        c.promote(5);
        c.promote(5);
        assert_eq!(c.used(), 1);
        c.release(&[5], 0);
        c.release(&[5], 0);
        assert_eq!(c.used(), 1);
        assert_eq!(c.hit_blocks(&[5], 1), 1);
    }

    #[test]
    fn external_store_lru_keeps_prefixes() {
        let mut s = ExternalStore::new(3);
        s.put(&[1, 2, 3]);
        assert_eq!(s.leading_run([1, 2, 3, 4].into_iter()), 3);
        s.put(&[1, 7]);
        // 3 (the oldest, the first chain's tail) went.
        assert_eq!(s.leading_run([1, 2, 3].into_iter()), 2);
        assert_eq!(s.leading_run([1, 7].into_iter()), 2);
        assert_eq!(s.len(), 3);
        s.touch(&[1, 2]);
        s.put(&[9]);
        assert_eq!(s.leading_run([1, 7].into_iter()), 1);
        assert_eq!(s.leading_run([1, 2].into_iter()), 2);
    }
}
