//! The recommendation at the end of a run: the settings (mode, preemption and pending
//! policies, prefetch limit, TTL, wait budget, server concurrency, `max_num_seqs`, KV
//! capacity) that serve the trace best at the stable p99, its margin over the
//! runner-up and over sync with its uncertainty ([`margin`](crate::margin)), and why
//! each other mode lost ([`mechanism`](crate::mechanism)).
//!
//! "Stable p99" is the largest TTFT p99 of a setting's perturbed reruns, and only
//! settings whose reruns stay within 2x of each other qualify
//! ([`stability`](crate::stability)) and none collapses: a setting that wins one run
//! and collapses on the next is not a recommendation.
//!
//! The search is coordinate descent from the run's own settings, one lever at a
//! time, each stage keeping the best value found so far. Per mode:
//! `lookup_on_preemption` {discard, keep_wait}; `--on-pending` {skip, wait} (not sync,
//! whose probes never answer `Pending`); server concurrency {1, 4} (not sync); prefetch
//! limit {8, 32, 128} and TTL {1, 2, 5} s (prefetch modes); the wait budget {auto,
//! 2 ms, 5 ms} (`prefetch+wait`). Then, around the best cells only (the leading mode
//! and sync, so the margin between them compares like with like), the engine's levers:
//! `max_num_seqs` {half, as given, double} and the GPU KV capacity {0.5x, 1x, 2x} of
//! the run's (2x is what an FP8 KV cache gives; a capacity that cannot hold the
//! trace's largest request is skipped).
//!
//! Screening: a candidate runs rerun 0, then the rerun at which the best setting so
//! far had its largest p99 (the perturbation most likely to be the candidate's worst,
//! as reruns are paired), then the others; once a run is above the best stable p99
//! found, it is not rerun further: its reruns can only raise its stable p99.

mod text;

use std::fmt::Write as _;

use serde::Serialize;

use crate::budget::WaitBudget;
use lookup_core::OnPreemption;

pub use self::text::describe;
use crate::engine::{PendingPolicy, SimParams, kv_blocks_needed};
use crate::margin::{Paired, paired};
use crate::mechanism::{Mechanism, diagnose};
use crate::mode::Mode;
use crate::report::{ModeSummary, summarise};
use crate::runner::{Job, perturbed, run_jobs};
use crate::stability::Verdict;
use crate::trace::TraceSource;

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
    /// What a `Pending` probe does to the waiting loop (`--on-pending`).
    pub on_pending: PendingPolicy,
    /// The engines' `max_num_seqs`.
    pub max_num_seqs: u32,
    /// The engines' GPU KV capacity (16-token blocks per engine).
    pub gpu_kv_blocks: u64,
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
            on_pending: params.engine.on_pending,
            max_num_seqs: params.engine.max_num_seqs,
            gpu_kv_blocks: params.engine.gpu_kv_blocks,
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
        p.engine.on_pending = self.on_pending;
        p.engine.max_num_seqs = self.max_num_seqs;
        p.engine.gpu_kv_blocks = self.gpu_kv_blocks;
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
        if self.mode != Mode::Sync {
            let pending = match self.on_pending {
                PendingPolicy::Skip => "skip",
                PendingPolicy::Wait => "wait",
            };
            let _ = write!(out, ", on pending {pending}");
        }
        let _ = write!(
            out,
            ", max_num_seqs {}, {} GPU KV blocks",
            self.max_num_seqs, self.gpu_kv_blocks
        );
        out
    }
}

/// A setting and how its reruns went.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scored {
    /// The setting.
    pub setting: Setting,
    /// Its reruns' verdict (over its screening runs only when `screened_out`).
    pub verdict: Verdict,
    /// A screening run's p99 was already above the p99 it had to beat, so it was not
    /// rerun further: its stable p99 can only be higher (the largest of its reruns).
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

/// One margin of the winner: against whom, and the paired p99 ratios.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Margin {
    /// `runner-up` (the best setting of another mode) or `sync` (the best sync one).
    pub against: &'static str,
    /// That setting.
    pub setting: Setting,
    /// Its p99 over the winner's, rerun by rerun (`None`: not paired).
    pub ratio: Option<Paired>,
}

