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

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use lookup_core::{BlockHashes, Event, LookupOutcome, Probe, Request, RequestId};
use lookup_tokio::{ClientStats, KeyLayout, LookupClient};

use super::peers::PutBatch;
use crate::simulate::mode::Mode;
use crate::simulate::trace::{TRACE_BLOCK_TOKENS, TraceRequest};

/// The modelled GPU and scheduler limits of one engine. Defaults: the simulator's
/// ([`EngineParams`](crate::simulate::engine::EngineParams) and
/// [`StoreParams`](crate::simulate::engine::StoreParams)): one H100 serving an 8B
/// model, loads at 2.7 ms per 512-token block.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct EngineModel {
    /// Token budget of one step (`max_num_batched_tokens`).
    pub max_num_batched_tokens: u32,
    /// Most requests running or loading at once (`max_num_seqs`).
    pub max_num_seqs: u32,
    /// Fixed cost of a step (seconds).
    pub step_fixed_s: f64,
    /// Cost per prefill token (seconds).
    pub prefill_token_s: f64,
    /// Cost per attended (query token, context token) pair of prefill (seconds).
    pub prefill_pair_s: f64,
    /// Cost per decoding request in a step (seconds).
    pub decode_seq_s: f64,
    /// Cost per context token a decoding request reads (seconds).
    pub decode_ctx_token_s: f64,
    /// Fixed cost of one load from the store (seconds).
    pub load_fixed_s: f64,
    /// Load cost per 512-token block (seconds).
    pub load_block_s: f64,
    /// Output tokens generated per request at most (the trace's `output_length`
    /// capped): 1 ends each request with its first token, so only prefill loads the
    /// engine.
    pub max_output_tokens: u32,
}

impl Default for EngineModel {
    fn default() -> Self {
        let e = crate::simulate::engine::EngineParams::default();
        let s = crate::simulate::engine::StoreParams::default();
        Self {
            max_num_batched_tokens: e.max_num_batched_tokens,
            max_num_seqs: e.max_num_seqs,
            step_fixed_s: e.step_fixed_s,
            prefill_token_s: e.prefill_token_s,
            prefill_pair_s: e.prefill_pair_s,
            decode_seq_s: e.decode_seq_s,
            decode_ctx_token_s: e.decode_ctx_token_s,
            load_fixed_s: s.load_fixed_s,
            load_block_s: s.load_block_s,
            max_output_tokens: 1,
        }
    }
}

impl EngineModel {
    /// Modelled GPU time of a step (seconds).
    fn step_s(&self, entries: &[Entry]) -> f64 {
        let mut s = self.step_fixed_s;
        for e in entries {
            match *e {
                Entry::Prefill { before, new, .. } => {
                    let (n, c) = (f64::from(new), f64::from(before));
                    s += n * self.prefill_token_s
                        + (n * c + n * (n + 1.0) / 2.0) * self.prefill_pair_s;
                }
                Entry::Decode { context, .. } => {
                    s += self.decode_seq_s + f64::from(context) * self.decode_ctx_token_s;
                }
            }
        }
        s
    }

    /// Modelled time to load `tokens` external tokens.
    fn load(&self, tokens: u32) -> Duration {
        let blocks = tokens.div_ceil(TRACE_BLOCK_TOKENS);
        Duration::from_secs_f64(self.load_fixed_s + f64::from(blocks) * self.load_block_s)
    }
}

/// One request as the engines see it.
#[derive(Debug)]
pub struct Prepared {
    /// What the lookup is asked about (`num_tokens` = the prompt, the hashes of its
    /// full blocks).
    pub core: Request,
    /// The trace's block ids of the full blocks.
    pub block_ids: Vec<u64>,
    /// When it arrives.
    pub arrival: Instant,
    /// Outputs to generate (at least 1).
    pub outputs: u32,
}

impl Prepared {
    /// The trace's requests, arriving from `t0` with arrivals compressed `rate_scale`
    /// times, outputs capped at `max_output_tokens`.
    #[must_use]
    pub fn from_trace(
        trace: &[TraceRequest],
        t0: Instant,
        rate_scale: f64,
        max_output_tokens: u32,
    ) -> Vec<Self> {
        let first = trace.first().map_or(0, |r| r.timestamp);
        trace
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let block_ids = r.hash_ids[..r.full_blocks()].to_vec();
                let offset = (r.timestamp - first) as f64 / 1e3 / rate_scale;
                Self {
                    core: Request {
                        request_id: RequestId(i as u64),
                        num_tokens: r.input_length,
                        block_hashes: BlockHashes::from_u64s(&block_ids),
                        skip_reading_external_kv: false,
                    },
                    block_ids,
                    arrival: t0 + Duration::from_secs_f64(offset),
                    outputs: r.output_length.min(max_output_tokens.max(1)),
                }
            })
            .collect()
    }
}

/// Where finished prefills' blocks go.
#[derive(Clone, Debug)]
pub struct BlockSink {
    /// The writer's queue.
    pub tx: mpsc::Sender<PutBatch>,
    /// Block ids already handed to the writer (by any engine).
    pub written: Arc<Mutex<HashSet<u64>>>,
    /// The store keys of a block.
    pub layout: KeyLayout,
}

