//! What the lookup server asks: which store keys exist.
//!
//! - [`KeyLayout`]: how a block hash becomes store keys, one per rank namespace
//!   (`spec/wire.md`, "What the server computes", step 2).
//! - [`BlockIndex`]: the store behind the server, asked once per lookup with every key
//!   of the blocks in question (step 3). Dyn-compatible and async, so that an index
//!   making network calls to a Mooncake master fits behind the same `Arc<dyn
//!   BlockIndex>` as the in-memory one.
//! - [`InMemoryIndex`]: the embedded default: a key set with optional LRU capacity.
//! - [`DelayedIndex`]: adds a fixed latency to every call of another index, to model a
//!   slow store in benchmarks and tests.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lookup_core::BlockHashes;
use mooncake_master::key::{KeyFormat, push_hex};

use crate::Error;

/// The future an index call returns: boxed so that [`BlockIndex`] stays
/// dyn-compatible (`Arc<dyn BlockIndex>`), `Send` so that the server's socket task can
/// hold it.
pub type IndexFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, IndexError>> + Send + 'a>>;

/// Why an index call failed. The server answers such a lookup with 0 hit tokens
/// (a miss), never with an error frame, and counts it (`spec/wire.md`, "What the
/// server computes", step 5).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// I/O: the store could not be reached (connection refused, timed out, closed).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store was reached and answered with an error of its own.
    #[error("store error: {0}")]
    Store(String),
    /// The store cannot do what was asked at all (for example a reset on a store
    /// whose client has no way to remove every key); asking again will not help.
    #[error("{operation} is not supported by this index: {why}")]
    Unsupported {
        /// The operation refused (`"reset"`).
        operation: &'static str,
        /// Why, for the log.
        why: &'static str,
    },
    /// Index protocol violation: an existence answer with a different number of flags
    /// than keys asked about. Raised where an answer is checked (the default
    /// [`BlockIndex::leading_blocks`]).
    #[error("the index answered {got} existence flags for {expected} keys")]
    AnswerCount {
        /// Keys asked about.
        expected: usize,
        /// Flags received.
        got: usize,
    },
}

/// A store of block keys that the lookup server asks about.
///
/// One [`exists`](Self::exists) call per lookup carries every key of every block in
/// question (`spec/wire.md`, "What the server computes", step 3: one batched existence
/// call); the server may run many calls at once, so implementations are `Sync` and
/// must not assume calls arrive one at a time.
pub trait BlockIndex: Send + Sync {
    /// Whether each key exists: the answer has exactly `keys.len()` flags, in the order
    /// of `keys` (the server treats any other length as
    /// [`IndexError::AnswerCount`]).
    ///
    /// # Errors
    /// [`IndexError`] when the store cannot answer; the server turns it into 0 hit
    /// tokens.
    fn exists<'a>(&'a self, keys: &'a [String]) -> IndexFuture<'a, Vec<bool>>;

    /// Removes every key: the server's answer to a reset request (`spec/wire.md`,
    /// `tagged-blob`, reset: vLLM drains pending puts, then `remove_all(force=True)`).
    ///
    /// # Errors
    /// [`IndexError`] when the store could not be wiped; the server answers `0x00`.
    fn clear(&self) -> IndexFuture<'_, ()>;

    /// The number of leading blocks whose every key exists, for `keys` laid out
    /// block-major with `keys_per_block` keys per block (one per rank namespace, as
    /// [`KeyLayout::chain_keys`] builds them): the first block with a missing key ends
    /// the run (`spec/wire.md`, "What the server computes", steps 2-3). A trailing
    /// partial block never counts; `keys_per_block == 0` gives 0. The server asks this
    /// once per lookup.
    ///
    /// The default asks [`exists`](Self::exists) once for every key and counts the
    /// run. An index that can stop asking once the run has ended (a store whose
    /// existence answers have side effects or cost per key, such as Mooncake's read
    /// leases) overrides it; it must still answer from one logical existence query.
    ///
    /// # Errors
    /// As [`exists`](Self::exists), and [`IndexError::AnswerCount`] when `exists`
    /// answers a different number of flags than keys.
    fn leading_blocks<'a>(
        &'a self,
        keys_per_block: usize,
        keys: &'a [String],
    ) -> IndexFuture<'a, usize> {
        Box::pin(async move {
            let flags = self.exists(keys).await?;
            if flags.len() != keys.len() {
                return Err(IndexError::AnswerCount {
                    expected: keys.len(),
                    got: flags.len(),
                });
            }
            Ok(crate::server::leading_run(&flags, keys_per_block))
        })
    }
}

