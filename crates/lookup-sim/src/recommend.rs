//! The recommendation at the end of a run: the lookup settings (mode, preemption
//! policy, prefetch limit, TTL, wait budget, server concurrency) that serve the trace
//! best at the stable p99, with the margin over sync.
//!
//! "Stable p99" is the largest TTFT p99 of a setting's perturbed reruns, and only
//! settings whose reruns stay within 2x of each other qualify
//! ([`stability`](super::stability)) and none collapses: a setting that wins one run
//! and collapses on the next is not a recommendation. The search is coordinate-wise,
//! per mode, from the run's own settings: `lookup_on_preemption` {discard,
//! keep_wait}, then server concurrency {1, 4}, then prefetch limit {8, 32, 128}, then TTL
//! {1, 2, 5} s, then (`prefetch+wait`) the wait budget {auto, 2 ms, 5 ms}; each stage
//! keeps the best value found so far. A candidate whose first run is already above
//! the best stable p99 found is not rerun: its reruns can only raise its stable p99.

use std::fmt::Write as _;

use serde::Serialize;

use super::budget::WaitBudget;
use lookup_core::OnPreemption;

use super::engine::SimParams;
use super::mode::Mode;
use super::report::{ModeSummary, summarise};
use super::runner::{Job, perturbed, run_jobs};
use super::stability::Verdict;
use super::trace::TraceSource;

/// The lookup settings an operator chooses.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Setting {
    /// The lookup mode.
    pub mode: Mode,
    /// Lookup server concurrency (and the client's `max_in_flight`).
    pub concurrency: u32,
    /// `lookup_prefetch_limit` (prefetch modes).
    pub prefetch_limit: u32,
    /// `lookup_prefetch_ttl_s` (seconds).
    pub ttl_s: f64,
    /// `prefetch+wait`'s wait budget.
    pub wait_budget: WaitBudget,
    /// `lookup_on_preemption` (`spec/behaviour.md` rule 8).
    #[serde(serialize_with = "crate::mode::policy_key")]
    pub on_preemption: OnPreemption,
}

impl Setting {
    /// The setting of `mode` in `params`.
    #[must_use]
    pub fn of(mode: Mode, params: &SimParams) -> Self {
        Self {
            mode,
            concurrency: params.server.concurrency,
            prefetch_limit: params.lookup.prefetch_limit,
            ttl_s: params.lookup.prefetch_ttl_s,
            wait_budget: params.lookup.wait_budget,
            on_preemption: params.lookup.on_preemption,
        }
    }

    /// `base` with this setting.
    #[must_use]
    pub fn apply(&self, base: &SimParams) -> SimParams {
        let mut p = base.clone();
        p.server.concurrency = self.concurrency;
        p.lookup.prefetch_limit = self.prefetch_limit;
        p.lookup.prefetch_ttl_s = self.ttl_s;
        p.lookup.wait_budget = self.wait_budget;
        p.lookup.on_preemption = self.on_preemption;
        p
    }

    fn prefetches(&self) -> bool {
        matches!(
            self.mode,
            Mode::Prefetch | Mode::PrefetchPlus | Mode::PrefetchWait
        )
    }

    /// In words, with only what matters to its mode.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut out = format!("{}, server concurrency {}", self.mode, self.concurrency);
        if self.prefetches() {
            let _ = write!(
                out,
                ", prefetch limit {}, TTL {} s",
                self.prefetch_limit, self.ttl_s
            );
        }
        if self.mode == Mode::PrefetchWait {
            let _ = write!(out, ", wait budget {}", self.wait_budget);
        }
        let _ = write!(out, ", on preemption {}", self.on_preemption);
        out
    }
}

/// A setting and how its reruns went.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scored {
    /// The setting.
    pub setting: Setting,
    /// Its reruns' verdict (over its first run only when `screened_out`).
    pub verdict: Verdict,
    /// Its first run's p99 was already above the p99 it had to beat, so it was not
    /// rerun: its stable p99 can only be higher (the largest of its reruns).
    pub screened_out: bool,
}

impl Scored {
    /// The p99 it can be counted on: the largest of its reruns (ms).
    #[must_use]
    pub fn stable_p99_ms(&self) -> f64 {
        self.verdict.p99_ms.max
    }

