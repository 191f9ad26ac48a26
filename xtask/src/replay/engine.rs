//! A real-time model of a vLLM-like engine, driving a real
//! `lookup_tokio::LookupClient`.
//!
//! Simpler than the simulator's engine (`simulate::engine`), on purpose: here the
//! clock is the wall clock, the lookups are real RPCs, and only the GPU is modelled.
//!
//! - **Step loop**, one step at a time (no async scheduling): the scheduler builds a
//!   step, the GPU "runs" it for the modelled step time (the task sleeps), then the
//!   outputs are processed. The scheduler's own time is whatever the code takes,
//!   lookups included: a sync probe blocks the step loop for as long as the RPC
//!   really takes.
//! - **Scheduler** (FCFS, vLLM V1): a token budget (`max_num_batched_tokens`) and
//!   `max_num_seqs`; running requests first (chunked prefill, one token per decode),
//!   then the waiting queue, probed only while budget and sequence slots are left. A
//!   `Pending` probe skips the request for this step and the scheduler continues
//!   with the next (vLLM's `skipped_waiting_requests`). A request with external
//!   tokens allocates and waits for its load (modelled time, serialised per engine)
//!   before its remaining prefill is scheduled; without, its first chunk is scheduled
//!   at once.
//! - **Not modelled**: the GPU KV-cache capacity, preemption and the local (GPU)
//!   prefix cache: every probe passes `num_computed_tokens = 0`, so every stored
//!   prefix is found in Mooncake (the simulator's round-robin case).
//! - **Step time**: the simulator's cost model ([`EngineParams`](crate::simulate::engine::EngineParams)):
//!   fixed + per prefill token + per attended (query, context) pair of prefill + per
//!   decoding request + per context token it reads.
//! - **New requests** are handled at their arrival time, also while a step runs
//!   (vLLM #65466): `on_new_request` (the prefetch) starts then.
//! - **Writes**: when a request's prefill ends (the output of the step that computed
//!   its last prompt token), its full blocks not written before are handed to the
//!   Python store client; they become visible to lookups once it has put them.
//!
//! TTFT = arrival to the end of the step that computed the last prompt token.

use lookup_tokio::Deadline;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use lookup_core::{Event, LookupOutcome, Probe};
use lookup_tokio::{ClientStats, LookupClient};

use super::model::Entry;
pub use super::model::{BlockSink, EngineModel, EngineResult, Outcomes, Prepared, block_id};
use crate::simulate::budget::{RecentLatency, WaitBudget};
use crate::simulate::mode::Mode;

/// A request in the engine.
#[derive(Debug)]
struct Live {
    req: usize,
    /// Prompt tokens computed or loaded.
    computed: u32,
    outputs_left: u32,
    /// The scheduler has probed it at least once.
    probed: bool,
}

/// The engine: its requests, its client, what it measured.
pub struct Engine<'a> {
    model: &'a EngineModel,
    mode: Mode,
    wait_budget: WaitBudget,
    /// On-wire times of the last answered lookups (the adaptive wait budget).
    recent: RecentLatency,
    reqs: &'a [Prepared],
    arrivals: VecDeque<usize>,
    client: LookupClient,
    sink: BlockSink,
    waiting: VecDeque<Live>,
    loading: Vec<(Instant, Live)>,
    running: Vec<Live>,
    link_free: Instant,
    result: EngineResult,
    on_finished: &'a (dyn Fn() + Sync),
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits is a valid histogram")
}

impl<'a> Engine<'a> {
    /// An engine serving `arrivals` (indices into `reqs`, in arrival order) with
    /// `client`.
    #[allow(clippy::too_many_arguments)]
    #[must_use]
    pub fn new(
        model: &'a EngineModel,
        mode: Mode,
        wait_budget: WaitBudget,
        reqs: &'a [Prepared],
        arrivals: VecDeque<usize>,
        client: LookupClient,
        sink: BlockSink,
        on_finished: &'a (dyn Fn() + Sync),
    ) -> Self {
        Self {
            model,
            mode,
            wait_budget,
            recent: RecentLatency::default(),
            reqs,
            arrivals,
            client,
            sink,
            waiting: VecDeque::new(),
            loading: Vec::new(),
            running: Vec::new(),
            link_free: Instant::now(),
            result: EngineResult {
                ttft: Vec::new(),
                queue_wait: Vec::new(),
                finished: 0,
                blocked: Duration::ZERO,
                deferred: 0,
                first_pending_idle: 0,
                steps: 0,
                external_hit_tokens: 0,
                on_wire_us: histogram(),
                total_us: histogram(),
                outcomes: Outcomes::default(),
                stats: ClientStats::default(),
                last_finish: None,
            },
            on_finished,
        }
    }

