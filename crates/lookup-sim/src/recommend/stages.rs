//! The search over the lookup settings: coordinate descent from the run's own
//! settings, one lever at a time, each stage keeping the best value found so far, on
//! the selection reruns only. Per mode: `lookup_on_preemption` discard (vLLM's, the
//! one its connector follows: the run's own `keep_wait` runs are kept but not
//! chosen, [`Setting::vllm_follows`]); server concurrency {1, 4} (not sync, whose single blocking probe uses one); prefetch
//! limit {8, 32, 128} and TTL {1, 2, 5} s (prefetch modes); the wait budget {auto,
//! 2 ms, 5 ms} (`prefetch+wait`).
//!
//! Screening: a candidate runs rerun 0, then the rerun at which the best setting so
//! far had its largest p99 (the perturbation most likely to be the candidate's worst,
//! as reruns are paired), then the others; once a run is above the best stable p99
//! found, it is not rerun further: its reruns can only raise its stable p99.

use lookup_core::OnPreemption;

use super::runs::Runs;
use super::setting::{Scored, Setting, best_of};
use crate::budget::WaitBudget;
use crate::mode::Mode;

/// The stages, in order, as named on the progress bars.
pub(crate) const STAGES: [&str; 5] = [
    "on preemption",
    "server concurrency",
    "prefetch limit",
    "prefetch TTL",
    "wait budget",
];

/// The search's state: every setting tried, each mode's best setting so far.
pub(crate) struct Search<'r, 'a> {
    pub(crate) runs: &'r mut Runs<'a>,
    pub(crate) tried: Vec<Scored>,
    pub(crate) best: Vec<Setting>,
}

impl Search<'_, '_> {
    fn find(&self, s: &Setting) -> Option<&Scored> {
        self.tried.iter().find(|t| t.setting == *s)
    }

    /// One stage: the `candidates` of each best setting that `applies`, screened
    /// against the best eligible p99 so far; each best setting moves to the best of
    /// its candidates.
    fn stage(
        &mut self,
        step: usize,
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
            let name = format!("search {}/{} {}", step + 1, STAGES.len() + 2, STAGES[step]);
            let scored = self.runs.screen(&name, &fresh, bar, probe)?;
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

    /// Every stage of the module docs, in order.
    pub(crate) fn run(&mut self, auto: WaitBudget) -> anyhow::Result<()> {
        let not_sync = |s: &Setting| s.mode != Mode::Sync;
        // Rule 8's policy first: vLLM's connector follows `discard` only.
        self.stage(
            0,
            &|_| true,
            &vary(&[OnPreemption::Discard], |s, v| s.on_preemption = v),
        )?;
        self.stage(1, &not_sync, &vary(&[1, 4], |s, v| s.concurrency = v))?;
        self.stage(
            2,
            &Setting::prefetches,
            &vary(&[8, 32, 128], |s, v| s.prefetch_limit = v),
        )?;
        self.stage(
            3,
            &Setting::prefetches,
            &vary(&[1.0, 2.0, 5.0], |s, v| s.ttl_s = v),
        )?;
        let budgets = [
            auto,
            WaitBudget::Fixed { s: 0.002 },
            WaitBudget::Fixed { s: 0.005 },
        ];
        self.stage(
            4,
            &|s| s.mode == Mode::PrefetchWait,
            &vary(&budgets, |s, v| s.wait_budget = v),
        )
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
