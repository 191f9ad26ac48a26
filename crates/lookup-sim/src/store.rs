//! The two KV caches of the model: the GPU's block pool with its local prefix cache,
//! and the external store (Mooncake Store) behind the lookup server.
//!
//! Both keep only full blocks under a hash, at the trace's 512-token granularity
//! (vLLM hashes full blocks only). The GPU's pool counts its capacity in vLLM's
//! 16-token KV blocks (a 512-token hash block is 32 of them) and hashes generated
//! blocks too, as vLLM V1 does; the external store counts 512-token blocks and holds
//! prompt blocks, written at the end of a prefill.
//!
//! [`LocalCache`] and [`Held`] (what one request holds in it, and vLLM's allocation
//! and promotion rules) are public so that `cargo xtask replay` models the GPU with
//! the same pool as the simulator rather than a second copy.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::trace::TRACE_BLOCK_TOKENS;

/// Tokens per GPU KV block: vLLM's default block size (`CacheConfig.block_size` 16).
pub const KV_BLOCK_TOKENS: u32 = 16;
/// KV blocks per trace hash block (512 / 16): the unit the prefix cache hashes here,
/// since the traces name only 512-token blocks.
pub const KV_PER_HASH: u64 = (TRACE_BLOCK_TOKENS / KV_BLOCK_TOKENS) as u64;

/// The GPU KV-cache block pool with vLLM V1's prefix cache, counted in vLLM's 16-token
/// blocks (vllm/v1/core/block_pool.py, kv_cache_manager.py, vLLM 0.33).
///
/// A request holds *hashed* blocks (a full hash block of prompt or generated tokens:
/// [`per_hash`](Self::per_hash) KV blocks under one hash, shareable, found by later
/// requests) and *anonymous* blocks (its partial tail, or blocks still being
/// loaded). The hash block is vLLM's own 16-token block
/// ([`with_hash_tokens`](Self::with_hash_tokens)`(_, 16)`) or a 512-token group of
/// 32 KV blocks ([`new`](Self::new)), evicted and hit whole (vLLM would still hit a
/// group's first 16-token blocks).
///
/// Free blocks are vLLM's `FreeKVCacheBlockQueue`, in its order
/// (vllm/v1/core/block_pool.py `free_blocks`, kv_cache_utils.py `prepend_n` /
/// `append_n`):
/// - blocks holding no hash (never used, left from an evicted group, or freed
///   without a hash) come first: vLLM prepends freed blocks without a hash;
/// - then freed cached blocks in the order they were freed: a request's blocks are
///   freed in reverse (`KVCacheManager.free` → `BlockPool.free_blocks(reversed(blocks))`),
///   its hashed blocks from last to first;
/// - a cached block keeps its hash until it is taken from the queue's head for a new
///   allocation (`BlockPool.get_new_blocks` → `_maybe_evict_cached_block`), so a
///   request preempted a moment ago finds its blocks again;
/// - a cached block hit by a new request leaves the queue (`touch`).
#[derive(Debug)]
pub struct LocalCache {
    capacity: u64,
    /// KV blocks held by requests under no hash.
    anonymous: u64,
    /// Free blocks at the queue's head holding no hash (nothing a request could hit).
    fresh: u64,
    entries: HashMap<u64, Entry>,
    /// The rest of the free queue: cached hashes ([`per_hash`](Self::per_hash) blocks
    /// each), by the stamp of when they were freed.
    queue: BTreeMap<u64, u64>,
    /// KV blocks in `queue`.
    queued: u64,
    clock: u64,
    /// KV blocks per prefix-cache hash: 1 (vLLM's own 16-token blocks) or
    /// [`KV_PER_HASH`] (512-token groups).
    per_hash: u64,
}

#[derive(Debug)]
struct Entry {
    refs: u32,
    /// Its stamp in `queue` while `refs == 0`.
    freed_at: u64,
}

impl LocalCache {
    /// An empty pool of `capacity` KV blocks (16 tokens each) that caches 512-token
    /// groups ([`KV_PER_HASH`] blocks under one hash, the traces' granularity).
    pub fn new(capacity: u64) -> Self {
        Self::with_hash_tokens(capacity, TRACE_BLOCK_TOKENS)
    }

