//! [`ClientMetrics`]: the metric handles of one `LookupClient`, on the scheduler's
//! thread, and [`LookupEnd`], the `outcome` label of a lookup RPC.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lookup_core::{LookupOutcome, ResetOutcome, RpcFailure, Stats};
use metrics::{Counter, Gauge, Histogram};

/// How a lookup RPC ended, as the `outcome` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum LookupEnd {
    Hit,
    Miss,
    Failed,
    TimedOut,
    Malformed,
    Cancelled,
    Stale,
}

impl LookupEnd {
    const COUNT: usize = 7;

    /// The label of an RPC that ended with `outcome`, answering `requests` live
    /// requests: `stale` when it answered none, whatever the reply.
    pub(crate) fn of(outcome: LookupOutcome, requests: u32) -> Self {
        if requests == 0 {
            return Self::Stale;
        }
        match outcome {
            LookupOutcome::Hit { .. } => Self::Hit,
            LookupOutcome::Miss => Self::Miss,
            LookupOutcome::Malformed => Self::Malformed,
            LookupOutcome::Failed(RpcFailure::TimedOut) => Self::TimedOut,
            LookupOutcome::Failed(_) => Self::Failed,
        }
    }

    /// The `outcome` label value.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Miss => "miss",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::Malformed => "malformed",
            Self::Cancelled => "cancelled",
            Self::Stale => "stale",
        }
    }
}

/// Handles of one outcome-labelled metric, indexed by [`LookupEnd`] (macro arms
/// spell the labels as literals so that every key is static).
macro_rules! per_outcome {
    ($kind:ident, $name:literal) => {
        [
            metrics::$kind!($name, "outcome" => "hit"),
            metrics::$kind!($name, "outcome" => "miss"),
            metrics::$kind!($name, "outcome" => "failed"),
            metrics::$kind!($name, "outcome" => "timed_out"),
            metrics::$kind!($name, "outcome" => "malformed"),
            metrics::$kind!($name, "outcome" => "cancelled"),
            metrics::$kind!($name, "outcome" => "stale"),
        ]
    };
}

/// Eligible requests by their first probe, over every client of the process: the
/// ratio gauge is one series, so it is computed from process-wide totals.
pub(super) static FIRST_PROBES_READY: AtomicU64 = AtomicU64::new(0);
pub(super) static FIRST_PROBES_PENDING: AtomicU64 = AtomicU64::new(0);

/// The core's counters the metrics follow, as of the last publication.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Watched {
    lookups_arrival: u64,
    lookups_probe: u64,
    rpcs_shared: u64,
    ttl_refreshes: u64,
    chain_refreshes: u64,
    prefetch_ineligible: u64,
    prefetch_cap_full: u64,
    prefetch_backlog_full: u64,
    first_probes_ready: u64,
    first_probes_pending: u64,
    slots_in_use: u32,
}

impl Watched {
    fn of(stats: &Stats, slots_in_use: u32) -> Self {
        Self {
            lookups_arrival: stats.lookups_arrival,
            lookups_probe: stats.lookups_probe,
            rpcs_shared: stats.rpcs_shared,
            ttl_refreshes: stats.ttl_refreshes,
            chain_refreshes: stats.chain_refreshes,
            prefetch_ineligible: stats.prefetch_ineligible,
            prefetch_cap_full: stats.prefetch_cap_full,
            prefetch_backlog_full: stats.prefetch_backlog_full,
            first_probes_ready: stats.first_probes_ready,
            first_probes_pending: stats.first_probes_pending,
            slots_in_use,
        }
    }
}

/// Adds the growth of a core counter to a metric counter.
fn add(counter: &Counter, was: u64, now: u64) {
    if now > was {
        counter.increment(now - was);
    }
}

/// The metric handles of one [`LookupClient`](crate::LookupClient), on the
/// scheduler's thread.
pub(crate) struct ClientMetrics {
    latency: [Histogram; LookupEnd::COUNT],
    outcomes: [Counter; LookupEnd::COUNT],
    queue_wait: Histogram,
    lookups_arrival: Counter,
    lookups_probe: Counter,
    rpcs_shared: Counter,
    refreshes_ttl: Counter,
    refreshes_chain: Counter,
    skipped_ineligible: Counter,
    skipped_cap_full: Counter,
    skipped_backlog_full: Counter,
    first_ready: Counter,
    first_pending: Counter,
    first_ready_ratio: Gauge,
    slots_in_use: Gauge,
    resets: [Counter; 3],
    published: Watched,
}

impl fmt::Debug for ClientMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientMetrics")
            .field("published", &self.published)
            .finish_non_exhaustive()
    }
}

