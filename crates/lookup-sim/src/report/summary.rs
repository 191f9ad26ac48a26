//! What one run's figures come to ([`ModeSummary`], from [`summarise`]): what the
//! table prints and the JSON holds (with [`Report`], the `--json` document), and
//! whether two modes measured the same ([`same_as`]).

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::engine::{
    BUCKET_FLOORS, BreakdownSums, FirstPending, ModeResult, Perturbation, SimParams, Waits,
};
use crate::health::Health;
use crate::mode::Mode;

/// Percentiles of a latency, milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median (ms).
    pub p50: f64,
    /// 90th percentile (ms).
    pub p90: f64,
    /// 99th percentile (ms).
    pub p99: f64,
    /// Mean (ms).
    pub mean: f64,
    /// Maximum (ms).
    pub max: f64,
}

impl Percentiles {
    /// Of a histogram recorded in µs; the mean from it unless `mean_ms` is given.
    #[must_use]
    pub fn of_us(h: &Histogram<u64>, mean_ms: Option<f64>) -> Self {
        if h.is_empty() {
            return Self {
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                mean: 0.0,
                max: 0.0,
            };
        }
        let q = |p: f64| h.value_at_quantile(p) as f64 / 1e3;
        Self {
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            mean: mean_ms.unwrap_or(h.mean() / 1e3),
            max: h.max() as f64 / 1e3,
        }
    }
}

/// The TTFT breakdown's means (ms): they add up to the TTFT mean.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct BreakdownMs {
    /// Waiting to be probed or scheduled.
    pub queue: f64,
    /// Waiting for the lookup (deferrals, sync blocking, waits).
    pub lookup_wait: f64,
    /// Loading external tokens.
    pub load: f64,
    /// Computing the prefill (preemptions included).
    pub prefill: f64,
}

impl BreakdownMs {
    fn of(b: &BreakdownSums, n: u64) -> Self {
        if n == 0 {
            return Self::default();
        }
        let mean = |ns: u128| ns as f64 / n as f64 / 1e6;
        Self {
            queue: mean(b.queue_ns),
            lookup_wait: mean(b.lookup_wait_ns),
            load: mean(b.load_ns),
            prefill: mean(b.prefill_ns),
        }
    }
}

/// The lookups of a mode.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LookupSummary {
    /// Lookups answered.
    pub answered: u64,
    /// Lookups failed (timed out).
    pub failed: u64,
    /// Submission to answer (ms): what a request waiting for its lookup sees.
    pub total_ms: Percentiles,
    /// Send to answer (ms): the server's time.
    pub on_wire_ms: Percentiles,
    /// Submission to send (ms): waiting for a free server slot.
    pub server_queue_ms: Percentiles,
    /// Keys asked per lookup served: mean.
    pub keys_asked_mean: f64,
    /// Keys asked per lookup served: 99th percentile.
    pub keys_asked_p99: f64,
    /// Store calls per lookup served.
    pub calls_mean: f64,
    /// Present keys among those asked (fraction).
    pub present_share: f64,
    /// Keys asked over keys in the prompts (fraction; below 1 thanks to the early stop).
    pub asked_of_prompt: f64,
}

/// Figures of one prompt-length bucket.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BucketSummary {
    /// Shortest prompt (tokens).
    pub min_tokens: u32,
    /// Longest prompt, exclusive (tokens); `None` for the last bucket.
    pub max_tokens: Option<u32>,
    /// Requests.
    pub requests: u64,
    /// TTFT (ms).
    pub ttft_ms: Percentiles,
    /// TTFT breakdown means (ms).
    pub breakdown_ms: BreakdownMs,
    /// Lookups served for prompts of this bucket.
    pub lookups: u64,
    /// Keys asked per lookup (mean).
    pub keys_asked_mean: f64,
}

/// `prefetch+wait`'s waits.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WaitSummary {
    /// Waits started.
    pub started: u64,
    /// Waits that ended with the answer (fraction).
    pub caught_share: f64,
    /// Budget, mean (ms).
    pub budget_mean_ms: f64,
    /// Time waited, mean (ms).
    pub waited_mean_ms: f64,
}

impl WaitSummary {
    fn of(w: &Waits) -> Self {
        let n = w.started.max(1) as f64;
        Self {
            started: w.started,
            caught_share: w.caught as f64 / n,
            budget_mean_ms: w.budget_ns as f64 / n / 1e6,
            waited_mean_ms: w.waited_ns as f64 / n / 1e6,
        }
    }
}

