//! What a run measured ([`ModeResult`]) and what one request did
//! ([`RequestRecord`]). Every per-request figure goes into a histogram or a sum when
//! the request finishes, so a run holds nothing per finished request.

use hdrhistogram::Histogram;
use lookup_core::Stats;
use serde::Serialize;

use super::sample::{Sample, Slope};
use crate::mode::Mode;
use crate::server::KeyCount;

/// Prompt-length buckets of the per-bucket figures: lower bounds in tokens.
pub const BUCKET_FLOORS: [u32; 5] = [0, 2_048, 8_192, 16_384, 32_768];

/// A histogram of values from 1 to about a year in µs (or keys), 3 significant digits.
#[must_use]
pub fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits is a valid histogram")
}

/// Records `v` (saturating at the histogram's range, which auto-resizes).
pub(super) fn record(h: &mut Histogram<u64>, v: u64) {
    let _ = h.record(v);
}

/// The bucket of a prompt of `num_tokens`.
#[must_use]
pub fn bucket_of(num_tokens: u32) -> usize {
    BUCKET_FLOORS
        .iter()
        .rposition(|&floor| num_tokens >= floor)
        .unwrap_or(0)
}

/// Where a request's TTFT went (ns): waiting to be probed or scheduled, waiting for its
/// lookup, loading external tokens, and computing its prefill. The four add up to the
/// TTFT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    /// Arrival to the first probe, plus the load's end (or the lookup's answer) to the
    /// first computed tokens.
    pub queue_ns: u64,
    /// First probe to the probe answered `Ready` (deferrals, sync blocking, waits).
    pub lookup_wait_ns: u64,
    /// The lookup's answer to the end of the load of its external tokens.
    pub load_ns: u64,
    /// First computed tokens to the first token (preemptions included).
    pub prefill_ns: u64,
}

/// Sums of [`Breakdown`]s (ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BreakdownSums {
    /// Sum of `queue_ns`.
    pub queue_ns: u128,
    /// Sum of `lookup_wait_ns`.
    pub lookup_wait_ns: u128,
    /// Sum of `load_ns`.
    pub load_ns: u128,
    /// Sum of `prefill_ns`.
    pub prefill_ns: u128,
}

impl BreakdownSums {
    fn add(&mut self, b: &Breakdown) {
        self.queue_ns += u128::from(b.queue_ns);
        self.lookup_wait_ns += u128::from(b.lookup_wait_ns);
        self.load_ns += u128::from(b.load_ns);
        self.prefill_ns += u128::from(b.prefill_ns);
    }
}

/// One finished request, as `--requests-out` writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RequestRecord {
    /// 0-based position in the trace.
    pub seq: u64,
    /// Engine it ran on.
    pub engine: u32,
    /// Arrival (ns from the trace start, after `--rate-scale`).
    pub arrival_ns: u64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Output tokens.
    pub output_length: u32,
    /// Arrival to the first token (ns).
    pub ttft_ns: u64,
    /// Arrival to the first scheduling, for compute or a load (ns).
    pub queue_wait_ns: u64,
    /// Where the TTFT went.
    pub breakdown: Breakdown,
    /// Tokens loaded from the external store.
    pub external_hit_tokens: u32,
    /// Tokens found in the GPU's prefix cache.
    pub local_hit_tokens: u32,
    /// Times it was preempted.
    pub preemptions: u32,
    /// When it finished (ns from the trace start).
    pub finished_ns: u64,
}

/// Figures of one prompt-length bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    /// Shortest prompt of the bucket (tokens).
    pub min_tokens: u32,
    /// Requests.
    pub requests: u64,
    /// TTFT (µs).
    pub ttft_us: Histogram<u64>,
    /// TTFT breakdown sums.
    pub breakdown: BreakdownSums,
    /// Lookups served for prompts of this bucket.
    pub lookups: u64,
    /// Keys they asked.
    pub keys_asked: u64,
}

impl Bucket {
    fn new(min_tokens: u32) -> Self {
        Self {
            min_tokens,
            requests: 0,
            ttft_us: histogram(),
            breakdown: BreakdownSums::default(),
            lookups: 0,
            keys_asked: 0,
        }
    }
}

