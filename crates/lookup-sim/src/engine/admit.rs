//! The waiting half of vLLM's `Scheduler.schedule` (vllm/v1/core/sched/scheduler.py,
//! vLLM 0.33, "Next, schedule the WAITING requests"): for each waiting request in
//! order, its local prefix-cache hit and the connector's probe ([`Engine::look_up`]),
//! then the admission gate and its blocks: a load of external tokens
//! ([`Engine::start_load`]) or its first chunk ([`Engine::start_compute`]).

use lookup_core::Probe;

use super::params::PendingPolicy;
use super::replica::Engine;
use super::scheduler::Pass;
use super::world::{Entry, Phase, World};
use crate::mode::Mode;
use crate::server::nanos;
use crate::store::blocks_for;
use crate::trace::TRACE_BLOCK_TOKENS;

/// What one waiting request did in the waiting loop.
enum Turn {
    /// Admitted: it runs from this step on.
    Admitted,
    /// Skipped for this step (`skip_request`): back at the head after the loop.
    Skipped,
    /// Ends the waiting loop (`break`).
    Stop,
}

/// A waiting request's prefix found: locally, and by the connector.
struct Found {
    /// Local prefix-cache hit (tokens, `num_new_local_computed_tokens`).
    local_tokens: u32,
    /// The cached blocks of that hit.
    hits: Vec<u64>,
    /// The connector's tokens beyond it (`num_external_computed_tokens`).
    external_tokens: u32,
}

impl Engine {
    /// vLLM's waiting loop: while budget is left and fewer than `max_num_seqs` run,
    /// the head of the queue is admitted, skipped (a `Pending` probe, a load not
    /// done) or ends the loop (its blocks do not fit). Requests that hold blocks (a
    /// load in flight or done) are served first, as vLLM drains its
    /// `kv_holding_waiting` queue before `waiting`. Skipped requests go back to the
    /// head in order (`prepend_requests`).
    pub(super) fn schedule_waiting(
        &mut self,
        pass: &mut Pass,
        w: &mut World<'_>,
    ) -> anyhow::Result<()> {
        self.holding_first(w);
        pass.skipped.clear();
        while pass.budget > 0 && !self.waiting.is_empty() {
            if self.running.len() >= w.p.engine.max_num_seqs as usize {
                break;
            }
            let idx = *self.waiting.front().expect("non-empty");
            match self.admit_one(idx, pass, w)? {
                Turn::Admitted => {
                    self.waiting.pop_front();
                    self.running.push(idx);
                }
                Turn::Skipped => {
                    self.waiting.pop_front();
                    pass.skipped.push(idx);
                }
                Turn::Stop => break,
            }
        }
        for idx in std::mem::take(&mut pass.skipped).into_iter().rev() {
            self.waiting.push_front(idx);
        }
        Ok(())
    }

    /// Moves the requests holding blocks (loading or loaded) to the head of the
    /// waiting queue, in their order: vLLM 0.33 keeps them in `kv_holding_waiting`
    /// (`_enqueue_waiting_request`, `_holds_kv_blocks`) and drains that queue first.
    fn holding_first(&mut self, w: &World<'_>) {
        let holds = |i: &usize| holds_blocks(&w.reqs[*i]);
        if !self.waiting.iter().skip_while(|i| holds(i)).any(holds) {
            return;
        }
        let (mut first, rest): (Vec<usize>, Vec<usize>) = self.waiting.drain(..).partition(holds);
        first.extend(rest);
        self.waiting.extend(first);
    }

