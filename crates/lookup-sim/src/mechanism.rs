//! Why a setting lost, named from its own runs' counters ([`Counters`], one per
//! rerun), against the winner's: the [`Mechanism`].
//!
//! A setting that collapsed in any rerun (the overload detector, [`crate::health`]) is
//! read at its worst collapsed run, in this order:
//!
//! 1. **preemption cascade**: more than
//!    [`MAX_PREEMPTIONS_PER_REQUEST`] preemptions per request, or one request
//!    preempted [`CASCADE_PREEMPTIONS`] times or more;
//! 2. **lookup backlog**: the lookups queued or on the wire grow by more than
//!    [`MAX_IN_FLIGHT_SLOPE_PER_MIN`] per minute per engine while requests arrive, or
//!    a lookup's p99 wait for a free server slot exceeds [`BACKLOG_SERVER_QUEUE_MS`],
//!    while the GPUs were busy less than [`BACKLOG_GPU_BUSY`] of the time (with the
//!    GPUs saturated, lookups pile up behind a queue that grows for want of compute);
//! 3. **KV-bound**: engines had requests waiting with their KV cache at least
//!    [`KV_BOUND_SHARE`](crate::engine::KV_BOUND_SHARE) held in at least
//!    [`KV_BOUND_MIN_SHARE`] of the samples;
//! 4. otherwise **overload**, with the detector's signs.
//!
//! A setting that did not collapse but whose p99 moves more than 2x over its reruns is
//! **unstable**. A stable one whose paired p99 ratio to the winner's
//! ([`crate::margin`]) is inside the noise or below 1 is **not behind** it at the
//! paired median (it lost on its worst rerun, the criterion, only). Otherwise it
//! is **slower** by the paired median ratio, attributed to the TTFT component (queue, lookup wait, load,
//! prefill; means over the reruns) that grew most against the winner: when that is
//! the lookup wait, the **lookup latency is on the critical path** (sync's blocking
//! probes, deferrals, waits).

use std::fmt::Write as _;

use serde::Serialize;

use super::health::MAX_PREEMPTIONS_PER_REQUEST;
use super::margin::{Paired, paired};
use super::stability::Verdict;

pub use super::counters::Counters;

/// Preemptions of a single request from which a collapse is a preemption cascade.
pub const CASCADE_PREEMPTIONS: u32 = super::health::MAX_PREEMPTIONS_OF_ONE_REQUEST;
/// Growth of the lookups in flight (per minute per engine) from which a collapse is a
/// lookup backlog.
pub const MAX_IN_FLIGHT_SLOPE_PER_MIN: f64 = 0.5;
/// p99 wait for a free server slot (ms) from which a collapse is a lookup backlog.
pub const BACKLOG_SERVER_QUEUE_MS: f64 = 1_000.0;
/// GPU utilisation below which growing lookups are the bottleneck, not a symptom.
pub const BACKLOG_GPU_BUSY: f64 = 0.9;
/// Share of KV-bound engine samples from which a collapse is KV-bound.
pub const KV_BOUND_MIN_SHARE: f64 = 0.5;

