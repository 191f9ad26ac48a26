//! Stable or say so: a setting whose perturbed reruns (seeds, ±1 % arrival rate) differ
//! by more than 2x at p99 is unstable, and the verdict shows what moved with the tail
//! (preemptions, KV occupancy, the waiting queue). Near saturation vLLM's
//! skip-and-continue over-admits and the KV cache thrashes: one run of such a setting
//! is a lottery ticket, not a measurement.

use std::fmt::Write as _;

use serde::Serialize;

use super::counters::Counters;
use super::engine::Perturbation;
use super::health::{Health, wilson};
use super::mode::Mode;
use super::report::ModeSummary;

/// Largest p99 ratio across reruns that still counts as stable.
pub const MAX_SPREAD: f64 = 2.0;

/// `(min, max)` of some values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Range {
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Range {
    /// Of `values` (both 0 when empty).
    #[must_use]
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut r: Option<Self> = None;
        for v in values {
            r = Some(match r {
                None => Self { min: v, max: v },
                Some(r) => Self {
                    min: r.min.min(v),
                    max: r.max.max(v),
                },
            });
        }
        r.unwrap_or_default()
    }
}

/// One mode's verdict over its reruns.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// The mode.
    pub mode: Mode,
    /// Runs compared.
    pub runs: usize,
    /// TTFT p50 over the runs (ms).
    pub p50_ms: Range,
    /// TTFT p99 over the runs (ms).
    pub p99_ms: Range,
    /// Largest over smallest p99.
    pub spread: f64,
    /// `spread <= MAX_SPREAD` (true with a single run: nothing to compare) and no run
    /// collapsed: a setting that collapses is never stable, however reproducibly.
    pub stable: bool,
    /// Preemptions over the runs.
    pub preemptions: Range,
    /// Mean KV occupancy over the runs (fraction).
    pub kv_mean: Range,
    /// Peak KV occupancy over the runs (fraction).
    pub kv_peak: Range,
    /// Longest waiting queue over the runs.
    pub waiting_peak: Range,
    /// Runs the overload detector found collapsed ([`crate::health`]).
    pub collapsed_runs: usize,
    /// `collapsed_runs / runs`.
    pub collapse_rate: f64,
    /// The collapse rate's 95 % Wilson interval.
    pub collapse_interval: (f64, f64),
    /// Every run: its perturbation, TTFT p50 and p99 (ms), preemptions and health.
    pub reruns: Vec<Rerun>,
}

/// One rerun of a verdict, as kept in the JSON.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rerun {
    /// What it varied.
    pub perturbation: Perturbation,
    /// TTFT p50 (ms).
    pub p50_ms: f64,
    /// TTFT p99 (ms).
    pub p99_ms: f64,
    /// Preemptions.
    pub preemptions: u64,
    /// The overload detector's verdict.
    pub health: Health,
    /// What names a mechanism ([`crate::mechanism`]).
    pub counters: Counters,
}

impl Verdict {
    /// The verdict of one mode's reruns (the same settings, perturbed).
    ///
    /// # Panics
    /// Never: an empty slice gives a stable verdict of 0 runs.
    #[must_use]
    pub fn of(mode: Mode, runs: &[ModeSummary]) -> Self {
        let p99 = Range::of(runs.iter().map(|s| s.ttft_ms.p99));
        let spread = if p99.min > 0.0 {
            p99.max / p99.min
        } else {
            1.0
        };
        let collapsed_runs = runs.iter().filter(|s| s.health.collapsed).count();
        Self {
            collapsed_runs,
            collapse_rate: collapsed_runs as f64 / runs.len().max(1) as f64,
            collapse_interval: wilson(collapsed_runs, runs.len()),
            reruns: runs
                .iter()
                .map(|s| Rerun {
                    perturbation: s.perturbation,
                    p50_ms: s.ttft_ms.p50,
                    p99_ms: s.ttft_ms.p99,
                    preemptions: s.preemptions,
                    health: s.health.clone(),
                    counters: Counters::of(s),
                })
                .collect(),
            mode,
            runs: runs.len(),
            p50_ms: Range::of(runs.iter().map(|s| s.ttft_ms.p50)),
            p99_ms: p99,
            spread,
            stable: spread <= MAX_SPREAD && collapsed_runs == 0,
            preemptions: Range::of(runs.iter().map(|s| s.preemptions as f64)),
            kv_mean: Range::of(runs.iter().map(|s| s.kv_occupancy_mean)),
            kv_peak: Range::of(runs.iter().map(|s| s.kv_occupancy_peak)),
            waiting_peak: Range::of(runs.iter().map(|s| s.waiting_peak as f64)),
        }
    }

