//! [`DelayedIndex`]: another index behind a fixed latency per call, to model a slow
//! store.

use std::time::Duration;

use super::{BlockIndex, IndexFuture, LeadingRun};

/// Another index behind a fixed latency per call: models a store that takes, say,
/// 1 ms to answer (benchmarks of concurrent lookups,
/// `cargo xtask bench`). The delay is a tokio timer, so calls wait concurrently, not in turn;
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
    ) -> IndexFuture<'a, LeadingRun> {
        Box::pin(async move {
            tokio::time::sleep(self.latency).await;
            self.inner.leading_blocks(keys_per_block, keys).await
        })
    }
}