    /// Runs until every request has finished; returns the measurements and shuts the
    /// client down.
    pub async fn run(mut self) -> EngineResult {
        loop {
            self.admit(Instant::now());
            if self.arrivals.is_empty()
                && self.waiting.is_empty()
                && self.loading.is_empty()
                && self.running.is_empty()
            {
                break;
            }
            let now = Instant::now();
            self.loaded(now);
            let entries = self.schedule().await;
            self.collect_events();
            if entries.is_empty() {
                self.idle().await;
                continue;
            }
            self.result.steps += 1;
            let step_end = Instant::now() + Duration::from_secs_f64(self.model.step_s(&entries));
            // The GPU runs; new requests are handled as they arrive (vLLM #65466).
            loop {
                let next = self.next_arrival().map_or(step_end, |a| a.min(step_end));
                tokio::time::sleep_until(next.into()).await;
                let now = Instant::now();
                self.admit(now);
                if now >= step_end {
                    break;
                }
            }
            self.outputs(&entries, Instant::now());
        }
        self.collect_events();
        self.result.stats = self.client.stats();
        self.client.shutdown().await;
        self.result
    }

    fn next_arrival(&self) -> Option<Instant> {
        self.arrivals.front().map(|&i| self.reqs[i].arrival)
    }

    /// Requests that arrived by `now`: `on_new_request` (prefetch), then the queue.
    fn admit(&mut self, now: Instant) {
        while let Some(&i) = self.arrivals.front() {
            if self.reqs[i].arrival > now {
                break;
            }
            self.arrivals.pop_front();
            self.client.on_new_request(&self.reqs[i].core);
            self.waiting.push_back(Live {
                req: i,
                computed: 0,
                outputs_left: self.reqs[i].outputs,
                probed: false,
            });
        }
    }

    /// Requests whose load is done join the running set.
    fn loaded(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.loading.len() {
            if self.loading[i].0 <= now {
                let (_, live) = self.loading.swap_remove(i);
                self.running.push(live);
            } else {
                i += 1;
            }
        }
    }

    /// Nothing to compute: waits for the next arrival or load, or for a lookup a
    /// waiting request needs.
    async fn idle(&mut self) {
        let now = Instant::now();
        let mut until = self.next_arrival();
        for (at, _) in &self.loading {
            until = Some(until.map_or(*at, |u| u.min(*at)));
        }
        if self.waiting.is_empty() {
            if let Some(until) = until {
                tokio::time::sleep_until(until.into()).await;
            }
        } else {
            // Requests wait for their lookups: wake on the client's progress.
            let cap = now + Duration::from_millis(50);
            let until = until.map_or(cap, |u| u.min(cap));
            self.client
                .wait_progress(until.saturating_duration_since(now))
                .await;
        }
    }

    /// Builds the next step: running requests first, then the waiting queue.
    async fn schedule(&mut self) -> Vec<Entry> {
        let mut budget = self.model.max_num_batched_tokens;
        let mut entries = Vec::new();
        for live in &self.running {
            let prompt = self.reqs[live.req].core.num_tokens;
            if live.computed < prompt {
                let new = budget.min(prompt - live.computed);
                if new > 0 {
                    entries.push(Entry::Prefill {
                        req: live.req,
                        before: live.computed,
                        new,
                    });
                    budget -= new;
                }
            } else if budget > 0 {
                let done = self.reqs[live.req].outputs - live.outputs_left;
                entries.push(Entry::Decode {
                    req: live.req,
                    context: prompt + done,
                });
                budget -= 1;
            }
        }
        let max_seqs = self.model.max_num_seqs as usize;
        // prefetch+wait: the step's wait budget, set at its first wait and shared by
        // the step's probes (as in `simulate`), so a waiting queue of pending lookups
        // cannot hold the engine for a budget each.
        let mut wait_left: Option<Duration> = None;
        let mut i = 0;
        while i < self.waiting.len()
            && budget > 0
            && self.running.len() + self.loading.len() < max_seqs
        {
            let req = self.waiting[i].req;
            let first = !std::mem::replace(&mut self.waiting[i].probed, true);
            // Nothing computing or loading and no step scheduled yet: the request
            // arrived at an idle engine, which probes it at once.
            let idle = self.running.is_empty() && self.loading.is_empty() && entries.is_empty();
            let probe = self.probe(req, &mut wait_left).await;
            let Probe::Ready {
                external_tokens, ..
            } = probe
            else {
                self.result.deferred += 1;
                if first && idle {
                    self.result.first_pending_idle += 1;
                }
                i += 1;
                continue;
            };
            let Some(mut live) = self.waiting.remove(i) else {
                break;
            };
            let now = Instant::now();
            self.client.on_allocated(self.reqs[req].core.request_id);
            self.result
                .queue_wait
                .push(now.saturating_duration_since(self.reqs[req].arrival));
            if external_tokens > 0 {
                live.computed = external_tokens;
                self.result.external_hit_tokens += u64::from(external_tokens);
                let start = self.link_free.max(now);
                let done = start + self.model.load(external_tokens);
                self.link_free = done;
                self.loading.push((done, live));
            } else {
                let prompt = self.reqs[req].core.num_tokens;
                let new = budget.min(prompt);
                entries.push(Entry::Prefill {
                    req,
                    before: 0,
                    new,
                });
                budget -= new;
                self.running.push(live);
            }
        }
        entries
    }