    /// Rerun and stable.
    #[must_use]
    pub fn eligible(&self) -> bool {
        self.verdict.stable && !self.screened_out
    }

    fn better_than(&self, other: &Self) -> bool {
        match (self.eligible(), other.eligible()) {
            (true, false) => true,
            (false, true) => false,
            _ => {
                (self.stable_p99_ms(), self.verdict.p50_ms.max)
                    < (other.stable_p99_ms(), other.verdict.p50_ms.max)
            }
        }
    }
}

/// The outcome of the search.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recommendation {
    /// The best stable setting, if any was stable.
    pub best: Option<Scored>,
    /// The best stable sync setting (the baseline), if sync was searched.
    pub sync: Option<Scored>,
    /// Every setting tried, in the order tried.
    pub tried: Vec<Scored>,
    /// Simulations run.
    pub runs: usize,
}

fn summaries(
    source: &TraceSource,
    limit: Option<usize>,
    base: &SimParams,
    runs: &[(Setting, u32)],
) -> anyhow::Result<Vec<ModeSummary>> {
    let jobs: Vec<Job> = runs
        .iter()
        .map(|(s, i)| Job {
            params: perturbed(&s.apply(base), *i),
            mode: s.mode,
        })
        .collect();
    let results = run_jobs(source, limit, &jobs, &|_, _| {})?;
    Ok(results
        .iter()
        .map(|r| summarise(r, base.engine.gpu_kv_blocks))
        .collect())
}

/// Runs each setting once, then reruns (`repeats` − 1 perturbed runs) those whose
/// first p99 is not above `bar(setting)` ms: the others cannot win. Every batch runs
/// on every core. Returns the settings scored, and the simulations run.
fn evaluate(
    source: &TraceSource,
    limit: Option<usize>,
    base: &SimParams,
    repeats: u32,
    settings: &[Setting],
    bar: &dyn Fn(&Setting) -> f64,
) -> anyhow::Result<(Vec<Scored>, usize)> {
    let first: Vec<(Setting, u32)> = settings.iter().map(|s| (*s, 0)).collect();
    let firsts = summaries(source, limit, base, &first)?;
    let rerun: Vec<usize> = (0..settings.len())
        .filter(|&i| repeats > 1 && firsts[i].ttft_ms.p99 <= bar(&settings[i]))
        .collect();
    let more: Vec<(Setting, u32)> = rerun
        .iter()
        .flat_map(|&i| (1..repeats).map(move |r| (settings[i], r)))
        .collect();
    let reruns = summaries(source, limit, base, &more)?;
    let mut scored = Vec::with_capacity(settings.len());
    for (i, s) in settings.iter().enumerate() {
        let mut runs = vec![firsts[i].clone()];
        if let Some(k) = rerun.iter().position(|&j| j == i) {
            let per = repeats as usize - 1;
            runs.extend_from_slice(&reruns[k * per..(k + 1) * per]);
        }
        scored.push(Scored {
            setting: *s,
            verdict: Verdict::of(s.mode, &runs),
            screened_out: repeats > 1 && runs.len() == 1,
        });
    }
    Ok((scored, first.len() + more.len()))
}

