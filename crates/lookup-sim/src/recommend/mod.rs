//! The recommendation at the end of a run: the lookup setting an operator should use
//! (mode, `lookup_on_preemption`, prefetch limit, TTL, wait budget, server
//! concurrency; [`Setting`]), honest about how it was chosen, with what the engine's
//! capacity levers would buy reported apart ([`Lever`]).
//!
//! 1. **Selection** on the run's `repeats` perturbed reruns (`0..repeats`): a
//!    coordinate descent over the lookup settings (`stages`), ranked by the stable
//!    p99 (the largest of a setting's reruns); only settings whose reruns stay within
//!    2x of each other and are all healthy qualify ([`crate::stability`],
//!    [`crate::health`]: no collapse, no request preempted 10 times, no p99 over 2x
//!    the best mode's median).
//! 2. **Confirmation** on fresh reruns (`repeats..2 * repeats`: other seeds, rates,
//!    orders and routings) of the pick, the runner-up (the best of another mode) and
//!    the cheapest setting ([`Setting::cheapest`]: sync, one REQ/REP pair, vLLM's
//!    `discard`). The margins are the paired p99 ratios on these reruns
//!    ([`crate::margin`]), which took no part in the choice: picking the best of
//!    some 20 candidates on the reruns that then measure it would flatter it.
//! 3. **Decision** ([`Decision`]): the pick is recommended only when it beats the
//!    cheapest setting on the fresh reruns by more than the noise (the 95 % interval
//!    of the paired median lies above 1). Otherwise no lookup setting moves TTFT p99
//!    by more than the noise, and the cheapest is recommended. When it does, the
//!    recommendation is the cheapest to run ([`Setting::cost`]: fewer connections,
//!    smaller prefetch limit, shorter TTL, no wait) of the pick, the runner-up and
//!    each searched mode's lever floor ([`Setting::floor`]) that lie inside the noise of the
//!    pick and beat the cheapest outside it ([`settle`]); the levers on which it
//!    differs from the pick are said to be inside the noise. Reruns pick among near
//!    equals by chance, so the best alone would change from seed to seed.
//! 4. **Apart** from the choice, at the recommended setting on the fresh reruns: the
//!    capacity levers, 2x the GPU KV blocks, half and twice `max_num_seqs`
//!    ([`Capacity::levers`]), and `lookup_on_preemption = keep_wait`, which this
//!    project's lookup-core drivers follow but vLLM's connector does not
//!    ([`Setting::vllm_follows`]): only settings the connector follows are chosen.
//! 5. **Losses**: why each other mode lost ([`crate::mechanism`]), from the selection
//!    reruns.

mod capacity;
mod outcome;
mod runs;
mod setting;
mod settle;
mod stages;
mod text;

use lookup_core::OnPreemption;

use crate::engine::SimParams;
use crate::margin::paired;
use crate::mechanism::diagnose;
use crate::mode::Mode;
use crate::progress::Progress;
use crate::trace::TraceSource;

pub use self::capacity::{Capacity, Lever};
pub use self::outcome::{Confirmed, Decision, Loss, Margin, Recommendation};
use self::runs::Runs;
use self::setting::best_of;
pub use self::setting::{Scored, Setting};
pub use self::settle::{Settled, settle};
use self::stages::{STAGES, Search};
pub use self::text::describe;
use crate::budget::WaitBudget;

/// What a search runs on.
#[derive(Clone, Copy, Debug)]
pub struct Problem<'a> {
    /// The trace.
    pub source: &'a TraceSource,
    /// Its first `limit` requests.
    pub limit: Option<usize>,
    /// The run's settings, which the search starts from.
    pub base: &'a SimParams,
    /// The modes searched.
    pub modes: &'a [Mode],
    /// Selection reruns per setting (and as many fresh ones).
    pub repeats: u32,
    /// Requests a run replays (for the progress bars).
    pub requests: u64,
    /// The best mode's median TTFT p99 over the run's own reruns (ms): a rerun whose
    /// p99 is over twice it is unhealthy ([`crate::health::Health::judge_tail`]).
    pub best_median_ms: f64,
    /// Where progress goes.
    pub progress: Progress,
}

