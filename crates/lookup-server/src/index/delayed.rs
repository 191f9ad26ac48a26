//! [`DelayedIndex`]: another index behind a fixed latency per call, to model a slow
//! store (a tokio timer, or with [`DelayedIndex::precise`] a thread's sleep).

use std::time::Duration;

use super::{BlockIndex, IndexError, IndexFuture, LeadingRun};

/// Another index behind a fixed latency per call: models a store that takes, say,
/// 1 ms to answer (benchmarks of concurrent lookups,
/// `cargo xtask bench`). The delay is a tokio timer, so calls wait concurrently, not in turn;
/// tokio timers tick in whole milliseconds, so a 1 ms latency waits 1-2 ms.
/// [`precise`](Self::precise) waits on a blocking-pool thread instead, within tens of
/// microseconds of the latency (0.1 and 0.5 ms: the range of a Mooncake master's
/// existence call).
#[derive(Debug)]
pub struct DelayedIndex<I> {
    inner: I,
    latency: Duration,
    precise: bool,
}

impl<I> DelayedIndex<I> {
    /// Wraps `inner`; each [`exists`](BlockIndex::exists) and
    /// [`clear`](BlockIndex::clear) call first waits `latency`.
    #[must_use]
    pub const fn new(inner: I, latency: Duration) -> Self {
        Self {
            inner,
            latency,
            precise: false,
        }
    }

    /// Wraps `inner`; each call first waits `latency` on a blocking-pool thread
    /// (`std::thread::sleep`, a high-resolution timer): calls wait concurrently, each
    /// holding a thread of tokio's blocking pool while it waits.
    #[must_use]
    pub const fn precise(inner: I, latency: Duration) -> Self {
        Self {
            inner,
            latency,
            precise: true,
        }
    }

    /// Waits the latency, on the timer or on a blocking thread.
    async fn wait(&self) -> Result<(), IndexError> {
        if !self.precise {
            tokio::time::sleep(self.latency).await;
            return Ok(());
        }
        let latency = self.latency;
        tokio::task::spawn_blocking(move || std::thread::sleep(latency))
            .await
            .map_err(|e| IndexError::Unavailable(format!("delay thread: {e}")))
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
            self.wait().await?;
            self.inner.exists(keys).await
        })
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        Box::pin(async move {
            self.wait().await?;
            self.inner.clear().await
        })
    }

    fn leading_blocks<'a>(
        &'a self,
        keys_per_block: usize,
        keys: &'a [String],
    ) -> IndexFuture<'a, LeadingRun> {
        Box::pin(async move {
            self.wait().await?;
            self.inner.leading_blocks(keys_per_block, keys).await
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::InMemoryIndex;

    #[tokio::test]
    async fn a_precise_delay_waits_on_a_thread_then_answers() {
        let inner = InMemoryIndex::new();
        inner.insert("x");
        // A thread's sleep, not a timer: tokio's paused clock cannot stand in for it.
        let delayed = DelayedIndex::precise(inner, Duration::from_micros(300));
        let start = Instant::now();
        let got = delayed.exists(&["x".into(), "y".into()]).await.unwrap();
        assert!(start.elapsed() >= Duration::from_micros(300));
        assert_eq!(got, vec![true, false]);
        assert_eq!(delayed.latency(), Duration::from_micros(300));
    }
}
