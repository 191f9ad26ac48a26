//! One call of vLLM's `Scheduler.schedule`: running requests, then the waiting
//! queue with its probes, block allocation, preemption, and the step's cost.

use lookup_core::{BlockHashes, Probe};

use super::params::PendingPolicy;
use super::replica::Engine;
use super::world::{Entry, Phase, Req, Step, World};
use crate::mode::Mode;
use crate::server::nanos;
use crate::store::{LocalCache, group_hash};
use crate::trace::TRACE_BLOCK_TOKENS;

impl Engine {
    /// Makes request `idx` hold blocks for its first `end` positions, reusing the local
    /// hit `hits` (only when it holds nothing yet). Full prompt blocks join the prefix
    /// cache unless `promote` is false (blocks still being loaded). False, with nothing
    /// changed, when the blocks do not fit.
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
        let (hashes, seq) = (&r.hashes, r.seq);
        r.held
            .promote_full(local, known, |k| group_hash(hashes, seq, k));
    }

    pub(super) fn release(local: &mut LocalCache, r: &mut Req) {
        r.held.release(local);
    }

    /// Recompute preemption (vLLM `_preempt_request`): blocks freed, back to the head
    /// of the waiting queue; its prompt now includes the outputs produced so far.
    pub(super) fn preempt(&mut self, idx: usize, now: u64, w: &mut World<'_>) {
        let r = &mut w.reqs[idx];
        Self::release(&mut self.local, r);
        r.num_computed = 0;
        r.prefill_len = r.input + r.outputs;
        r.core.num_tokens = r.prefill_len;
        // vLLM's `Request.block_hashes` covers every full block of the prompt and the
        // generated tokens, so the connector's probe after a preemption asks about the
        // grown chain (vllm/v1/request.py, `get_request_block_hasher`).
        let full = (r.prefill_len / TRACE_BLOCK_TOKENS) as usize;
        r.core.block_hashes = BlockHashes::from_u64s(&r.chain(full));
        r.epoch += 1;
        r.phase = Phase::Waiting;
        r.preemptions += 1;
        let id = r.core.request_id;
        self.preemptions += 1;
        self.waiting.push_front(idx);
        self.conn.on_preempted(id, now, &w.store);
    }

    /// One call of vLLM's `Scheduler.schedule` at the engine thread's time. Advances
    /// the engine clock by the time blocked on sync lookups and, when a step is built,
    /// by the scheduler's cost.
    pub(super) fn schedule(&mut self, w: &mut World<'_>) -> anyhow::Result<Option<Step>> {
        let mut now = self.t;
        self.schedule_began = now;
        let mut budget = w.p.engine.max_num_batched_tokens;
        let mut entries = Vec::new();
        let mut preempted = false;
        // Probes of waiting requests in this call: each costs engine-thread time.
        let mut probes: u64 = 0;
        self.waiting_peak = self.waiting_peak.max(self.waiting.len());

        // Running requests first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let idx = self.running[i];
            let r = &w.reqs[idx];
            if r.num_computed >= r.target {
                // Its last token is computing; it ends with that step's output.
                i += 1;
                continue;
            }
            let new = if r.num_computed < r.prefill_len {
                (r.prefill_len - r.num_computed).min(budget)
            } else {
                1
            };
            let end = r.num_computed + new;
            let mut fits = true;
            while !self.allocate(&mut w.reqs[idx], &[], end, true) {
                let victim = self.running.pop().expect("the request itself is running");
                self.preempt(victim, now, w);
                preempted = true;
                if victim == idx {
                    fits = false;
                    break;
                }
            }
            if !fits {
                break;
            }
            let r = &mut w.reqs[idx];
            entries.push(Entry {
                req: idx,
                seq: r.seq,
                epoch: r.epoch,
                before: r.num_computed,
                new,
            });
            r.num_computed = end;
            budget -= new;
            i += 1;
        }

        // Then the waiting queue, unless this step preempted.
        if !preempted {
            let mut skipped = Vec::new();
            // prefetch+wait: what is left of this step's wait budget (ns), set at the
            // first wait: the budget is per step, so a long waiting queue of pending
            // lookups cannot hold the engine thread for a budget each.
            let mut wait_left: Option<u64> = None;
            while budget > 0 && !self.waiting.is_empty() {
                if self.running.len() >= w.p.engine.max_num_seqs as usize {
                    break;
                }
                let idx = *self.waiting.front().expect("non-empty");
                let mut computed = w.reqs[idx].num_computed;
                let mut hits: Vec<u64> = Vec::new();
                let mut local_tokens = 0;
                let mut external_tokens = 0;
                match w.reqs[idx].phase {
                    Phase::Loading { done_at, .. } if done_at > now => {
                        self.waiting.pop_front();
                        skipped.push(idx);
                        continue;
                    }
                    Phase::Loading { tokens, .. } => {
                        let r = &mut w.reqs[idx];
                        if self.prefix_cache {
                            Self::promote_full(&mut self.local, r, tokens);
                        }
                        r.num_computed = tokens;
                        r.phase = Phase::Waiting;
                        computed = tokens;
                    }
                    _ => {}
                }
                if computed == 0 {
                    let r = &mut w.reqs[idx];
                    let cap_blocks = ((r.prefill_len - 1) / TRACE_BLOCK_TOKENS) as usize;
                    // After a preemption the chain covers the generated tokens too.
                    let chain = r.chain(cap_blocks);
                    let hit_blocks = if w.p.engine.local_prefix_cache {
                        self.local.hit_blocks(&chain, cap_blocks)
                    } else {
                        0
                    };
                    local_tokens = hit_blocks as u32 * TRACE_BLOCK_TOKENS;
                    hits = chain[..hit_blocks].to_vec();
                    let first_probe = !r.probed;
                    r.probed = true;
                    r.first_probe.get_or_insert(now);
                    if first_probe && let Some(rpc) = r.prefetch_rpc {
                        let useless = local_tokens >= cap_blocks as u32 * TRACE_BLOCK_TOKENS;
                        self.conn.prefetch_probed(rpc, useless);
                    }
                    let refreshes = self.conn.stats().ttl_refreshes;
                    probes += 1;
                    let mut answer =
                        self.conn
                            .probe(&w.reqs[idx].core, local_tokens, now, &w.store);
                    if first_probe && answer == Probe::Pending {
                        let why = &mut self.first_pending;
                        if self.conn.stats().ttl_refreshes > refreshes {
                            why.expired += 1;
                        } else if w.reqs[idx].prefetched {
                            why.on_the_wire += 1;
                            if self.running.is_empty() && self.in_flight.is_empty() {
                                why.on_the_wire_idle += 1;
                            }
                        } else {
                            why.not_prefetched += 1;
                        }
                    }
                    if answer == Probe::Pending
                        && w.mode == Mode::PrefetchWait
                        && wait_left != Some(0)
                    {
                        // Its lookup is queued or on the wire (a Pending probe always
                        // leaves one): a short wait beats deferring a whole step. Once
                        // the step's budget is spent, no wait starts (one would end
                        // at once, with nothing delivered: every reply due by now
                        // was, during the waits that spent it).
                        let budget_ns = *wait_left.get_or_insert_with(|| {
                            nanos(w.p.lookup.wait_budget.seconds(self.conn.recent_on_wire()))
                        });
                        let (ready, at) = self.conn.wait_ready_until(
                            &w.reqs[idx].core,
                            local_tokens,
                            now,
                            now + budget_ns,
                            &w.store,
                        );
                        self.waits.started += 1;
                        self.waits.budget_ns += budget_ns;
                        self.waits.waited_ns += at - now;
                        if ready != Probe::Pending {
                            self.waits.caught += 1;
                        }
                        wait_left = Some(budget_ns.saturating_sub(at - now));
                        self.blocked_ns += at - now;
                        now = at;
                        answer = ready;
                    }
                    let id = w.reqs[idx].core.request_id;
                    let preempted_ns = self.conn.wait_budget(id);
                    if answer == Probe::Pending && preempted_ns > 0 {
                        // Rule 8 (`wait`): a preempted request is waited for, not
                        // overtaken by the younger requests behind it.
                        let (ready, at) = self.conn.wait_ready_until(
                            &w.reqs[idx].core,
                            local_tokens,
                            now,
                            now.saturating_add(preempted_ns),
                            &w.store,
                        );
                        let pw = &mut self.preempted_waits;
                        pw.started += 1;
                        pw.budget_ns += preempted_ns;
                        pw.waited_ns += at - now;
                        if ready != Probe::Pending {
                            pw.caught += 1;
                        }
                        self.blocked_ns += at - now;
                        now = at;
                        answer = ready;
                    }
                    if answer == Probe::Pending {
                        if w.mode == Mode::Sync {
                            let (ready, at) = self.conn.wait_ready(
                                &w.reqs[idx].core,
                                local_tokens,
                                now,
                                &w.store,
                            )?;
                            self.blocked_ns += at - now;
                            now = at;
                            answer = ready;
                        } else {
                            self.deferred += 1;
                            if w.p.engine.on_pending == PendingPolicy::Wait {
                                break;
                            }
                            self.waiting.pop_front();
                            skipped.push(idx);
                            continue;
                        }
                    }
                    if let Probe::Ready {
                        external_tokens: ext,
                        ..
                    } = answer
                    {
                        external_tokens = ext;
                    }
                    computed = local_tokens;
                }
                w.reqs[idx].ready_at.get_or_insert(now);
                let id = w.reqs[idx].core.request_id;
                if external_tokens > 0 {
                    // Load asynchronously: blocks now, compute once loaded.
                    let end = local_tokens + external_tokens;
                    if !self.allocate(&mut w.reqs[idx], &hits, end, false) {
                        break;
                    }
                    self.conn.on_allocated(id, now, &w.store);
                    let blocks = u64::from(external_tokens / TRACE_BLOCK_TOKENS);
                    let start = now.max(self.load_free);
                    let done_at = start
                        + nanos(w.p.store.load_fixed_s)
                        + blocks * nanos(w.p.store.load_block_s);
                    self.load_free = done_at;
                    let r = &mut w.reqs[idx];
                    let first = hits.len();
                    w.store.touch(&r.hashes[first..first + blocks as usize]);
                    r.phase = Phase::Loading {
                        done_at,
                        tokens: end,
                    };
                    r.first_scheduled.get_or_insert(now);
                    r.load_done.get_or_insert(done_at);
                    r.local_hit_tokens += local_tokens;
                    r.external_hit_tokens += external_tokens;
                    self.local_hit_tokens += u64::from(local_tokens);
                    self.external_hit_tokens += u64::from(external_tokens);
                    self.waiting.pop_front();
                    skipped.push(idx);
                    continue;
                }
                let r = &w.reqs[idx];
                let new = (r.prefill_len - computed).min(budget);
                let end = computed + new;
                if !self.allocate(&mut w.reqs[idx], &hits, end, true) {
                    break;
                }
                self.conn.on_allocated(id, now, &w.store);
                self.local_hit_tokens += u64::from(local_tokens);
                let r = &mut w.reqs[idx];
                r.local_hit_tokens += local_tokens;
                r.first_scheduled.get_or_insert(now);
                r.first_compute.get_or_insert(now);
                r.phase = Phase::Running;
                entries.push(Entry {
                    req: idx,
                    seq: r.seq,
                    epoch: r.epoch,
                    before: computed,
                    new,
                });
                r.num_computed = end;
                budget -= new;
                self.waiting.pop_front();
                self.running.push(idx);
            }
            for idx in skipped.into_iter().rev() {
                self.waiting.push_front(idx);
            }
        }

        // The probes' time passes whether or not a step comes of it.
        self.t = now + probes * nanos(w.p.engine.scheduler_probe_s);
        if entries.is_empty() {
            return Ok(None);
        }
        self.t += nanos(w.p.engine.scheduler_s);
        let cost = Self::step_cost(&entries, w);
        let start = self.t.max(self.gpu_free);
        Ok(Some(Step {
            end: start + cost,
            entries,
        }))
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
