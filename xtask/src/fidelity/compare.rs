//! Two step logs of one scenario compared step by step: lookup-sim's engine and
//! vLLM 0.33's `Scheduler`. A step is identical when both scheduled the same
//! requests with the same token counts, admitted and preempted the same requests in
//! the same order, hold the same number of KV blocks and found the same local
//! prefix-cache hits. TTFT is counted in steps, from the logs alone.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::simulate::engine::stepped::{Scenario, StepLine};

/// Which decision of a step differs.
#[must_use]
pub(super) fn differences(a: &StepLine, b: &StepLine) -> Vec<&'static str> {
    let mut d = Vec::new();
    if a.scheduled != b.scheduled {
        d.push("scheduled");
    }
    if a.admitted != b.admitted {
        d.push("admitted");
    }
    if a.preempted != b.preempted {
        d.push("preempted");
    }
    if a.blocks_in_use != b.blocks_in_use {
        d.push("blocks_in_use");
    }
    if a.local_hits != b.local_hits {
        d.push("local_hits");
    }
    d
}

/// One slice's comparison.
#[derive(Debug, Clone)]
pub(super) struct Comparison {
    /// Steps on the longer side.
    pub steps: usize,
    /// Steps identical on both sides.
    pub identical: usize,
    /// The first step that differs, if any.
    pub first_divergence: Option<usize>,
    /// Steps that differ, by the decision that differs.
    pub by_field: Vec<(&'static str, usize)>,
    /// TTFT in steps, lookup-sim's (sorted).
    pub ttft_sim: Vec<u64>,
    /// TTFT in steps, vLLM's (sorted).
    pub ttft_vllm: Vec<u64>,
}

impl Comparison {
    /// Identical steps, in % of the steps.
    #[must_use]
    pub(super) fn identical_pct(&self) -> f64 {
        100.0 * self.identical as f64 / self.steps.max(1) as f64
    }
}

/// Compares lookup-sim's log `sim` with vLLM's `vllm`, both of `scenario`.
#[must_use]
pub(super) fn compare(scenario: &Scenario, sim: &[StepLine], vllm: &[StepLine]) -> Comparison {
    let steps = sim.len().max(vllm.len());
    let mut identical = 0;
    let mut first = None;
    let mut by: HashMap<&'static str, usize> = HashMap::new();
    for i in 0..steps {
        match (sim.get(i), vllm.get(i)) {
            (Some(a), Some(b)) => {
                let d = differences(a, b);
                if d.is_empty() {
                    identical += 1;
                } else {
                    first.get_or_insert(i);
                    for f in d {
                        *by.entry(f).or_default() += 1;
                    }
                }
            }
            _ => {
                first.get_or_insert(i);
                *by.entry("steps").or_default() += 1;
            }
        }
    }
    let mut by_field: Vec<_> = by.into_iter().collect();
    by_field.sort();
    Comparison {
        steps,
        identical,
        first_divergence: first,
        by_field,
        ttft_sim: ttft_steps(scenario, sim),
        ttft_vllm: ttft_steps(scenario, vllm),
    }
}

/// Each request's TTFT in steps (sorted): from its arrival step to the step whose
/// output holds its first token (the step in which its computed tokens, hits
/// included, first reach its prompt), counted inclusively.
#[must_use]
pub(super) fn ttft_steps(scenario: &Scenario, log: &[StepLine]) -> Vec<u64> {
    let info: HashMap<&str, (u64, usize)> = scenario
        .requests
        .iter()
        .map(|r| {
            (
                r.request_id.as_str(),
                (r.arrival_step, r.prompt_token_ids.len()),
            )
        })
        .collect();
    let mut computed: HashMap<&str, usize> = HashMap::new();
    let mut ttft: HashMap<&str, u64> = HashMap::new();
    for line in log {
        for id in &line.preempted {
            computed.remove(id.as_str());
        }
        for (id, n) in line.local_hits.iter().chain(&line.external_hits) {
            *computed.entry(id.as_str()).or_default() += *n as usize;
        }
        for (id, n) in &line.scheduled {
            let c = computed.entry(id.as_str()).or_default();
            *c += *n as usize;
            if let Some(&(arrival, prompt)) = info.get(id.as_str())
                && *c >= prompt
                && !ttft.contains_key(id.as_str())
            {
                ttft.insert(id.as_str(), line.step + 1 - arrival);
            }
        }
    }
    let mut v: Vec<u64> = ttft.into_values().collect();
    v.sort_unstable();
    v
}

/// The `q`-quantile (0..=1) of sorted `v` (nearest rank), 0 when empty.
#[must_use]
pub(super) fn quantile(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// One step's decisions on one line.
fn line(l: &StepLine) -> String {
    let sched: Vec<String> = l
        .scheduled
        .iter()
        .map(|(id, n)| format!("{id}:{n}"))
        .collect();
    let hits: Vec<String> = l
        .local_hits
        .iter()
        .map(|(id, n)| format!("{id}:{n}"))
        .collect();
    format!(
        "sched [{}] adm {:?} pre {:?} blocks {} hits [{}] w/r {}/{}",
        sched.join(" "),
        l.admitted,
        l.preempted,
        l.blocks_in_use,
        hits.join(" "),
        l.waiting,
        l.running
    )
}

/// The first divergence with `context` steps either side, both sides.
#[must_use]
pub(super) fn divergence_context(
    sim: &[StepLine],
    vllm: &[StepLine],
    at: usize,
    context: usize,
) -> String {
    let mut out = String::new();
    let from = at.saturating_sub(context);
    let to = (at + context + 1).min(sim.len().max(vllm.len()));
    for i in from..to {
        let mark = if i == at { ">>" } else { "  " };
        let s = sim.get(i).map_or("(no step)".to_owned(), line);
        let v = vllm.get(i).map_or("(no step)".to_owned(), line);
        let diff = match (sim.get(i), vllm.get(i)) {
            (Some(a), Some(b)) => differences(a, b).join(","),
            _ => "steps".to_owned(),
        };
        let _ = writeln!(out, "{mark} step {i} {diff}");
        let _ = writeln!(out, "     lookup-sim: {s}");
        let _ = writeln!(out, "     vLLM:       {v}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::engine::stepped::{ConnectorAnswer, ScenarioRequest, Settings};

    fn step(i: u64, sched: &[(&str, u32)], hits: &[(&str, u32)]) -> StepLine {
        StepLine {
            step: i,
            scheduled: sched.iter().map(|&(a, n)| (a.to_owned(), n)).collect(),
            admitted: hits.iter().map(|&(a, _)| a.to_owned()).collect(),
            preempted: vec![],
            finished: vec![],
            skipped_pending: vec![],
            blocks_in_use: 4,
            local_hits: hits.iter().map(|&(a, n)| (a.to_owned(), n)).collect(),
            external_hits: hits.iter().map(|&(a, _)| (a.to_owned(), 0)).collect(),
            waiting: 0,
            running: 1,
        }
    }

    #[test]
    fn ttft_counts_hits_and_chunks_and_the_first_divergence_is_found() {
        let sc = Scenario {
            settings: Settings {
                block_size: 16,
                num_gpu_blocks: 10,
                max_num_seqs: 4,
                max_num_batched_tokens: 64,
                max_model_len: 1000,
                enable_chunked_prefill: true,
                enable_prefix_caching: true,
                long_prefill_token_threshold: 0,
                async_scheduling: false,
                scheduler_reserve_full_isl: true,
                max_steps: 10,
            },
            requests: vec![ScenarioRequest {
                request_id: "r0".into(),
                arrival_step: 1,
                prompt_token_ids: vec![1; 100],
                output_token_ids: vec![2],
                connector: ConnectorAnswer::Missing,
            }],
        };
        let a = [
            step(1, &[("r0", 64)], &[("r0", 16)]),
            step(2, &[("r0", 20)], &[]),
        ];
        let b = [
            step(1, &[("r0", 64)], &[("r0", 16)]),
            step(2, &[("r0", 36)], &[]),
        ];
        // 16 hit + 64 + 20 = 100 at step 2: TTFT 2 steps; the other side too.
        assert_eq!(ttft_steps(&sc, &a), vec![2]);
        let c = compare(&sc, &a, &b);
        assert_eq!((c.steps, c.identical, c.first_divergence), (2, 1, Some(1)));
        assert_eq!(c.by_field, vec![("scheduled", 1)]);
        assert_eq!(quantile(&[1, 2, 3, 4], 0.5), 2);
        assert_eq!(quantile(&[1, 2, 3, 4], 0.99), 4);
    }
}