impl ClientMetrics {
    /// Handles from the recorder installed now (no-ops without one).
    pub(crate) fn new() -> Self {
        use metrics::{counter, gauge, histogram};
        Self {
            latency: per_outcome!(histogram, "lookup_latency_seconds"),
            outcomes: per_outcome!(counter, "lookup_outcomes_total"),
            queue_wait: histogram!("lookup_queue_wait_seconds"),
            lookups_arrival: counter!("lookup_lookups_total", "origin" => "arrival"),
            lookups_probe: counter!("lookup_lookups_total", "origin" => "probe"),
            rpcs_shared: counter!("lookup_rpcs_shared_total"),
            refreshes_ttl: counter!("lookup_refreshes_total", "reason" => "ttl"),
            refreshes_chain: counter!("lookup_refreshes_total", "reason" => "chain"),
            skipped_ineligible: counter!("lookup_prefetch_skipped_total", "reason" => "ineligible"),
            skipped_cap_full: counter!("lookup_prefetch_skipped_total", "reason" => "cap_full"),
            skipped_backlog_full: counter!("lookup_prefetch_skipped_total", "reason" => "backlog_full"),
            first_ready: counter!("lookup_first_probes_total", "result" => "ready"),
            first_pending: counter!("lookup_first_probes_total", "result" => "pending"),
            first_ready_ratio: gauge!("lookup_first_probe_ready_ratio"),
            slots_in_use: gauge!("lookup_prefetch_slots_in_use"),
            resets: [
                counter!("lookup_resets_total", "outcome" => "ok"),
                counter!("lookup_resets_total", "outcome" => "failed"),
                counter!("lookup_resets_total", "outcome" => "timed_out"),
            ],
            published: Watched::default(),
        }
    }

    /// A lookup RPC ended after `latency` (seconds of the caller's clock) from its
    /// submission.
    pub(crate) fn lookup_ended(&self, end: LookupEnd, latency: Duration) {
        self.latency[end as usize].record(latency.as_secs_f64());
        self.outcomes[end as usize].increment(1);
    }

    /// A lookup RPC went on the wire `wait` after its submission.
    pub(crate) fn lookup_sent(&self, wait: Duration) {
        self.queue_wait.record(wait.as_secs_f64());
    }

    /// A reset RPC ended.
    pub(crate) fn reset_ended(&self, outcome: ResetOutcome) {
        let i = match outcome {
            ResetOutcome::Ok => 0,
            ResetOutcome::Failed => 1,
            ResetOutcome::TimedOut => 2,
        };
        self.resets[i].increment(1);
    }

    /// Publishes what changed in the core's counters since the last call; returns how
    /// many lookups joined a shared RPC meanwhile (for the caller's log). A handful
    /// of integer comparisons when nothing changed, as after a cached probe.
    pub(crate) fn sync(&mut self, stats: &Stats, slots_in_use: u32) -> u64 {
        let now = Watched::of(stats, slots_in_use);
        if now == self.published {
            return 0;
        }
        let was = std::mem::replace(&mut self.published, now);
        add(
            &self.lookups_arrival,
            was.lookups_arrival,
            now.lookups_arrival,
        );
        add(&self.lookups_probe, was.lookups_probe, now.lookups_probe);
        add(&self.rpcs_shared, was.rpcs_shared, now.rpcs_shared);
        add(&self.refreshes_ttl, was.ttl_refreshes, now.ttl_refreshes);
        add(
            &self.refreshes_chain,
            was.chain_refreshes,
            now.chain_refreshes,
        );
        add(
            &self.skipped_ineligible,
            was.prefetch_ineligible,
            now.prefetch_ineligible,
        );
        add(
            &self.skipped_cap_full,
            was.prefetch_cap_full,
            now.prefetch_cap_full,
        );
        add(
            &self.skipped_backlog_full,
            was.prefetch_backlog_full,
            now.prefetch_backlog_full,
        );
        if now.slots_in_use != was.slots_in_use {
            self.slots_in_use
                .increment(f64::from(now.slots_in_use) - f64::from(was.slots_in_use));
        }
        let ready = now
            .first_probes_ready
            .saturating_sub(was.first_probes_ready);
        let pending = now
            .first_probes_pending
            .saturating_sub(was.first_probes_pending);
        if ready + pending > 0 {
            self.first_ready.increment(ready);
            self.first_pending.increment(pending);
            let ready = FIRST_PROBES_READY.fetch_add(ready, Ordering::Relaxed) + ready;
            let pending = FIRST_PROBES_PENDING.fetch_add(pending, Ordering::Relaxed) + pending;
            // Counts stay far below 2^53, where f64 is exact.
            #[allow(clippy::cast_precision_loss)]
            self.first_ready_ratio
                .set(ready as f64 / (ready + pending) as f64);
        }
        now.rpcs_shared.saturating_sub(was.rpcs_shared)
    }
}

impl Drop for ClientMetrics {
    fn drop(&mut self) {
        // The gauge is a sum over clients: take this one's share out.
        if self.published.slots_in_use > 0 {
            self.slots_in_use
                .decrement(f64::from(self.published.slots_in_use));
        }
    }
}
