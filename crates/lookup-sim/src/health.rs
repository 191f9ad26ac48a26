//! The overload detector: each run is checked for a collapsed engine, whatever its
//! spread over reruns. Three signs, each with its threshold:
//!
//! - the waiting queues (summed over the engines) grow while requests still arrive:
//!   a least-squares slope above [`MAX_WAITING_SLOPE_PER_MIN`] requests per minute per
//!   engine;
//! - the run drains long after the last arrival: makespan beyond the trace's span by
//!   more than [`MAX_DRAIN_S`] seconds and [`MAX_DRAIN_SHARE`] of the span;
//! - requests are preempted again and again: more than
//!   [`MAX_PREEMPTIONS_PER_REQUEST`] preemptions per request, or one request
//!   preempted [`MAX_PREEMPTIONS_OF_ONE_REQUEST`] times or more (a transient cascade
//!   the queue recovers from still gives its victims a TTFT of minutes);
//! - the run's TTFT p99 is over [`MAX_P99_OVER_BEST_MEDIAN`] times the best mode's
//!   median p99 over the reruns ([`Health::judge_tail`], which needs the other
//!   modes' runs).
//!
//! Each sign also says how far past its threshold it is ([`Health::severity`]): a
//! knee needs a clear margin or two rates in a row ([`crate::knee`]).
//!
//! A healthy engine's queue has no trend over an hour of arrivals, drains within a
//! few requests' service times and preempts a few requests in a hundred; a collapsed
//! one (the preemption livelock `cargo xtask simulate` traced) grows its queue to
//! hundreds, ends its work an hour late and preempts a request hundreds of times.
//!
//! [`wilson`] gives the collapse rate's interval over a setting's reruns.

use serde::Serialize;

use super::engine::ModeResult;

/// Largest growth of the waiting queues while requests arrive (requests per minute
/// per engine) a healthy run shows.
pub const MAX_WAITING_SLOPE_PER_MIN: f64 = 0.5;
/// Longest drain after the last arrival (seconds) a healthy run shows, when it is
/// also more than [`MAX_DRAIN_SHARE`] of the span.
pub const MAX_DRAIN_S: f64 = 120.0;
/// Largest drain as a share of the trace's span.
pub const MAX_DRAIN_SHARE: f64 = 0.05;
/// Most preemptions per request a healthy run shows.
pub const MAX_PREEMPTIONS_PER_REQUEST: f64 = 0.1;
/// Preemptions of a single request from which a run is unhealthy.
pub const MAX_PREEMPTIONS_OF_ONE_REQUEST: u32 = 10;
/// A run whose TTFT p99 is over this many times the best mode's median p99 over the
/// reruns is unhealthy.
pub const MAX_P99_OVER_BEST_MEDIAN: f64 = 2.0;

/// One run's health.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Health {
    /// Growth of the waiting queues while requests arrived (requests per minute,
    /// per engine).
    pub waiting_slope_per_min: f64,
    /// Makespan minus the last arrival (seconds).
    pub drain_s: f64,
    /// The last arrival (seconds from the trace's start).
    pub span_s: f64,
    /// Preemptions per request.
    pub preemptions_per_request: f64,
    /// Most preemptions of one request.
    pub preemptions_max: u32,
    /// Any sign above its threshold: the run is unhealthy (collapsed).
    pub collapsed: bool,
    /// How far past its threshold the strongest sign is (its value over the
    /// threshold; 0 when healthy).
    pub severity: f64,
    /// The signs that fired, in words (empty when healthy).
    pub signs: Vec<String>,
}