impl BlockSink {
    /// Hands the blocks of `ids` not written yet to the writer.
    fn write(&self, ids: &[u64], at: Instant) {
        let fresh: Vec<u64> = {
            let mut written = self
                .written
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            ids.iter()
                .copied()
                .filter(|id| written.insert(*id))
                .collect()
        };
        if fresh.is_empty() {
            return;
        }
        let keys = self
            .layout
            .chain_keys(&BlockHashes::from_u64s(&fresh), fresh.len());
        // The writer outlives the engines; a send fails only if it died, which the
        // run reports from the writer's own stats.
        let _ = self.tx.send(PutBatch { keys, at });
    }
}

/// What one engine measured.
#[derive(Debug)]
pub struct EngineResult {
    /// (request index, TTFT) of each request that got its first token.
    pub ttft: Vec<(usize, Duration)>,
    /// Arrival to first scheduling (compute or load), per scheduled request.
    pub queue_wait: Vec<Duration>,
    /// Requests finished.
    pub finished: u64,
    /// Time the step loop spent waiting in sync probes (or `prefetch+wait` waits).
    pub blocked: Duration,
    /// Probes answered `Pending` that pushed a request to a later step.
    pub deferred: u64,
    /// First probes answered `Pending` on an idle engine (nothing running or loading):
    /// it probes a request as soon as it arrives, before its prefetch can answer.
    pub first_pending_idle: u64,
    /// Steps run.
    pub steps: u64,
    /// Tokens loaded from the store instead of computed.
    pub external_hit_tokens: u64,
    /// Lookup RPCs: send to end (`Event::LookupDone::on_wire`), µs.
    pub on_wire_us: Histogram<u64>,
    /// Lookup RPCs: submission to end (`Event::LookupDone::total`), µs.
    pub total_us: Histogram<u64>,
    /// Lookup RPC outcomes: hit, miss, malformed, failed (timeouts included), timed out.
    pub outcomes: Outcomes,
    /// The client's counters at the end.
    pub stats: ClientStats,
    /// When the last request finished.
    pub last_finish: Option<Instant>,
}

/// Lookup RPC outcomes, counted from the client's events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Outcomes {
    /// Replies with hit tokens > 0.
    pub hit: u64,
    /// Replies of 0 tokens.
    pub miss: u64,
    /// Malformed replies.
    pub malformed: u64,
    /// Timed out.
    pub timed_out: u64,
    /// Failed otherwise (transport, not sent).
    pub failed: u64,
}

#[derive(Debug, Clone, Copy)]
enum Entry {
    Prefill { req: usize, before: u32, new: u32 },
    Decode { req: usize, context: u32 },
}

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
    wait_budget: Duration,
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
        wait_budget: Duration,
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
            let probe = self.probe(req).await;
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
    /// its budget; the others answer at once.
    async fn probe(&mut self, req: usize) -> Probe {
        let core = &self.reqs[req].core;
        match self.mode {
            Mode::Sync => {
                let started = Instant::now();
                let answer = self.client.probe_wait(core, 0).await;
                self.result.blocked += started.elapsed();
                answer
            }
            Mode::PrefetchWait => {
                let started = Instant::now();
                let give_up = started + self.wait_budget;
                let mut answer = self.client.probe(core, 0);
                while answer == Probe::Pending {
                    let now = Instant::now();
                    if now >= give_up {
                        break;
                    }
                    self.client.wait_progress(give_up - now).await;
                    answer = self.client.probe(core, 0);
                }
                self.result.blocked += started.elapsed();
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_time_is_the_simulators_cost_model() {
        let model = EngineModel::default();
        let entries = [
            Entry::Prefill {
                req: 0,
                before: 512,
                new: 1024,
            },
            Entry::Decode {
                req: 1,
                context: 1000,
            },
        ];
        // 5 ms fixed; 1024 tokens at 30 µs; 1024·512 + 1024·1025/2 = 1,049,088 pairs at
        // 1 ns; one decode of 20 µs plus 1000 context tokens at 39 ns.
        let want = 0.005 + 0.030_72 + 0.001_049_088 + 0.000_02 + 0.000_039;
        assert!((model.step_s(&entries) - want).abs() < 1e-12);
        assert!((model.step_s(&[]) - 0.005).abs() < 1e-12);
        // 1,025 tokens span 3 blocks of 512, loaded at 2.7 ms each.
        assert_eq!(model.load(1025), Duration::from_secs_f64(0.0081));
    }

    #[test]
    fn arrivals_are_compressed_and_only_full_blocks_are_asked() {
        let trace = [
            TraceRequest {
                timestamp: 1000,
                input_length: 1100,
                output_length: 50,
                hash_ids: vec![7, 8, 9],
            },
            TraceRequest {
                timestamp: 3000,
                input_length: 512,
                output_length: 1,
                hash_ids: vec![7],
            },
        ];
        let t0 = Instant::now();
        let reqs = Prepared::from_trace(&trace, t0, 2.0, 4);
        assert_eq!(reqs[0].arrival, t0);
        assert_eq!(reqs[1].arrival, t0 + Duration::from_secs(1));
        assert_eq!(reqs[0].block_ids, [7, 8]);
        assert_eq!(reqs[0].core.block_hashes, BlockHashes::from_u64s(&[7, 8]));
        assert_eq!(reqs[0].core.num_tokens, 1100);
        assert_eq!((reqs[0].outputs, reqs[1].outputs), (4, 1));
        assert_eq!(reqs[1].core.request_id, RequestId(1));
    }
}