/// The lookups of a run as the connector saw them.
#[derive(Clone, Debug, PartialEq)]
pub struct LookupFigures {
    /// Lookups answered (hit or miss).
    pub answered: u64,
    /// Lookups failed (timed out).
    pub failed: u64,
    /// Submission to answer (µs): what a request waiting for its lookup sees.
    pub total_us: Histogram<u64>,
    /// Send to answer (µs): the server's service time.
    pub on_wire_us: Histogram<u64>,
    /// Submission to send (µs): the wait for a free server slot (the client keeps at
    /// most `--server-concurrency` on the wire).
    pub server_queue_us: Histogram<u64>,
    /// Keys asked per lookup served.
    pub keys_asked: Histogram<u64>,
    /// Lookups served.
    pub served: u64,
    /// Store calls, summed.
    pub calls: u64,
    /// Present keys asked, summed.
    pub keys_present: u64,
    /// Absent keys asked, summed.
    pub keys_absent: u64,
    /// Keys in the prompts served, summed (what a server without early stop asks).
    pub keys_in_prompt: u64,
    /// Per prompt-length bucket: (lookups served, keys asked).
    pub per_bucket: [(u64, u64); BUCKET_FLOORS.len()],
}

impl Default for LookupFigures {
    fn default() -> Self {
        Self {
            answered: 0,
            failed: 0,
            total_us: histogram(),
            on_wire_us: histogram(),
            server_queue_us: histogram(),
            keys_asked: histogram(),
            served: 0,
            calls: 0,
            keys_present: 0,
            keys_absent: 0,
            keys_in_prompt: 0,
            per_bucket: [(0, 0); BUCKET_FLOORS.len()],
        }
    }
}

impl LookupFigures {
    /// A lookup for `num_tokens` was served, asking `keys`.
    pub fn served(&mut self, num_tokens: u32, keys: &KeyCount) {
        self.served += 1;
        self.calls += u64::from(keys.calls);
        self.keys_present += u64::from(keys.present);
        self.keys_absent += u64::from(keys.absent);
        self.keys_in_prompt += u64::from(keys.in_prompt);
        record(&mut self.keys_asked, u64::from(keys.asked()));
        let b = &mut self.per_bucket[bucket_of(num_tokens)];
        b.0 += 1;
        b.1 += u64::from(keys.asked());
    }

    /// Adds another run's (or engine's) figures.
    pub fn add(&mut self, o: &Self) {
        self.answered += o.answered;
        self.failed += o.failed;
        let _ = self.total_us.add(&o.total_us);
        let _ = self.on_wire_us.add(&o.on_wire_us);
        let _ = self.server_queue_us.add(&o.server_queue_us);
        let _ = self.keys_asked.add(&o.keys_asked);
        self.served += o.served;
        self.calls += o.calls;
        self.keys_present += o.keys_present;
        self.keys_absent += o.keys_absent;
        self.keys_in_prompt += o.keys_in_prompt;
        for (a, b) in self.per_bucket.iter_mut().zip(&o.per_bucket) {
            a.0 += b.0;
            a.1 += b.1;
        }
    }
}

/// Why first probes answered `Pending` (each eligible request's first probe at most
/// once). In sync mode these are the probes that blocked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FirstPending {
    /// Not prefetched (a mode without prefetch, every slot taken, backlog full): the
    /// probe started the lookup.
    pub not_prefetched: u64,
    /// Prefetched, but its lookup was still queued or on the wire: the probe came
    /// sooner after arrival than the lookup took.
    pub on_the_wire: u64,
    /// Of `on_the_wire`: the engine had nothing running and no step in flight, so it
    /// scheduled at once on arrival.
    pub on_the_wire_idle: u64,
    /// Prefetched and answered, but older than `lookup_prefetch_ttl_s` by the first
    /// probe: looked up again (rule 6).
    pub expired: u64,
}

impl FirstPending {
    pub(super) fn add(&mut self, o: &Self) {
        self.not_prefetched += o.not_prefetched;
        self.on_the_wire += o.on_the_wire;
        self.on_the_wire_idle += o.on_the_wire_idle;
        self.expired += o.expired;
    }
}

/// `prefetch+wait`'s waits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Waits {
    /// Waits started (a `Pending` probe whose lookup was queued or on the wire).
    pub started: u64,
    /// Waits that ended with the answer.
    pub caught: u64,
    /// Budgets, summed (ns).
    pub budget_ns: u64,
    /// Time waited, summed (ns).
    pub waited_ns: u64,
}