impl Health {
    /// The health of run `r`.
    #[must_use]
    pub fn of(r: &ModeResult) -> Self {
        let engines = f64::from(r.engines.max(1));
        let slope = r.waiting_slope.per_s() * 60.0 / engines;
        let span_s = r.trace_span_ns as f64 / 1e9;
        let drain_s = r.makespan_ns.saturating_sub(r.trace_span_ns) as f64 / 1e9;
        let per_request = r.preemptions as f64 / r.requests.max(1) as f64;
        let mut signs = Vec::new();
        let mut severity: f64 = 0.0;
        if slope > MAX_WAITING_SLOPE_PER_MIN {
            severity = severity.max(slope / MAX_WAITING_SLOPE_PER_MIN);
            signs.push(format!(
                "waiting queue grows {slope:.1} requests/min per engine while requests arrive"
            ));
        }
        if drain_s > MAX_DRAIN_S && drain_s > MAX_DRAIN_SHARE * span_s {
            severity =
                severity.max((drain_s / MAX_DRAIN_S).min(drain_s / (MAX_DRAIN_SHARE * span_s)));
            signs.push(format!(
                "drains {drain_s:.0} s after the last arrival ({:.0} % of the {span_s:.0} s span)",
                100.0 * drain_s / span_s.max(1e-9)
            ));
        }
        if r.preemptions_max >= MAX_PREEMPTIONS_OF_ONE_REQUEST {
            severity = severity
                .max(f64::from(r.preemptions_max) / f64::from(MAX_PREEMPTIONS_OF_ONE_REQUEST));
            signs.push(format!(
                "a request preempted {} times (unhealthy from {MAX_PREEMPTIONS_OF_ONE_REQUEST})",
                r.preemptions_max
            ));
        }
        if per_request > MAX_PREEMPTIONS_PER_REQUEST {
            severity = severity.max(per_request / MAX_PREEMPTIONS_PER_REQUEST);
            signs.push(format!(
                "{per_request:.2} preemptions per request ({} in all)",
                r.preemptions
            ));
        }
        Self {
            waiting_slope_per_min: slope,
            drain_s,
            span_s,
            preemptions_per_request: per_request,
            preemptions_max: r.preemptions_max,
            collapsed: !signs.is_empty(),
            severity,
            signs,
        }
    }

    /// Adds the tail sign: the run's TTFT p99 (`p99_ms`) is over
    /// [`MAX_P99_OVER_BEST_MEDIAN`] times `best_median_ms`, the best mode's median
    /// p99 over the reruns (nothing when that is 0 or not finite).
    pub fn judge_tail(&mut self, p99_ms: f64, best_median_ms: f64) {
        if !(best_median_ms.is_finite() && best_median_ms > 0.0) {
            return;
        }
        let over = p99_ms / best_median_ms;
        if over > MAX_P99_OVER_BEST_MEDIAN {
            self.severity = self.severity.max(over / MAX_P99_OVER_BEST_MEDIAN);
            self.collapsed = true;
            self.signs.push(format!(
                "TTFT p99 {p99_ms:.0} ms, {over:.1}x the best mode's median {best_median_ms:.0} ms (unhealthy over {MAX_P99_OVER_BEST_MEDIAN}x)"
            ));
        }
    }
}

/// Wilson score interval (95 %, z = 1.96) of a rate of `k` in `n`: `(low, high)`;
/// `(0, 1)` when `n` is 0.
#[must_use]
pub fn wilson(k: usize, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let z = 1.96_f64;
    let n = n as f64;
    let p = k as f64 / n;
    let d = 1.0 + z * z / n;
    let centre = (p + z * z / (2.0 * n)) / d;
    let half = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / d;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_interval_of_known_rates() {
        let (lo, hi) = wilson(0, 10);
        assert_eq!(lo, 0.0);
        assert!((hi - 0.2775).abs() < 1e-4, "{hi}");
        let (lo, hi) = wilson(4, 8);
        assert!(
            (lo - 0.2152).abs() < 1e-4 && (hi - 0.7848).abs() < 1e-4,
            "{lo} {hi}"
        );
        assert_eq!(wilson(3, 0), (0.0, 1.0));
        let (lo, hi) = wilson(10, 10);
        assert!((lo - 0.7225).abs() < 1e-4, "{lo}");
        assert!((hi - 1.0).abs() < 1e-12, "{hi}");
    }
}
