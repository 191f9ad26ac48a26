//! What one run counted that names a mechanism ([`Counters`]): kept per rerun in a
//! verdict ([`crate::stability`]) and read by [`crate::mechanism`] to say why a
//! setting lost. Its own module so that the verdict does not depend on the diagnosis.

use serde::Serialize;

use super::report::ModeSummary;

/// What one run counted that names a mechanism.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Counters {
    /// Preemptions per request.
    pub preemptions_per_request: f64,
    /// Most preemptions of one request.
    pub preemptions_max: u32,
    /// Growth of the waiting queues while requests arrived (per minute per engine).
    pub waiting_slope_per_min: f64,
    /// Longest waiting queue of one engine.
    pub waiting_peak: u64,
    /// Growth of the lookups queued or on the wire (per minute per engine).
    pub in_flight_slope_per_min: f64,
    /// Most lookups queued or on the wire of one engine.
    pub in_flight_peak: u64,
    /// Share of engine samples KV-bound (requests waiting, KV nearly all held).
    pub kv_bound_share: f64,
    /// Lookups' wait for a free server slot, p99 (ms).
    pub server_queue_p99_ms: f64,
    /// TTFT breakdown means (ms): waiting to be probed or scheduled.
    pub queue_ms: f64,
    /// Waiting for the lookup (sync blocking, deferrals, waits).
    pub lookup_wait_ms: f64,
    /// Loading external blocks.
    pub load_ms: f64,
    /// Computing the prefill (preemptions included).
    pub prefill_ms: f64,
    /// Engine-thread time blocked on lookups (s, all engines).
    pub engine_blocked_s: f64,
    /// GPU busy time over the run's span (fraction, mean over the engines).
    pub gpu_utilisation: f64,
}

impl Counters {
    /// The counters of one run.
    #[must_use]
    pub fn of(s: &ModeSummary) -> Self {
        let b = &s.ttft_breakdown_ms;
        Self {
            preemptions_per_request: s.health.preemptions_per_request,
            preemptions_max: s.preemptions_max,
            waiting_slope_per_min: s.health.waiting_slope_per_min,
            waiting_peak: s.waiting_peak,
            in_flight_slope_per_min: s.lookups_in_flight_slope_per_min,
            in_flight_peak: s.lookups_in_flight_peak,
            kv_bound_share: s.kv_bound_share,
            server_queue_p99_ms: s.lookups.server_queue_ms.p99,
            queue_ms: b.queue,
            lookup_wait_ms: b.lookup_wait,
            load_ms: b.load,
            prefill_ms: b.prefill,
            engine_blocked_s: s.engine_blocked_s,
            gpu_utilisation: s.gpu_utilisation,
        }
    }
}