/// One mode's figures, as printed and written to JSON.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModeSummary {
    /// The mode.
    pub mode: Mode,
    /// Requests served.
    pub requests: u64,
    /// Time to first token (hdrhistogram, 3 significant digits, recorded in µs; the
    /// mean exact).
    pub ttft_ms: Percentiles,
    /// Time per output token after the first (hdrhistogram of each request's mean,
    /// recorded in µs), of requests with more than one output token.
    pub tpot_ms: Percentiles,
    /// Where the TTFT went (means, ms).
    pub ttft_breakdown_ms: BreakdownMs,
    /// Mean time from arrival to first scheduling (ms).
    pub queue_wait_mean_ms: f64,
    /// The lookups: latency, server queue, keys asked.
    pub lookups: LookupSummary,
    /// Engine-thread time blocked on lookup RPCs (seconds; sync probes and waits).
    pub engine_blocked_s: f64,
    /// Eligible requests whose lookup was ready at their first probe, as a fraction
    /// of eligible requests probed (`Stats::first_probes_ready / (first_probes_ready +
    /// first_probes_pending)`); `None` when none was probed. In sync mode a probe that
    /// had to block counts as not ready.
    pub ready_at_first_probe: Option<f64>,
    /// Why first probes were not ready.
    pub first_probes_pending: FirstPending,
    /// Probes answered `Pending` that deferred a request to a later step.
    pub lookups_deferred: u64,
    /// `prefetch+wait`'s waits.
    pub waits: WaitSummary,
    /// Lookup RPCs put on the wire.
    pub rpcs_sent: u64,
    /// Lookups that joined an RPC already queued or in flight (rule 16).
    pub rpcs_shared: u64,
    /// Queued prefetches promoted by a probe (rule 15).
    pub promotions: u64,
    /// RPCs sent whose answer was of no use: every asker was gone when it ended
    /// (finished, preempted or already scheduled), or a prefetch whose request's local
    /// hit reached the cap at its first probe.
    pub rpcs_wasted: u64,
    /// RPCs cancelled before they were sent (rule 9).
    pub rpcs_cancelled: u64,
    /// Tokens loaded from the external store instead of recomputed.
    pub external_hit_tokens: u64,
    /// Tokens served by the GPU prefix cache.
    pub local_hit_tokens: u64,
    /// Results looked up again after the TTL (rule 6).
    pub ttl_refreshes: u64,
    /// Arrivals not prefetched because every prefetch slot was taken (rule 2).
    pub prefetch_cap_full: u64,
    /// Preemptions (recompute).
    pub preemptions: u64,
    /// Most preemptions of one request.
    pub preemptions_max: u32,
    /// Growth of the lookups queued or on the wire while requests arrived (lookups
    /// per minute per engine, least squares).
    pub lookups_in_flight_slope_per_min: f64,
    /// Most lookups queued or on the wire of one engine at a sample.
    pub lookups_in_flight_peak: u64,
    /// Share of engine samples while requests arrived at which the engine had
    /// requests waiting with its KV cache at least
    /// [`KV_BOUND_SHARE`](crate::engine::KV_BOUND_SHARE) held.
    pub kv_bound_share: f64,
    /// KV blocks held by requests over the run, mean (fraction of the capacity,
    /// weighted by GPU time).
    pub kv_occupancy_mean: f64,
    /// Most KV blocks held at once on one engine (fraction).
    pub kv_occupancy_peak: f64,
    /// Longest waiting queue of one engine.
    pub waiting_peak: u64,
    /// Most requests held in memory at once (all engines).
    pub live_peak: u64,
    /// Steps run.
    pub steps: u64,
    /// GPU busy time over the run's span, averaged over the engines (fraction).
    pub gpu_utilisation: f64,
    /// Time the last request finished (seconds from the trace start).
    pub makespan_s: f64,
    /// Per prompt-length bucket.
    pub buckets: Vec<BucketSummary>,
    /// Waits for preempted requests' probes (`lookup_on_preemption` = `wait`).
    pub preempted_waits: WaitSummary,
    /// Lookups kept across a preemption (`lookup_on_preemption` = `keep`).
    pub lookups_kept_on_preemption: u64,
    /// The overload detector's verdict on this run.
    pub health: Health,
    /// What this run's perturbation was.
    pub perturbation: Perturbation,
}

/// The JSON document of `--json`.
#[derive(Debug, Serialize)]
pub struct Report<'a, S: Serialize> {
    /// Where the trace came from (a path, or the generator and its seed).
    pub trace: String,
    /// Requests replayed.
    pub requests: u64,
    /// Every parameter of the run.
    pub params: &'a SimParams,
    /// The calibration the server model came from (machine, date, profile).
    pub calibration: String,
    /// One entry per mode, in the order run (the first, unperturbed run).
    pub modes: &'a [ModeSummary],
    /// Stability, recommendation or sweep, as run.
    pub analysis: S,
}

fn mean_ms(sum_ns: u128, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        sum_ns as f64 / n as f64 / 1e6
    }
}

