//! The engine driven step by step, for comparison with vLLM 0.33's own `Scheduler`
//! (`cargo xtask fidelity --against vllm`): a [`Scenario`] (settings, requests with
//! token ids and a scripted connector answer each) goes through one engine's
//! `schedule` and output processing, one call per step, and every step's decisions
//! come out as a [`StepLine`], in the interchange format the vLLM harness writes
//! too.
//!
//! Time is counted in steps: no step cost, no lookup server. The connector is a
//! stand-in (`Script`) that answers as the scenario says (ready, pending for k
//! probes, missing); external tokens load synchronously (`load_kv_async = false`)
//! or, when the answer says so, asynchronously for a number of steps
//! (`WAITING_FOR_REMOTE_KVS` until the model runner reports the load in
//! `finished_recving`).
//! Each step is one turn of vLLM's engine loop (vllm/v1/engine/core.py): without
//! async scheduling `EngineCore.step` (schedule, then that batch's output); with it
//! (`async_scheduling`, what vLLM 0.33 resolves for one GPU)
//! `EngineCore.step_with_batch_queue` over a queue of 2 batches: a turn schedules a
//! batch (an empty one too) and then processes the oldest batch's output only when
//! the queue is full or nothing more can be scheduled, so a finished request is
//! reported a step later. The connector stands for a `kv_both` one (the Mooncake
//! store connector's role, as the harness runs it), so with async scheduling block
//! frees are fenced behind the step in flight (`engine::fence::Fence`) and
//! a preempted request's output in flight is dropped (`requires_kv_delivery`).
//! The prefix cache hashes vLLM's 16-token blocks, chained
//! over the scenario's token ids, so equal prefixes hash equal here exactly when
//! they do in vLLM.

use std::collections::VecDeque;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::replica::Engine;
pub use super::script::ConnectorAnswer;
use super::script::{Decisions, Script};
use super::world::{Feed, Phase, Req, Step, World, mix};
use super::{EngineParams, SimParams};
use crate::connector::Connector;
use crate::mode::Mode;
use crate::server::LookupServer;
use crate::trace::TraceRequest;

/// A scenario file: settings and requests (the interchange format).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scenario {
    /// The scheduler's settings.
    pub settings: Settings,
    /// The requests, in arrival order.
    pub requests: Vec<ScenarioRequest>,
}

/// The scheduler's settings, as vLLM's `SchedulerConfig` / `CacheConfig` name them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// Tokens per KV block (`block_size`); 16.
    pub block_size: u32,
    /// Usable KV blocks in the pool (vLLM is given one more: its null block).
    pub num_gpu_blocks: u64,
    /// Most running requests.
    pub max_num_seqs: u32,
    /// Token budget per step.
    pub max_num_batched_tokens: u32,
    /// Longest sequence (tokens).
    pub max_model_len: u32,
    /// Chunked prefill (must be true here).
    pub enable_chunked_prefill: bool,
    /// The GPU's prefix cache.
    pub enable_prefix_caching: bool,
    /// vLLM's cap on one prefill chunk (0: none; must be 0 here).
    pub long_prefill_token_threshold: u32,
    /// Async scheduling (vLLM's `AsyncScheduler`, two batches in flight); vLLM 0.33
    /// resolves it to true for one GPU (vllm/config/vllm.py).
    pub async_scheduling: bool,
    /// The full-prompt admission gate.
    pub scheduler_reserve_full_isl: bool,
    /// Steps at most.
    pub max_steps: u64,
}

/// One request of a scenario.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScenarioRequest {
    /// Its id (`r0`, `r1`, ...).
    pub request_id: String,
    /// The step before whose `schedule` it is added.
    pub arrival_step: u64,
    /// The prompt's token ids.
    pub prompt_token_ids: Vec<u32>,
    /// The tokens the stand-in model emits, one per output (at least one).
    pub output_token_ids: Vec<u32>,
    /// What the stand-in connector answers.
    pub connector: ConnectorAnswer,
}

/// One line of a step log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLine {
    /// Step number, from 0.
    pub step: u64,
    /// Request id → tokens scheduled, sorted by id.
    pub scheduled: Vec<(String, u32)>,
    /// Moved waiting → running, in order.
    pub admitted: Vec<String>,
    /// Preempted, in order.
    pub preempted: Vec<String>,
    /// Finished by this step's output.
    pub finished: Vec<String>,
    /// Waiting requests whose connector answered `None`, in order.
    pub skipped_pending: Vec<String>,
    /// KV blocks held by requests after `schedule`.
    pub blocks_in_use: u64,
    /// Per admission: local prefix-cache hit tokens.
    pub local_hits: Vec<(String, u32)>,
    /// Per admission: the connector's external tokens used.
    pub external_hits: Vec<(String, u32)>,
    /// Waiting requests after `schedule`.
    pub waiting: u64,
    /// Running requests after `schedule`.
    pub running: u64,
}

