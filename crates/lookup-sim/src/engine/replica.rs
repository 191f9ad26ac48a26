//! One engine's loop on the virtual clock: when it next acts, what it does then
//! (handle arrivals and replies, schedule, launch a step, process its output).

use std::collections::VecDeque;

use super::fence::Fence;
use super::params::ArrivalHandling;
use super::result::{FirstPending, ModeResult, Waits, add_stats};
use super::sample::Sample;
use super::world::{Phase, Step, World};
use crate::connector::Connector;
use crate::store::LocalCache;

/// Where an engine's thread is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// About to run its loop (handle new requests, schedule) at its clock.
    Top,
    /// Waiting until `until` for the output of `awaiting` (or, idle, for something to
    /// happen; `u64::MAX`: for a request); lookup replies and, by default, new
    /// requests are handled meanwhile.
    Wait { until: u64 },
}

pub(super) struct Engine {
    pub(super) conn: Connector,
    pub(super) local: LocalCache,
    /// Full prompt blocks join the GPU's prefix cache.
    pub(super) prefix_cache: bool,
    /// Requests routed here that have not arrived yet (slots, in arrival order).
    pub(super) arrivals: VecDeque<usize>,
    /// Requests routed here that have not finished.
    pub(super) unfinished: usize,
    pub(super) waiting: VecDeque<usize>,
    pub(super) running: Vec<usize>,
    pub(super) in_flight: VecDeque<Step>,
    pub(super) awaiting: Option<Step>,
    pub(super) state: State,
    /// Engine-thread clock (ns).
    pub(super) t: u64,
    pub(super) gpu_free: u64,
    pub(super) load_free: u64,
    pub(super) blocked_ns: u64,
    pub(super) gpu_busy_ns: u64,
    pub(super) makespan_ns: u64,
    pub(super) steps: u64,
    pub(super) deferred: u64,
    pub(super) preemptions: u64,
    pub(super) local_hit_tokens: u64,
    pub(super) external_hit_tokens: u64,
    pub(super) first_pending: FirstPending,
    pub(super) waits: Waits,
    pub(super) preempted_waits: Waits,
    pub(super) kv_held_block_ns: u128,
    pub(super) kv_time_ns: u128,
    pub(super) kv_peak_blocks: u64,
    pub(super) waiting_peak: usize,
    /// Steps launched since this engine last produced an output token: the livelock
    /// watchdog ([`STALL_STEPS`]).
    pub(super) steps_without_output: u64,
    /// The engine clock when the last `schedule` call began: a load that ended
    /// during that call (while it blocked on sync lookups) was not seen by it.
    pub(super) schedule_began: u64,
    /// A step-driven run's record of the current step's decisions
    /// ([`stepped`](super::stepped)); `None` in a timed run.
    pub(super) log: Option<super::script::Decisions>,
    /// A step-driven run's stand-in connector answers; `None`: the real connector.
    pub(super) script: Option<super::script::Script>,
    /// Block frees deferred while a step that may write the blocks is in flight
    /// (vLLM's `defer_block_free`, [`Fence`]).
    pub(super) fence: Fence,
}

/// Steps an engine may launch without producing a single output token before the run
/// is reported as livelocked. The longest prefill a GPU can hold takes a few hundred
/// chunks (52 at the default token budget), so only a cycle that never ends (requests preempting each other, or
/// themselves, while others hold the KV cache) gets this far.
pub(super) const STALL_STEPS: u64 = 20_000;

impl Engine {
    pub(super) fn new(
        conn: Connector,
        gpu_kv_blocks: u64,
        prefix_cache: bool,
        hash_tokens: u32,
        defer_block_free: bool,
    ) -> Self {
        Self {
            conn,
            local: LocalCache::with_hash_tokens(gpu_kv_blocks, hash_tokens),
            prefix_cache,
            unfinished: 0,
            state: State::Top,
            arrivals: VecDeque::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight: VecDeque::new(),
            awaiting: None,
            t: 0,
            gpu_free: 0,
            load_free: 0,
            blocked_ns: 0,
            gpu_busy_ns: 0,
            makespan_ns: 0,
            steps: 0,
            deferred: 0,
            preemptions: 0,
            local_hit_tokens: 0,
            external_hit_tokens: 0,
            first_pending: FirstPending::default(),
            waits: Waits::default(),
            preempted_waits: Waits::default(),
            kv_held_block_ns: 0,
            kv_time_ns: 0,
            kv_peak_blocks: 0,
            waiting_peak: 0,
            steps_without_output: 0,
            schedule_began: 0,
            log: None,
            script: None,
            fence: Fence::new(defer_block_free),
        }
    }

    /// Request `slot` was routed here; it arrives at its time.
    pub(super) fn route(&mut self, slot: usize) {
        self.arrivals.push_back(slot);
        self.unfinished += 1;
    }