    /// An empty pool of `capacity` KV blocks (16 tokens each) that caches blocks of
    /// `hash_tokens` tokens under one hash: [`KV_BLOCK_TOKENS`] is vLLM's own
    /// prefix cache (every full 16-token block hashed, `BlockPool.cache_full_blocks`,
    /// vllm/v1/core/block_pool.py), [`TRACE_BLOCK_TOKENS`] the coarser 512-token groups.
    ///
    /// # Panics
    /// `hash_tokens` not a positive multiple of [`KV_BLOCK_TOKENS`] (a caller's bug;
    /// [`EngineParams::validate`](crate::engine::SimParams::validate) checks the flag).
    pub fn with_hash_tokens(capacity: u64, hash_tokens: u32) -> Self {
        assert!(
            hash_tokens > 0 && hash_tokens % KV_BLOCK_TOKENS == 0,
            "hash blocks are whole KV blocks"
        );
        Self {
            per_hash: u64::from(hash_tokens / KV_BLOCK_TOKENS),
            capacity,
            anonymous: 0,
            fresh: capacity,
            entries: HashMap::new(),
            queue: BTreeMap::new(),
            queued: 0,
            clock: 0,
        }
    }

    /// Leading groups of `hashes` (at most `max_blocks`) cached on the GPU: the local
    /// prefix-cache hit, in 512-token groups (vLLM `get_computed_blocks`).
    pub fn hit_blocks(&self, hashes: &[u64], max_blocks: usize) -> usize {
        hashes
            .iter()
            .take(max_blocks)
            .take_while(|h| self.entries.contains_key(h))
            .count()
    }

    /// True when `new_blocks` more KV blocks fit after reusing the cached groups
    /// `hits` (which must not be evicted to make room for them).
    pub fn can_allocate(&self, hits: &[u64], new_blocks: u64) -> bool {
        let pinned_free = hits
            .iter()
            .filter(|h| self.entries.get(h).is_some_and(|e| e.refs == 0))
            .count() as u64;
        self.fresh + self.queued - pinned_free * self.per_hash >= new_blocks
    }

    /// Takes a reference on each cached group of `hits` (a local prefix hit): a free
    /// one leaves the free queue.
    pub fn reference(&mut self, hits: &[u64]) {
        for h in hits {
            let e = self.entries.get_mut(h).expect("hits are cached blocks");
            if e.refs == 0 {
                self.queue.remove(&e.freed_at);
                self.queued -= self.per_hash;
            }
            e.refs += 1;
        }
    }

    /// Allocates `n` anonymous KV blocks from the head of the free queue, evicting the
    /// cached groups it reaches. False (and nothing changed) when they do not fit.
    pub fn allocate(&mut self, n: u64) -> bool {
        if self.fresh + self.queued < n {
            return false;
        }
        let mut need = n;
        let take = need.min(self.fresh);
        self.fresh -= take;
        need -= take;
        while need > 0 {
            let (_, h) = self.queue.pop_first().expect("checked above");
            self.entries.remove(&h);
            self.queued -= self.per_hash;
            let t = self.per_hash.min(need);
            need -= t;
            self.fresh += self.per_hash - t;
        }
        self.anonymous += n;
        true
    }

    /// [`per_hash`](Self::per_hash) anonymous blocks of a request became the full block
    /// `hash` (`BlockPool.cache_full_blocks`): it joins the prefix cache. When the same
    /// block is cached already and free, the request takes that one (as a hit would)
    /// and frees its own. When it is cached and held by another request, vLLM does
    /// not deduplicate (`BlockHashToBlockMap`, NOTE #1, vllm/v1/core/block_pool.py:
    /// block tables are append-only): the request keeps its own copy too. Returns
    /// true in that case, with nothing changed: the copy stays in use, anonymous
    /// here, without a reference on the cached block, until the request frees it
    /// ([`Held::duplicates`]).
    pub fn promote(&mut self, hash: u64) -> bool {
        if let Some(e) = self.entries.get_mut(&hash) {
            if e.refs > 0 {
                return true;
            }
            e.refs = 1;
            self.queue.remove(&e.freed_at);
            self.queued -= self.per_hash;
            self.anonymous -= self.per_hash;
            self.fresh += self.per_hash;
        } else {
            self.anonymous -= self.per_hash;
            self.entries.insert(
                hash,
                Entry {
                    refs: 1,
                    freed_at: 0,
                },
            );
        }
        false
    }

