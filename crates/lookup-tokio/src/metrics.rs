//! Metrics of the lookup client and server, through the [`metrics`] facade.
//!
//! Nothing is recorded unless the process installs a recorder
//! ([`metrics::set_global_recorder`], or `install_prometheus` with the `prometheus`
//! feature). Each [`LookupClient`] and
//! [`LookupServer`] takes its metric handles from the recorder installed when it is
//! created (connect, bind), so **install the recorder first**; without one every
//! handle is a no-op and recording costs a branch.
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
//! # Server metrics
//!
//! | name | type | unit | labels | what |
//! |---|---|---|---|---|
//! | `lookup_server_requests_total` | counter | requests | `format`, `kind` | messages received: `kind` `lookup`, `reset`, `malformed`, `unknown`, `no_delimiter`; `format` `tagged-blob`, `msgpack-hex`, `unknown` (neither), `none` (no delimiter) |
//! | `lookup_server_keys_checked_total` | counter | keys | — | store keys asked about (blocks × rank namespaces) |
//! | `lookup_server_index_latency_seconds` | histogram | seconds | — | per index call, failed ones included |
//! | `lookup_server_decode_errors_total` | counter | requests | `format` | malformed lookups, answered with hit 0 (`spec/wire.md`) |
//!
//! [`LookupClient`]: crate::LookupClient
//! [`LookupServer`]: crate::LookupServer

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lookup_core::wire::{Format, ServerRequest};
use lookup_core::{LookupOutcome, ResetOutcome, RpcFailure, Stats};
use metrics::{Counter, Gauge, Histogram, Unit};

/// Upper bounds (seconds) of the histogram buckets that `install_prometheus` (feature
/// `prometheus`) exports: from 50 µs (a lookup answered from a local index) to 10 s
/// (beyond the default `lookup_timeout_s` of 5 s).
pub const LATENCY_BUCKETS_SECONDS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

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
    describe_counter!(
        "lookup_server_requests_total",
        Unit::Count,
        "Messages received by the lookup server, by format and kind"
    );
    describe_counter!(
        "lookup_server_keys_checked_total",
        Unit::Count,
        "Store keys asked about by the lookup server"
    );
    describe_histogram!(
        "lookup_server_index_latency_seconds",
        Unit::Seconds,
        "Index calls of the lookup server"
    );
    describe_counter!(
        "lookup_server_decode_errors_total",
        Unit::Count,
        "Malformed lookups received by the lookup server, by format"
    );
}

#[cfg(feature = "prometheus")]
pub use prometheus::{MetricsError, PrometheusHandle, install_prometheus};

#[cfg(feature = "prometheus")]
mod prometheus {
    use std::net::SocketAddr;

    pub use metrics_exporter_prometheus::PrometheusHandle;
    use metrics_exporter_prometheus::{BuildError, ExporterFuture, PrometheusBuilder};

    use super::{LATENCY_BUCKETS_SECONDS, describe};

    /// Why [`install_prometheus`] failed.
    #[derive(Debug, thiserror::Error)]
    #[non_exhaustive]
    pub enum MetricsError {
        /// The exporter could not be built: the address is in use or not allowed
        /// (I/O), or another recorder is installed already (caller misuse: one
        /// recorder per process).
        #[error("prometheus exporter: {0}")]
        Exporter(#[from] BuildError),
        /// I/O: the exporter's thread or runtime could not be started.
        #[error("prometheus exporter thread: {0}")]
        Thread(#[from] std::io::Error),
    }

    /// Installs a Prometheus recorder as the process's global [`metrics`] recorder and
    /// serves its text exposition at `http://{addr}/metrics` (any path answers),
    /// histograms with [`LATENCY_BUCKETS_SECONDS`]. Call it before connecting clients
    /// or binding servers: they take their handles from the recorder of that moment.
    ///
    /// The listener runs on a thread of its own with its own runtime, so scrapes are
    /// answered while the caller's runtime is busy or blocked; this call waits only
    /// for the bind. Every address is accepted: the exposition holds counts and
    /// timings, no keys or prompts. Returns a handle that renders the same text
    /// in-process.
    ///
    /// # Errors
    /// [`MetricsError::Exporter`] when `addr` cannot be bound or a recorder is already
    /// installed (a process has one); [`MetricsError::Thread`] when the thread or its
    /// runtime cannot be started.
    pub fn install_prometheus(addr: SocketAddr) -> Result<PrometheusHandle, MetricsError> {
        let (ready, started) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("lookup-metrics".to_owned())
            .spawn(move || match start(addr) {
                Ok((handle, exporter, runtime)) => {
                    let _ = ready.send(Ok(handle));
                    if let Err(error) = runtime.block_on(exporter) {
                        tracing::error!(?error, "prometheus exporter stopped");
                    }
                }
                // The runtime is dropped here, on this thread, never in the caller's
                // async context.
                Err(error) => {
                    let _ = ready.send(Err(error));
                }
            })?;
        let handle = started.recv().map_err(|_| {
            MetricsError::Thread(std::io::Error::other("the exporter thread ended early"))
        })??;
        describe();
        tracing::info!(%addr, "prometheus metrics served over http");
        Ok(handle)
    }

    /// On the exporter's thread: its runtime, the bound listener, the global recorder.
    fn start(
        addr: SocketAddr,
    ) -> Result<(PrometheusHandle, ExporterFuture, tokio::runtime::Runtime), MetricsError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (recorder, exporter) = {
            // The listener and the upkeep task register with this runtime.
            let _entered = runtime.enter();
            PrometheusBuilder::new()
                .with_http_listener(addr)
                .set_buckets(&LATENCY_BUCKETS_SECONDS)?
                .build()?
        };
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).map_err(BuildError::from)?;
        Ok((handle, exporter, runtime))
    }
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

// ---------------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------------

/// The metric handles of one [`LookupServer`](crate::LookupServer).
pub(crate) struct ServerMetrics {
    /// By [`ServerMetrics::request_index`].
    requests: [Counter; 7],
    keys_checked: Counter,
    index_latency: Histogram,
    /// `tagged-blob`, `msgpack-hex`.
    decode_errors: [Counter; 2],
}

impl ServerMetrics {
    /// Handles from the recorder installed now (no-ops without one).
    pub(crate) fn new() -> Self {
        use metrics::{counter, histogram};
        Self {
            requests: [
                counter!("lookup_server_requests_total", "format" => "tagged-blob", "kind" => "lookup"),
                counter!("lookup_server_requests_total", "format" => "msgpack-hex", "kind" => "lookup"),
                counter!("lookup_server_requests_total", "format" => "tagged-blob", "kind" => "reset"),
                counter!("lookup_server_requests_total", "format" => "tagged-blob", "kind" => "malformed"),
                counter!("lookup_server_requests_total", "format" => "msgpack-hex", "kind" => "malformed"),
                counter!("lookup_server_requests_total", "format" => "unknown", "kind" => "unknown"),
                counter!("lookup_server_requests_total", "format" => "none", "kind" => "no_delimiter"),
            ],
            keys_checked: counter!("lookup_server_keys_checked_total"),
            index_latency: histogram!("lookup_server_index_latency_seconds"),
            decode_errors: [
                counter!("lookup_server_decode_errors_total", "format" => "tagged-blob"),
                counter!("lookup_server_decode_errors_total", "format" => "msgpack-hex"),
            ],
        }
    }