/// Summarises one run, given the GPU capacity of one engine (blocks) for the KV
/// occupancy.
#[must_use]
pub fn summarise(r: &ModeResult, gpu_kv_blocks: u64) -> ModeSummary {
    let n = r.requests;
    let s = &r.stats;
    let probed = s.first_probes_ready + s.first_probes_pending;
    let span = r.makespan_ns.max(1) as f64 * f64::from(r.engines.max(1));
    let l = &r.lookups;
    let served = l.served.max(1) as f64;
    let asked = l.keys_present + l.keys_absent;
    let buckets = r
        .buckets
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let (lookups, keys) = l.per_bucket[i];
            BucketSummary {
                min_tokens: b.min_tokens,
                max_tokens: BUCKET_FLOORS.get(i + 1).copied(),
                requests: b.requests,
                ttft_ms: Percentiles::of_us(&b.ttft_us, None),
                breakdown_ms: BreakdownMs::of(&b.breakdown, b.requests),
                lookups,
                keys_asked_mean: keys as f64 / lookups.max(1) as f64,
            }
        })
        .collect();
    ModeSummary {
        mode: r.mode,
        requests: n,
        ttft_ms: Percentiles::of_us(&r.ttft_us, Some(mean_ms(r.ttft_sum_ns, n))),
        tpot_ms: Percentiles::of_us(&r.tpot_us, None),
        ttft_breakdown_ms: BreakdownMs::of(&r.breakdown, n),
        queue_wait_mean_ms: mean_ms(r.queue_wait_sum_ns, n),
        lookups: LookupSummary {
            answered: l.answered,
            failed: l.failed,
            total_ms: Percentiles::of_us(&l.total_us, None),
            on_wire_ms: Percentiles::of_us(&l.on_wire_us, None),
            server_queue_ms: Percentiles::of_us(&l.server_queue_us, None),
            keys_asked_mean: asked as f64 / served,
            keys_asked_p99: l.keys_asked.value_at_quantile(0.99) as f64,
            calls_mean: l.calls as f64 / served,
            present_share: l.keys_present as f64 / asked.max(1) as f64,
            asked_of_prompt: asked as f64 / l.keys_in_prompt.max(1) as f64,
        },
        engine_blocked_s: r.blocked_ns as f64 / 1e9,
        ready_at_first_probe: (probed > 0).then(|| s.first_probes_ready as f64 / probed as f64),
        first_probes_pending: r.first_pending,
        lookups_deferred: r.deferred,
        waits: WaitSummary::of(&r.waits),
        rpcs_sent: r.rpcs_sent,
        rpcs_shared: s.rpcs_shared,
        promotions: s.promotions,
        rpcs_wasted: r.rpcs_wasted,
        rpcs_cancelled: s.rpcs_cancelled,
        external_hit_tokens: r.external_hit_tokens,
        local_hit_tokens: r.local_hit_tokens,
        ttl_refreshes: s.ttl_refreshes,
        prefetch_cap_full: s.prefetch_cap_full,
        preemptions: r.preemptions,
        preemptions_max: r.preemptions_max,
        lookups_in_flight_slope_per_min: r.in_flight_slope.per_s() * 60.0
            / f64::from(r.engines.max(1)),
        lookups_in_flight_peak: r.in_flight_peak,
        kv_bound_share: r.kv_bound_share,
        kv_occupancy_mean: r.kv_mean(gpu_kv_blocks),
        kv_occupancy_peak: r.kv_peak,
        waiting_peak: r.waiting_peak,
        live_peak: r.live_peak,
        steps: r.steps,
        gpu_utilisation: r.gpu_busy_ns as f64 / span,
        makespan_s: r.makespan_ns as f64 / 1e9,
        buckets,
        preempted_waits: WaitSummary::of(&r.preempted_waits),
        lookups_kept_on_preemption: s.lookups_kept_on_preemption,
        health: Health::of(r),
        perturbation: r.perturbation,
    }
}

/// Whether `prefetch+` measured the same as `prefetch` (TTFT p50, p90, p99 and mean
/// within 0.5 %, preemptions within 1 % or 2): then its column adds nothing on this
/// trace.
#[must_use]
pub fn same_as(a: &ModeSummary, b: &ModeSummary) -> bool {
    let close = |x: f64, y: f64| (x - y).abs() <= 0.005 * x.abs().max(y.abs()).max(1e-9);
    let (ta, tb) = (&a.ttft_ms, &b.ttft_ms);
    close(ta.p50, tb.p50)
        && close(ta.p90, tb.p90)
        && close(ta.p99, tb.p99)
        && close(ta.mean, tb.mean)
        && a.preemptions.abs_diff(b.preemptions) <= (a.preemptions / 100).max(2)
}
