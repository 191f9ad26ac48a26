//! Metrics of the lookup client, through the [`metrics`] facade.
//!
//! Nothing is recorded unless the process installs a recorder
//! ([`metrics::set_global_recorder`], or `install_prometheus` with the `prometheus`
//! feature). Each [`LookupClient`] takes its metric handles from the recorder
//! installed when it connects, so **install the recorder first**; without one every
//! handle is a no-op and recording costs a branch. The reference server's metrics
//! (`lookup_server_*`) are `lookup_server::metrics`'; a process with both installs one
//! recorder and calls both crates' `describe`.
//!
//! The client records off the probe's path where it can: lookup outcomes and latencies
//! from the core's [`Event`](lookup_core::Event)s as the handle drains them, counters
//! from the core's [`Stats`] by difference after each call (a probe answered from the
//! result cache changes none of them and records nothing), and wire gauges in the I/O
//! task. Handles are registered once, so a recording is one atomic operation on an
//! existing series (about 10 ns with the Prometheus recorder), never a registry
//! lookup or an allocation.
//!
//! Several clients in one process add up: counters and histograms are shared series,
//! and each client moves the gauges by its own changes.
//!
//! # Client metrics
//!
//! | name | type | unit | labels | what |
//! |---|---|---|---|---|
//! | `lookup_latency_seconds` | histogram | seconds | `outcome` | per lookup RPC, from submission to its end (reply, failure, timeout or cancellation) |
//! | `lookup_queue_wait_seconds` | histogram | seconds | — | per lookup RPC sent, from submission to the send |
//! | `lookup_outcomes_total` | counter | RPCs | `outcome` | lookup RPCs ended, by outcome |
//! | `lookup_lookups_total` | counter | lookups | `origin` | lookups submitted, one per request (shared ones included) |
//! | `lookup_rpcs_shared_total` | counter | lookups | — | lookups that joined an RPC already queued or in flight (`spec/behaviour.md` rule 16) |
//! | `lookup_refreshes_total` | counter | lookups | `reason` | results looked up again: `ttl` (rule 6), `chain` (rule 7) |
//! | `lookup_prefetch_skipped_total` | counter | arrivals | `reason` | arrivals not prefetched: `ineligible` (rule 1), `cap_full` (rule 2), `backlog_full` (`max_queued`) |
//! | `lookup_first_probes_total` | counter | requests | `result` | eligible requests by their first probe's answer: `ready`, `pending` |
//! | `lookup_first_probe_ready_ratio` | gauge | ratio 0-1 | — | `ready / (ready + pending)` of the counter above, over the process's life |
//! | `lookup_in_flight` | gauge | RPCs | — | lookup RPCs on the wire (sent, not ended) |
//! | `lookup_prefetch_slots_in_use` | gauge | lookups | — | arrival-time lookups not ended (rule 3) |
//! | `lookup_socket_reopens_total` | counter | reopens | `reason` | sockets dropped and opened again: `timeouts` (rule 17), `reset` (rule 13), `error` |
//! | `lookup_late_replies_total` | counter | replies | — | replies dropped because their RPC had ended (rule 17) |
//! | `lookup_resets_total` | counter | resets | `outcome` | reset RPCs ended: `ok`, `failed`, `timed_out` |
//!
//! `outcome` of a lookup RPC: `hit` (hit tokens > 0), `miss` (0), `malformed` (a
//! reply that broke `spec/wire.md` or its guards), `timed_out` (unanswered
//! `lookup_timeout_s` after its send), `failed` (transport error, or dropped unsent),
//! `cancelled` (every asker discarded before it was sent: never on the wire, rule 9;
//! also RPCs still open when the client closes), `stale` (it ended, whatever the
//! reply, with no live request left to answer: a wasted RPC). Each lookup RPC counts
//! once; several requests can share one (rule 16), so `lookup_lookups_total` can
//! exceed the sum of `lookup_outcomes_total`. `origin`: `arrival` (prefetch at
//! `on_new_request`) or `probe`.
//!
//! For a ratio over a window rather than the process's life, use the counters:
//! `rate(lookup_first_probes_total{result="ready"}[5m]) / rate(lookup_first_probes_total[5m])`.
//!
//! [`LookupClient`]: crate::LookupClient

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lookup_core::{LookupOutcome, ResetOutcome, RpcFailure, Stats};
use metrics::{Counter, Gauge, Histogram, Unit};

pub use lookup_metrics::LATENCY_BUCKETS_SECONDS;
#[cfg(feature = "prometheus")]
pub use lookup_metrics::{MetricsError, PrometheusHandle};

