//! What the client records while the lifecycle works: the metrics of each lookup and
//! its tracing span. It is the core's [`Observe`] hook, so it sees each lookup as the
//! core creates, shares, cancels and ends it, and keeps no copy of the core's state:
//! only the open lookups' spans (those only while debug tracing is on) and prompt
//! lengths, per announced request its arrival time until its first answer (for the
//! lookup time per request), and the caller's own ids when given (for the spans).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lookup_core::{Event, LookupOutcome, Observe, Origin, Probe, RequestId, RpcId};
use tracing::Span;
use tracing::field::Empty;

use crate::metrics::{ClientMetrics, LookupEnd};
use crate::warn::WarnLimiter;

/// The observer's tables are the core's own ([`lookup_core::Table`]): they are on the
/// probe's path (a first `Ready` answer and each reply it applies touch up to three
/// of them), and the arrival table grows with the request table.
type Map<K, V> = lookup_core::Table<K, V>;

/// Whether a caller's own id is worth keeping: the `lookup` spans that record it
/// (`caller_request_id`, debug level, target `lookup_tokio::client`) are enabled. A
/// static check of the callsite's interest, no table or clock read. Requests that
/// arrived while they were off have no caller id in their spans, and so do spans
/// enabled by a filter on the span's name alone (`[lookup]=debug`): enable the target
/// (`lookup_tokio::client=debug`) to see the ids.
pub(crate) fn caller_ids_wanted() -> bool {
    tracing::enabled!(target: "lookup_tokio::client", tracing::Level::DEBUG)
}

/// The client's [`Observe`] implementation.
#[derive(Debug)]
pub(crate) struct ClientObserver {
    pub(crate) metrics: ClientMetrics,
    /// Spans of lookup RPCs not ended yet; empty while debug tracing is off.
    spans: Map<RpcId, Span>,
    /// The clock read of the client's current call.
    pub(crate) clock: Instant,
    warn: WarnLimiter,
    /// Where lookups go, for warnings.
    endpoint: String,
    /// `num_tokens` of each lookup RPC not ended yet (for the token counters).
    rpc_tokens: Map<RpcId, u32>,
    /// Requests announced by `on_new_request` and not answered `Ready` yet: arrival
    /// time, nanoseconds after `base` (8 bytes: the scheduler may hold 100,000s).
    arrivals: Map<RequestId, u64>,
    /// The caller's own ids (`on_new_request_with_id`), for spans, with the
    /// arrival time (for the idle sweep); only requests given one, and only while
    /// the lookup spans are enabled ([`caller_ids_wanted`]): otherwise nothing reads
    /// them, and keeping one costs an allocation and two table operations a request.
    caller_ids: Map<RequestId, (u64, Arc<str>)>,
    /// The origin of the arrival times.
    base: Instant,
}

impl ClientObserver {
    /// An observer whose metric series carry `client = label`, warning about
    /// `endpoint`.
    pub(crate) fn new(clock: Instant, endpoint: String, label: &str) -> Self {
        Self {
            metrics: ClientMetrics::new(label),
            spans: Map::default(),
            clock,
            warn: WarnLimiter::default(),
            endpoint,
            rpc_tokens: Map::default(),
            arrivals: Map::default(),
            caller_ids: Map::default(),
            base: clock,
        }
    }

    /// The current call's clock read, in nanoseconds after `base` (saturating).
    fn now_ns(&self) -> u64 {
        u64::try_from(self.clock.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX)
    }

    /// `request_id` arrived now (`on_new_request`), named `caller_id` by the caller
    /// (kept while [`caller_ids_wanted`]). A second arrival before the first answer
    /// keeps the first's time.
    pub(crate) fn arrived(&mut self, request_id: RequestId, caller_id: Option<Arc<str>>) {
        let now = self.now_ns();
        self.arrivals.entry(request_id).or_insert(now);
        if let Some(caller_id) = caller_id
            && caller_ids_wanted()
        {
            self.caller_ids.insert(request_id, (now, caller_id));
        }
    }

    /// A probe of `request_id` answered `probe`: external tokens are counted, and the
    /// request's first `Ready` answer since its arrival records its lookup time.
    pub(crate) fn probed(&mut self, request_id: RequestId, probe: Probe) {
        let Probe::Ready {
            external_tokens, ..
        } = probe
        else {
            return;
        };
        self.metrics.ready(external_tokens);
        if let Some(arrived) = self.arrivals.remove(&request_id) {
            let lookup_time = Duration::from_nanos(self.now_ns().saturating_sub(arrived));
            self.metrics.request_answered(lookup_time);
        }
    }

    /// `request_id` finished: forget it.
    pub(crate) fn finished(&mut self, request_id: RequestId) {
        self.arrivals.remove(&request_id);
        if !self.caller_ids.is_empty() {
            self.caller_ids.remove(&request_id);
        }
    }

    /// Forgets requests that arrived longer than `older_than` ago (the client's
    /// `end_idle` sweep).
    pub(crate) fn sweep(&mut self, older_than: Duration) {
        let cutoff = self
            .now_ns()
            .saturating_sub(u64::try_from(older_than.as_nanos()).unwrap_or(u64::MAX));
        self.arrivals.retain(|_, arrived| *arrived >= cutoff);
        self.caller_ids.retain(|_, (arrived, _)| *arrived >= cutoff);
    }