    /// What moved with the tail, in words.
    #[must_use]
    pub fn cause(&self) -> String {
        let mut out = format!(
            "preemptions {:.0}-{:.0}, KV occupancy mean {:.0}-{:.0} % (peak {:.0} %), waiting queue peak {:.0}-{:.0}",
            self.preemptions.min,
            self.preemptions.max,
            self.kv_mean.min * 100.0,
            self.kv_mean.max * 100.0,
            self.kv_peak.max * 100.0,
            self.waiting_peak.min,
            self.waiting_peak.max
        );
        if let Some(r) = self.reruns.iter().find(|r| r.health.collapsed) {
            let _ = write!(
                out,
                "; collapsed in {} of {} runs (rate {:.0} %, 95 % interval {:.0}-{:.0} %), e.g. {}",
                self.collapsed_runs,
                self.runs,
                100.0 * self.collapse_rate,
                100.0 * self.collapse_interval.0,
                100.0 * self.collapse_interval.1,
                r.health.signs.join(", ")
            );
        }
        if self.preemptions.max > 2.0 * self.preemptions.min + 10.0 {
            out.push_str(
                ": the long-tailed reruns preempt far more (over-admission thrashes the KV cache)",
            );
        } else if self.waiting_peak.max > 2.0 * self.waiting_peak.min + 10.0 {
            out.push_str(": a backlog builds in the long-tailed reruns");
        }
        out
    }
}

/// The verdicts of every mode as printed: one line each, and a first line saying
/// whether the whole setting is stable.
#[must_use]
pub fn describe(verdicts: &[Verdict]) -> String {
    let mut out = String::new();
    let runs = verdicts.iter().map(|v| v.runs).max().unwrap_or(0);
    if runs < 2 {
        out.push_str("stability: not checked (--repeats 1)\n");
        return out;
    }
    let unstable: Vec<&Verdict> = verdicts.iter().filter(|v| !v.stable).collect();
    if unstable.is_empty() {
        let worst = verdicts
            .iter()
            .max_by(|a, b| a.spread.total_cmp(&b.spread))
            .map_or(1.0, |v| v.spread);
        let _ = writeln!(
            out,
            "stability: stable, every mode's TTFT p99 within {worst:.2}x over {runs} perturbed reruns (seed, arrival rate +-1 %, order within bursts, routing offset), none collapsed"
        );
    } else {
        let names: Vec<&str> = unstable.iter().map(|v| v.mode.name()).collect();
        let _ = writeln!(
            out,
            "stability: UNSTABLE ({}): TTFT p99 moves more than {MAX_SPREAD}x, or a run collapses (overload detector), over {runs} perturbed reruns (seed, arrival rate +-1 %, order within bursts, routing offset); one run of this setting is not a measurement",
            names.join(", ")
        );
    }
    for v in verdicts {
        let _ = writeln!(
            out,
            "  {:<14} p99 {:.1}-{:.1} ms ({:.2}x), collapsed {}/{} (95 % {:.0}-{:.0} %) {}{}",
            v.mode.name(),
            v.p99_ms.min,
            v.p99_ms.max,
            v.spread,
            v.collapsed_runs,
            v.runs,
            100.0 * v.collapse_interval.0,
            100.0 * v.collapse_interval.1,
            if v.stable { "stable" } else { "UNSTABLE" },
            if v.stable {
                String::new()
            } else {
                format!(": {}", v.cause())
            }
        );
    }
    out
}
