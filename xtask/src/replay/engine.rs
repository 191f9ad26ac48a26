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
//! - **GPU KV cache, prefix cache and preemption** (`replay::gpu`): the
//!   simulator's block pool and vLLM V1's rules (`gpu_kv_blocks` 16-token blocks,
//!   full blocks cached, recompute preemption of the most recently admitted running
//!   request). A waiting request's probe passes its local prefix hit as
//!   `num_computed_tokens`. With `gpu_kv_blocks` unbounded and `prefix_cache` off,
//!   every probe passes 0 and nothing is preempted (the older comparison).
//! - **Queue time series**: each engine records its waiting, running and held KV
//!   blocks once a second from the first arrival, as the simulator's `--timeseries`
//!   does; a sample is taken when the loop first runs at or after its instant, with
//!   the state of that moment (the loop runs at least once per step and arrival).
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

use super::gpu::{Gpu, Live};
use super::model::Entry;
pub use super::model::{
    BlockSink, EngineModel, EngineResult, Outcomes, Prepared, block_id, block_id_of,
};
use crate::simulate::budget::{RecentLatency, WaitBudget};
use crate::simulate::engine::{SAMPLE_NS, Sample};
use crate::simulate::mode::Mode;

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
    gpu: Gpu,
    /// When the next sample is due, and its number.
    next_sample: (Instant, u64),
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
    /// `client`; `block_size`: the tokens per hash of the requests' chains. Samples
    /// are taken from `t0`, the first arrival.
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
        block_size: u32,
        t0: Instant,
    ) -> Self {
        Self {
            gpu: Gpu::new(model.gpu_kv_blocks, model.prefix_cache, block_size),
            next_sample: (t0, 0),
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
                preemptions: 0,
                preemptions_max: 0,
                samples: Vec::new(),
            },
            on_finished,
        }
    }

    /// Runs until every request has finished; returns the measurements and shuts the
    /// client down.
    pub async fn run(mut self) -> EngineResult {
        loop {
            self.sample(Instant::now());
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
                self.sample(now);
                self.admit(now);
                if now >= step_end {
                    break;
                }
            }
            self.outputs(&entries, Instant::now());
        }
        self.collect_events();
        self.result.preemptions = self.gpu.preemptions;
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
            self.waiting.push_back(Live::new(i, &self.reqs[i]));
        }
    }

    /// Requests whose load is done join the running set.
    fn loaded(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.loading.len() {
            if self.loading[i].0 <= now {
                let (_, mut live) = self.loading.swap_remove(i);
                self.gpu.loaded(&mut live, self.reqs);
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

    /// The engine's state at every sample instant passed by `now`.
    fn sample(&mut self, now: Instant) {
        while self.next_sample.0 <= now {
            let (_, k) = self.next_sample;
            self.result.samples.push(Sample {
                t_ms: k * SAMPLE_NS / 1_000_000,
                engine: 0,
                waiting: (self.waiting.len() + self.loading.len()) as u64,
                running: self.running.len() as u64,
                kv_held: self.gpu.held(),
                preemptions: self.gpu.preemptions,
                lookups_in_flight: self.client.stats().open_rpcs as u64,
            });
            self.next_sample = (self.next_sample.0 + Duration::from_nanos(SAMPLE_NS), k + 1);
        }
    }

    /// Builds the next step: running requests first (preempting when KV blocks run
    /// out), then, unless that preempted, the waiting queue.
    async fn schedule(&mut self) -> Vec<Entry> {
        let mut budget = self.model.max_num_batched_tokens;
        let (mut entries, preempted) =
            self.gpu
                .schedule_running(&mut self.running, &mut self.waiting, &mut budget, self.reqs);
        for &req in &preempted {
            self.client.on_preempted(self.reqs[req].core.request_id);
        }
        if !preempted.is_empty() {
            return entries;
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
            let (hits, local) = self.gpu.local_hit(&self.waiting[i], self.reqs);
            let probe = self.probe(i, local, &mut wait_left).await;
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
            let now = Instant::now();
            let live = &mut self.waiting[i];
            let admitted = if external_tokens > 0 {
                let end = local + external_tokens;
                self.gpu
                    .admit_load(live, self.reqs, &hits, end)
                    .then_some(None)
            } else {
                self.gpu
                    .admit_compute(live, self.reqs, &hits, local, budget)
                    .map(Some)
            };
            // An allocation that does not fit ends the waiting pass (vLLM `break`).
            let Some(compute) = admitted else { break };
            let Some(mut live) = self.waiting.remove(i) else {
                break;
            };
            self.client.on_allocated(self.reqs[req].core.request_id);
            if !std::mem::replace(&mut live.scheduled, true) {
                self.result
                    .queue_wait
                    .push(now.saturating_duration_since(self.reqs[req].arrival));
            }
            match compute {
                None => {
                    self.result.external_hit_tokens += u64::from(external_tokens);
                    let start = self.link_free.max(now);
                    let done = start + self.model.load(external_tokens);
                    self.link_free = done;
                    self.loading.push((done, live));
                }
                Some((entry, new)) => {
                    entries.push(entry);
                    budget -= new;
                    self.running.push(live);
                }
            }
        }
        entries
    }

    /// The probe of waiting request `i`, whose local hit is `local` tokens, in the
    /// mode: sync waits for the answer; `prefetch+wait` waits up to what is left of
    /// the step's budget `wait_left` (set at the step's first wait, lowered by each
    /// wait); the others answer at once. In every async mode a preempted request's
    /// probe first waits up to `lookup_preempted_wait_s` (rule 8, `keep_wait` and
    /// `wait`; the client's `Deadline::Within`).
    async fn probe(&mut self, i: usize, local: u32, wait_left: &mut Option<Duration>) -> Probe {
        let live = &self.waiting[i];
        let core = live.core(self.reqs);
        let preempted = live.preemptions > 0;
        let started = Instant::now();
        let mut answer = if self.mode == Mode::Sync {
            self.client.probe_until(core, local, Deadline::Answer).await
        } else {
            self.client
                .probe_until(core, local, Deadline::Within(Duration::ZERO))
                .await
        };
        if self.mode == Mode::Sync || preempted {
            self.result.blocked += started.elapsed();
        }
        if self.mode != Mode::PrefetchWait
            || answer != Probe::Pending
            || *wait_left == Some(Duration::ZERO)
        {
            return answer;
        }
        let started = Instant::now();
        let budget = *wait_left
            .get_or_insert_with(|| Duration::from_secs_f64(self.wait_budget.seconds(&self.recent)));
        let give_up = started + budget;
        while answer == Probe::Pending {
            let now = Instant::now();
            if now >= give_up {
                break;
            }
            self.client.wait_progress(give_up - now).await;
            answer = self.client.probe(core, local);
        }
        let waited = started.elapsed();
        *wait_left = Some(budget.saturating_sub(waited));
        self.result.blocked += waited;
        answer
    }

    /// The outputs of a step that ended at `now`: first tokens (TTFT), prefill ends
    /// (blocks to the store), finished requests (blocks freed; the running order,
    /// which picks preemption victims, is kept).
    fn outputs(&mut self, entries: &[Entry], now: Instant) {
        for entry in entries {
            let req = match *entry {
                Entry::Prefill { req, .. } | Entry::Decode { req, .. } => req,
            };
            let Some(pos) = self.running.iter().position(|l| l.req == req) else {
                continue;
            };
            let live = &mut self.running[pos];
            let out = self.gpu.output(live, entry, self.reqs);
            if out.prefill_ended {
                if live.outputs == 1 {
                    // The first token is out.
                    let arrival = self.reqs[req].arrival;
                    self.result
                        .ttft
                        .push((req, now.saturating_duration_since(arrival)));
                }
                self.sink.write(&self.reqs[req].block_ids, now);
            }
            if out.finished {
                let live = self.running.remove(pos);
                self.result.preemptions_max = self.result.preemptions_max.max(live.preemptions);
                self.client.on_finished(self.reqs[live.req].core.request_id);
                self.result.finished += 1;
                self.result.last_finish = Some(now);
                (self.on_finished)();
            }
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