/// Searches the settings of `modes` from `base` (see the module docs), `repeats`
/// perturbed runs each. `known` are settings already run (the run's own), with their
/// reruns, so they are not run again.
///
/// # Errors
/// A failing simulation.
pub fn search(
    source: &TraceSource,
    limit: Option<usize>,
    base: &SimParams,
    modes: &[Mode],
    repeats: u32,
    known: Vec<Scored>,
) -> anyhow::Result<Recommendation> {
    let repeats = repeats.max(1);
    let mut tried = known;
    let mut runs = 0;
    let mut best: Vec<Setting> = modes.iter().map(|&m| Setting::of(m, base)).collect();
    type Stage = (fn(&Setting) -> bool, fn(&Setting) -> Vec<Setting>);
    let stages: [Stage; 5] = [
        // Rule 8's policy first: it decides whether the asynchronous modes collapse.
        (
            |_| true,
            |s| {
                [OnPreemption::Discard, OnPreemption::KeepWait]
                    .map(|on_preemption| Setting {
                        on_preemption,
                        ..*s
                    })
                    .to_vec()
            },
        ),
        (
            |s| s.mode != Mode::Sync,
            |s| {
                [1, 4]
                    .map(|c| Setting {
                        concurrency: c,
                        ..*s
                    })
                    .to_vec()
            },
        ),
        (Setting::prefetches, |s| {
            [8, 32, 128]
                .map(|l| Setting {
                    prefetch_limit: l,
                    ..*s
                })
                .to_vec()
        }),
        (Setting::prefetches, |s| {
            [1.0, 2.0, 5.0].map(|t| Setting { ttl_s: t, ..*s }).to_vec()
        }),
        (
            |s| s.mode == Mode::PrefetchWait,
            |s| {
                let auto = match s.wait_budget {
                    w @ WaitBudget::Adaptive { .. } => w,
                    WaitBudget::Fixed { .. } => WaitBudget::default(),
                };
                [
                    auto,
                    WaitBudget::Fixed { s: 0.002 },
                    WaitBudget::Fixed { s: 0.005 },
                ]
                .map(|w| Setting {
                    wait_budget: w,
                    ..*s
                })
                .to_vec()
            },
        ),
    ];
    let find = |tried: &[Scored], s: &Setting| tried.iter().position(|t| t.setting == *s);
    for (applies, candidates) in stages {
        let mut fresh: Vec<Setting> = Vec::new();
        for s in best.iter().filter(|s| applies(s)) {
            for c in candidates(s) {
                if find(&tried, &c).is_none() && !fresh.contains(&c) {
                    fresh.push(c);
                }
            }
        }
        // A candidate is rerun only if its first run could still win: its stable p99 is
        // at least its first run's, so above the best eligible one so far it cannot.
        let best_so_far = tried
            .iter()
            .filter(|t| t.eligible())
            .map(Scored::stable_p99_ms)
            .fold(f64::INFINITY, f64::min);
        let bar = |_: &Setting| best_so_far;
        let (scored, n) = evaluate(source, limit, base, repeats, &fresh, &bar)?;
        runs += n;
        tried.extend(scored);
        for s in best.iter_mut().filter(|s| applies(s)) {
            let mut options = candidates(s);
            options.push(*s);
            let mut winner: Option<&Scored> = None;
            for o in &options {
                if let Some(i) = find(&tried, o) {
                    if winner.is_none_or(|w| tried[i].better_than(w)) {
                        winner = Some(&tried[i]);
                    }
                }
            }
            if let Some(w) = winner {
                *s = w.setting;
            }
        }
    }
    let pick = |pred: &dyn Fn(&Scored) -> bool| -> Option<Scored> {
        tried
            .iter()
            .filter(|t| t.eligible() && pred(t))
            .fold(None::<&Scored>, |acc, t| match acc {
                Some(a) if !t.better_than(a) => Some(a),
                _ => Some(t),
            })
            .cloned()
    };
    Ok(Recommendation {
        best: pick(&|_| true),
        sync: pick(&|t| t.setting.mode == Mode::Sync),
        tried,
        runs,
    })
}

/// The recommendation as printed.
#[must_use]
pub fn describe(r: &Recommendation, repeats: u32) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "recommendation: the lowest TTFT p99 that holds over {repeats} perturbed reruns ({} settings tried, {} more runs)",
        r.tried.len(),
        r.runs
    );
    let Some(best) = &r.best else {
        out.push_str("  none: every setting tried was unstable (see the stability lines above)\n");
        return out;
    };
    let v = &best.verdict;
    let _ = writeln!(out, "  {}", best.setting.describe());
    let _ = write!(
        out,
        "  TTFT p99 {:.1} ms ({:.1}-{:.1} over reruns), p50 {:.1} ms",
        best.stable_p99_ms(),
        v.p99_ms.min,
        v.p99_ms.max,
        v.p50_ms.max
    );
    match &r.sync {
        Some(sync) if sync.setting == best.setting => out.push_str("; sync itself is best\n"),
        Some(sync) => {
            let (b, s) = (best.stable_p99_ms(), sync.stable_p99_ms());
            let _ = writeln!(
                out,
                "; margin over sync ({}): p99 {:.1} ms lower ({:.1} %; sync {:.1} ms)",
                sync.setting.describe(),
                s - b,
                (s - b) / s * 100.0,
                s
            );
        }
        None => out.push_str("; no stable sync setting to compare with\n"),
    }
    out
}