/// Registers the description and unit of every metric of the module's tables with the
/// installed recorder (exporters print them as `# HELP`). `install_prometheus` calls
/// it; call it after installing another recorder. Harmless without one, or twice.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(
        "lookup_latency_seconds",
        Unit::Seconds,
        "Lookup RPCs from submission to their end, by outcome"
    );
    describe_histogram!(
        "lookup_queue_wait_seconds",
        Unit::Seconds,
        "Lookup RPCs from submission to their send"
    );
    describe_counter!(
        "lookup_outcomes_total",
        Unit::Count,
        "Lookup RPCs ended, by outcome"
    );
    describe_counter!(
        "lookup_lookups_total",
        Unit::Count,
        "Lookups submitted (one per request, shared ones included), by origin"
    );
    describe_counter!(
        "lookup_rpcs_shared_total",
        Unit::Count,
        "Lookups that joined an identical RPC already queued or in flight"
    );
    describe_counter!(
        "lookup_refreshes_total",
        Unit::Count,
        "Results looked up again: ttl (expired) or chain (prompt changed)"
    );
    describe_counter!(
        "lookup_prefetch_skipped_total",
        Unit::Count,
        "Arrivals not prefetched: ineligible, cap_full or backlog_full"
    );
    describe_counter!(
        "lookup_first_probes_total",
        Unit::Count,
        "Eligible requests by the answer of their first probe: ready or pending"
    );
    describe_gauge!(
        "lookup_first_probe_ready_ratio",
        Unit::Count,
        "Fraction of eligible requests whose lookup was ready at their first probe"
    );
    describe_gauge!(
        "lookup_in_flight",
        Unit::Count,
        "Lookup RPCs on the wire (sent, not ended)"
    );
    describe_gauge!(
        "lookup_prefetch_slots_in_use",
        Unit::Count,
        "Arrival-time lookups (prefetches) not ended"
    );
    describe_counter!(
        "lookup_socket_reopens_total",
        Unit::Count,
        "Lookup sockets dropped and opened again, by reason"
    );
    describe_counter!(
        "lookup_late_replies_total",
        Unit::Count,
        "Replies dropped because their RPC had already ended"
    );
    describe_counter!(
        "lookup_resets_total",
        Unit::Count,
        "Reset RPCs ended, by outcome"
    );
}

/// Installs the Prometheus exporter ([`lookup_metrics::install_prometheus`]: the
/// process's global recorder, served at `http://{addr}/metrics` from a thread of its
/// own, histograms with [`LATENCY_BUCKETS_SECONDS`]), then [`describe`]s this crate's
/// metrics. Call it before connecting clients: they take their handles from the
/// recorder of that moment. The listener answers scrapes while the caller's runtime
/// is busy or blocked; this call waits only for the bind. Returns a handle that
/// renders the same text in-process.
///
/// # Errors
/// [`MetricsError::Exporter`] when `addr` cannot be bound or a recorder is already
/// installed (a process has one); [`MetricsError::Thread`] when the exporter's thread
/// or runtime cannot be started.
#[cfg(feature = "prometheus")]
pub fn install_prometheus(addr: std::net::SocketAddr) -> Result<PrometheusHandle, MetricsError> {
    let handle = lookup_metrics::install_prometheus(addr)?;
    describe();
    Ok(handle)
}

// ---------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------

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
static FIRST_PROBES_READY: AtomicU64 = AtomicU64::new(0);
static FIRST_PROBES_PENDING: AtomicU64 = AtomicU64::new(0);

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

/// Why the I/O task dropped and reopened its socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReopenReason {
    /// `reopen_after_timeouts` lookups timed out in a row (rule 17).
    Timeouts,
    /// A reset is sent on a fresh socket (rule 13).
    Reset,
    /// The socket failed to send or receive.
    Error,
}

/// The metric handles of one client's I/O task.
pub(crate) struct ActorMetrics {
    in_flight: Gauge,
    /// This task's share of `in_flight`.
    on_wire: u32,
    reopens: [Counter; 3],
    late_replies: Counter,
}

impl ActorMetrics {
    /// Handles from the recorder installed now (no-ops without one).
    pub(crate) fn new() -> Self {
        use metrics::{counter, gauge};
        Self {
            in_flight: gauge!("lookup_in_flight"),
            on_wire: 0,
            reopens: [
                counter!("lookup_socket_reopens_total", "reason" => "timeouts"),
                counter!("lookup_socket_reopens_total", "reason" => "reset"),
                counter!("lookup_socket_reopens_total", "reason" => "error"),
            ],
            late_replies: counter!("lookup_late_replies_total"),
        }
    }