    /// One waiting request's turn.
    fn admit_one(
        &mut self,
        idx: usize,
        pass: &mut Pass,
        w: &mut World<'_>,
    ) -> anyhow::Result<Turn> {
        let mut found = Found {
            local_tokens: 0,
            hits: Vec::new(),
            external_tokens: 0,
        };
        let mut computed = w.reqs[idx].num_computed;
        match w.reqs[idx].phase {
            // vLLM `_handle_blocked_waiting_request`: still WAITING_FOR_REMOTE_KVS.
            Phase::Loading { done_at, .. } if done_at > pass.now => return Ok(Turn::Skipped),
            // `_update_waiting_for_remote_kv`: loaded blocks are cached.
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
            match self.look_up(idx, pass, w)? {
                Some(f) => found = f,
                None => {
                    self.deferred += 1;
                    if let Some(log) = &mut self.log {
                        log.skipped_pending.push(w.reqs[idx].seq);
                    }
                    if w.p.engine.on_pending == PendingPolicy::Wait {
                        return Ok(Turn::Stop);
                    }
                    return Ok(Turn::Skipped);
                }
            }
            computed = found.local_tokens;
        }
        w.reqs[idx].ready_at.get_or_insert(pass.now);
        let load_async = self
            .script
            .as_ref()
            .map_or(w.p.engine.load_kv_async, |s| s.loads_async(w.reqs[idx].seq));
        if found.external_tokens > 0 && load_async {
            return Ok(self.start_load(idx, &found, pass, w));
        }
        computed += found.external_tokens;
        Ok(self.start_compute(idx, &found, computed, pass, w))
    }

    /// The admission gate `scheduler_reserve_full_isl` (vLLM 0.33
    /// `SchedulerConfig.scheduler_reserve_full_isl`, default true, vllm/config/scheduler.py;
    /// the scheduler passes `full_sequence_must_fit` on every waiting admission and
    /// `KVCacheManager.allocate_slots` returns `None` when the blocks of
    /// `request.num_tokens` beyond its hit do not fit the free blocks,
    /// vllm/v1/core/kv_cache_manager.py; vLLM PR #37307). True when the request may
    /// be admitted.
    fn full_prompt_fits(&self, idx: usize, hits: &[u64], w: &World<'_>) -> bool {
        if !w.p.engine.scheduler_reserve_full_isl {
            return true;
        }
        let r = &w.reqs[idx];
        r.held.fits(&self.local, hits, r.prefill_len, 0)
    }

    /// Blocks that in-flight prefills still need to hold their whole sequence (vLLM
    /// `Scheduler._inflight_prefill_reserved_blocks`, the sum of
    /// `_request_remaining_blocks` over `_inflight_prefills`: requests admitted with
    /// prefill left after their chunk, and requests holding blocks for a load, in
    /// the queue or skipped earlier in this pass, a load started in it included).
    fn inflight_reserved_blocks(&self, pass: &Pass, w: &World<'_>) -> u64 {
        let per = self.local.per_hash();
        let remaining = |i: &usize| {
            let r = &w.reqs[*i];
            blocks_for(r.prefill_len).saturating_sub(r.held.blocks(per))
        };
        let running: u64 = self
            .running
            .iter()
            .filter(|&&i| w.reqs[i].num_computed < w.reqs[i].prefill_len)
            .map(remaining)
            .sum();
        let loading: u64 = self
            .waiting
            .iter()
            .chain(&pass.skipped)
            .filter(|&&i| holds_blocks(&w.reqs[i]))
            .map(remaining)
            .sum();
        running + loading
    }

