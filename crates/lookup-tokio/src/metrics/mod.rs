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
//! from the core's [`Stats`](lookup_core::Stats) by difference after each call (a probe answered from the
//! result cache changes none of them and records nothing), and wire gauges in the I/O
//! task. Handles are registered once, so a recording is one atomic operation on an
//! existing series (about 10 ns with the Prometheus recorder), never a registry
//! lookup or an allocation.
//!
//! Every series carries a `client` label: [`ClientConfig::client_label`], by default
//! where the client sends its lookups ([`Transport::target`]: a vLLM worker's ipc
//! path names its data-parallel rank). Clients of one process with different labels
//! (data-parallel engines) are told apart; clients that share a label add up into
//! its series (each moves the gauges by its own changes).
//!
//! [`ClientConfig::client_label`]: crate::ClientConfig::client_label
//! [`Transport::target`]: crate::Transport::target
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
//! | `lookup_answers_total` | counter | probes | `answer` | `Ready` answers by what they rest on: `hit`, `miss`, `not_needed` (nothing to ask), `unavailable` (the 0 is not a miss: timed out, transport down, malformed, retrying, disabled, closed) |
//! | `lookup_first_probes_total` | counter | requests | `result` | eligible requests by their first probe's answer: `ready`, `pending` |
//! | `lookup_first_probe_ready_ratio` | gauge | ratio 0-1 | — | `ready / (ready + pending)` of the counter above, over the process's life |
//! | `lookup_in_flight` | gauge | RPCs | — | lookup RPCs on the wire (sent, not ended) |
//! | `lookup_prefetch_slots_in_use` | gauge | lookups | — | arrival-time lookups not ended (rule 3) |
//! | `lookup_socket_reopens_total` | counter | reopens | `reason` | sockets dropped and opened again: `timeouts` (rule 17), `reset` (rule 13), `error` |
//! | `lookup_late_replies_total` | counter | replies | — | replies dropped because their RPC had ended (rule 17) |
//! | `lookup_warnings_total` | counter | warnings | `kind` | every warning of the client's I/O task and handle, printed or suppressed by the once-per-10-s limit: `peer_closed`, `peer_unreachable`, `peer_hung`, `peer_no_answer`, `peer_not_zeromq`, `timeout`, `call_timeout`, `queued_too_long`, `send_error`, `recv_error`, `open_error`, `malformed`, `bad_envelope`, `not_sent`, `wait_gave_up`, and the direct transport's own |
//! | `lookup_resets_total` | counter | resets | `outcome` | reset RPCs ended: `ok`, `failed`, `timed_out` |
//! | `lookup_tokens_queried_total` | counter | tokens | — | prompt tokens (`num_tokens`) of the lookup RPCs the store answered (hit or miss) |
//! | `lookup_hit_tokens_total` | counter | tokens | — | hit tokens those answers claimed (from the start of the prompt, before the local hit is taken off) |
//! | `lookup_external_tokens_total` | counter | tokens | — | external tokens of every `Ready` answer given to the scheduler (a request probed again before allocation counts again) |
//! | `lookup_request_lookup_seconds` | histogram | seconds | — | per request, from its arrival (`on_new_request`) to its first `Ready` answer; requests never announced are not timed |
//!
//! All but `lookup_server_*` also carry `client`.
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

use metrics::Unit;

mod client;
mod io;
#[cfg(test)]
mod tests;

/// Held by tests that drive clients, so that they run one at a time.
#[cfg(test)]
pub(crate) static PROCESS_WIDE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub(crate) use client::{ClientMetrics, LookupEnd};
pub(crate) use io::{ActorMetrics, ReopenReason};

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
        "lookup_request_lookup_seconds",
        Unit::Seconds,
        "Requests from their arrival to their first Ready answer"
    );
    describe_counter!(
        "lookup_tokens_queried_total",
        Unit::Count,
        "Prompt tokens of the lookup RPCs the store answered"
    );
    describe_counter!(
        "lookup_hit_tokens_total",
        Unit::Count,
        "Hit tokens the store's answers claimed"
    );
    describe_counter!(
        "lookup_external_tokens_total",
        Unit::Count,
        "External tokens of the Ready answers given to the scheduler"
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
        "lookup_answers_total",
        Unit::Count,
        "Ready answers by what they rest on: hit, miss, not_needed or unavailable"
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
        "lookup_warnings_total",
        Unit::Count,
        "Warnings of the client, by kind, printed or suppressed by the rate limit"
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
