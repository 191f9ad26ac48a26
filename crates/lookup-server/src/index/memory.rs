//! [`InMemoryIndex`]: the embedded store of the reference server, a key set with
//! optional least-recently-used eviction.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};

use lookup_core::BlockHashes;
use mooncake_master::KeyLayout;

use super::{BlockIndex, IndexFuture};

/// The embedded [`BlockIndex`]: a set of keys, optionally bounded with least-recently
/// used eviction.
///
/// Capacity counts keys, not blocks: a block of a layout with N namespaces takes N.
/// "Used" means inserted, or found by an [`exists`](BlockIndex::exists) call (a block
/// the scheduler asks about is about to be loaded). Thread-safe behind one mutex,
/// held for one call's keys at a time: calls never await while holding it.
#[derive(Debug, Default)]
pub struct InMemoryIndex {
    state: Mutex<KeySet>,
}

#[derive(Debug, Default)]
struct KeySet {
    /// Key → its last-use stamp (0 when unbounded: no order is kept).
    keys: HashMap<Arc<str>, u64>,
    /// Last-use stamp → key, oldest first; empty when unbounded.
    order: BTreeMap<u64, Arc<str>>,
    next_stamp: u64,
    capacity: Option<NonZeroUsize>,
    evictions: u64,
}

impl KeySet {
    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    fn insert(&mut self, key: &str) -> bool {
        if self.capacity.is_none() {
            return self.keys.insert(Arc::from(key), 0).is_none();
        }
        let stamp = self.stamp();
        if let Some(old) = self.keys.get_mut(key) {
            let old = std::mem::replace(old, stamp);
            if let Some(k) = self.order.remove(&old) {
                self.order.insert(stamp, k);
            }
            return false;
        }
        let key: Arc<str> = Arc::from(key);
        self.keys.insert(Arc::clone(&key), stamp);
        self.order.insert(stamp, key);
        self.evict();
        true
    }

    fn evict(&mut self) {
        let Some(capacity) = self.capacity else {
            return;
        };
        while self.keys.len() > capacity.get() {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.keys.remove(&oldest);
            self.evictions += 1;
        }
    }

    fn touch(&mut self, key: &str) -> bool {
        if self.capacity.is_none() {
            return self.keys.contains_key(key);
        }
        let stamp = self.next_stamp + 1;
        let Some(old) = self.keys.get_mut(key) else {
            return false;
        };
        let old = std::mem::replace(old, stamp);
        self.next_stamp = stamp;
        if let Some(k) = self.order.remove(&old) {
            self.order.insert(stamp, k);
        }
        true
    }

    fn remove(&mut self, key: &str) -> bool {
        match self.keys.remove(key) {
            Some(stamp) => {
                self.order.remove(&stamp);
                true
            }
            None => false,
        }
    }
}

impl InMemoryIndex {
    /// An empty index without a capacity bound.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty index holding at most `capacity` keys; inserting one more evicts the
    /// least recently used key.
    #[must_use]
    pub fn bounded(capacity: NonZeroUsize) -> Self {
        Self {
            state: Mutex::new(KeySet {
                capacity: Some(capacity),
                ..KeySet::default()
            }),
        }
    }

    /// The lock; a panic while holding it cannot leave the set half-updated in a way
    /// that matters for existence answers, so a poisoned lock is still used.
    fn lock(&self) -> MutexGuard<'_, KeySet> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds `key` (or marks it used if present); true when it was new.
    pub fn insert(&self, key: &str) -> bool {
        self.lock().insert(key)
    }

    /// Adds every key of the first `blocks` blocks of `block_hashes` in every
    /// namespace of `layout` (see [`KeyLayout::chain_keys`]): what a worker's puts
    /// after a prefill leave in the store. Returns the number of keys added.
    pub fn insert_chain(
        &self,
        layout: &KeyLayout,
        block_hashes: &BlockHashes,
        blocks: usize,
    ) -> usize {
        let keys = layout.chain_keys(block_hashes, blocks);
        let mut state = self.lock();
        keys.iter().filter(|k| state.insert(k)).count()
    }