    /// vLLM's prefix lookup for a request with nothing computed: the local
    /// prefix-cache hit (`KVCacheManager.get_computed_blocks`, capped at
    /// `num_tokens - 1`), then the connector's `get_num_new_matched_tokens` (or
    /// the scripted answer of a step-driven run), with the mode's waits. `None`:
    /// the probe answered `Pending` (vLLM `ext_tokens is None`).
    fn look_up(
        &mut self,
        idx: usize,
        pass: &mut Pass,
        w: &mut World<'_>,
    ) -> anyhow::Result<Option<Found>> {
        let now = pass.now;
        let hash_tokens = self.local.hash_tokens();
        let r = &mut w.reqs[idx];
        let cap_blocks = ((r.prefill_len - 1) / hash_tokens) as usize;
        // After a preemption the chain covers the generated tokens too.
        let chain = r.kv_chain(cap_blocks);
        let hit_blocks = if w.p.engine.local_prefix_cache {
            self.local.hit_blocks(&chain, cap_blocks)
        } else {
            0
        };
        let local_tokens = hit_blocks as u32 * hash_tokens;
        let hits = chain[..hit_blocks].to_vec();
        let first_probe = !r.probed;
        r.probed = true;
        r.first_probe.get_or_insert(now);
        pass.probes += 1;
        if let Some(script) = &mut self.script {
            let answer = script.probe(r.seq, local_tokens, r.prefill_len);
            return Ok(answer.map(|external_tokens| Found {
                local_tokens,
                hits,
                external_tokens,
            }));
        }
        if first_probe && let Some(rpc) = r.prefetch_rpc {
            let cap = (r.prefill_len - 1) / TRACE_BLOCK_TOKENS * TRACE_BLOCK_TOKENS;
            self.conn.prefetch_probed(rpc, local_tokens >= cap);
        }
        let answer = self.probe_connector(idx, local_tokens, first_probe, pass, w)?;
        Ok(match answer {
            Probe::Pending => None,
            Probe::Ready {
                external_tokens, ..
            } => Some(Found {
                local_tokens,
                hits,
                external_tokens,
            }),
        })
    }

