//! One call of vLLM's `Scheduler.schedule` (vllm/v1/core/sched/scheduler.py, vLLM
//! 0.33), in its named steps: the running requests ([`Engine::schedule_running`],
//! with recompute preemption), then, unless the step preempted, the waiting queue
//! ([`Engine::schedule_waiting`], in `admit.rs`), then the step's cost. Block
//! allocation and release on the GPU's pool are here too.

use lookup_core::BlockHashes;

use super::replica::Engine;
use super::world::{Entry, Req, Step, World};
use crate::server::nanos;
use crate::store::{LocalCache, group_hash};
use crate::trace::TRACE_BLOCK_TOKENS;

/// What one `schedule` call builds while it runs: vLLM's locals of `schedule()`.
pub(super) struct Pass {
    /// The engine thread's clock (ns): sync lookups and waits move it.
    pub(super) now: u64,
    /// Tokens left in this step (`token_budget`).
    pub(super) budget: u32,
    /// The step's requests and their tokens (`num_scheduled_tokens`).
    pub(super) entries: Vec<Entry>,
    /// A request was preempted in this step (`preempted_reqs` non-empty).
    pub(super) preempted: bool,
    /// Probes of waiting requests in this call: each costs engine-thread time.
    pub(super) probes: u64,
    /// prefetch+wait: what is left of this step's wait budget (ns), set at the first
    /// wait: the budget is per step, so a long waiting queue of pending lookups
    /// cannot hold the engine thread for a budget each.
    pub(super) wait_left: Option<u64>,
    /// Waiting requests skipped so far in this pass (`step_skipped_waiting` and
    /// `step_skipped_kv_holding`), back at the head of the queue after it.
    pub(super) skipped: Vec<usize>,
}

impl Engine {
    /// Makes request `r` hold blocks for its first `end` positions, reusing the local
    /// hit `hits` (only when it holds nothing yet). Full blocks join the prefix
    /// cache unless `promote` is false (blocks still being loaded). False, with
    /// nothing changed, when the blocks do not fit.
    pub(super) fn allocate(&mut self, r: &mut Req, hits: &[u64], end: u32, promote: bool) -> bool {
        if !r.held.allocate(&mut self.local, hits, end) {
            return false;
        }
        if promote && self.prefix_cache {
            Self::promote_full(&mut self.local, r, end);
        }
        true
    }

    /// The request's anonymous blocks that are now full join the prefix cache: every
    /// block whose tokens are all known (prompt or generated) and scheduled by `end`,
    /// as vLLM V1's `KVCacheManager.allocate_slots` caches up to
    /// `min(num_computed_tokens + num_new_tokens, request.num_tokens)` tokens
    /// (`cache_blocks`, vllm/v1/core/kv_cache_manager.py), generated tokens included.
    pub(super) fn promote_full(local: &mut LocalCache, r: &mut Req, end: u32) {
        let known = end.min(r.input + r.outputs);
        let (hashes, seq) = (&r.kv_hashes, r.seq);
        r.held
            .promote_full(local, known, |k| group_hash(hashes, seq, k));
    }

    /// Recompute preemption (vLLM `Scheduler._preempt_request`): blocks freed
    /// (`KVCacheManager.free`, through the [`Fence`](super::fence::Fence)), `num_computed_tokens` back to 0, prepended to the
    /// waiting queue; its prompt now includes the outputs produced so far.
    pub(super) fn preempt(&mut self, idx: usize, now: u64, w: &mut World<'_>) {
        let r = &mut w.reqs[idx];
        self.fence
            .free(&mut self.local, r.last_sched_seq, &mut r.held);
        r.num_computed = 0;
        r.prefill_len = r.input + r.outputs;
        r.core.num_tokens = r.prefill_len;
        // vLLM's `Request.block_hashes` covers every full block of the prompt and the
        // generated tokens, so the connector's probe after a preemption asks about the
        // grown chain (vllm/v1/request.py, `get_request_block_hasher`).
        let full = (r.prefill_len / TRACE_BLOCK_TOKENS) as usize;
        r.core.block_hashes = BlockHashes::from_u64s(&r.chain(full));
        r.epoch += 1;
        r.phase = super::world::Phase::Waiting;
        r.preemptions += 1;
        let id = r.core.request_id;
        let seq = r.seq;
        self.preemptions += 1;
        self.waiting.push_front(idx);
        if let Some(log) = &mut self.log {
            log.preempted.push(seq);
        }
        self.conn.on_preempted(id, now, &w.store);
    }