impl<T: BlockIndex + ?Sized> BlockIndex for Arc<T> {
    fn exists<'a>(&'a self, keys: &'a [String]) -> IndexFuture<'a, Vec<bool>> {
        (**self).exists(keys)
    }

    fn leading_blocks<'a>(
        &'a self,
        keys_per_block: usize,
        keys: &'a [String],
    ) -> IndexFuture<'a, usize> {
        (**self).leading_blocks(keys_per_block, keys)
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        (**self).clear()
    }
}

// ---------------------------------------------------------------------------------
// Key layout
// ---------------------------------------------------------------------------------

/// One rank namespace of the store keys (`spec/wire.md`, "What the server computes",
/// step 2): the ranks of the worker that stored a block's KV shard; the block is
/// usable only when every namespace's key exists. Shared with the master client.
pub use mooncake_master::key::RankNamespace;

/// How block hashes become store keys (`spec/wire.md`, "What the server computes",
/// step 2):
///
/// `[{cache_prefix}@]{model}@tp_rank:{t}@pcp{c}@dcp{d}@pp_rank:{p}@group:{g}@{hex(hash)}`
///
/// with one key per [`RankNamespace`] and `hex` the lowercase hex of the hash bytes.
/// The namespace part of each key is formatted once, at construction.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyLayout {
    cache_prefix: Option<String>,
    model: String,
    namespaces: Vec<RankNamespace>,
    /// The formatter of these keys (the part before the hash, built once).
    format: KeyFormat,
}

impl fmt::Debug for KeyLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyLayout")
            .field("cache_prefix", &self.cache_prefix)
            .field("model", &self.model)
            .field("namespaces", &self.namespaces)
            .finish()
    }
}

impl Default for KeyLayout {
    /// Model name `"model"`, no cache prefix, the single namespace of rank 0.
    fn default() -> Self {
        Self::new("model")
    }
}

impl KeyLayout {
    /// The layout of an unsharded deployment of `model`: no cache prefix, one namespace
    /// with every rank and the group 0.
    #[must_use]
    pub fn new(model: impl Into<String>) -> Self {
        let mut layout = Self {
            cache_prefix: None,
            model: model.into(),
            namespaces: vec![RankNamespace::default()],
            format: KeyFormat::new(None, "", &[]),
        };
        layout.rebuild();
        layout
    }

    /// Sets the optional `{cache_prefix}@` in front of every key; `None` or an empty
    /// string means no prefix.
    #[must_use]
    pub fn with_cache_prefix(mut self, cache_prefix: Option<String>) -> Self {
        self.cache_prefix = cache_prefix.filter(|p| !p.is_empty());
        self.rebuild();
        self
    }

    /// Replaces the rank namespaces; a block is present only when its key exists in
    /// every one of them.
    ///
    /// # Errors
    /// [`Error::InvalidServerConfig`] for an empty list: with no namespace every block
    /// would count as present.
    pub fn with_namespaces(mut self, namespaces: Vec<RankNamespace>) -> Result<Self, Error> {
        if namespaces.is_empty() {
            return Err(Error::InvalidServerConfig {
                key: "namespaces",
                why: "at least one rank namespace is needed".to_owned(),
            });
        }
        self.namespaces = namespaces;
        self.rebuild();
        Ok(self)
    }