    /// Its state at `t_ns` (`--timeseries`).
    pub(super) fn sample(&self, t_ns: u64, engine: u32) -> Sample {
        Sample {
            t_ms: t_ns / 1_000_000,
            engine,
            waiting: self.waiting.len() as u64,
            running: self.running.len() as u64,
            kv_held: self.local.held(),
            preemptions: self.preemptions,
            lookups_in_flight: self.conn.open_rpcs() as u64,
        }
    }

    /// Requests routed here that have not finished.
    pub(super) fn unfinished(&self) -> usize {
        self.unfinished
    }

    fn next_arrival(&self, w: &World<'_>) -> Option<u64> {
        self.arrivals.front().map(|&i| w.reqs[i].arrival)
    }

    /// When this engine next does something, if it knows (a request routed to it
    /// later may wake it).
    pub(super) fn next_time(&self, w: &World<'_>) -> Option<u64> {
        match self.state {
            State::Top => Some(self.t),
            State::Wait { until } => {
                let mut next = until;
                if let Some(c) = self.conn.next_event() {
                    next = next.min(c.max(self.t));
                }
                if self.awaiting.is_none() || w.p.engine.arrivals == ArrivalHandling::WhileWaiting {
                    if let Some(a) = self.next_arrival(w) {
                        next = next.min(a.max(self.t));
                    }
                }
                (next < u64::MAX).then_some(next)
            }
        }
    }

    /// Does what is due at `now` (= [`next_time`](Self::next_time)).
    pub(super) fn act(&mut self, now: u64, w: &mut World<'_>) -> anyhow::Result<()> {
        match self.state {
            State::Top => self.top(w),
            State::Wait { until } if now < until => {
                // Something happens while the thread waits: a reply, or a new request
                // (handled at once while waiting for output, by default, or when idle).
                self.conn.advance_to(now, &w.store);
                let handles_arrivals =
                    self.awaiting.is_none() || w.p.engine.arrivals == ArrivalHandling::WhileWaiting;
                if handles_arrivals {
                    while self.next_arrival(w).is_some_and(|a| a <= now) {
                        self.handle_arrival(now.max(self.t), w);
                    }
                }
                if self.awaiting.is_none() {
                    // Idle: anything new is a reason to schedule.
                    self.t = self.t.max(now);
                    self.state = State::Top;
                }
                Ok(())
            }
            State::Wait { until } => {
                self.conn.advance_to(until, &w.store);
                self.t = self.t.max(until);
                self.state = State::Top;
                if let Some(step) = self.awaiting.take() {
                    self.process_output(step, w);
                }
                Ok(())
            }
        }
    }

    /// One turn of the engine loop at the engine's clock.
    fn top(&mut self, w: &mut World<'_>) -> anyhow::Result<()> {
        while self.next_arrival(w).is_some_and(|a| a <= self.t) {
            self.handle_arrival(self.t, w);
        }
        if self.unfinished == 0 {
            // Nothing routed here is left: wait for a request (or a late reply).
            self.state = State::Wait { until: u64::MAX };
            return Ok(());
        }
        self.conn.advance_to(self.t, &w.store);
        let queue = w.p.engine.batch_queue as usize;
        if self.in_flight.len() < queue && !(self.running.is_empty() && self.waiting.is_empty()) {
            if self.steps_without_output >= STALL_STEPS {
                return Err(self.stalled(w));
            }
            if let Some(step) = self.schedule(w)? {
                self.launch(step);
                if self.in_flight.len() < queue {
                    // Async scheduling: prepare the next step while this one runs.
                    return Ok(());
                }
            }
        }
        if let Some(step) = self.in_flight.pop_front() {
            self.state = State::Wait { until: step.end };
            self.awaiting = Some(step);
            return Ok(());
        }
        // Idle: nothing on the GPU and nothing schedulable now.
        let lookup_event = self.conn.next_event();
        if lookup_event.is_some_and(|n| n <= self.t) {
            // A reply due now (a zero-latency server): deliver it and schedule again.
            return Ok(());
        }
        // A load that ended while the last `schedule` call ran (blocked on sync
        // lookups) was not seen by it: schedule again.
        let began = self.schedule_began;
        let unseen = self.waiting.iter().any(|&i| {
            matches!(w.reqs[i].phase, Phase::Loading { done_at, .. } if done_at > began && done_at <= self.t)
        });
        if unseen {
            return Ok(());
        }
        // A load done before can only be waiting behind a request that does not fit;
        // it changes nothing until something else happens.
        let load_done = self.next_load_done(w).filter(|&n| n > self.t);
        let next = [self.next_arrival(w), lookup_event, load_done]
            .into_iter()
            .flatten()
            .min();
        self.state = State::Wait {
            until: next.unwrap_or(u64::MAX),
        };
        Ok(())
    }