    /// Requests kept: not answered yet, or named by the caller.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.arrivals.len().max(self.caller_ids.len())
    }

    /// The span of an open lookup RPC (its `rpc` span's parent), or [`Span::none`].
    pub(crate) fn span(&self, rpc_id: RpcId) -> Span {
        // Empty while debug tracing is off: no hashing on the submit path then.
        if self.spans.is_empty() {
            return Span::none();
        }
        self.spans.get(&rpc_id).cloned().unwrap_or_else(Span::none)
    }

    /// The client closed (rule 14): lookups still open end as cancelled.
    pub(crate) fn close(&mut self) {
        self.rpc_tokens.clear();
        self.arrivals.clear();
        self.caller_ids.clear();
        for (_, span) in self.spans.drain() {
            record_end(&span, LookupEnd::Cancelled, None, 0, None, Duration::ZERO);
        }
    }
}

impl Observe for ClientObserver {
    fn lookup_submitted(
        &mut self,
        rpc_id: RpcId,
        request_id: RequestId,
        origin: Origin,
        num_tokens: u32,
        blocks: usize,
    ) {
        self.rpc_tokens.insert(rpc_id, num_tokens);
        let span = tracing::debug_span!(
            target: "lookup_tokio::client",
            "lookup",
            request_id = request_id.0,
            caller_request_id = Empty,
            rpc_id = rpc_id.0,
            origin = origin_label(origin),
            num_tokens,
            blocks,
            outcome = Empty,
            hit_tokens = Empty,
            requests = Empty,
            queue_wait_us = Empty,
            latency_us = Empty,
        );
        if !span.is_disabled() {
            if let Some((_, caller_id)) = self.caller_ids.get(&request_id) {
                span.record("caller_request_id", &**caller_id);
            }
            tracing::debug!(target: "lookup_tokio::client", parent: &span, "lookup submitted");
            self.spans.insert(rpc_id, span);
        }
    }

    fn lookup_shared(&mut self, rpc_id: RpcId, request_id: RequestId) {
        tracing::debug!(
            request_id = request_id.0,
            rpc_id = rpc_id.0,
            "lookup joined an identical RPC already queued or in flight"
        );
    }

    fn lookup_cancelled(&mut self, rpc_id: RpcId, submitted_at: Instant) {
        self.rpc_tokens.remove(&rpc_id);
        let latency = self.clock.saturating_duration_since(submitted_at);
        self.metrics.lookup_ended(LookupEnd::Cancelled, latency);
        if let Some(span) = self.spans.remove(&rpc_id) {
            record_end(&span, LookupEnd::Cancelled, None, 0, None, latency);
        }
    }

    fn reply_rejected(&mut self, rpc_id: RpcId, num_tokens: u32, hit_tokens: u32) {
        self.warn.warn(
            "reply_rejected",
            self.clock,
            format_args!(
                "{} claimed {hit_tokens} hit tokens for a {num_tokens}-token prompt \
                 ({rpc_id}): above the prompt or not whole blocks; counted as malformed, \
                 the request loads nothing",
                self.endpoint
            ),
        );
    }

    fn event(&mut self, event: &Event) {
        match *event {
            Event::LookupDone {
                rpc_id,
                outcome,
                requests,
                total,
                queue_wait,
                ..
            } => {
                let end = LookupEnd::of(outcome, requests);
                let num_tokens = self.rpc_tokens.remove(&rpc_id).unwrap_or(0);
                match outcome {
                    LookupOutcome::Hit { hit_tokens } => {
                        self.metrics.answered(num_tokens, hit_tokens);
                    }
                    LookupOutcome::Miss => self.metrics.answered(num_tokens, 0),
                    LookupOutcome::Malformed | LookupOutcome::Failed(_) => {}
                }
                self.metrics.lookup_sent(queue_wait);
                self.metrics.lookup_ended(end, total);
                if let Some(span) = self.spans.remove(&rpc_id) {
                    let hit_tokens = match outcome {
                        LookupOutcome::Hit { hit_tokens } => Some(hit_tokens),
                        _ => None,
                    };
                    record_end(&span, end, hit_tokens, requests, Some(queue_wait), total);
                }
            }
            Event::ResetDone { outcome, .. } => self.metrics.reset_ended(outcome),
        }
    }
}

/// The `origin` label and span field of a lookup.
fn origin_label(origin: Origin) -> &'static str {
    match origin {
        Origin::Arrival => "arrival",
        Origin::Probe => "probe",
    }
}

/// Microseconds, saturating (for span fields).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Records how a lookup RPC ended on its span, and logs it there.
fn record_end(
    span: &Span,
    end: LookupEnd,
    hit_tokens: Option<u32>,
    requests: u32,
    queue_wait: Option<Duration>,
    latency: Duration,
) {
    let latency_us = micros(latency);
    span.record("outcome", end.as_str());
    if let Some(hit_tokens) = hit_tokens {
        span.record("hit_tokens", hit_tokens);
    }
    if let Some(wait) = queue_wait {
        span.record("queue_wait_us", micros(wait));
    }
    span.record("requests", requests);
    span.record("latency_us", latency_us);
    tracing::debug!(target: "lookup_tokio::client", parent: span, outcome = end.as_str(), latency_us, "lookup ended");
}