    /// A request released its blocks (finished or preempted), as vLLM 0.33's
    /// `KVCacheManager.free` → `BlockPool.free_blocks(reversed(blocks))` does
    /// (vllm/v1/core/single_type_kv_cache_manager.py `free`, block_pool.py
    /// `free_blocks`): its `anonymous` blocks (no hash, nothing a request could hit)
    /// go to the *front* of the free queue, reused first (`prepend_n`, "LIFO reuse of
    /// non-cached blocks"); its `hashed` blocks (in prompt order) are appended from
    /// the last, so a prefix's tail is evicted before its head (`append_n`). A hashed
    /// block still referenced by another request stays.
    pub fn release(&mut self, hashed: &[u64], anonymous: u64) {
        self.anonymous -= anonymous;
        self.fresh += anonymous;
        for h in hashed.iter().rev() {
            let e = self.entries.get_mut(h).expect("held blocks are cached");
            e.refs -= 1;
            if e.refs == 0 {
                self.clock += 1;
                e.freed_at = self.clock;
                self.queue.insert(self.clock, *h);
                self.queued += self.per_hash;
            }
        }
    }

    /// KV blocks held by requests (neither free nor only cached): the KV occupancy.
    pub fn held(&self) -> u64 {
        self.capacity - self.fresh - self.queued
    }

    /// Capacity in KV blocks.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// KV blocks under one prefix-cache hash (1 or [`KV_PER_HASH`]).
    pub fn per_hash(&self) -> u64 {
        self.per_hash
    }

    /// Tokens under one prefix-cache hash (16 or 512).
    pub fn hash_tokens(&self) -> u32 {
        self.per_hash as u32 * KV_BLOCK_TOKENS
    }

    /// KV blocks in use or cached.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.anonymous + self.entries.len() as u64 * self.per_hash
    }
}

/// KV blocks (vLLM's 16 tokens each) that `tokens` positions take.
#[must_use]
pub fn blocks_for(tokens: u32) -> u64 {
    u64::from(tokens.div_ceil(KV_BLOCK_TOKENS))
}

/// The prefix-cache hash of block `k` (0-based, 512 tokens) of request number `seq`
/// whose full prompt blocks have the trace's ids `prompt_hashes`: that id for a full
/// prompt block; for any other block (a prompt block the trace gives no id for, or
/// one holding generated tokens) a hash of its own, unique to the request: vLLM V1
/// hashes every full block, generated tokens included (`Request.block_hashes` grows
/// as output tokens are appended, through `get_request_block_hasher`,
/// vllm/v1/request.py and kv_cache_utils.py), so a preempted request finds its own
/// generated blocks again in the prefix cache.
#[must_use]
pub fn group_hash(prompt_hashes: &[u64], seq: u64, k: usize) -> u64 {
    match prompt_hashes.get(k) {
        Some(&h) => h,
        // The top bit keeps these apart from the traces' small integer ids.
        None => (1 << 63) | crate::hash::mix(seq.wrapping_mul(0x1_0000_0001) ^ k as u64),
    }
}

/// The KV blocks one request holds in a [`LocalCache`]: *hashed* groups (full
/// 512-token blocks, in prompt order, shareable) and *anonymous* blocks (its partial
/// tail, or blocks still being loaded), with vLLM V1's rules for growing them
/// (`KVCacheManager.allocate_slots`), caching full ones (`cache_blocks`) and freeing
/// them (`KVCacheManager.free`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Hashes of the full groups held, in prompt order ([`KV_PER_HASH`] blocks each).
    pub hashed: Vec<u64>,
    /// KV blocks held under no hash.
    pub anonymous: u64,
    /// The hashes of `hashed` held as a second copy of a cached block another request
    /// held when this one's became full ([`LocalCache::promote`]): anonymous in the
    /// pool, in use until freed, then freed as blocks without a hash (vLLM would keep
    /// the copy's hash; this model finds the block by the first copy only).
    pub duplicates: Vec<u64>,
}