    /// Removes `key`; true when it was present.
    pub fn remove(&self, key: &str) -> bool {
        self.lock().remove(key)
    }

    /// Removes every key. The synchronous form of [`BlockIndex::clear`].
    pub fn remove_all(&self) {
        let mut state = self.lock();
        state.keys.clear();
        state.order.clear();
    }

    /// Whether `key` is present, without marking it used.
    #[must_use]
    pub fn contains(&self, key: &str) -> bool {
        self.lock().keys.contains_key(key)
    }

    /// Number of keys held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().keys.len()
    }

    /// True when no key is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The capacity bound in keys, if any.
    #[must_use]
    pub fn capacity(&self) -> Option<NonZeroUsize> {
        self.lock().capacity
    }

    /// Keys evicted to respect the capacity since construction.
    #[must_use]
    pub fn evictions(&self) -> u64 {
        self.lock().evictions
    }

    /// The existence flags of `keys`, marking the present ones used.
    #[must_use]
    pub fn exists_now(&self, keys: &[String]) -> Vec<bool> {
        let mut state = self.lock();
        keys.iter().map(|k| state.touch(k)).collect()
    }
}

impl BlockIndex for InMemoryIndex {
    fn exists<'a>(&'a self, keys: &'a [String]) -> IndexFuture<'a, Vec<bool>> {
        Box::pin(std::future::ready(Ok(self.exists_now(keys))))
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        self.remove_all();
        Box::pin(std::future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use mooncake_master::RankNamespace;

    use super::*;

    fn hashes(ids: &[u64]) -> BlockHashes {
        BlockHashes::from_u64s(ids)
    }

    #[test]
    fn in_memory_insert_remove_clear() {
        let index = InMemoryIndex::new();
        assert!(index.insert("a"));
        assert!(!index.insert("a"));
        assert!(index.insert("b"));
        assert_eq!(
            index.exists_now(&["a".into(), "c".into(), "b".into()]),
            vec![true, false, true]
        );
        assert!(index.remove("a"));
        assert!(!index.remove("a"));
        assert_eq!(index.len(), 1);
        index.remove_all();
        assert!(index.is_empty());
    }

    #[test]
    fn insert_chain_covers_every_namespace() {
        let layout = KeyLayout::new("m")
            .with_namespaces(RankNamespace::grid(1, 3))
            .unwrap();
        let index = InMemoryIndex::new();
        assert_eq!(index.insert_chain(&layout, &hashes(&[7, 8, 9]), 2), 6);
        assert_eq!(index.insert_chain(&layout, &hashes(&[7, 8, 9]), 3), 3);
        assert_eq!(index.len(), 9);
        assert!(index.contains(&layout.key(2, &9u64.to_be_bytes()).unwrap()));
    }

    #[test]
    fn bounded_index_evicts_least_recently_used() {
        let index = InMemoryIndex::bounded(NonZeroUsize::new(2).unwrap());
        index.insert("a");
        index.insert("b");
        // Finding "a" marks it used, so "b" is now the oldest.
        assert_eq!(index.exists_now(&["a".into()]), vec![true]);
        index.insert("c");
        assert_eq!(index.evictions(), 1);
        assert!(index.contains("a"));
        assert!(!index.contains("b"));
        assert!(index.contains("c"));
        // Re-inserting refreshes too: "a" is newer than "c" afterwards.
        index.insert("a");
        index.insert("d");
        assert!(!index.contains("c"));
        assert_eq!(index.len(), 2);
        assert_eq!(index.evictions(), 2);
        assert!(index.remove("a"));
        index.insert("e");
        assert_eq!(index.len(), 2);
        assert_eq!(index.evictions(), 2);
    }
}