    fn rebuild(&mut self) {
        self.format = KeyFormat::new(self.cache_prefix.as_deref(), &self.model, &self.namespaces);
    }

    /// The cache prefix, if any.
    #[must_use]
    pub fn cache_prefix(&self) -> Option<&str> {
        self.cache_prefix.as_deref()
    }

    /// The model name.
    #[must_use]
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The rank namespaces, never empty.
    #[must_use]
    pub fn namespaces(&self) -> &[RankNamespace] {
        &self.namespaces
    }

    /// The key of block `hash` in namespace number `namespace` (an index into
    /// [`namespaces`](Self::namespaces)), or `None` past the end.
    #[must_use]
    pub fn key(&self, namespace: usize, hash: &[u8]) -> Option<String> {
        let prefix = self.format.prefix(namespace)?;
        let mut key = String::with_capacity(prefix.len() + 2 * hash.len());
        key.push_str(prefix);
        push_hex(&mut key, hash);
        Some(key)
    }

    /// Every key of block `hash`, one per namespace, in namespace order.
    #[must_use]
    pub fn block_keys(&self, hash: &[u8]) -> Vec<String> {
        self.format.block_keys(hash)
    }

    /// The keys of the first `blocks` blocks of `block_hashes` (fewer if the chain is
    /// shorter), block-major: block 0's key in every namespace, then block 1's, ...;
    /// `blocks * namespaces().len()` keys.
    #[must_use]
    pub fn chain_keys(&self, block_hashes: &BlockHashes, blocks: usize) -> Vec<String> {
        let blocks = blocks.min(block_hashes.len());
        let mut out = Vec::with_capacity(blocks * self.namespaces.len());
        for hash in block_hashes.iter().take(blocks) {
            self.format.push_block_keys(&mut out, hash);
        }
        out
    }
}

// ---------------------------------------------------------------------------------
// In-memory index
// ---------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------
// Delayed index
// ---------------------------------------------------------------------------------

/// Another index behind a fixed latency per call: models a store that takes, say,
/// 1 ms to answer (benchmarks of concurrent lookups, `issues` "lookup-tokio",
/// acceptance). The delay is a tokio timer, so calls wait concurrently, not in turn;
/// tokio timers tick in whole milliseconds, so a 1 ms latency waits 1-2 ms.
#[derive(Debug)]
pub struct DelayedIndex<I> {
    inner: I,
    latency: Duration,
}

impl<I> DelayedIndex<I> {
    /// Wraps `inner`; each [`exists`](BlockIndex::exists) and
    /// [`clear`](BlockIndex::clear) call first waits `latency`.
    #[must_use]
    pub const fn new(inner: I, latency: Duration) -> Self {
        Self { inner, latency }
    }

    /// The wrapped index.
    #[must_use]
    pub const fn inner(&self) -> &I {
        &self.inner
    }

    /// The added latency per call.
    #[must_use]
    pub const fn latency(&self) -> Duration {
        self.latency
    }
}

impl<I: BlockIndex> BlockIndex for DelayedIndex<I> {
    fn exists<'a>(&'a self, keys: &'a [String]) -> IndexFuture<'a, Vec<bool>> {
        Box::pin(async move {
            tokio::time::sleep(self.latency).await;
            self.inner.exists(keys).await
        })
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        Box::pin(async move {
            tokio::time::sleep(self.latency).await;
            self.inner.clear().await
        })
    }