    /// The connector's probe and the mode's waits on a `Pending` answer: the
    /// prefetch+wait step budget, the `wait` preemption policy (rule 8), and sync
    /// mode's blocking lookup.
    fn probe_connector(
        &mut self,
        idx: usize,
        local_tokens: u32,
        first_probe: bool,
        pass: &mut Pass,
        w: &mut World<'_>,
    ) -> anyhow::Result<Probe> {
        let mut now = pass.now;
        let refreshes = self.conn.stats().ttl_refreshes;
        let mut answer = self
            .conn
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
        if answer == Probe::Pending && w.mode == Mode::PrefetchWait && pass.wait_left != Some(0) {
            // Its lookup is queued or on the wire (a Pending probe always leaves
            // one): a short wait beats deferring a whole step. Once the step's
            // budget is spent, no wait starts (one would end at once, with nothing
            // delivered: every reply due by now was, during the waits that spent it).
            let budget_ns = *pass.wait_left.get_or_insert_with(|| {
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
            pass.wait_left = Some(budget_ns.saturating_sub(at - now));
            self.blocked_ns += at - now;
            now = at;
            answer = ready;
        }
        let id = w.reqs[idx].core.request_id;
        let preempted_ns = self.conn.wait_budget(id);
        if answer == Probe::Pending && preempted_ns > 0 {
            // Rule 8 (`wait`): a preempted request is waited for, not overtaken by
            // the younger requests behind it.
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
        if answer == Probe::Pending && w.mode == Mode::Sync {
            let (ready, at) =
                self.conn
                    .wait_ready(&w.reqs[idx].core, local_tokens, now, &w.store)?;
            self.blocked_ns += at - now;
            now = at;
            answer = ready;
        }
        pass.now = now;
        Ok(answer)
    }

    /// An asynchronous load of the external tokens (vLLM `load_kv_async`,
    /// `WAITING_FOR_REMOTE_KVS`): blocks now, compute once loaded; it keeps its place
    /// in the queue. Admitted only when the whole prompt fits
    /// ([`full_prompt_fits`](Self::full_prompt_fits)) and its blocks fit beside the
    /// blocks in-flight prefills still need (vLLM's `reserved_blocks` for async
    /// loads, `_inflight_prefill_reserved_blocks`).
    fn start_load(&mut self, idx: usize, found: &Found, pass: &Pass, w: &mut World<'_>) -> Turn {
        let now = pass.now;
        let end = found.local_tokens + found.external_tokens;
        let reserved = self.inflight_reserved_blocks(pass, w);
        let fits = w.reqs[idx]
            .held
            .fits(&self.local, &found.hits, end, reserved);
        if !fits || !self.full_prompt_fits(idx, &found.hits, w) {
            return Turn::Stop;
        }
        if !self.allocate(&mut w.reqs[idx], &found.hits, end, false) {
            return Turn::Stop;
        }
        let id = w.reqs[idx].core.request_id;
        self.conn.on_allocated(id, now, &w.store);
        let first = (found.local_tokens / TRACE_BLOCK_TOKENS) as usize;
        let last = (end.div_ceil(TRACE_BLOCK_TOKENS) as usize).max(first);
        let blocks = (last - first) as u64;
        let done_at = if let Some(script) = &self.script {
            script.load_done_at(w.reqs[idx].seq, now)
        } else {
            let start = now.max(self.load_free);
            let done =
                start + nanos(w.p.store.load_fixed_s) + blocks * nanos(w.p.store.load_block_s);
            self.load_free = done;
            done
        };
        let r = &mut w.reqs[idx];
        let stored = r.hashes.len();
        w.store
            .touch(&r.hashes[first.min(stored)..last.min(stored)]);
        r.phase = Phase::Loading {
            done_at,
            tokens: end,
        };
        r.first_scheduled.get_or_insert(now);
        r.load_done.get_or_insert(done_at);
        // Not an admission: the step log's hits are those of admissions.
        self.count_hits(idx, found, false, w);
        Turn::Skipped
    }

    /// Its first chunk: `computed` positions known (local hit, a load done, or
    /// external tokens loaded synchronously), the rest of the prompt chunked by the
    /// budget, behind the admission gate.
    fn start_compute(
        &mut self,
        idx: usize,
        found: &Found,
        computed: u32,
        pass: &mut Pass,
        w: &mut World<'_>,
    ) -> Turn {
        let now = pass.now;
        let r = &w.reqs[idx];
        let new = (r.prefill_len - computed).min(pass.budget);
        let end = computed + new;
        if !self.full_prompt_fits(idx, &found.hits, w) {
            return Turn::Stop;
        }
        if !self.allocate(&mut w.reqs[idx], &found.hits, end, true) {
            return Turn::Stop;
        }
        let id = w.reqs[idx].core.request_id;
        self.conn.on_allocated(id, now, &w.store);
        self.count_hits(idx, found, true, w);
        let r = &mut w.reqs[idx];
        r.first_scheduled.get_or_insert(now);
        r.first_compute.get_or_insert(now);
        r.phase = Phase::Running;
        pass.entries.push(Entry {
            req: idx,
            seq: r.seq,
            epoch: r.epoch,
            before: computed,
            new,
        });
        r.num_computed = end;
        pass.budget -= new;
        if let Some(log) = &mut self.log {
            log.admitted.push(r.seq);
        }
        Turn::Admitted
    }

    /// The hits go into the request's and the engine's figures, and, for an
    /// admission (`admitted`), the step log's.
    fn count_hits(&mut self, idx: usize, found: &Found, admitted: bool, w: &mut World<'_>) {
        let r = &mut w.reqs[idx];
        r.local_hit_tokens += found.local_tokens;
        r.external_hit_tokens += found.external_tokens;
        self.local_hit_tokens += u64::from(found.local_tokens);
        self.external_hit_tokens += u64::from(found.external_tokens);
        if let Some(log) = self.log.as_mut().filter(|_| admitted) {
            log.local_hits.push((r.seq, found.local_tokens));
            log.external_hits.push((r.seq, found.external_tokens));
        }
    }
}

/// A waiting request that holds KV blocks: its load in flight, or done and not yet
/// admitted (vLLM `Scheduler._holds_kv_blocks`: `num_computed_tokens > 0` or
/// `WAITING_FOR_REMOTE_KVS`). vLLM keeps these in `kv_holding_waiting`, drained
/// first, and counts them in `_inflight_prefills` until their prefill is scheduled.
fn holds_blocks(r: &super::world::Req) -> bool {
    matches!(r.phase, Phase::Loading { .. }) || (r.phase == Phase::Waiting && r.num_computed > 0)
}