    /// The probe of the mode: sync waits for the answer; `prefetch+wait` waits up to
    /// what is left of the step's budget `wait_left` (set at the step's first wait,
    /// lowered by each wait); the others answer at once.
    async fn probe(&mut self, req: usize, wait_left: &mut Option<Duration>) -> Probe {
        let core = &self.reqs[req].core;
        match self.mode {
            Mode::Sync => {
                let started = Instant::now();
                let answer = self.client.probe_until(core, 0, Deadline::Answer).await;
                self.result.blocked += started.elapsed();
                answer
            }
            Mode::PrefetchWait => {
                let started = Instant::now();
                let mut answer = self.client.probe(core, 0);
                if answer != Probe::Pending || *wait_left == Some(Duration::ZERO) {
                    return answer;
                }
                let budget = *wait_left.get_or_insert_with(|| {
                    Duration::from_secs_f64(self.wait_budget.seconds(&self.recent))
                });
                let give_up = started + budget;
                while answer == Probe::Pending {
                    let now = Instant::now();
                    if now >= give_up {
                        break;
                    }
                    self.client.wait_progress(give_up - now).await;
                    answer = self.client.probe(core, 0);
                }
                let waited = started.elapsed();
                *wait_left = Some(budget.saturating_sub(waited));
                self.result.blocked += waited;
                answer
            }
            Mode::Async | Mode::Prefetch | Mode::PrefetchPlus => self.client.probe(core, 0),
        }
    }

    /// The outputs of a step that ended at `now`.
    fn outputs(&mut self, entries: &[Entry], now: Instant) {
        let mut finished = Vec::new();
        for entry in entries {
            let req = match *entry {
                Entry::Prefill { req, .. } | Entry::Decode { req, .. } => req,
            };
            let Some(pos) = self.running.iter().position(|l| l.req == req) else {
                continue;
            };
            let live = &mut self.running[pos];
            let prompt = self.reqs[req].core.num_tokens;
            match *entry {
                Entry::Prefill { new, .. } => {
                    live.computed += new;
                    if live.computed >= prompt {
                        // The first token is out: the prefill's blocks go to the store.
                        let arrival = self.reqs[req].arrival;
                        self.result
                            .ttft
                            .push((req, now.saturating_duration_since(arrival)));
                        self.sink.write(&self.reqs[req].block_ids, now);
                        live.outputs_left -= 1;
                    }
                }
                Entry::Decode { .. } => live.outputs_left -= 1,
            }
            if live.computed >= prompt && live.outputs_left == 0 {
                finished.push(pos);
            }
        }
        finished.sort_unstable_by(|a, b| b.cmp(a));
        for pos in finished {
            let live = self.running.swap_remove(pos);
            self.client.on_finished(self.reqs[live.req].core.request_id);
            self.result.finished += 1;
            self.result.last_finish = Some(now);
            (self.on_finished)();
        }
    }

    /// Lookup outcomes and latencies from the client's events.
    fn collect_events(&mut self) {
        while let Some(event) = self.client.poll_event() {
            let Event::LookupDone {
                outcome,
                total,
                on_wire,
                ..
            } = event
            else {
                continue;
            };
            let outcome_answered =
                matches!(outcome, LookupOutcome::Hit { .. } | LookupOutcome::Miss);
            let o = &mut self.result.outcomes;
            match outcome {
                LookupOutcome::Hit { .. } => o.hit += 1,
                LookupOutcome::Miss => o.miss += 1,
                LookupOutcome::Malformed => o.malformed += 1,
                LookupOutcome::Failed(lookup_core::RpcFailure::TimedOut) => o.timed_out += 1,
                LookupOutcome::Failed(_) => o.failed += 1,
            }
            let _ = self.result.total_us.record(micros(total));
            let _ = self.result.on_wire_us.record(micros(on_wire));
            if outcome_answered {
                self.recent
                    .record(u64::try_from(on_wire.as_nanos()).unwrap_or(u64::MAX));
            }
        }
    }
}