/// Searches the lookup settings of `problem.modes` (see the module docs). `known`
/// are settings already run on the selection reruns (the run's own), so they are
/// not run again.
///
/// # Errors
/// A failing simulation; a trace that cannot be read.
pub fn search(problem: &Problem<'_>, known: Vec<Scored>) -> anyhow::Result<Recommendation> {
    let base = problem.base;
    let mut runs = Runs {
        source: problem.source,
        limit: problem.limit,
        base,
        repeats: problem.repeats.max(1),
        requests: problem.requests,
        best_median_ms: problem.best_median_ms,
        progress: problem.progress,
        runs: 0,
    };
    let auto = match base.lookup.wait_budget {
        w @ WaitBudget::Adaptive { .. } => w,
        WaitBudget::Fixed { .. } => WaitBudget::default(),
    };
    let mut search = Search {
        runs: &mut runs,
        tried: known,
        best: problem
            .modes
            .iter()
            .map(|&m| Setting::of(m, base))
            .collect(),
    };
    search.run(auto)?;
    let tried = search.tried;

    let best = best_of(&tried, &Scored::eligible)
        .filter(|b| b.eligible())
        .cloned();
    let runner_up = best.as_ref().and_then(|b| {
        best_of(&tried, &|t| {
            t.eligible() && t.setting.mode != b.setting.mode
        })
        .cloned()
    });
    let cheapest = Setting::cheapest(base);
    let own = Capacity::of(base);
    let mut check: Vec<Setting> = Vec::new();
    for s in [best.as_ref(), runner_up.as_ref()]
        .into_iter()
        .flatten()
        .map(|t| t.setting)
        .chain(best.as_ref().into_iter().flat_map(|b| {
            problem
                .modes
                .iter()
                .filter(|&&m| m != Mode::Sync)
                .map(|&mode| Setting { mode, ..b.setting }.floor())
        }))
        .chain([cheapest])
    {
        if !check.contains(&s) {
            check.push(s);
        }
    }
    let name = format!(
        "search {}/{} fresh reruns",
        STAGES.len() + 1,
        STAGES.len() + 2
    );
    let items: Vec<(Setting, Capacity)> = check.iter().map(|&s| (s, own)).collect();
    let verdicts = runs.fresh(&name, &items)?;
    let confirmed: Vec<Confirmed> = check
        .iter()
        .zip(verdicts)
        .map(|(&setting, verdict)| Confirmed { setting, verdict })
        .collect();
    let fresh = |s: &Setting| {
        confirmed
            .iter()
            .find(|c| c.setting == *s)
            .map(|c| &c.verdict)
    };
    let best_setting = best.as_ref().map(|b| b.setting);
    let decision = Decision::of(
        best_setting.as_ref(),
        &cheapest,
        best_setting.as_ref().and_then(fresh),
        fresh(&cheapest),
    );
    let mut recommended = decision.pick(best_setting.as_ref(), &cheapest);
    let mut inside_noise = Vec::new();
    if let (Decision::Better, Some(b), Some(c)) = (decision, best_setting, fresh(&cheapest)) {
        if let Some(bv) = fresh(&b) {
            let others: Vec<(Setting, &crate::stability::Verdict)> = confirmed
                .iter()
                .filter(|k| k.setting != b && k.setting != cheapest)
                .map(|k| (k.setting, &k.verdict))
                .collect();
            let settled = settle((&b, bv), c, &others);
            recommended = Some(settled.setting);
            inside_noise = settled.inside_noise;
        }
    }
    let mut margins = Vec::new();
    if let Some(pick) = recommended.and_then(|r| fresh(&r).map(|v| (r, v))) {
        let (r, v) = pick;
        let others = [
            ("cheapest", Some(cheapest)),
            ("best tried", best.as_ref().map(|b| b.setting)),
            ("runner-up", runner_up.as_ref().map(|u| u.setting)),
        ];
        for (against, s) in others {
            let Some(s) = s.filter(|s| *s != r && margins.iter().all(|m: &Margin| m.setting != *s))
            else {
                continue;
            };
            if let Some(o) = fresh(&s) {
                margins.push(Margin {
                    against,
                    setting: s,
                    ratio: paired(v, o),
                });
            }
        }
    }
    let mut capacity = Vec::new();
    let mut keep_wait = None;
    if let Some(r) = recommended {
        let mut levers: Vec<(String, Setting, Capacity)> = Capacity::levers(base)
            .into_iter()
            .map(|(l, c)| (l, r, c))
            .collect();
        let kept = Setting {
            on_preemption: OnPreemption::KeepWait,
            ..r
        };
        levers.push((
            "lookup_on_preemption keep_wait (lookup-core's own drivers; vLLM's connector follows discard)".to_owned(),
            kept,
            own,
        ));
        let name = format!(
            "search {}/{} capacity levers",
            STAGES.len() + 2,
            STAGES.len() + 2
        );
        let items: Vec<(Setting, Capacity)> = levers.iter().map(|&(_, s, c)| (s, c)).collect();
        let verdicts = runs.fresh(&name, &items)?;
        let at = fresh(&r);
        for ((lever, setting, c), verdict) in levers.into_iter().zip(verdicts) {
            let l = Lever {
                ratio: at.and_then(|a| paired(a, &verdict)),
                lever,
                setting,
                capacity: c,
                verdict,
            };
            if setting == r {
                capacity.push(l);
            } else {
                keep_wait = Some(l);
            }
        }
    }
    let mut losses = Vec::new();
    if let Some(b) = &best {
        // Neither the best tried nor the recommended mode (the cheapest inside the
        // best's noise, when it is another) is one that lost.
        let won = |m: Mode| m == b.setting.mode || recommended.is_some_and(|r| r.mode == m);
        for &m in problem.modes.iter().filter(|&&m| !won(m)) {
            if let Some(l) = best_of(&tried, &|t| t.setting.mode == m && t.setting.vllm_follows()) {
                let mechanism = diagnose(&l.verdict, &b.verdict);
                losses.push(Loss {
                    setting: l.setting,
                    text: mechanism.describe(),
                    mechanism,
                });
            }
        }
    }
    Ok(Recommendation {
        decision,
        recommended,
        inside_noise,
        best,
        runner_up,
        cheapest,
        repeats: runs.repeats,
        confirmed,
        margins,
        capacity,
        keep_wait,
        losses,
        tried,
        runs: runs.runs,
    })
}
