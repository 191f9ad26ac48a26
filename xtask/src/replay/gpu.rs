//! The replay engine's GPU: its KV cache with vLLM V1's prefix cache, block
//! allocation and recompute preemption, as in the simulator (`simulate::engine`,
//! scheduler.rs): the pool *is* the simulator's ([`LocalCache`], [`Held`]), only the
//! clock differs.
//!
//! - **KV cache**: `gpu_kv_blocks` blocks of 16 tokens; full 512-token blocks (prompt
//!   or generated) are cached under a hash ([`group_hash`]); freed blocks go to the
//!   evictable queue in vLLM's order and keep their hash until taken again.
//! - **Running requests first** (vLLM `Scheduler.schedule`): each gets its next chunk
//!   (or one decode token); when its blocks do not fit, the most recently admitted
//!   running request is preempted (recompute: blocks freed, back to the head of the
//!   waiting queue, its prompt now the input plus the outputs so far), until it fits
//!   or it was itself the victim. A step that preempted probes no waiting request.
//! - **Waiting requests** that hold nothing take their local prefix hit first; the
//!   probe is asked about the rest (`num_computed_tokens` = the local hit).
//!
//! The probes and the clock stay in [`engine`](super::engine); this module decides.

use std::collections::VecDeque;

use lookup_core::{BlockHashes, Request};

use super::model::{Entry, Prepared, block_id_of};
use crate::simulate::store::{Held, LocalCache, group_hash};
use crate::simulate::trace::TRACE_BLOCK_TOKENS;

/// A request in the engine (waiting, loading or running).
#[derive(Debug)]
pub(super) struct Live {
    /// Its index in the run's requests (= its `request_id`).
    pub(super) req: usize,
    /// Positions computed or loaded (vLLM `num_computed_tokens`).
    pub(super) num_computed: u32,
    /// Prompt to (re)compute: the input, plus the outputs produced before a preemption.
    pub(super) prefill_len: u32,
    /// Output tokens produced.
    pub(super) outputs: u32,
    /// The scheduler has probed it at least once.
    pub(super) probed: bool,
    /// Its KV blocks.
    pub(super) held: Held,
    /// After a preemption: the request as probed (the grown prompt and hash chain).
    pub(super) grown: Option<Request>,
    /// Times preempted.
    pub(super) preemptions: u32,
    /// Its queue wait was recorded (first scheduling).
    pub(super) scheduled: bool,
}

impl Live {
    /// A request that just arrived.
    pub(super) fn new(req: usize, p: &Prepared) -> Self {
        Self {
            req,
            num_computed: 0,
            prefill_len: p.core.num_tokens,
            outputs: 0,
            probed: false,
            held: Held::default(),
            grown: None,
            preemptions: 0,
            scheduled: false,
        }
    }

    /// The request as the connector is asked about it now.
    pub(super) fn core<'r>(&'r self, reqs: &'r [Prepared]) -> &'r Request {
        self.grown.as_ref().unwrap_or(&reqs[self.req].core)
    }

    /// Positions to compute in all: prompt + outputs − 1.
    pub(super) fn target(&self, reqs: &[Prepared]) -> u32 {
        let p = &reqs[self.req];
        p.core.num_tokens + p.outputs - 1
    }

    /// Its part of a step: `new` positions from `num_computed`.
    fn entry(&self, new: u32) -> Entry {
        if self.num_computed < self.prefill_len {
            Entry::Prefill {
                req: self.req,
                before: self.num_computed,
                new,
            }
        } else {
            Entry::Decode {
                req: self.req,
                context: self.num_computed + 1,
            }
        }
    }
}

/// What the output of a step means for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Output {
    /// Its prefill ended (its prompt's blocks go to the store).
    pub(super) prefill_ended: bool,
    /// It finished.
    pub(super) finished: bool,
}

/// One engine's GPU KV cache and its preemption count.
#[derive(Debug)]
pub(super) struct Gpu {
    cache: LocalCache,
    prefix_cache: bool,
    block_size: u32,
    /// Preemptions so far.
    pub(super) preemptions: u64,
}

impl Gpu {
    /// `capacity` KV blocks; `prefix_cache`: full blocks are cached and hit locally;
    /// `block_size`: tokens per hash the connector is asked about.
    pub(super) fn new(capacity: u64, prefix_cache: bool, block_size: u32) -> Self {
        Self {
            cache: LocalCache::new(capacity),
            prefix_cache,
            block_size,
            preemptions: 0,
        }
    }

    /// KV blocks held by requests.
    pub(super) fn held(&self) -> u64 {
        self.cache.held()
    }