/// The last line of a step log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndLine {
    /// Always true.
    pub end: bool,
    /// Steps run.
    pub steps: u64,
    /// Requests finished.
    pub finished: u64,
}

/// The chained prefix-cache hashes of the full `block_size`-token blocks of
/// `tokens`: each block's hash covers its parent's and its tokens, as vLLM's
/// `hash_block_tokens` (vllm/v1/core/kv_cache_utils.py) chains them, so two requests
/// share a block hash exactly when their prefixes up to it are equal. The top bit is
/// clear, apart from the request-unique hashes of generated blocks.
#[must_use]
pub fn token_block_hashes(tokens: &[u32], block_size: u32) -> Vec<u64> {
    let mut parent = 0x9e37_79b9_7f4a_7c15_u64;
    tokens
        .chunks_exact(block_size as usize)
        .map(|block| {
            let mut h = parent;
            for &t in block {
                h = mix(h ^ u64::from(t));
            }
            parent = h;
            h >> 1
        })
        .collect()
}

impl Scenario {
    /// Checks what the step-driven engine cannot run.
    ///
    /// # Errors
    /// Settings outside what it models (block size not 16, chunked prefill off, a
    /// long-prefill threshold), an empty prompt or output, a
    /// request that cannot fit the pool alone, or duplicate ids.
    pub fn validate(&self) -> anyhow::Result<()> {
        let s = &self.settings;
        if s.block_size != crate::store::KV_BLOCK_TOKENS {
            bail!("block_size must be 16, got {}", s.block_size);
        }
        if !s.enable_chunked_prefill || s.long_prefill_token_threshold != 0 {
            bail!(
                "the step-driven engine models chunked prefill and no long_prefill_token_threshold"
            );
        }
        if s.max_num_seqs == 0 || s.max_num_batched_tokens == 0 {
            bail!("max_num_seqs and max_num_batched_tokens must be at least 1");
        }
        let mut ids = std::collections::HashSet::new();
        for r in &self.requests {
            if r.prompt_token_ids.is_empty() || r.output_token_ids.is_empty() {
                bail!("request {}: empty prompt or output", r.request_id);
            }
            let positions = (r.prompt_token_ids.len() + r.output_token_ids.len() - 1) as u64;
            if positions.div_ceil(16) > s.num_gpu_blocks || positions >= u64::from(s.max_model_len)
            {
                bail!(
                    "request {}: {positions} positions do not fit {} KV blocks / max_model_len {}",
                    r.request_id,
                    s.num_gpu_blocks,
                    s.max_model_len
                );
            }
            if !ids.insert(&r.request_id) {
                bail!("request id {} appears twice", r.request_id);
            }
        }
        Ok(())
    }
}