    fn format_index(format: Format) -> usize {
        match format {
            Format::TaggedBlob => 0,
            Format::MsgpackHex => 1,
        }
    }

    /// A decoded request arrived.
    pub(crate) fn request(&self, request: &ServerRequest) {
        let i = match request {
            ServerRequest::Lookup { format, .. } => Self::format_index(*format),
            ServerRequest::Reset => 2,
            ServerRequest::Malformed { format, .. } => {
                self.decode_errors[Self::format_index(*format)].increment(1);
                3 + Self::format_index(*format)
            }
            ServerRequest::Unknown => 5,
        };
        self.requests[i].increment(1);
    }

    /// A message without the empty delimiter frame arrived (dropped).
    pub(crate) fn no_delimiter(&self) {
        self.requests[6].increment(1);
    }

    /// An index call asked about `keys` keys and took `took`.
    pub(crate) fn index_call(&self, keys: usize, took: Duration) {
        self.keys_checked
            .increment(u64::try_from(keys).unwrap_or(u64::MAX));
        self.index_latency.record(took.as_secs_f64());
    }
}

/// Held by tests that drive clients, and by the test of the process-wide first-probe
/// ratio, so that the ratio's inputs do not move while it is checked.
#[cfg(test)]
pub(crate) static PROCESS_WIDE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[cfg(test)]
mod tests {
    use lookup_core::BlockHashes;
    use lookup_core::wire::WireError;
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

    #[test]
    fn server_requests_by_format_and_kind() {
        let recorder = recorder();
        let handle = recorder.handle();
        let server = metrics::with_local_recorder(&recorder, ServerMetrics::new);
        let lookup = |format| ServerRequest::Lookup {
            format,
            num_tokens: 32,
            block_hashes: BlockHashes::from_u64s(&[1, 2]),
        };
        server.request(&lookup(Format::TaggedBlob));
        server.request(&lookup(Format::TaggedBlob));
        server.request(&lookup(Format::MsgpackHex));
        server.request(&ServerRequest::Reset);
        server.request(&ServerRequest::Malformed {
            format: Format::MsgpackHex,
            error: WireError::WrongFrameCount {
                expected: 2,
                got: 3,
            },
        });
        server.request(&ServerRequest::Unknown);
        server.no_delimiter();
        server.index_call(6, Duration::from_micros(200));
        server.index_call(2, Duration::from_millis(30));
        let text = handle.render();
        let get = |series: &str| value(&text, series);
        let req = |format: &str, kind: &str| {
            get(&format!(
                "lookup_server_requests_total{{format=\"{format}\",kind=\"{kind}\"}}"
            ))
        };
        assert_eq!(req("tagged-blob", "lookup"), Some(2.0));
        assert_eq!(req("msgpack-hex", "lookup"), Some(1.0));
        assert_eq!(req("tagged-blob", "reset"), Some(1.0));
        assert_eq!(req("tagged-blob", "malformed"), Some(0.0));
        assert_eq!(req("msgpack-hex", "malformed"), Some(1.0));
        assert_eq!(req("unknown", "unknown"), Some(1.0));
        assert_eq!(req("none", "no_delimiter"), Some(1.0));
        assert_eq!(
            get("lookup_server_decode_errors_total{format=\"msgpack-hex\"}"),
            Some(1.0)
        );
        assert_eq!(
            get("lookup_server_decode_errors_total{format=\"tagged-blob\"}"),
            Some(0.0)
        );
        assert_eq!(get("lookup_server_keys_checked_total"), Some(8.0));
        assert_eq!(get("lookup_server_index_latency_seconds_count"), Some(2.0));
        assert_eq!(
            get("lookup_server_index_latency_seconds_bucket{le=\"0.00025\"}"),
            Some(1.0)
        );
    }
}