/// Why a mode lost: its best setting tried and the mechanism.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Loss {
    /// The mode's best setting tried.
    pub setting: Setting,
    /// What it is compared with: the winner, or the winner's mode at this setting's
    /// `max_num_seqs` and KV capacity when those were not searched for this mode.
    pub against: Setting,
    /// The mechanism, from its runs' counters.
    pub mechanism: Mechanism,
    /// The mechanism in words.
    pub text: String,
}

/// The outcome of the search.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recommendation {
    /// The best stable setting, if any was stable.
    pub best: Option<Scored>,
    /// The best stable setting of another mode than `best`'s.
    pub runner_up: Option<Scored>,
    /// The best stable sync setting (the baseline), if sync was searched.
    pub sync: Option<Scored>,
    /// The winner against the runner-up and against sync (when it is not the
    /// runner-up nor the winner).
    pub margins: Vec<Margin>,
    /// Each other mode searched, at its best setting, and why it lost.
    pub losses: Vec<Loss>,
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
        .zip(runs)
        .map(|(r, (s, _))| summarise(r, s.gpu_kv_blocks))
        .collect())
}

/// Runs each setting's rerun 0, then rerun `probe` of those whose p99 is not above
/// `bar` ms, then the other reruns of those still not above it: the others cannot win
/// (a collapsing candidate, slow to simulate, costs one run). Every batch runs on
/// every core. Returns the settings scored, and the simulations run.
#[allow(clippy::too_many_arguments)]
fn evaluate(
    source: &TraceSource,
    limit: Option<usize>,
    base: &SimParams,
    repeats: u32,
    settings: &[Setting],
    bar: f64,
    probe: u32,
) -> anyhow::Result<(Vec<Scored>, usize)> {
    let probe = if (1..repeats).contains(&probe) {
        probe
    } else {
        1
    };
    let rest: Vec<u32> = (1..repeats).filter(|&i| i != probe).collect();
    let rounds: [Vec<u32>; 3] = if repeats > 1 {
        [vec![0], vec![probe], rest]
    } else {
        [vec![0], Vec::new(), Vec::new()]
    };
    let mut runs: Vec<Vec<(u32, ModeSummary)>> = vec![Vec::new(); settings.len()];
    let mut n = 0;
    for round in &rounds {
        let alive: Vec<usize> = (0..settings.len())
            .filter(|&k| runs[k].iter().all(|(_, s)| s.ttft_ms.p99 <= bar))
            .collect();
        let batch: Vec<(Setting, u32)> = alive
            .iter()
            .flat_map(|&k| round.iter().map(move |&i| (settings[k], i)))
            .collect();
        if batch.is_empty() {
            continue;
        }
        let done = summaries(source, limit, base, &batch)?;
        n += batch.len();
        for (j, &k) in alive.iter().enumerate() {
            for (m, &i) in round.iter().enumerate() {
                runs[k].push((i, done[j * round.len() + m].clone()));
            }
        }
    }
    let scored = settings
        .iter()
        .zip(runs.iter_mut())
        .map(|(s, r)| {
            r.sort_by_key(|(i, _)| *i);
            let r: Vec<ModeSummary> = r.iter().map(|(_, m)| m.clone()).collect();
            Scored {
                setting: *s,
                verdict: Verdict::of(s.mode, &r),
                screened_out: repeats > 1 && r.len() < repeats as usize,
            }
        })
        .collect();
    Ok((scored, n))
}

/// The best of `tried` satisfying `pred` (eligible first).
fn best_of<'a>(tried: &'a [Scored], pred: &dyn Fn(&Scored) -> bool) -> Option<&'a Scored> {
    tried
        .iter()
        .filter(|t| pred(t))
        .fold(None::<&Scored>, |acc, t| match acc {
            Some(a) if !t.better_than(a) => Some(a),
            _ => Some(t),
        })
}