    fn leading_blocks<'a>(
        &'a self,
        keys_per_block: usize,
        keys: &'a [String],
    ) -> IndexFuture<'a, usize> {
        Box::pin(async move {
            tokio::time::sleep(self.latency).await;
            self.inner.leading_blocks(keys_per_block, keys).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(ids: &[u64]) -> BlockHashes {
        BlockHashes::from_u64s(ids)
    }

    #[test]
    fn key_format_single_namespace() {
        let layout = KeyLayout::new("meta-llama/Llama-3.1-8B");
        assert_eq!(
            layout.key(0, &[0xab, 0x01, 0xff]).unwrap(),
            "meta-llama/Llama-3.1-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab01ff"
        );
        assert_eq!(layout.key(1, &[0xab]), None);
    }

    #[test]
    fn key_format_with_cache_prefix_and_ranks() {
        let ns = RankNamespace {
            tp_rank: 3,
            pcp_rank: 1,
            dcp_rank: 2,
            pp_rank: 4,
            group: 5,
        };
        let layout = KeyLayout::new("m")
            .with_cache_prefix(Some("pfx".to_owned()))
            .with_namespaces(vec![ns])
            .unwrap();
        assert_eq!(
            layout.key(0, &[0x00, 0x0a]).unwrap(),
            "pfx@m@tp_rank:3@pcp1@dcp2@pp_rank:4@group:5@000a"
        );
        // An empty prefix is no prefix.
        let layout = layout.with_cache_prefix(Some(String::new()));
        assert_eq!(layout.cache_prefix(), None);
        assert_eq!(
            layout.key(0, &[0x10]).unwrap(),
            "m@tp_rank:3@pcp1@dcp2@pp_rank:4@group:5@10"
        );
    }

    #[test]
    fn empty_namespace_list_is_refused() {
        let err = KeyLayout::new("m").with_namespaces(Vec::new()).unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidServerConfig {
                key: "namespaces",
                ..
            }
        ));
    }

    #[test]
    fn grid_is_tp_major() {
        let grid = RankNamespace::grid(2, 2);
        let pairs: Vec<(u32, u32)> = grid.iter().map(|n| (n.tp_rank, n.pp_rank)).collect();
        assert_eq!(pairs, vec![(0, 0), (0, 1), (1, 0), (1, 1)]);
        assert_eq!(RankNamespace::grid(0, 0), vec![RankNamespace::default()]);
    }

    #[test]
    fn chain_keys_are_block_major_and_bounded_by_the_chain() {
        let layout = KeyLayout::new("m")
            .with_namespaces(RankNamespace::grid(2, 1))
            .unwrap();
        let keys = layout.chain_keys(&hashes(&[1, 2]), 5);
        assert_eq!(
            keys,
            vec![
                "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@0000000000000001",
                "m@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@0000000000000001",
                "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@0000000000000002",
                "m@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@0000000000000002",
            ]
        );
        assert_eq!(layout.chain_keys(&hashes(&[1, 2]), 1).len(), 2);
        assert!(layout.chain_keys(&BlockHashes::empty(), 3).is_empty());
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

    #[tokio::test]
    async fn default_leading_blocks_counts_whole_blocks_through_wrappers() {
        let index = InMemoryIndex::new();
        for key in ["a0", "a1", "b0", "c0", "c1"] {
            index.insert(key);
        }
        let keys: Vec<String> = ["a0", "a1", "b0", "b1", "c0", "c1"]
            .map(String::from)
            .into();
        assert_eq!(index.leading_blocks(2, &keys).await.unwrap(), 1);
        assert_eq!(index.leading_blocks(1, &keys).await.unwrap(), 3);
        assert_eq!(index.leading_blocks(0, &keys).await.unwrap(), 0);
        let wrapped: Arc<dyn BlockIndex> =
            Arc::new(DelayedIndex::new(index, Duration::from_millis(1)));
        assert_eq!(wrapped.leading_blocks(2, &keys[..3]).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn trait_calls_answer_and_clear() {
        let index: Arc<dyn BlockIndex> = Arc::new(InMemoryIndex::new());
        let inner = InMemoryIndex::new();
        inner.insert("x");
        let delayed = DelayedIndex::new(inner, Duration::ZERO);
        assert_eq!(
            delayed.exists(&["x".into(), "y".into()]).await.unwrap(),
            vec![true, false]
        );
        delayed.clear().await.unwrap();
        assert!(delayed.inner().is_empty());
        assert_eq!(index.exists(&["x".into()]).await.unwrap(), vec![false]);
    }
}