    /// Full 512-token groups of `live` scheduled by `end` join the prefix cache.
    fn promote(&mut self, live: &mut Live, reqs: &[Prepared], end: u32) {
        if !self.prefix_cache {
            return;
        }
        let p = &reqs[live.req];
        let known = end.min(p.core.num_tokens + live.outputs);
        let seq = live.req as u64;
        live.held
            .promote_full(&mut self.cache, known, |k| group_hash(&p.hashes, seq, k));
    }

    fn allocate(
        &mut self,
        live: &mut Live,
        reqs: &[Prepared],
        hits: &[u64],
        end: u32,
        promote: bool,
    ) -> bool {
        if !live.held.allocate(&mut self.cache, hits, end) {
            return false;
        }
        if promote {
            self.promote(live, reqs, end);
        }
        true
    }

    /// Recompute preemption (vLLM `_preempt_request`): blocks freed; its prompt now
    /// includes the outputs produced, and so does the chain it is probed with.
    fn preempt(&mut self, live: &mut Live, reqs: &[Prepared]) {
        live.held.release(&mut self.cache);
        let p = &reqs[live.req];
        live.num_computed = 0;
        live.prefill_len = p.core.num_tokens + live.outputs;
        let blocks = (live.prefill_len / self.block_size.max(1)) as usize;
        let ids: Vec<u64> = (0..blocks)
            .map(|j| block_id_of(&p.hashes, live.req as u64, j, self.block_size))
            .collect();
        live.grown = Some(Request {
            request_id: p.core.request_id,
            num_tokens: live.prefill_len,
            block_hashes: BlockHashes::from_u64s(&ids),
            skip_reading_external_kv: false,
        });
        live.preemptions += 1;
        self.preemptions += 1;
    }

    /// The running pass of a step with `budget` tokens: the entries, and the
    /// requests preempted (moved to the head of `waiting`, in preemption order).
    pub(super) fn schedule_running(
        &mut self,
        running: &mut Vec<Live>,
        waiting: &mut VecDeque<Live>,
        budget: &mut u32,
        reqs: &[Prepared],
    ) -> (Vec<Entry>, Vec<usize>) {
        let mut entries = Vec::new();
        let mut preempted = Vec::new();
        let mut i = 0;
        while i < running.len() && *budget > 0 {
            let live = &running[i];
            let new = if live.num_computed < live.prefill_len {
                (live.prefill_len - live.num_computed).min(*budget)
            } else {
                1
            };
            let end = live.num_computed + new;
            let mut fits = true;
            while !self.allocate(&mut running[i], reqs, &[], end, true) {
                let mut victim = running.pop().expect("the request itself is running");
                let itself = running.len() == i;
                self.preempt(&mut victim, reqs);
                preempted.push(victim.req);
                waiting.push_front(victim);
                if itself {
                    fits = false;
                    break;
                }
            }
            if !fits {
                break;
            }
            let live = &mut running[i];
            entries.push(live.entry(new));
            live.num_computed = end;
            *budget -= new;
            i += 1;
        }
        (entries, preempted)
    }

    /// The local prefix hit of a waiting request that holds nothing: the cached
    /// groups and their tokens (at most the prompt less one token, as vLLM's
    /// `get_computed_blocks`).
    pub(super) fn local_hit(&self, live: &Live, reqs: &[Prepared]) -> (Vec<u64>, u32) {
        if !self.prefix_cache || live.num_computed > 0 {
            return (Vec::new(), 0);
        }
        let p = &reqs[live.req];
        let cap = ((live.prefill_len.max(1) - 1) / TRACE_BLOCK_TOKENS) as usize;
        let chain: Vec<u64> = (0..cap)
            .map(|k| group_hash(&p.hashes, live.req as u64, k))
            .collect();
        let n = self.cache.hit_blocks(&chain, cap);
        let mut hits = chain;
        hits.truncate(n);
        (hits, n as u32 * TRACE_BLOCK_TOKENS)
    }

    /// A waiting request with no external tokens: blocks for its first chunk (after
    /// its local hit `hits`, `computed` tokens) within `budget`. `None` (nothing
    /// changed) when they do not fit: the waiting pass ends.
    pub(super) fn admit_compute(
        &mut self,
        live: &mut Live,
        reqs: &[Prepared],
        hits: &[u64],
        computed: u32,
        budget: u32,
    ) -> Option<(Entry, u32)> {
        let new = (live.prefill_len - computed).min(budget);
        let end = computed + new;
        if !self.allocate(live, reqs, hits, end, true) {
            return None;
        }
        live.num_computed = computed;
        let entry = live.entry(new);
        live.num_computed = end;
        Some((entry, new))
    }