/// The search's state: every setting tried, each mode's best setting so far.
struct Search<'a> {
    source: &'a TraceSource,
    limit: Option<usize>,
    base: &'a SimParams,
    repeats: u32,
    tried: Vec<Scored>,
    best: Vec<Setting>,
    runs: usize,
}

impl Search<'_> {
    fn find(&self, s: &Setting) -> Option<&Scored> {
        self.tried.iter().find(|t| t.setting == *s)
    }

    /// One stage: the `candidates` of each best setting that `applies`, screened
    /// against the best eligible p99 so far; each best setting moves to the best of
    /// its candidates.
    fn stage(
        &mut self,
        applies: &dyn Fn(&Setting) -> bool,
        candidates: &dyn Fn(&Setting) -> Vec<Setting>,
    ) -> anyhow::Result<()> {
        let mut fresh: Vec<Setting> = Vec::new();
        for s in self.best.iter().filter(|s| applies(s)) {
            for c in candidates(s) {
                if self.find(&c).is_none() && !fresh.contains(&c) {
                    fresh.push(c);
                }
            }
        }
        let incumbent = best_of(&self.tried, &Scored::eligible);
        let bar = incumbent.map_or(f64::INFINITY, Scored::stable_p99_ms);
        let probe = incumbent
            .and_then(|t| {
                (0..t.verdict.reruns.len()).max_by(|&a, &b| {
                    t.verdict.reruns[a]
                        .p99_ms
                        .total_cmp(&t.verdict.reruns[b].p99_ms)
                })
            })
            .unwrap_or(1) as u32;
        if !fresh.is_empty() {
            let (scored, n) = evaluate(
                self.source,
                self.limit,
                self.base,
                self.repeats,
                &fresh,
                bar,
                probe,
            )?;
            self.runs += n;
            self.tried.extend(scored);
        }
        let mut best = self.best.clone();
        for s in best.iter_mut().filter(|s| applies(s)) {
            let mut options = candidates(s);
            options.push(*s);
            let mut winner: Option<&Scored> = None;
            for o in &options {
                if let Some(t) = self.find(o) {
                    if winner.is_none_or(|w| t.better_than(w)) {
                        winner = Some(t);
                    }
                }
            }
            if let Some(w) = winner {
                *s = w.setting;
            }
        }
        self.best = best;
        Ok(())
    }
}

fn vary<T: Copy>(values: &[T], set: fn(&mut Setting, T)) -> impl Fn(&Setting) -> Vec<Setting> + '_ {
    move |s| {
        values
            .iter()
            .map(|&v| {
                let mut c = *s;
                set(&mut c, v);
                c
            })
            .collect()
    }
}