impl Waits {
    pub(super) fn add(&mut self, o: &Self) {
        self.started += o.started;
        self.caught += o.caught;
        self.budget_ns += o.budget_ns;
        self.waited_ns += o.waited_ns;
    }
}

/// What one mode's run measured, summed over the engines. Times in nanoseconds of
/// virtual time unless the name says otherwise.
#[derive(Clone, Debug, PartialEq)]
pub struct ModeResult {
    /// The mode.
    pub mode: Mode,
    /// Engines.
    pub engines: u32,
    /// Requests finished.
    pub requests: u64,
    /// TTFT (µs).
    pub ttft_us: Histogram<u64>,
    /// TTFTs summed (ns), for an exact mean.
    pub ttft_sum_ns: u128,
    /// TPOT (µs): first token to the last, over the output tokens after the first, of
    /// each request with more than one output token.
    pub tpot_us: Histogram<u64>,
    /// Queue waits (arrival to first scheduling) summed (ns).
    pub queue_wait_sum_ns: u128,
    /// TTFT breakdowns summed.
    pub breakdown: BreakdownSums,
    /// Per prompt-length bucket ([`BUCKET_FLOORS`]).
    pub buckets: Vec<Bucket>,
    /// The lookups.
    pub lookups: LookupFigures,
    /// `prefetch+wait`'s waits.
    pub waits: Waits,
    /// Waits for preempted requests' probes (`lookup_on_preemption` = `wait` or
    /// `keep_wait`, `spec/behaviour.md` rule 8).
    pub preempted_waits: Waits,
    /// Engine-thread time blocked on lookups (sync probes, waits), ns.
    pub blocked_ns: u64,
    /// GPU busy time, all engines, ns.
    pub gpu_busy_ns: u64,
    /// Time the last request finished, ns from the trace start.
    pub makespan_ns: u64,
    /// Steps run.
    pub steps: u64,
    /// Probes answered `Pending` that deferred a request to a later step.
    pub deferred: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Tokens served from the GPU prefix caches at scheduling.
    pub local_hit_tokens: u64,
    /// Tokens loaded from the external store.
    pub external_hit_tokens: u64,
    /// The core's counters, summed over the engines' connectors.
    pub stats: Stats,
    /// RPCs sent whose answer was of no use (see `ModeSummary::rpcs_wasted`).
    pub rpcs_wasted: u64,
    /// RPCs sent to the lookup server, summed over the engines' dispatchers.
    pub rpcs_sent: u64,
    /// Why first probes answered `Pending`.
    pub first_pending: FirstPending,
    /// Blocks in the external store at the end.
    pub store_blocks: u64,
    /// KV blocks held by requests, weighted by step time, summed over the engines
    /// (block·ns); divided by `kv_time_ns` × capacity it is the mean occupancy.
    pub kv_held_block_ns: u128,
    /// GPU time over which `kv_held_block_ns` was taken (ns, all engines).
    pub kv_time_ns: u128,
    /// Most KV blocks held at once on one engine, as a fraction of its capacity.
    pub kv_peak: f64,
    /// Longest waiting queue of one engine.
    pub waiting_peak: u64,
    /// Most requests held at once (read and not finished), all engines.
    pub live_peak: u64,
    /// The last arrival (ns from the trace's start): the trace's span at this rate.
    pub trace_span_ns: u64,
    /// The waiting queues, summed over the engines, against time while requests
    /// still arrived (sampled every [`SAMPLE_NS`](super::SAMPLE_NS)).
    pub waiting_slope: Slope,
    /// The lookups queued or on the wire, summed over the engines, against time while
    /// requests still arrived.
    pub in_flight_slope: Slope,
    /// Most lookups queued or on the wire of one engine at a sample.
    pub in_flight_peak: u64,
    /// Share of engine samples while requests still arrived at which the engine had
    /// requests waiting and at least [`KV_BOUND_SHARE`](super::KV_BOUND_SHARE) of its
    /// KV blocks held.
    pub kv_bound_share: f64,
    /// Most preemptions of one request.
    pub preemptions_max: u32,
    /// Every engine's state once per period (`SimParams::timeseries`), else empty.
    pub timeseries: Vec<Sample>,
    /// The run's perturbation (its parameters that reruns vary).
    pub perturbation: Perturbation,
}