    /// One call of vLLM's `Scheduler.schedule` at the engine thread's time. Advances
    /// the engine clock by the time blocked on sync lookups and, when a step is built,
    /// by the scheduler's cost.
    ///
    /// # Errors
    /// A sync lookup that never answers (`Connector::wait_ready`).
    pub(super) fn schedule(&mut self, w: &mut World<'_>) -> anyhow::Result<Option<Step>> {
        let mut pass = Pass {
            now: self.t,
            budget: w.p.engine.max_num_batched_tokens,
            entries: Vec::new(),
            preempted: false,
            probes: 0,
            wait_left: None,
            skipped: Vec::new(),
        };
        self.schedule_began = pass.now;
        self.waiting_peak = self.waiting_peak.max(self.waiting.len());
        self.schedule_running(&mut pass, w);
        // vLLM: `if not preempted_reqs`: no waiting request is admitted in a step
        // that preempted.
        if !pass.preempted {
            self.schedule_waiting(&mut pass, w)?;
        }
        let step = self.build_step(pass, w);
        if let Some(st) = &step {
            let stamp = self.fence.step_scheduled();
            for en in &st.entries {
                w.reqs[en.req].last_sched_seq = stamp;
            }
        }
        Ok(step)
    }

    /// vLLM `schedule()`, "First, schedule the RUNNING requests": in order, each
    /// gets the rest of its prefill (chunked by the budget) or one decode token;
    /// when its blocks do not fit, the last running request is preempted
    /// (`self.running.pop()`, FCFS) until they do, or until it preempted itself,
    /// which ends the pass (`break`). With deferred frees (async scheduling and a KV
    /// consumer connector) a last running request scheduled in the step in flight
    /// is not preempted: the pass ends there, nothing preempted
    /// (`_request_blocks_can_be_freed`, [`Fence`](super::fence::Fence)).
    fn schedule_running(&mut self, pass: &mut Pass, w: &mut World<'_>) {
        let mut i = 0;
        while i < self.running.len() && pass.budget > 0 {
            let idx = self.running[i];
            let r = &w.reqs[idx];
            if r.num_computed >= r.target {
                // Async scheduling: its last token is computing; it ends with that
                // step's output (vLLM's `num_output_placeholders` check).
                i += 1;
                continue;
            }
            let new = if r.num_computed < r.prefill_len {
                (r.prefill_len - r.num_computed).min(pass.budget)
            } else {
                1
            };
            let end = r.num_computed + new;
            let mut fits = true;
            while !self.allocate(&mut w.reqs[idx], &[], end, true) {
                let last = *self.running.last().expect("the request itself is running");
                if !self.fence.can_free(w.reqs[last].last_sched_seq) {
                    // vLLM: "A deferred free will not help with immediate
                    // allocation": the request is not scheduled, and the loop ends.
                    fits = false;
                    break;
                }
                let victim = self.running.pop().expect("the request itself is running");
                self.preempt(victim, pass.now, w);
                pass.preempted = true;
                if victim == idx {
                    fits = false;
                    break;
                }
            }
            if !fits {
                break;
            }
            let r = &mut w.reqs[idx];
            pass.entries.push(Entry {
                req: idx,
                seq: r.seq,
                epoch: r.epoch,
                before: r.num_computed,
                new,
            });
            r.num_computed = end;
            pass.budget -= new;
            i += 1;
        }
    }

    /// The step the pass built, if any, and the engine thread's time for it: the
    /// probes' time passes whether or not a step comes of it.
    fn build_step(&mut self, pass: Pass, w: &World<'_>) -> Option<Step> {
        self.t = pass.now + pass.probes * nanos(w.p.engine.scheduler_probe_s);
        if pass.entries.is_empty() {
            return None;
        }
        self.t += nanos(w.p.engine.scheduler_s);
        let cost = Self::step_cost(&pass.entries, w);
        let start = self.t.max(self.gpu_free);
        Some(Step {
            end: start + cost,
            entries: pass.entries,
        })
    }

    pub(super) fn step_cost(entries: &[Entry], w: &World<'_>) -> u64 {
        let e = &w.p.engine;
        let mut s = e.step_fixed_s;
        for en in entries {
            let r = &w.reqs[en.req];
            let n = f64::from(en.new);
            let c = f64::from(en.before);
            if en.before < r.prefill_len {
                s += n * e.prefill_token_s + (n * c + n * (n + 1.0) / 2.0) * e.prefill_pair_s;
            } else {
                s += e.decode_seq_s + (c + 1.0) * e.decode_ctx_token_s;
            }
        }
        nanos(s)
    }
}