/// Why a setting lost.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Mechanism {
    /// Collapsed: requests preempted again and again.
    PreemptionCascade {
        /// Runs collapsed, of `runs`.
        collapsed: usize,
        /// Runs.
        runs: usize,
        /// Of the worst collapsed run.
        counters: Counters,
    },
    /// Collapsed: the lookups pile up ahead of the server.
    LookupBacklog {
        /// Runs collapsed, of `runs`.
        collapsed: usize,
        /// Runs.
        runs: usize,
        /// Of the worst collapsed run.
        counters: Counters,
    },
    /// Collapsed: the waiting queue grows with the KV cache full.
    KvBound {
        /// Runs collapsed, of `runs`.
        collapsed: usize,
        /// Runs.
        runs: usize,
        /// Of the worst collapsed run.
        counters: Counters,
    },
    /// Collapsed otherwise (the detector's signs).
    Overload {
        /// Runs collapsed, of `runs`.
        collapsed: usize,
        /// Runs.
        runs: usize,
        /// GPU utilisation of the worst collapsed run.
        gpu_utilisation: f64,
        /// The detector's signs in the worst collapsed run.
        signs: Vec<String>,
    },
    /// No collapse, but the p99 moves more than 2x over the reruns.
    Unstable {
        /// Largest over smallest p99.
        spread: f64,
    },
    /// Stable, and not behind the winner at the paired median (inside the noise, or
    /// lower): it lost on the criterion (its worst rerun) only.
    InsideNoise {
        /// Its p99 over the winner's, rerun by rerun.
        ratio: Paired,
    },
    /// Stable and slower, most in the lookup wait.
    LookupOnCriticalPath {
        /// Its p99 over the winner's, rerun by rerun (`None`: not paired).
        ratio: Option<Paired>,
        /// Its mean lookup wait (ms).
        lookup_wait_ms: f64,
        /// The winner's (ms).
        winner_lookup_wait_ms: f64,
        /// Its engine-thread time blocked on lookups (s, mean over reruns).
        engine_blocked_s: f64,
    },
    /// Stable and slower, without overload.
    Slower {
        /// Its p99 over the winner's, rerun by rerun (`None`: not paired).
        ratio: Option<Paired>,
        /// The TTFT component that grew most (`queue`, `load`, `prefill`), or `none`.
        component: &'static str,
        /// By how much, mean (ms).
        extra_ms: f64,
    },
}

/// A TTFT component: its name and how to read it.
type Part = (&'static str, fn(&Counters) -> f64);

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (n, s) = v.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    if n == 0 { 0.0 } else { s / n as f64 }
}