/// What a rerun varies ([`perturbed`](crate::runner::perturbed)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Perturbation {
    /// The servers' jitter seed.
    pub seed: u64,
    /// The arrival rate multiplier.
    pub rate_scale: f64,
    /// The shuffle of requests within bursts (0: the trace's order).
    pub order_seed: u64,
    /// The routing offset.
    pub route_offset: u32,
}

impl ModeResult {
    pub(super) fn new(mode: Mode, engines: u32) -> Self {
        Self {
            mode,
            engines,
            requests: 0,
            ttft_us: histogram(),
            ttft_sum_ns: 0,
            tpot_us: histogram(),
            queue_wait_sum_ns: 0,
            breakdown: BreakdownSums::default(),
            buckets: BUCKET_FLOORS.iter().map(|&f| Bucket::new(f)).collect(),
            lookups: LookupFigures::default(),
            waits: Waits::default(),
            preempted_waits: Waits::default(),
            blocked_ns: 0,
            gpu_busy_ns: 0,
            makespan_ns: 0,
            steps: 0,
            deferred: 0,
            preemptions: 0,
            local_hit_tokens: 0,
            external_hit_tokens: 0,
            stats: Stats::default(),
            rpcs_wasted: 0,
            rpcs_sent: 0,
            first_pending: FirstPending::default(),
            store_blocks: 0,
            kv_held_block_ns: 0,
            kv_time_ns: 0,
            kv_peak: 0.0,
            waiting_peak: 0,
            live_peak: 0,
            trace_span_ns: 0,
            waiting_slope: Slope::default(),
            in_flight_slope: Slope::default(),
            in_flight_peak: 0,
            kv_bound_share: 0.0,
            preemptions_max: 0,
            timeseries: Vec::new(),
            perturbation: Perturbation::default(),
        }
    }

    /// Adds a finished request.
    pub(super) fn finished(&mut self, r: &RequestRecord) {
        self.requests += 1;
        self.preemptions_max = self.preemptions_max.max(r.preemptions);
        let us = r.ttft_ns / 1_000;
        record(&mut self.ttft_us, us);
        self.ttft_sum_ns += u128::from(r.ttft_ns);
        if r.output_length > 1 {
            let decode = r.finished_ns.saturating_sub(r.arrival_ns + r.ttft_ns);
            record(
                &mut self.tpot_us,
                decode / u64::from(r.output_length - 1) / 1_000,
            );
        }
        self.queue_wait_sum_ns += u128::from(r.queue_wait_ns);
        self.breakdown.add(&r.breakdown);
        let b = &mut self.buckets[bucket_of(r.input_length)];
        b.requests += 1;
        record(&mut b.ttft_us, us);
        b.breakdown.add(&r.breakdown);
    }

    /// Mean KV occupancy over the run (fraction of the capacity), given the capacity
    /// of one engine in blocks.
    #[must_use]
    pub fn kv_mean(&self, capacity: u64) -> f64 {
        if self.kv_time_ns == 0 || capacity == 0 {
            return 0.0;
        }
        self.kv_held_block_ns as f64 / (self.kv_time_ns as f64 * capacity as f64)
    }
}

/// Field-wise sum of the core's counters.
pub(super) fn add_stats(to: &mut Stats, s: &Stats) {
    to.lookups_arrival += s.lookups_arrival;
    to.lookups_probe += s.lookups_probe;
    to.prefetch_ineligible += s.prefetch_ineligible;
    to.prefetch_cap_full += s.prefetch_cap_full;
    to.prefetch_backlog_full += s.prefetch_backlog_full;
    to.rpcs_created += s.rpcs_created;
    to.rpcs_shared += s.rpcs_shared;
    to.rpcs_cancelled += s.rpcs_cancelled;
    to.replies_stale += s.replies_stale;
    to.hits += s.hits;
    to.misses += s.misses;
    to.failed_timed_out += s.failed_timed_out;
    to.failed_malformed += s.failed_malformed;
    to.failed_transport += s.failed_transport;
    to.failed_store_unavailable += s.failed_store_unavailable;
    to.ttl_refreshes += s.ttl_refreshes;
    to.chain_refreshes += s.chain_refreshes;
    to.promotions += s.promotions;
    to.probes_pending += s.probes_pending;
    to.probes_ready += s.probes_ready;
    to.first_probes_ready += s.first_probes_ready;
    to.first_probes_pending += s.first_probes_pending;
    to.resets += s.resets;
    to.lookups_kept_on_preemption += s.lookups_kept_on_preemption;
}