impl Held {
    /// KV blocks held (16 tokens each), with `per_hash` KV blocks under each hash
    /// ([`LocalCache::per_hash`]).
    #[must_use]
    pub fn blocks(&self, per_hash: u64) -> u64 {
        self.hashed.len() as u64 * per_hash + self.anonymous
    }

    /// Makes the request hold blocks for its first `end` positions, reusing the local
    /// prefix hit `hits` (cached groups; only when it holds nothing yet), the new ones
    /// anonymous. False, with nothing changed, when they do not fit.
    pub fn allocate(&mut self, cache: &mut LocalCache, hits: &[u64], end: u32) -> bool {
        let per = cache.per_hash();
        let new = blocks_for(end).saturating_sub(self.blocks(per) + hits.len() as u64 * per);
        if !cache.can_allocate(hits, new) {
            return false;
        }
        cache.reference(hits);
        self.hashed.extend_from_slice(hits);
        let ok = cache.allocate(new);
        debug_assert!(ok, "can_allocate said it fits");
        self.anonymous += new;
        true
    }

    /// True when [`allocate`](Self::allocate)`(cache, hits, end)` would fit with
    /// `reserved` more free blocks left over: vLLM's check in
    /// `KVCacheManager.allocate_slots` (new blocks plus the hit blocks taken off the
    /// free queue, against `free blocks - reserved_blocks`).
    #[must_use]
    pub fn fits(&self, cache: &LocalCache, hits: &[u64], end: u32, reserved: u64) -> bool {
        let per = cache.per_hash();
        let new = blocks_for(end).saturating_sub(self.blocks(per) + hits.len() as u64 * per);
        cache.can_allocate(hits, new.saturating_add(reserved))
    }

    /// The anonymous blocks that are now full join the prefix cache: every group
    /// whose tokens are all known and scheduled by `known` (vLLM caches up to
    /// `min(num_computed_tokens + num_new_tokens, request.num_tokens)` tokens), its
    /// hash `hash(k)` for group `k` ([`group_hash`]).
    pub fn promote_full(
        &mut self,
        cache: &mut LocalCache,
        known: u32,
        hash: impl Fn(usize) -> u64,
    ) {
        let full = (known / cache.hash_tokens()) as usize;
        let per = cache.per_hash();
        while self.hashed.len() < full && self.anonymous >= per {
            let h = hash(self.hashed.len());
            if cache.promote(h) {
                self.duplicates.push(h);
            }
            self.anonymous -= per;
            self.hashed.push(h);
        }
    }