    /// The error of an engine left with requests and nothing that could move them:
    /// no event left at all (a deadlock), or [`STALL_STEPS`] steps without an output
    /// token (a livelock: time moves, nothing is produced). Either way, whatever the
    /// mode, the run ends with this error rather than spinning.
    pub(super) fn stalled(&self, w: &World<'_>) -> anyhow::Error {
        let how = if self.steps_without_output >= STALL_STEPS {
            format!(
                "livelocked ({} steps without an output token, {} preemptions)",
                self.steps_without_output, self.preemptions
            )
        } else {
            "stalled".to_owned()
        };
        let head = self.waiting.front().map_or(String::new(), |&i| {
            let r = &w.reqs[i];
            format!(
                "; the head of the queue needs {} tokens and holds {} KV blocks, phase {:?}",
                r.prefill_len,
                r.held.blocks(self.local.per_hash()),
                r.phase
            )
        });
        anyhow::anyhow!(
            "{} mode {how} at {:.3} s with {} requests waiting and {} running \
             (KV cache held by requests that cannot proceed: {} of {} KV blocks held{head})",
            w.mode,
            self.t as f64 / 1e9,
            self.waiting.len(),
            self.running.len(),
            self.local.held(),
            self.local.capacity()
        )
    }

    fn next_load_done(&self, w: &World<'_>) -> Option<u64> {
        self.waiting
            .iter()
            .filter_map(|&i| match w.reqs[i].phase {
                Phase::Loading { done_at, .. } => Some(done_at),
                _ => None,
            })
            .min()
    }

    /// vLLM `add_request`: into the waiting queue, and the connector's `on_new_request`.
    pub(super) fn handle_arrival(&mut self, now: u64, w: &mut World<'_>) {
        let idx = self.arrivals.pop_front().expect("an arrival is due");
        let submitted = self.conn.stats().lookups_arrival;
        let rpc = self.conn.on_new_request(&w.reqs[idx].core, now, &w.store);
        let r = &mut w.reqs[idx];
        r.prefetch_rpc = rpc;
        r.prefetched = self.conn.stats().lookups_arrival > submitted;
        r.phase = Phase::Waiting;
        self.waiting.push_back(idx);
    }

    fn launch(&mut self, step: Step) {
        let start = self.t.max(self.gpu_free);
        let gpu = step.end - start;
        self.gpu_busy_ns += gpu;
        self.gpu_free = step.end;
        self.steps += 1;
        self.steps_without_output += 1;
        let held = self.local.held();
        self.kv_held_block_ns += u128::from(held) * u128::from(gpu);
        self.kv_time_ns += u128::from(gpu);
        self.kv_peak_blocks = self.kv_peak_blocks.max(held);
        self.in_flight.push_back(step);
    }

    /// vLLM `update_from_output` at the engine thread's time: first tokens, prefill
    /// ends (blocks written to the store), finished requests.
    pub(super) fn process_output(&mut self, step: Step, w: &mut World<'_>) {
        let now = self.t;
        self.fence.step_processed(&mut self.local);
        for en in step.entries {
            let Some(r) = w.reqs.get_mut(en.req, en.seq) else {
                continue;
            };
            if r.epoch != en.epoch || r.phase != Phase::Running {
                continue;
            }
            let after = en.before + en.new;
            if after < r.prefill_len {
                continue;
            }
            r.outputs += 1;
            self.steps_without_output = 0;
            if en.before < r.prefill_len {
                // Prefill ended: the first token (unless recomputing after preemption),
                // and the prompt's full blocks are written to the store.
                if r.ttft.is_none() {
                    r.first_token(now);
                }
                w.store.put(&r.hashes);
            }
            if after >= r.target {
                self.fence
                    .free(&mut self.local, r.last_sched_seq, &mut r.held);
                let id = r.core.request_id;
                if let Some(pos) = self.running.iter().position(|&x| x == en.req) {
                    self.running.remove(pos);
                }
                self.conn.on_finished(id, now, &w.store);
                if let Some(log) = &mut self.log {
                    log.finished.push(r.seq);
                }
                self.unfinished -= 1;
                self.makespan_ns = self.makespan_ns.max(now);
                w.finish(en.req, now);
            }
        }
    }

    /// Adds this engine's figures to the run's.
    pub(super) fn add_to(&self, r: &mut ModeResult) {
        r.blocked_ns += self.blocked_ns;
        r.gpu_busy_ns += self.gpu_busy_ns;
        r.makespan_ns = r.makespan_ns.max(self.makespan_ns);
        r.steps += self.steps;
        r.deferred += self.deferred;
        r.preemptions += self.preemptions;
        r.local_hit_tokens += self.local_hit_tokens;
        r.external_hit_tokens += self.external_hit_tokens;
        r.rpcs_wasted += self.conn.counts().rpcs_wasted;
        r.rpcs_sent += self.conn.counts().rpcs_sent;
        r.first_pending.add(&self.first_pending);
        r.waits.add(&self.waits);
        r.preempted_waits.add(&self.preempted_waits);
        r.lookups.add(self.conn.lookups());
        add_stats(&mut r.stats, self.conn.stats());
        r.kv_held_block_ns += self.kv_held_block_ns;
        r.kv_time_ns += self.kv_time_ns;
        let cap = self.local.capacity().max(1) as f64;
        r.kv_peak = r.kv_peak.max(self.kv_peak_blocks as f64 / cap);
        r.waiting_peak = r.waiting_peak.max(self.waiting_peak as u64);
    }
}
