//! The engines' state over virtual time: one [`Sample`] per engine per period (for
//! `--timeseries`), and, while requests still arrive, the least-squares slopes of the
//! waiting queues ([`Slope`], the overload detector's first sign: `crate::health`) and
//! of the lookups in flight, their peak, and the share of engine samples that were
//! KV-bound (the mechanisms `crate::mechanism` names).

use serde::Serialize;

/// Sampling period of the engines' state (ns of virtual time).
pub const SAMPLE_NS: u64 = 1_000_000_000;
/// Most samples kept per run; beyond it every other one is dropped and the period
/// doubles, so that a run that drags on for days of virtual time stays small.
const MAX_SAMPLES: usize = 200_000;

/// One engine's state at one instant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// Virtual time (ms from the trace's start).
    pub t_ms: u64,
    /// The engine.
    pub engine: u32,
    /// Requests in its waiting queue (loading ones included).
    pub waiting: u64,
    /// Requests running.
    pub running: u64,
    /// KV blocks held by requests (16 tokens each).
    pub kv_held: u64,
    /// Preemptions so far.
    pub preemptions: u64,
    /// Lookup RPCs queued or on the wire.
    pub lookups_in_flight: u64,
}

/// Least squares of a quantity against time, kept as sums (no samples stored).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Slope {
    n: f64,
    st: f64,
    sy: f64,
    stt: f64,
    sty: f64,
}

impl Slope {
    /// Adds the value `y` at `t_s` seconds.
    pub fn add(&mut self, t_s: f64, y: f64) {
        self.n += 1.0;
        self.st += t_s;
        self.sy += y;
        self.stt += t_s * t_s;
        self.sty += t_s * y;
    }

    /// The fitted slope (units per second); 0 with fewer than two distinct times.
    #[must_use]
    pub fn per_s(&self) -> f64 {
        let d = self.n * self.stt - self.st * self.st;
        if self.n < 2.0 || d <= 0.0 {
            return 0.0;
        }
        (self.n * self.sty - self.st * self.sy) / d
    }

    /// Samples taken.
    #[must_use]
    pub fn samples(&self) -> u64 {
        self.n as u64
    }
}

/// The samples of one run: `keep` stores them (the first run of a mode, with
/// `--timeseries`); the slope is always kept.
#[derive(Debug)]
pub(super) struct Sampler {
    pub(super) next_ns: u64,
    period_ns: u64,
    keep: bool,
    pub(super) samples: Vec<Sample>,
    /// The waiting queues summed over the engines, while requests still arrive.
    pub(super) waiting: Slope,
    /// The lookups queued or on the wire summed over the engines, while requests
    /// still arrive.
    pub(super) in_flight: Slope,
    /// Most lookups queued or on the wire of one engine at a sample.
    pub(super) in_flight_peak: u64,
    /// Engine samples, while requests still arrive.
    pub(super) engine_samples: u64,
    /// Of those, samples of an engine with requests waiting and at least
    /// [`KV_BOUND_SHARE`] of its KV blocks held.
    pub(super) kv_bound_samples: u64,
    kv_bound_blocks: u64,
}

/// Share of its KV blocks held by requests from which an engine with requests waiting
/// counts as KV-bound at a sample.
pub const KV_BOUND_SHARE: f64 = 0.95;

impl Sampler {
    /// `gpu_kv_blocks`: one engine's KV capacity (blocks), for the KV-bound share.
    pub(super) fn new(keep: bool, gpu_kv_blocks: u64) -> Self {
        Self {
            next_ns: 0,
            period_ns: SAMPLE_NS,
            keep,
            samples: Vec::new(),
            waiting: Slope::default(),
            in_flight: Slope::default(),
            in_flight_peak: 0,
            engine_samples: 0,
            kv_bound_samples: 0,
            kv_bound_blocks: (gpu_kv_blocks as f64 * KV_BOUND_SHARE).ceil() as u64,
        }
    }

    /// Records the engines' states `states` at `self.next_ns` and moves on one period.
    /// `arriving`: requests are still to arrive (the slope is taken over that span).
    pub(super) fn take(&mut self, states: impl Iterator<Item = Sample>, arriving: bool) {
        let (mut total, mut in_flight) = (0, 0);
        for s in states {
            total += s.waiting;
            in_flight += s.lookups_in_flight;
            if arriving {
                self.engine_samples += 1;
                self.in_flight_peak = self.in_flight_peak.max(s.lookups_in_flight);
                if s.waiting > 0 && s.kv_held >= self.kv_bound_blocks {
                    self.kv_bound_samples += 1;
                }
            }
            if self.keep {
                self.samples.push(s);
            }
        }
        if arriving {
            let t_s = self.next_ns as f64 / 1e9;
            self.waiting.add(t_s, total as f64);
            self.in_flight.add(t_s, in_flight as f64);
        }
        if self.samples.len() > MAX_SAMPLES {
            let period = self.period_ns;
            self.samples
                .retain(|s| (s.t_ms * 1_000_000 / period) % 2 == 0);
            self.period_ns *= 2;
        }
        self.next_ns += self.period_ns;
    }
}
