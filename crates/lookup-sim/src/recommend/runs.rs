//! Running the recommendation's candidates: screened batches on the selection
//! reruns (`0..repeats`, the reruns the choice is made on) and full batches on fresh
//! reruns (`repeats..2 * repeats`: other seeds, arrival rates, orders and routings,
//! on which the chosen setting's margin is reported, so the choice cannot have
//! flattered it). Every batch runs on every core, with a progress bar per batch.

use lookup_core::OnPreemption;

use super::capacity::Capacity;
use super::setting::{Scored, Setting};
use crate::engine::SimParams;
use crate::progress::Progress;
use crate::report::{ModeSummary, summarise};
use crate::runner::{Job, perturbed, run_jobs};
use crate::stability::Verdict;
use crate::trace::TraceSource;

/// What every batch of one search shares.
pub(crate) struct Runs<'a> {
    pub(crate) source: &'a TraceSource,
    pub(crate) limit: Option<usize>,
    pub(crate) base: &'a SimParams,
    /// Reruns per setting (at least 1).
    pub(crate) repeats: u32,
    /// Requests each run replays (for the progress bars).
    pub(crate) requests: u64,
    /// The tail reference: the best mode's median p99 over the run's own reruns (ms;
    /// [`crate::health::Health::judge_tail`]).
    pub(crate) best_median_ms: f64,
    pub(crate) progress: Progress,
    /// Simulations run so far.
    pub(crate) runs: usize,
}

/// A run's label on the progress bar: `async keep_wait rerun 3`.
fn label(s: &Setting, rerun: u32) -> String {
    let policy = if s.on_preemption == OnPreemption::Discard {
        String::new()
    } else {
        format!(" {}", s.on_preemption)
    };
    format!("{}{policy} rerun {rerun}", s.mode)
}

impl Runs<'_> {
    /// Runs `batch` (each a setting, its capacity and the rerun) as the stage `name`.
    fn batch(
        &mut self,
        name: &str,
        batch: &[(Setting, Capacity, u32)],
    ) -> anyhow::Result<Vec<ModeSummary>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let jobs: Vec<Job> = batch
            .iter()
            .map(|(s, c, i)| Job {
                params: perturbed(&c.apply(&s.apply(self.base)), *i),
                mode: s.mode,
            })
            .collect();
        let labels = batch.iter().map(|(s, _, i)| label(s, *i)).collect();
        let stage = self.progress.stage(name, labels, self.requests);
        let results = run_jobs(self.source, self.limit, &jobs, &|j, _| {
            stage.on_request(j);
        })?;
        stage.finish();
        self.runs += jobs.len();
        Ok(results
            .iter()
            .zip(batch)
            .map(|(r, (_, c, _))| {
                let mut s = summarise(r, c.gpu_kv_blocks);
                s.health.judge_tail(s.ttft_ms.p99, self.best_median_ms);
                s
            })
            .collect())
    }

    /// Runs each setting's rerun 0, then rerun `probe` of those whose p99 is not
    /// above `bar` ms, then the other selection reruns of those still not above it:
    /// the others cannot win (a collapsing candidate, slow to simulate, costs one
    /// run).
    pub(crate) fn screen(
        &mut self,
        name: &str,
        settings: &[Setting],
        bar: f64,
        probe: u32,
    ) -> anyhow::Result<Vec<Scored>> {
        let repeats = self.repeats;
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
        let capacity = Capacity::of(self.base);
        let mut runs: Vec<Vec<(u32, ModeSummary)>> = vec![Vec::new(); settings.len()];
        for (n, round) in rounds.iter().enumerate() {
            let alive: Vec<usize> = (0..settings.len())
                .filter(|&k| runs[k].iter().all(|(_, s)| s.ttft_ms.p99 <= bar))
                .collect();
            let batch: Vec<(Setting, Capacity, u32)> = alive
                .iter()
                .flat_map(|&k| round.iter().map(move |&i| (settings[k], capacity, i)))
                .collect();
            let done = self.batch(&format!("{name}, round {}/3", n + 1), &batch)?;
            for (j, &k) in alive.iter().enumerate() {
                for (m, &i) in round.iter().enumerate() {
                    if let Some(s) = done.get(j * round.len() + m) {
                        runs[k].push((i, s.clone()));
                    }
                }
            }
        }
        Ok(settings
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
            .collect())
    }

    /// Every fresh rerun (`repeats..2 * repeats`) of each (setting, capacity): their
    /// verdicts, in order.
    pub(crate) fn fresh(
        &mut self,
        name: &str,
        items: &[(Setting, Capacity)],
    ) -> anyhow::Result<Vec<Verdict>> {
        let reruns: Vec<u32> = (self.repeats..2 * self.repeats).collect();
        let batch: Vec<(Setting, Capacity, u32)> = items
            .iter()
            .flat_map(|&(s, c)| reruns.iter().map(move |&i| (s, c, i)))
            .collect();
        let done = self.batch(name, &batch)?;
        Ok(items
            .iter()
            .zip(done.chunks(reruns.len().max(1)))
            .map(|((s, _), runs)| Verdict::of(s.mode, runs))
            .collect())
    }
}