/// Runs `scenario` through one engine, step by step: at each step the requests
/// arriving by it are added, then one turn of vLLM's engine loop runs (`schedule`,
/// and the output of the step just scheduled, or with async scheduling of the
/// step before it). Returns one [`StepLine`] per step and the [`EndLine`]; it stops when every
/// request finished or at `max_steps`. The prefix cache hashes `hash_tokens`-token
/// blocks (16: vLLM's own; 512: the timed simulator's default groups).
///
/// # Errors
/// A scenario that does not validate ([`Scenario::validate`]), or `hash_tokens`
/// not a multiple of 16 dividing 512.
pub fn run_steps(
    scenario: &Scenario,
    hash_tokens: u32,
) -> anyhow::Result<(Vec<StepLine>, EndLine)> {
    scenario.validate()?;
    let s = &scenario.settings;
    let params = SimParams {
        engine: EngineParams {
            engines: 1,
            max_num_batched_tokens: s.max_num_batched_tokens,
            max_num_seqs: s.max_num_seqs,
            gpu_kv_blocks: s.num_gpu_blocks,
            local_prefix_cache: s.enable_prefix_caching,
            prefix_hash_tokens: hash_tokens,
            scheduler_reserve_full_isl: s.scheduler_reserve_full_isl,
            load_kv_async: false,
            batch_queue: if s.async_scheduling { 2 } else { 1 },
            ..EngineParams::default()
        },
        ..SimParams::default()
    };
    params.validate()?;
    let mode = Mode::Async;
    let server = LookupServer::new(params.server.clone(), 0, None);
    let conn =
        Connector::new(mode.config(&params.lookup, 1), server).context("lookup configuration")?;
    let mut engine = Engine::new(
        conn,
        s.num_gpu_blocks,
        s.enable_prefix_caching,
        hash_tokens,
        s.async_scheduling,
    );
    engine.script = Some(Script {
        answers: scenario.requests.iter().map(|r| r.connector).collect(),
        probes: vec![0; scenario.requests.len()],
        block_size: s.block_size,
        output_lag: u64::from(s.async_scheduling),
    });
    let no_trace = std::iter::empty();
    let on_finished = |_: &super::RequestRecord| {};
    let mut w = World::new(Feed::new(Box::new(no_trace)), mode, &params, &on_finished);
    let ids: Vec<&str> = scenario
        .requests
        .iter()
        .map(|r| r.request_id.as_str())
        .collect();
    let mut order: VecDeque<usize> = {
        let mut o: Vec<usize> = (0..scenario.requests.len()).collect();
        o.sort_by_key(|&i| scenario.requests[i].arrival_step);
        o.into()
    };
    let mut lines = Vec::new();
    let mut finished = 0u64;
    let mut step = 0u64;
    let name = |seq: u64| ids[seq as usize].to_owned();
    let named = |v: &[(u64, u32)]| v.iter().map(|&(q, n)| (name(q), n)).collect::<Vec<_>>();
    // vLLM's batch queue (`EngineCore.batch_queue`, `max_concurrent_batches`): 2
    // with async scheduling, 1 without. An empty step takes a place too.
    let depth = if s.async_scheduling { 2 } else { 1 };
    let mut batches: VecDeque<Option<Step>> = VecDeque::new();
    // vLLM's `has_finished_requests`: a request finished since the last schedule.
    let mut finished_since_schedule = false;
    while step < s.max_steps && (finished as usize) < scenario.requests.len() {
        engine.t = step * 1_000_000;
        while order
            .front()
            .is_some_and(|&i| scenario.requests[i].arrival_step <= step)
        {
            let i = order.pop_front().expect("checked");
            let slot = w
                .reqs
                .insert(request(&scenario.requests[i], i as u64, hash_tokens));
            engine.route(slot);
            engine.handle_arrival(engine.t, &mut w);
        }
        engine.log = Some(Decisions::default());
        let mut blocks_in_use = engine.local.held();
        let (mut waiting, mut running) = (engine.waiting.len() as u64, engine.running.len() as u64);
        let mut scheduled = Vec::new();
        let has_requests = waiting + running > 0 || finished_since_schedule;
        let mut process = None;
        if has_requests {
            // One turn of `EngineCore.step` / `step_with_batch_queue`
            // (vllm/v1/engine/core.py): schedule a batch (possibly empty) into the
            // queue; process the oldest batch's output when the queue is full or
            // nothing more can be scheduled.
            let built = engine.schedule(&mut w)?;
            finished_since_schedule = false;
            blocks_in_use = engine.local.held();
            (waiting, running) = (engine.waiting.len() as u64, engine.running.len() as u64);
            let executed = built.is_some();
            if let Some(st) = &built {
                scheduled = st.entries.iter().map(|e| (name(e.seq), e.new)).collect();
                engine.steps += 1;
            }
            batches.push_back(built);
            if batches.len() >= depth || !(executed || waiting + running > 0) {
                process = batches.pop_front();
            }
        } else {
            process = batches.pop_front();
        }
        if let Some(Some(st)) = process {
            engine.process_output(st, &mut w);
        }
        scheduled.sort();
        let mut d = engine.log.take().unwrap_or_default();
        d.finished
            .sort_by(|a, b| ids[*a as usize].cmp(ids[*b as usize]));
        finished += d.finished.len() as u64;
        finished_since_schedule |= !d.finished.is_empty();
        lines.push(StepLine {
            step,
            scheduled,
            admitted: d.admitted.iter().map(|&q| name(q)).collect(),
            preempted: d.preempted.iter().map(|&q| name(q)).collect(),
            finished: d.finished.iter().map(|&q| name(q)).collect(),
            skipped_pending: d.skipped_pending.iter().map(|&q| name(q)).collect(),
            blocks_in_use,
            local_hits: named(&d.local_hits),
            external_hits: named(&d.external_hits),
            waiting,
            running,
        });
        step += 1;
    }
    Ok((
        lines,
        EndLine {
            end: true,
            steps: step,
            finished,
        },
    ))
}