    /// A waiting request with `external` tokens to load after its local hit: blocks
    /// for both (not cached until loaded). False (nothing changed) when they do not
    /// fit.
    pub(super) fn admit_load(
        &mut self,
        live: &mut Live,
        reqs: &[Prepared],
        hits: &[u64],
        end: u32,
    ) -> bool {
        if !self.allocate(live, reqs, hits, end, false) {
            return false;
        }
        live.num_computed = end;
        true
    }

    /// Its load ended: the loaded full blocks join the prefix cache.
    pub(super) fn loaded(&mut self, live: &mut Live, reqs: &[Prepared]) {
        let end = live.num_computed;
        self.promote(live, reqs, end);
    }

    /// The output of `entry` for `live` (vLLM `update_from_output`); a finished
    /// request's blocks are freed.
    pub(super) fn output(&mut self, live: &mut Live, entry: &Entry, reqs: &[Prepared]) -> Output {
        let (before, new) = match *entry {
            Entry::Prefill { before, new, .. } => (before, new),
            Entry::Decode { context, .. } => (context - 1, 1),
        };
        let after = before + new;
        let mut out = Output {
            prefill_ended: false,
            finished: false,
        };
        if after < live.prefill_len {
            return out;
        }
        live.outputs += 1;
        out.prefill_ended = before < live.prefill_len;
        if after >= live.target(reqs) {
            live.held.release(&mut self.cache);
            out.finished = true;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::replay::engine::EngineModel;
    use crate::simulate::budget::WaitBudget;
    use crate::simulate::engine::{SimParams, StoreParams, simulate};
    use crate::simulate::mode::{LookupParams, Mode};
    use crate::simulate::server::ServerParams;
    use crate::simulate::trace::TraceRequest;

    fn req(timestamp: u64, input_length: u32, output_length: u32, ids: &[u64]) -> TraceRequest {
        TraceRequest {
            timestamp,
            input_length,
            output_length,
            hash_ids: ids.to_vec(),
        }
    }

    /// Round numbers: a step costs 10 ms + 10 µs per prefill token; one engine.
    fn model(gpu_kv_blocks: u64) -> EngineModel {
        EngineModel {
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            step_fixed_s: 0.01,
            prefill_token_s: 0.000_01,
            prefill_pair_s: 0.0,
            decode_seq_s: 0.0,
            decode_ctx_token_s: 0.0,
            load_fixed_s: 0.0,
            load_block_s: 0.002,
            max_output_tokens: u32::MAX,
            gpu_kv_blocks,
            prefix_cache: true,
        }
    }

    /// What a run of the replay's step loop does with the GPU, on a virtual clock,
    /// every probe answering `Ready(0)` (an empty store): per request its
    /// preemptions and local hit tokens, and the victims in preemption order.
    fn drive(trace: &[TraceRequest], m: &EngineModel) -> (Vec<u32>, Vec<u32>, Vec<usize>) {
        let t0 = Instant::now();
        let reqs = Prepared::from_trace(trace, t0, 1.0, m.max_output_tokens, 512);
        let mut gpu = Gpu::new(m.gpu_kv_blocks, m.prefix_cache, 512);
        let (mut waiting, mut running) = (VecDeque::new(), Vec::new());
        let mut hit = vec![0u32; reqs.len()];
        let mut pre = vec![0u32; reqs.len()];
        let (mut victims, mut next, mut done) = (Vec::new(), 0, 0);
        let mut now = t0;
        while done < reqs.len() {
            while next < reqs.len() && reqs[next].arrival <= now {
                waiting.push_back(Live::new(next, &reqs[next]));
                next += 1;
            }
            let mut budget = m.max_num_batched_tokens;
            let (mut entries, preempted) =
                gpu.schedule_running(&mut running, &mut waiting, &mut budget, &reqs);
            victims.extend_from_slice(&preempted);
            while preempted.is_empty()
                && budget > 0
                && running.len() < m.max_num_seqs as usize
                && !waiting.is_empty()
            {
                let (hits, local) = gpu.local_hit(&waiting[0], &reqs);
                let Some((entry, new)) =
                    gpu.admit_compute(&mut waiting[0], &reqs, &hits, local, budget)
                else {
                    break;
                };
                let live = waiting.pop_front().expect("non-empty");
                hit[live.req] += local;
                entries.push(entry);
                budget -= new;
                running.push(live);
            }
            if entries.is_empty() {
                now = reqs[next].arrival;
                continue;
            }
            now += Duration::from_secs_f64(m.step_s(&entries));
            for entry in &entries {
                let req = match *entry {
                    Entry::Prefill { req, .. } | Entry::Decode { req, .. } => req,
                };
                let pos = running.iter().position(|l| l.req == req).expect("running");
                if gpu.output(&mut running[pos], entry, &reqs).finished {
                    let live = running.remove(pos);
                    pre[live.req] = live.preemptions;
                    done += 1;
                }
            }
        }
        assert_eq!(gpu.held(), 0, "every block is freed at the end");
        (pre, hit, victims)
    }

    /// The simulator on the same trace with the replay's engine loop (one step at a
    /// time, the scheduler free, lookups answering at once, an external store that
    /// keeps nothing): per request its preemptions and local hit tokens, and the total.
    fn simulated(trace: &[TraceRequest], m: &EngineModel) -> (Vec<u32>, Vec<u32>, u64) {
        let p = SimParams {
            engine: m.sim_engine(1, None),
            // Nothing is stored: every probe answers `Ready(0)`, as in `drive`.
            store: StoreParams {
                capacity_blocks: 0,
                load_fixed_s: 0.0,
                load_block_s: m.load_block_s,
            },
            server: ServerParams {
                fixed_s: 0.0,
                per_call_s: 0.0,
                present_key_s: 0.0,
                absent_key_s: 0.0,
                block_size: 512,
                namespaces: 1,
                chunk_keys: 0,
                concurrency: 1,
                jitter_s: 0.0,
                shared: false,
            },
            lookup: LookupParams {
                wait_budget: WaitBudget::Fixed { s: 0.005 },
                ..LookupParams::default()
            },
            rate_scale: 1.0,
            seed: 0,
            order_seed: 0,
            route_offset: 0,
            timeseries: false,
        };
        let records = std::sync::Mutex::new(Vec::new());
        let r = simulate(trace.iter().cloned().map(Ok), Mode::Sync, &p, &|r| {
            records.lock().expect("lock").push(r.clone());
        })
        .expect("simulate");
        let mut records = records.into_inner().expect("lock");
        records.sort_by_key(|r| r.seq);
        (
            records.iter().map(|r| r.preemptions).collect(),
            records.iter().map(|r| r.local_hit_tokens).collect(),
            r.preemptions,
        )
    }

    /// The simulator's own preemption case (tests/preemption.rs): one engine of 7 x 32
    /// KV blocks; R1 (600 tokens, 1,400 outputs) arrives first, R0 (1,024 tokens,
    /// 1,100 outputs) 5 ms later; both decode until they need more than 224 blocks,
    /// then R0, the most recently admitted, is preempted, and its restart finds its
    /// three full groups (two prompt, one generated) in the prefix cache: 1,536 local
    /// hit tokens. One step at a time (no async scheduling) it is preempted once (four
    /// times with the simulator's batch queue of 2). The replay's GPU and the
    /// simulator's engine agree request by request.
    #[test]
    fn preemption_matches_the_simulator_request_by_request() {
        let trace = vec![req(0, 600, 1400, &[5]), req(5, 1024, 1100, &[1, 2])];
        let m = model(7 * 32);
        let (pre, hit, victims) = drive(&trace, &m);
        assert_eq!(pre, [0, 1]);
        assert_eq!(hit, [0, 1536]);
        assert_eq!(victims, [1]);
        let (sim_pre, sim_hit, sim_total) = simulated(&trace, &m);
        assert_eq!((sim_pre, sim_hit, sim_total), (pre, hit, 1));
    }

    /// Four requests decoding side by side in 7 x 32 blocks (89 blocks each for the
    /// first three, 82 for the fourth at their ends): when one needs a block the
    /// victim is the running request admitted last (vLLM `running.pop()`), R3, then
    /// R2. R2's restart finds its one full prompt group still cached (512 local hit
    /// tokens); R3's was taken by then. Without the prefix cache neither hits, and
    /// the victims are the same. The simulator agrees request by request.
    #[test]
    fn the_victim_is_the_most_recently_admitted() {
        let trace = vec![
            req(0, 512, 900, &[1]),
            req(1, 512, 900, &[2]),
            req(2, 512, 900, &[3]),
            req(3, 700, 600, &[4]),
        ];
        let m = model(7 * 32);
        let (pre, hit, victims) = drive(&trace, &m);
        assert_eq!(pre, [0, 0, 1, 1]);
        assert_eq!(victims, [3, 2]);
        assert_eq!(hit, [0, 0, 512, 0]);
        let (sim_pre, sim_hit, sim_total) = simulated(&trace, &m);
        assert_eq!((sim_pre, sim_hit, sim_total), (pre, hit, 2));
        let cold = EngineModel {
            prefix_cache: false,
            ..m
        };
        let (pre, hit, victims) = drive(&trace, &cold);
        assert_eq!(
            (pre.clone(), hit.clone(), victims),
            (vec![0, 0, 1, 1], vec![0; 4], vec![3, 2])
        );
        assert_eq!(simulated(&trace, &cold), (pre, hit, 2));
    }
}