    /// Frees everything held (finished or preempted), in vLLM's order
    /// ([`LocalCache::release`]).
    pub fn release(&mut self, cache: &mut LocalCache) {
        let copies = self.duplicates.len() as u64 * cache.per_hash();
        if self.duplicates.is_empty() {
            cache.release(&self.hashed, self.anonymous);
        } else {
            let mut dups = std::mem::take(&mut self.duplicates);
            let referenced: Vec<u64> = self
                .hashed
                .iter()
                .filter(|h| match dups.iter().position(|d| d == *h) {
                    Some(i) => {
                        dups.swap_remove(i);
                        false
                    }
                    None => true,
                })
                .copied()
                .collect();
            cache.release(&referenced, self.anonymous + copies);
        }
        self.hashed.clear();
        self.anonymous = 0;
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

    const G: u64 = KV_PER_HASH;

    #[test]
    fn local_cache_reuses_evicts_tail_first_and_refuses_when_full() {
        let mut c = LocalCache::new(4 * G);
        assert!(c.allocate(3 * G));
        for h in [10, 11, 12] {
            c.promote(h);
        }
        assert_eq!(c.hit_blocks(&[10, 11, 12, 13], 9), 3);
        assert_eq!(c.hit_blocks(&[10, 11, 12, 13], 2), 2);
        c.release(&[10, 11, 12], 0);
        assert_eq!(c.used(), 3 * G);
        assert_eq!(c.held(), 0);
        // Two groups' worth: the never-used group, then the least recently freed
        // (the tail, 12).
        assert!(c.allocate(2 * G));
        assert_eq!(c.hit_blocks(&[10, 11, 12], 9), 2);
        // Pinning the remaining hits leaves no room for one more block.
        assert!(!c.can_allocate(&[10, 11], 1));
        c.reference(&[10, 11]);
        assert!(!c.allocate(1));
        assert_eq!(c.held(), 4 * G);
        c.release(&[], 2 * G);
        c.release(&[10, 11], 0);
        assert_eq!(c.used(), 2 * G);
    }

    /// vLLM 0.33's free queue (vllm/v1/core/block_pool.py `free_blocks`): freed
    /// blocks without a hash go to the front and are reused first; cached blocks
    /// wait at the back in the order they were freed. A request's partial tail
    /// (anonymous) freed after another request's cached group is taken before that
    /// group, which stays cached.
    #[test]
    fn freed_blocks_without_a_hash_are_taken_first() {
        let mut c = LocalCache::new(2 * G + 5);
        assert!(c.allocate(G));
        c.promote(7);
        c.release(&[7], 0);
        assert!(c.allocate(G + 5));
        // Everything never used is gone: 0 fresh, the group 7 cached in the queue.
        c.release(&[], G + 5);
        // 5 blocks: taken from the tail freed last (at the front), group 7 stays.
        assert!(c.allocate(5));
        assert_eq!(c.hit_blocks(&[7], 1), 1);
        assert_eq!(c.held(), 5);
        // G + 1 more: the rest of the tail, then group 7 is evicted for the last one.
        assert!(c.allocate(G + 1));
        assert_eq!(c.hit_blocks(&[7], 1), 0);
        assert_eq!(c.held(), G + 6);
        assert!(c.can_allocate(&[], G - 1));
        assert!(!c.can_allocate(&[], G));
    }

    /// vLLM's own 16-token prefix cache: one KV block per hash, evicted one by one.
    #[test]
    fn sixteen_token_hash_blocks_are_evicted_one_by_one() {
        let mut c = LocalCache::with_hash_tokens(4, KV_BLOCK_TOKENS);
        assert_eq!(c.per_hash(), 1);
        assert!(c.allocate(3));
        for h in [1, 2, 3] {
            c.promote(h);
        }
        // Freed in reverse: 3, 2, 1 queue in that order.
        c.release(&[1, 2, 3], 0);
        assert!(c.allocate(2));
        // The never-used block, then 3 (the tail) went.
        assert_eq!(c.hit_blocks(&[1, 2, 3], 3), 2);
        assert_eq!(c.held(), 2);
    }

    #[test]
    fn promote_of_a_block_cached_meanwhile_keeps_both_copies() {
        // Two requests fill the same block: vLLM keeps both copies (no
        // deduplication); the second is freed without a hash.
        let mut c = LocalCache::new(4 * G);
        let (mut a, mut b) = (Held::default(), Held::default());
        assert!(a.allocate(&mut c, &[], 512));
        assert!(b.allocate(&mut c, &[], 512));
        a.promote_full(&mut c, 512, |_| 5);
        b.promote_full(&mut c, 512, |_| 5);
        assert_eq!((b.duplicates.clone(), b.blocks(G)), (vec![5], G));
        assert_eq!((c.used(), c.held()), (2 * G, 2 * G));
        // The first copy's owner frees it: it stays cached, free; the copy is held.
        a.release(&mut c);
        assert_eq!((c.used(), c.held()), (2 * G, G));
        b.release(&mut c);
        assert_eq!((c.used(), c.held()), (G, 0));
        assert_eq!(c.hit_blocks(&[5], 1), 1);
        // A free cached copy is taken instead, and the request's own freed.
        let mut d = Held::default();
        assert!(d.allocate(&mut c, &[], 512));
        d.promote_full(&mut c, 512, |_| 5);
        assert!(d.duplicates.is_empty());
        assert_eq!((c.used(), c.held()), (G, G));
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