/// The engine's request for scenario request `r` (number `seq`): its prompt hashed
/// in `hash_tokens`-token blocks from its token ids.
fn request(r: &ScenarioRequest, seq: u64, hash_tokens: u32) -> Req {
    let tr = TraceRequest {
        timestamp: 0,
        input_length: r.prompt_token_ids.len() as u32,
        output_length: r.output_token_ids.len() as u32,
        hash_ids: Vec::new(),
    };
    let mut req = Req::new(seq, 0, tr, 0, None, hash_tokens);
    req.kv_hashes = token_block_hashes(&r.prompt_token_ids, hash_tokens);
    req.phase = Phase::NotArrived;
    req
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(gate: bool) -> Scenario {
        let req = |id: &str, prompt: u32, outputs: u32| ScenarioRequest {
            request_id: id.to_owned(),
            arrival_step: 0,
            prompt_token_ids: (0..prompt).map(|t| t + 1000 * prompt).collect(),
            output_token_ids: (0..outputs).collect(),
            connector: ConnectorAnswer::Missing,
        };
        Scenario {
            settings: Settings {
                block_size: 16,
                num_gpu_blocks: 8,
                max_num_seqs: 4,
                max_num_batched_tokens: 64,
                max_model_len: 1000,
                enable_chunked_prefill: true,
                enable_prefix_caching: true,
                long_prefill_token_threshold: 0,
                async_scheduling: false,
                scheduler_reserve_full_isl: gate,
                max_steps: 40,
            },
            requests: vec![req("r0", 96, 3), req("r1", 80, 1)],
        }
    }

    fn sched(l: &StepLine) -> Vec<(&str, u32)> {
        l.scheduled
            .iter()
            .map(|(id, n)| (id.as_str(), *n))
            .collect()
    }

    /// vLLM 0.33's `scheduler_reserve_full_isl` (default true): at step 1 r0's
    /// prefill ends with 6 of 8 blocks held and 32 tokens of budget left; r1's
    /// 80-token prompt needs 5 blocks, so the gate refuses it although its 32-token
    /// chunk (2 blocks) would fit. Without the gate r1 is admitted on that chunk and
    /// preempted the next step, when r0's first decode needs a 7th block
    /// (`running.pop()`), as vLLM PR #37307 describes.
    #[test]
    fn the_full_prompt_gate_refuses_what_only_its_first_chunk_would_fit() {
        let (on, end) = run_steps(&scenario(true), 16).unwrap();
        assert_eq!((end.finished, end.steps), (2, on.len() as u64));
        assert_eq!(sched(&on[1]), vec![("r0", 32)]);
        assert!(on[1].admitted.is_empty());
        assert_eq!(on[1].blocks_in_use, 6);
        assert_eq!(sched(&on[2]), vec![("r0", 1)]);
        assert!(on[2].preempted.is_empty());

        let (off, _) = run_steps(&scenario(false), 16).unwrap();
        assert_eq!(sched(&off[1]), vec![("r0", 32), ("r1", 32)]);
        assert_eq!(off[1].admitted, vec!["r1".to_owned()]);
        assert_eq!(off[1].blocks_in_use, 8);
        assert_eq!(off[2].preempted, vec!["r1".to_owned()]);
        assert_eq!(sched(&off[2]), vec![("r0", 1)]);
    }

    /// Async scheduling (vLLM 0.33's `AsyncScheduler` in
    /// `EngineCore.step_with_batch_queue`, two batches in flight, a `kv_both`
    /// connector so block frees are fenced): at step 2 r0's first decode needs a 7th
    /// of 8 blocks, but r1, the last running request, was scheduled in step 1, still
    /// in flight, so it is not preempted and nothing is scheduled
    /// (`_request_blocks_can_be_freed`); it is preempted at step 3, once step 1's
    /// output is processed. A finished request is reported a step after its last
    /// token is scheduled. The lines are those vLLM's own scheduler gives on this
    /// scenario (scripts/vllm/fidelity/harness.py).
    #[test]
    fn async_scheduling_preempts_only_requests_out_of_the_step_in_flight() {
        let mut sc = scenario(false);
        sc.settings.async_scheduling = true;
        let (log, end) = run_steps(&sc, 16).unwrap();
        assert_eq!((end.steps, end.finished), (8, 2));
        type Line<'a> = (Vec<(&'a str, u32)>, Vec<&'a str>, Vec<&'a str>, u64);
        let got: Vec<Line<'_>> = log
            .iter()
            .map(|l| {
                (
                    sched(l),
                    l.preempted.iter().map(String::as_str).collect(),
                    l.finished.iter().map(String::as_str).collect(),
                    l.blocks_in_use,
                )
            })
            .collect();
        let none: Vec<&str> = Vec::new();
        assert_eq!(
            got,
            vec![
                (vec![("r0", 64)], none.clone(), none.clone(), 4),
                (vec![("r0", 32), ("r1", 32)], none.clone(), none.clone(), 8),
                (vec![], none.clone(), none.clone(), 8),
                (vec![("r0", 1)], vec!["r1"], none.clone(), 7),
                (vec![("r0", 1)], none.clone(), none.clone(), 7),
                (vec![], none.clone(), vec!["r0"], 7),
                (vec![("r1", 64)], none.clone(), none.clone(), 5),
                (vec![], none.clone(), vec!["r1"], 5),
            ]
        );
        assert_eq!(log[6].local_hits, vec![("r1".to_owned(), 16)]);
    }

    /// An asynchronous load (`load_kv_async` True) of 48 of a 50-token prompt for 2
    /// steps: its 3 blocks are held from step 0 with nothing scheduled; the load ends
    /// in step 1's output, seen by step 2's schedule (step 3's with async scheduling,
    /// whose step-1 output is processed after step 2's schedule); admitted then, it
    /// computes its last 2 tokens into a 4th block. The steps vLLM's own scheduler
    /// gives on this scenario (scripts/vllm/fidelity/test_harness.py).
    #[test]
    fn an_async_load_holds_its_blocks_until_its_output_reports_it() {
        for (overlap, admitted_at) in [(false, 2), (true, 3)] {
            let mut sc = scenario(true);
            sc.settings.async_scheduling = overlap;
            sc.requests.truncate(1);
            sc.requests[0].prompt_token_ids.truncate(50);
            sc.requests[0].output_token_ids.truncate(2);
            sc.requests[0].connector = ConnectorAnswer::Ready {
                hit_tokens: 48,
                load_steps: Some(2),
            };
            let (log, _) = run_steps(&sc, 16).unwrap();
            for l in &log[..admitted_at] {
                assert!(l.scheduled.is_empty() && l.admitted.is_empty());
                assert_eq!((l.blocks_in_use, l.waiting, l.running), (3, 1, 0));
            }
            let l = &log[admitted_at];
            assert_eq!(sched(l), vec![("r0", 2)]);
            assert_eq!(l.admitted, vec!["r0".to_owned()]);
            assert_eq!(l.local_hits, vec![("r0".to_owned(), 0)]);
            assert_eq!(l.external_hits, vec![("r0".to_owned(), 0)]);
            assert_eq!((l.blocks_in_use, l.waiting, l.running), (4, 0, 1));
        }
    }

    /// `hash_tokens` is the prefix cache's granularity: r1 repeats r0's first 90
    /// tokens after r0 finished; vLLM's 16-token blocks find 80 of them (5 full
    /// blocks), 512-token groups none.
    #[test]
    fn the_prefix_cache_hashes_blocks_of_hash_tokens() {
        let mut sc = scenario(true);
        sc.requests[1].prompt_token_ids = sc.requests[0].prompt_token_ids[..90]
            .iter()
            .copied()
            .chain(5000..5020)
            .collect();
        sc.requests[1].arrival_step = 10;
        for (hash_tokens, hit) in [(16, 80), (512, 0)] {
            let (log, _) = run_steps(&sc, hash_tokens).unwrap();
            let hits: Vec<_> = log.iter().flat_map(|l| l.local_hits.clone()).collect();
            assert_eq!(
                hits,
                vec![("r0".to_owned(), 0), ("r1".to_owned(), hit)],
                "{hash_tokens}"
            );
        }
    }

    /// A pending answer skips the request for as many probes as scripted, then its
    /// hit is used, capped below its last token.
    #[test]
    fn a_pending_answer_skips_then_loads_the_hit_below_the_last_token() {
        let mut sc = scenario(true);
        sc.requests.truncate(1);
        sc.requests[0].connector = ConnectorAnswer::Pending {
            steps: 2,
            hit_tokens: 96,
            load_steps: None,
        };
        let (log, _) = run_steps(&sc, 16).unwrap();
        assert_eq!(log[0].skipped_pending, vec!["r0".to_owned()]);
        assert_eq!(log[1].skipped_pending, vec!["r0".to_owned()]);
        assert_eq!(log[2].external_hits, vec![("r0".to_owned(), 80)]);
        assert_eq!(sched(&log[2]), vec![("r0", 16)]);
    }
}