/// Searches the settings of `modes` from `base` (see the module docs), `repeats`
/// perturbed runs each. `known` are settings already run (the run's own), with their
/// reruns, so they are not run again.
///
/// # Errors
/// A failing simulation; a trace that cannot be read.
pub fn search(
    source: &TraceSource,
    limit: Option<usize>,
    base: &SimParams,
    modes: &[Mode],
    repeats: u32,
    known: Vec<Scored>,
) -> anyhow::Result<Recommendation> {
    let mut largest = 0;
    for r in source.open(limit)? {
        largest = largest.max(kv_blocks_needed(&r?));
    }
    let mut sr = Search {
        source,
        limit,
        base,
        repeats: repeats.max(1),
        tried: known,
        best: modes.iter().map(|&m| Setting::of(m, base)).collect(),
        runs: 0,
    };
    let not_sync = |s: &Setting| s.mode != Mode::Sync;
    // Rule 8's policy first: it decides whether the asynchronous modes collapse.
    sr.stage(
        &|_| true,
        &vary(&[OnPreemption::Discard, OnPreemption::KeepWait], |s, v| {
            s.on_preemption = v;
        }),
    )?;
    sr.stage(
        &not_sync,
        &vary(&[PendingPolicy::Skip, PendingPolicy::Wait], |s, v| {
            s.on_pending = v;
        }),
    )?;
    sr.stage(&not_sync, &vary(&[1, 4], |s, v| s.concurrency = v))?;
    sr.stage(
        &Setting::prefetches,
        &vary(&[8, 32, 128], |s, v| s.prefetch_limit = v),
    )?;
    sr.stage(
        &Setting::prefetches,
        &vary(&[1.0, 2.0, 5.0], |s, v| s.ttl_s = v),
    )?;
    let auto = match base.lookup.wait_budget {
        w @ WaitBudget::Adaptive { .. } => w,
        WaitBudget::Fixed { .. } => WaitBudget::default(),
    };
    let budgets = [
        auto,
        WaitBudget::Fixed { s: 0.002 },
        WaitBudget::Fixed { s: 0.005 },
    ];
    sr.stage(
        &|s| s.mode == Mode::PrefetchWait,
        &vary(&budgets, |s, v| s.wait_budget = v),
    )?;
    // The engine's levers around the best cells: the leading mode and sync.
    let mut ranked: Vec<&Scored> = sr.best.iter().filter_map(|s| sr.find(s)).collect();
    ranked.sort_by(|a, b| {
        if a.better_than(b) {
            std::cmp::Ordering::Less
        } else if b.better_than(a) {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    });
    let mut leaders: Vec<Mode> = ranked.iter().take(1).map(|t| t.setting.mode).collect();
    leaders.push(Mode::Sync);
    let lead = |s: &Setting| leaders.contains(&s.mode);
    let seqs = base.engine.max_num_seqs;
    let seqs = [(seqs / 2).max(1), seqs, seqs.saturating_mul(2)];
    sr.stage(&lead, &vary(&seqs, |s, v| s.max_num_seqs = v))?;
    let kv = base.engine.gpu_kv_blocks;
    let kvs: Vec<u64> = [kv / 2, kv, kv.saturating_mul(2)]
        .into_iter()
        .filter(|&b| b >= largest && b > 0)
        .collect();
    sr.stage(&lead, &vary(&kvs, |s, v| s.gpu_kv_blocks = v))?;

    let tried = sr.tried;
    let best = best_of(&tried, &Scored::eligible)
        .filter(|b| b.eligible())
        .cloned();
    let runner_up = best.as_ref().and_then(|b| {
        best_of(&tried, &|t| {
            t.eligible() && t.setting.mode != b.setting.mode
        })
        .cloned()
    });
    let sync = best_of(&tried, &|t| t.eligible() && t.setting.mode == Mode::Sync).cloned();
    let mut margins = Vec::new();
    let mut losses = Vec::new();
    if let Some(b) = &best {
        if let Some(r) = &runner_up {
            margins.push(Margin {
                against: "runner-up",
                setting: r.setting,
                ratio: paired(&b.verdict, &r.verdict),
            });
        }
        if let Some(s) = sync.as_ref().filter(|s| {
            s.setting != b.setting && runner_up.as_ref().is_none_or(|r| r.setting != s.setting)
        }) {
            margins.push(Margin {
                against: "sync",
                setting: s.setting,
                ratio: paired(&b.verdict, &s.verdict),
            });
        }
        for &m in modes.iter().filter(|&&m| m != b.setting.mode) {
            if let Some(l) = best_of(&tried, &|t| t.setting.mode == m) {
                // Like with like: the winner's mode at the loser's engine levers, when
                // the loser was not searched over them.
                let same_engine = |t: &Scored| {
                    t.eligible()
                        && t.setting.mode == b.setting.mode
                        && t.setting.max_num_seqs == l.setting.max_num_seqs
                        && t.setting.gpu_kv_blocks == l.setting.gpu_kv_blocks
                };
                let against = best_of(&tried, &same_engine)
                    .filter(|t| same_engine(t))
                    .unwrap_or(b);
                let mechanism = diagnose(&l.verdict, &against.verdict);
                losses.push(Loss {
                    setting: l.setting,
                    against: against.setting,
                    text: mechanism.describe(),
                    mechanism,
                });
            }
        }
    }
    Ok(Recommendation {
        best,
        runner_up,
        sync,
        margins,
        losses,
        tried,
        runs: sr.runs,
    })
}