/// The mechanism behind `loser`'s loss to `winner` (see the module docs).
#[must_use]
pub fn diagnose(loser: &Verdict, winner: &Verdict) -> Mechanism {
    let (collapsed, runs) = (loser.collapsed_runs, loser.runs);
    let worst = loser
        .reruns
        .iter()
        .filter(|r| r.health.collapsed)
        .max_by(|a, b| a.p99_ms.total_cmp(&b.p99_ms));
    if let Some(w) = worst {
        let c = w.counters.clone();
        return if c.preemptions_per_request > MAX_PREEMPTIONS_PER_REQUEST
            || c.preemptions_max >= CASCADE_PREEMPTIONS
        {
            Mechanism::PreemptionCascade {
                collapsed,
                runs,
                counters: c,
            }
        } else if (c.in_flight_slope_per_min > MAX_IN_FLIGHT_SLOPE_PER_MIN
            || c.server_queue_p99_ms > BACKLOG_SERVER_QUEUE_MS)
            && c.gpu_utilisation < BACKLOG_GPU_BUSY
        {
            Mechanism::LookupBacklog {
                collapsed,
                runs,
                counters: c,
            }
        } else if c.kv_bound_share >= KV_BOUND_MIN_SHARE {
            Mechanism::KvBound {
                collapsed,
                runs,
                counters: c,
            }
        } else {
            Mechanism::Overload {
                collapsed,
                runs,
                gpu_utilisation: c.gpu_utilisation,
                signs: w.health.signs.clone(),
            }
        };
    }
    if !loser.stable {
        return Mechanism::Unstable {
            spread: loser.spread,
        };
    }
    let ratio = paired(winner, loser);
    if let Some(r) = ratio.as_ref().filter(|r| r.within_noise || r.median < 1.0) {
        return Mechanism::InsideNoise { ratio: r.clone() };
    }
    let avg = |v: &Verdict, f: fn(&Counters) -> f64| mean(v.reruns.iter().map(|r| f(&r.counters)));
    let parts: [Part; 4] = [
        ("queue", |c| c.queue_ms),
        ("lookup wait", |c| c.lookup_wait_ms),
        ("load", |c| c.load_ms),
        ("prefill", |c| c.prefill_ms),
    ];
    let (component, extra_ms) = parts
        .iter()
        .map(|&(name, f)| (name, avg(loser, f) - avg(winner, f)))
        .filter(|&(_, d)| d > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or(("none", 0.0));
    if component == "lookup wait" {
        return Mechanism::LookupOnCriticalPath {
            ratio,
            lookup_wait_ms: avg(loser, |c| c.lookup_wait_ms),
            winner_lookup_wait_ms: avg(winner, |c| c.lookup_wait_ms),
            engine_blocked_s: avg(loser, |c| c.engine_blocked_s),
        };
    }
    Mechanism::Slower {
        ratio,
        component,
        extra_ms,
    }
}

fn slower(ratio: Option<&Paired>) -> String {
    match ratio {
        None => "slower at the worst rerun (not paired)".to_owned(),
        Some(r) => {
            let mut out = if r.median >= 1.0 {
                format!(
                    "slower by {:.1} % (p99 over the winner's {})",
                    r.slower_pct(),
                    r.describe()
                )
            } else {
                format!(
                    "faster by {:.1} % at the paired median but higher at its worst rerun \
                     (p99 over the winner's {})",
                    -r.slower_pct(),
                    r.describe()
                )
            };
            if r.within_noise {
                out.push_str(", inside the noise");
            }
            out
        }
    }
}

impl Mechanism {
    /// In words.
    #[must_use]
    pub fn describe(&self) -> String {
        let runs = |k: usize, n: usize| format!("collapsed in {k} of {n} runs");
        match self {
            Self::PreemptionCascade {
                collapsed,
                runs: n,
                counters: c,
            } => format!(
                "{} by a preemption cascade: {:.2} preemptions per request, one request preempted {} times (waiting queue peak {})",
                runs(*collapsed, *n),
                c.preemptions_per_request,
                c.preemptions_max,
                c.waiting_peak
            ),
            Self::LookupBacklog {
                collapsed,
                runs: n,
                counters: c,
            } => format!(
                "{} by a lookup backlog: lookups queued or on the wire grow {:.1}/min per engine (peak {} on one engine), server queue p99 {:.0} ms, GPUs busy {:.0} %",
                runs(*collapsed, *n),
                c.in_flight_slope_per_min,
                c.in_flight_peak,
                c.server_queue_p99_ms,
                100.0 * c.gpu_utilisation
            ),
            Self::KvBound {
                collapsed,
                runs: n,
                counters: c,
            } => format!(
                "{} KV-bound: the waiting queue grows {:.1}/min per engine with the KV cache full and requests waiting in {:.0} % of the samples",
                runs(*collapsed, *n),
                c.waiting_slope_per_min,
                100.0 * c.kv_bound_share
            ),
            Self::Overload {
                collapsed,
                runs: n,
                gpu_utilisation,
                signs,
            } => format!(
                "{} by overload (GPUs busy {:.0} %): {}",
                runs(*collapsed, *n),
                100.0 * gpu_utilisation,
                signs.join(", ")
            ),
            Self::InsideNoise { ratio } => format!(
                "not behind the winner at the paired median: p99 over the winner's {}, {}; no overload (it lost on its worst rerun only)",
                ratio.describe(),
                if ratio.within_noise {
                    "inside the noise"
                } else {
                    "lower than the winner's"
                }
            ),
            Self::Unstable { spread } => {
                format!("unstable without a collapse: its p99 moves {spread:.2}x over the reruns")
            }
            Self::LookupOnCriticalPath {
                ratio,
                lookup_wait_ms,
                winner_lookup_wait_ms,
                engine_blocked_s,
            } => {
                let mut out = format!(
                    "lookup latency on the critical path: {}; lookup wait mean {lookup_wait_ms:.1} ms against {winner_lookup_wait_ms:.1} ms",
                    slower(ratio.as_ref())
                );
                if *engine_blocked_s > 0.0 {
                    let _ = write!(out, ", engine thread blocked {engine_blocked_s:.1} s");
                }
                out.push_str("; no overload");
                out
            }
            Self::Slower {
                ratio,
                component,
                extra_ms,
            } => {
                let mut out = format!("{} without overload", slower(ratio.as_ref()));
                if *component == "none" {
                    out.push_str("; no TTFT component larger on average (the tail only)");
                } else {
                    let _ = write!(out, "; most in the {component} (+{extra_ms:.1} ms mean)");
                }
                out
            }
        }
    }
}