    /// A lookup RPC went on the wire.
    pub(crate) fn lookup_on_wire(&mut self) {
        self.on_wire += 1;
        self.in_flight.increment(1.0);
    }

    /// A lookup RPC left the wire (reply, timeout, socket dropped).
    pub(crate) fn lookup_off_wire(&mut self) {
        if self.on_wire > 0 {
            self.on_wire -= 1;
            self.in_flight.decrement(1.0);
        }
    }

    /// The socket was dropped and will be opened again.
    pub(crate) fn reopened(&self, reason: ReopenReason) {
        self.reopens[reason as usize].increment(1);
    }

    /// A reply came for an RPC no longer on the wire.
    pub(crate) fn late_reply(&self) {
        self.late_replies.increment(1);
    }
}

impl Drop for ActorMetrics {
    fn drop(&mut self) {
        if self.on_wire > 0 {
            self.in_flight.decrement(f64::from(self.on_wire));
        }
    }
}

/// Held by tests that drive clients, and by the test of the process-wide first-probe
/// ratio, so that the ratio's inputs do not move while it is checked.
#[cfg(test)]
pub(crate) static PROCESS_WIDE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

    use super::*;

    /// A recorder of its own (not the global one) and its rendering.
    fn recorder() -> PrometheusRecorder {
        PrometheusBuilder::new()
            .set_buckets(&LATENCY_BUCKETS_SECONDS)
            .expect("buckets")
            .build_recorder()
    }

    /// The value of the series `series` (name and labels as rendered), if present.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().expect("a number"))
        })
    }

    #[test]
    fn outcome_labels() {
        let hit = LookupOutcome::Hit { hit_tokens: 16 };
        assert_eq!(LookupEnd::of(hit, 2), LookupEnd::Hit);
        assert_eq!(LookupEnd::of(hit, 0), LookupEnd::Stale);
        assert_eq!(LookupEnd::of(LookupOutcome::Miss, 1), LookupEnd::Miss);
        assert_eq!(
            LookupEnd::of(LookupOutcome::Malformed, 1),
            LookupEnd::Malformed
        );
        assert_eq!(
            LookupEnd::of(LookupOutcome::Failed(RpcFailure::TimedOut), 1),
            LookupEnd::TimedOut
        );
        assert_eq!(
            LookupEnd::of(LookupOutcome::Failed(RpcFailure::Transport), 1),
            LookupEnd::Failed
        );
        assert_eq!(
            LookupEnd::of(LookupOutcome::Failed(RpcFailure::NotSent), 1),
            LookupEnd::Failed
        );
        assert_eq!(
            LookupEnd::of(LookupOutcome::Failed(RpcFailure::TimedOut), 0),
            LookupEnd::Stale
        );
    }

    /// Each outcome lands in the series whose label is its name (the handle arrays
    /// are indexed by the enum).
    #[test]
    fn each_outcome_records_under_its_label() {
        let recorder = recorder();
        let handle = recorder.handle();
        let client = metrics::with_local_recorder(&recorder, ClientMetrics::new);
        let all = [
            LookupEnd::Hit,
            LookupEnd::Miss,
            LookupEnd::Failed,
            LookupEnd::TimedOut,
            LookupEnd::Malformed,
            LookupEnd::Cancelled,
            LookupEnd::Stale,
        ];
        for (i, end) in all.into_iter().enumerate() {
            for _ in 0..=i {
                client.lookup_ended(end, Duration::from_millis(3));
            }
        }
        let text = handle.render();
        for (i, end) in all.into_iter().enumerate() {
            let label = end.as_str();
            let expected = (i + 1) as f64;
            assert_eq!(
                value(
                    &text,
                    &format!("lookup_outcomes_total{{outcome=\"{label}\"}}")
                ),
                Some(expected),
                "{label}"
            );
            assert_eq!(
                value(
                    &text,
                    &format!("lookup_latency_seconds_count{{outcome=\"{label}\"}}")
                ),
                Some(expected),
                "{label}"
            );
            // 3 ms falls in the 5 ms bucket and not in the 2.5 ms one.
            assert_eq!(
                value(
                    &text,
                    &format!("lookup_latency_seconds_bucket{{outcome=\"{label}\",le=\"0.005\"}}")
                ),
                Some(expected)
            );
            assert_eq!(
                value(
                    &text,
                    &format!("lookup_latency_seconds_bucket{{outcome=\"{label}\",le=\"0.0025\"}}")
                ),
                Some(0.0)
            );
        }
    }

    /// Counters follow the core's by difference; gauges move by this client's share
    /// and give it back when the client goes.
    #[test]
    fn sync_publishes_differences() {
        let recorder = recorder();
        let handle = recorder.handle();
        let mut client = metrics::with_local_recorder(&recorder, ClientMetrics::new);
        let mut stats = Stats::default();
        stats.lookups_arrival = 3;
        stats.lookups_probe = 1;
        stats.rpcs_shared = 1;
        stats.ttl_refreshes = 2;
        stats.prefetch_cap_full = 4;
        assert_eq!(client.sync(&stats, 2), 1);
        assert_eq!(client.sync(&stats, 2), 0, "nothing changed");
        stats.lookups_arrival = 5;
        stats.rpcs_shared = 3;
        stats.chain_refreshes = 1;
        assert_eq!(client.sync(&stats, 1), 2);
        let text = handle.render();
        let get = |series: &str| value(&text, series);
        assert_eq!(get("lookup_lookups_total{origin=\"arrival\"}"), Some(5.0));
        assert_eq!(get("lookup_lookups_total{origin=\"probe\"}"), Some(1.0));
        assert_eq!(get("lookup_rpcs_shared_total"), Some(3.0));
        assert_eq!(get("lookup_refreshes_total{reason=\"ttl\"}"), Some(2.0));
        assert_eq!(get("lookup_refreshes_total{reason=\"chain\"}"), Some(1.0));
        assert_eq!(
            get("lookup_prefetch_skipped_total{reason=\"cap_full\"}"),
            Some(4.0)
        );
        assert_eq!(
            get("lookup_prefetch_skipped_total{reason=\"ineligible\"}"),
            Some(0.0)
        );
        assert_eq!(get("lookup_prefetch_slots_in_use"), Some(1.0));

        let other = metrics::with_local_recorder(&recorder, ClientMetrics::new);
        let mut other = other;
        other.sync(&Stats::default(), 3);
        assert_eq!(
            value(&handle.render(), "lookup_prefetch_slots_in_use"),
            Some(4.0),
            "the gauge sums the clients"
        );
        drop(client);
        assert_eq!(
            value(&handle.render(), "lookup_prefetch_slots_in_use"),
            Some(3.0)
        );
        drop(other);
        assert_eq!(
            value(&handle.render(), "lookup_prefetch_slots_in_use"),
            Some(0.0)
        );
    }

    #[test]
    fn first_probe_counters_and_ratio() {
        let _only = PROCESS_WIDE.blocking_lock();
        let recorder = recorder();
        let handle = recorder.handle();
        let mut client = metrics::with_local_recorder(&recorder, ClientMetrics::new);
        // The ratio is process-wide; other tests of this binary may add to it, so
        // only this test's counters are checked exactly.
        let mut stats = Stats::default();
        stats.first_probes_ready = 3;
        stats.first_probes_pending = 1;
        client.sync(&stats, 0);
        let text = handle.render();
        assert_eq!(
            value(&text, "lookup_first_probes_total{result=\"ready\"}"),
            Some(3.0)
        );
        assert_eq!(
            value(&text, "lookup_first_probes_total{result=\"pending\"}"),
            Some(1.0)
        );
        let ready = FIRST_PROBES_READY.load(Ordering::Relaxed) as f64;
        let pending = FIRST_PROBES_PENDING.load(Ordering::Relaxed) as f64;
        assert_eq!(
            value(&text, "lookup_first_probe_ready_ratio"),
            Some(ready / (ready + pending))
        );
    }

    #[test]
    fn actor_gauge_and_reopens() {
        let recorder = recorder();
        let handle = recorder.handle();
        let mut actor = metrics::with_local_recorder(&recorder, ActorMetrics::new);
        actor.lookup_on_wire();
        actor.lookup_on_wire();
        actor.lookup_off_wire();
        actor.reopened(ReopenReason::Timeouts);
        actor.reopened(ReopenReason::Error);
        actor.reopened(ReopenReason::Error);
        actor.late_reply();
        let text = handle.render();
        assert_eq!(value(&text, "lookup_in_flight"), Some(1.0));
        assert_eq!(
            value(&text, "lookup_socket_reopens_total{reason=\"timeouts\"}"),
            Some(1.0)
        );
        assert_eq!(
            value(&text, "lookup_socket_reopens_total{reason=\"reset\"}"),
            Some(0.0)
        );
        assert_eq!(
            value(&text, "lookup_socket_reopens_total{reason=\"error\"}"),
            Some(2.0)
        );
        assert_eq!(value(&text, "lookup_late_replies_total"), Some(1.0));
        drop(actor);
        assert_eq!(value(&handle.render(), "lookup_in_flight"), Some(0.0));
    }
}
