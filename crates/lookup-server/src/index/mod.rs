//! What the lookup server asks: which store keys exist.
//!
//! - [`BlockIndex`]: the store behind the server, asked once per lookup with every key
//!   of the blocks in question (`spec/wire.md`, "What the server computes", step 3).
//!   Dyn-compatible and async, so that an index making network calls to a Mooncake
//!   master fits behind the same `Arc<dyn BlockIndex>` as the in-memory one. The keys
//!   come from a [`KeyLayout`](mooncake_master::KeyLayout) (step 2).
//! - [`InMemoryIndex`]: the embedded default: a key set with optional LRU capacity.
//! - [`DelayedIndex`]: adds a fixed latency to every call of another index, to model a
//!   slow store in benchmarks and tests.
//! - [`MooncakeIndex`]: asks a real Mooncake master.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use lookup_core::answer::leading_run;

pub use crate::error::IndexError;

mod delayed;
mod memory;
mod mooncake;

pub use delayed::DelayedIndex;
pub use memory::InMemoryIndex;
pub use mooncake::{
    DEFAULT_CLIENT_TTL, DEFAULT_REOPEN_AFTER_TIMEOUTS, IndexStats, MooncakeIndex, ResetPolicy,
};

/// The future an index call returns: boxed so that [`BlockIndex`] stays
/// dyn-compatible (`Arc<dyn BlockIndex>`), `Send` so that the server's socket task can
/// hold it.
pub type IndexFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, IndexError>> + Send + 'a>>;

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
    /// [`IndexError`] when the store cannot answer; the server answers the lookup
    /// with the store-unavailable error reply (`spec/wire.md`, "Store unavailable").
    fn exists<'a>(&'a self, keys: &'a [String]) -> IndexFuture<'a, Vec<bool>>;

    /// Removes every key: the server's answer to a reset request (`spec/wire.md`,
    /// `tagged-blob`, reset: vLLM drains pending puts, then `remove_all(force=True)`).
    ///
    /// # Errors
    /// [`IndexError`] when the store could not be wiped; the server answers `0x00`.
    fn clear(&self) -> IndexFuture<'_, ()>;

    /// The number of leading blocks whose every key exists, for `keys` laid out
    /// block-major with `keys_per_block` keys per block (one per rank namespace, as
    /// [`KeyLayout::chain_keys`](mooncake_master::KeyLayout::chain_keys) builds them): the first block with a missing key ends
    /// the run (`spec/wire.md`, "What the server computes", steps 2-3). A trailing
    /// partial block never counts; `keys_per_block == 0` gives 0. The server asks this
    /// once per lookup.
    ///
    /// The default asks [`exists`](Self::exists) once for every key and counts the
    /// run. An index that can stop asking once the run has ended (a store whose
    /// existence answers have side effects or cost per key, such as Mooncake's read
    /// leases) overrides it; it must still answer from one logical existence query.
    ///
    /// The answer says how many keys the index actually asked its store
    /// ([`LeadingRun::keys_asked`]: the server's `keys_checked`); the default asks
    /// all of them.
    ///
    /// # Errors
    /// As [`exists`](Self::exists), and [`IndexError::AnswerCount`] when `exists`
    /// answers a different number of flags than keys.
    fn leading_blocks<'a>(
        &'a self,
        keys_per_block: usize,
        keys: &'a [String],
    ) -> IndexFuture<'a, LeadingRun> {
        Box::pin(async move {
            let flags = self.exists(keys).await?;
            if flags.len() != keys.len() {
                return Err(IndexError::AnswerCount {
                    expected: keys.len(),
                    got: flags.len(),
                });
            }
            Ok(LeadingRun {
                blocks: leading_run(&flags, keys_per_block),
                keys_asked: keys.len(),
            })
        })
    }
}

/// The answer of [`BlockIndex::leading_blocks`]: the run, and what it cost the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeadingRun {
    /// Leading blocks whose every key exists.
    pub blocks: usize,
    /// Keys the index asked its store about (an index that stops after the call
    /// ending the run asks fewer than it was given).
    pub keys_asked: usize,
}

impl<T: BlockIndex + ?Sized> BlockIndex for Arc<T> {
    fn exists<'a>(&'a self, keys: &'a [String]) -> IndexFuture<'a, Vec<bool>> {
        (**self).exists(keys)
    }

    fn leading_blocks<'a>(
        &'a self,
        keys_per_block: usize,
        keys: &'a [String],
    ) -> IndexFuture<'a, LeadingRun> {
        (**self).leading_blocks(keys_per_block, keys)
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        (**self).clear()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn default_leading_blocks_counts_whole_blocks_through_wrappers() {
        let index = InMemoryIndex::new();
        for key in ["a0", "a1", "b0", "c0", "c1"] {
            index.insert(key);
        }
        let keys: Vec<String> = ["a0", "a1", "b0", "b1", "c0", "c1"]
            .map(String::from)
            .into();
        assert_eq!(index.leading_blocks(2, &keys).await.unwrap().blocks, 1);
        assert_eq!(index.leading_blocks(1, &keys).await.unwrap().blocks, 3);
        assert_eq!(index.leading_blocks(0, &keys).await.unwrap().blocks, 0);
        let wrapped: Arc<dyn BlockIndex> =
            Arc::new(DelayedIndex::new(index, Duration::from_millis(1)));
        assert_eq!(
            wrapped.leading_blocks(2, &keys[..3]).await.unwrap().blocks,
            1
        );
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
