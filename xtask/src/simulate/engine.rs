//! A discrete-event model of a vLLM-V1-like engine on a virtual clock.
//!
//! # What is modelled
//!
//! - **Engine loop with async scheduling** (vLLM `EngineCore.step_with_batch_queue`,
//!   batch queue of 2): the engine thread schedules step n+1 and hands it to the GPU
//!   while step n runs, then waits for step n's output and processes it. The GPU runs
//!   steps back to back; scheduler time beyond a step's GPU time is GPU idle time.
//! - **Scheduler** (vLLM `Scheduler.schedule`, FCFS): a token budget
//!   (`max_num_batched_tokens`) and `max_num_seqs`; running requests first (chunked
//!   prefill, one token per decode), preempting the last running request when KV
//!   blocks run out (recompute); then the waiting queue, probed only while budget is
//!   left. A waiting request's local prefix-cache hit is computed, then the connector
//!   is probed. A `Pending` probe skips the request and the scheduler **continues with
//!   the next waiting request** (vLLM's `ext_tokens is None` branch pops the request
//!   into `skipped_waiting_requests` and `continue`s; skipped requests go back to the
//!   head of the queue, in order, after the loop). A request with external tokens
//!   allocates its blocks and waits for the load (`WAITING_FOR_REMOTE_KVS`, the
//!   default `load_async = true`), keeping its place; once loaded it is scheduled
//!   without a new probe. An allocation failure ends the waiting loop (`break`).
//! - **GPU KV cache** ([`store::LocalCache`](super::store)): 512-token blocks with a
//!   prefix cache of full prompt blocks.
//! - **Step cost** ([`EngineParams`]): fixed + per prefill token + per attended
//!   (query, context) pair of prefill + per decode sequence + per context token read
//!   by decode.
//! - **New requests** are handled while the engine thread waits for a step's output
//!   (vLLM #65466, the default) or only between steps. `on_new_request` runs when the
//!   request is handled, so with prefetch the lookup starts then.
//! - **External store** ([`store::ExternalStore`](super::store)): full prompt blocks
//!   written when a request's prefill ends (at the output of its last prefill chunk);
//!   loads serialised on one link at a cost per block.
//! - **Lookup server** ([`server`](super::server)) and the **real connector**
//!   (`lookup_core::Lookups` + `Dispatcher`, [`connector`](super::connector)).
//!
//! # Measured
//!
//! TTFT = arrival to the engine thread processing the output of the step that
//! computed the last prompt token (the first token is then emitted). Queue wait =
//! arrival to the first scheduling (blocks allocated for compute or for a load).

use std::collections::VecDeque;

use anyhow::{Context, bail};
use lookup_core::{BlockHashes, Probe, Request, RequestId, RpcId, Stats};
use serde::Serialize;

use super::connector::{Connector, ConnectorCounts};
use super::mode::{LookupParams, Mode};
use super::server::{LookupServer, ServerParams, nanos};
use super::store::{ExternalStore, LocalCache};
use super::trace::{TRACE_BLOCK_TOKENS, TraceRequest};

/// When new requests are handled by the engine thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ArrivalHandling {
    /// While the engine thread waits for a step's output (vLLM #65466): a request is
    /// handled at its arrival unless the thread is busy scheduling. The default.
    WhileWaiting,
    /// Only between steps (before #65466): a request arriving during a step is handled
    /// when the thread next loops, right before it schedules.
    BetweenSteps,
}

/// The engine and its cost model. Defaults: one H100 SXM 80 GB serving an 8B dense
/// model (Llama-3.1-8B: 32 layers, hidden 4096, 8 KV heads of 128, BF16 weights and
/// KV cache, 128 KiB of KV per token, 64 MiB per 512-token block).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EngineParams {
    /// Token budget of one step (`max_num_batched_tokens`). Default 8192, vLLM V1's
    /// default for the OpenAI server with chunked prefill.
    pub max_num_batched_tokens: u32,
    /// Most running requests (`max_num_seqs`). Default 256, vLLM's default.
    pub max_num_seqs: u32,
    /// GPU KV-cache capacity in 512-token blocks. Default 832: (80 GiB × 0.9
    /// `gpu_memory_utilization` − 15 GiB of weights − ~5 GiB of activations and CUDA
    /// graphs) / 64 MiB per block.
    pub gpu_kv_blocks: u64,
    /// Fixed cost of a step (seconds). Default 0.005: one forward pass reads all 16 GB
    /// of weights, 4.8 ms at the H100's 3.35 TB/s (the decode floor).
    pub step_fixed_s: f64,
    /// Cost per prefill token (seconds). Default 30e-6: 2 × 8.0e9 FLOPs per token at
    /// ~55 % of the H100's 989 dense BF16 TFLOPS.
    pub prefill_token_s: f64,
    /// Cost per attended (query token, context token) pair of prefill (seconds).
    /// Default 1e-9: 4 × 32 layers × 4096 = 524k FLOPs per pair at the same rate. A
    /// chunk of n tokens after c cached or computed ones attends n·c + n(n+1)/2 pairs.
    pub prefill_pair_s: f64,
    /// Cost per decoding request in a step (seconds). Default 20e-6 (sampling and
    /// per-sequence bookkeeping).
    pub decode_seq_s: f64,
    /// Cost per context token a decoding request reads (seconds). Default 39e-9:
    /// 128 KiB of KV per token at 3.35 TB/s.
    pub decode_ctx_token_s: f64,
    /// Engine-thread time per scheduled step, scheduling plus output processing
    /// (seconds). Default 0.002: vLLM #23622 measured `Scheduler.schedule` at
    /// ~2 ms per call.
    pub scheduler_s: f64,
    /// When new requests are handled.
    pub arrivals: ArrivalHandling,
}

impl Default for EngineParams {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            gpu_kv_blocks: 832,
            step_fixed_s: 0.005,
            prefill_token_s: 30e-6,
            prefill_pair_s: 1e-9,
            decode_seq_s: 20e-6,
            decode_ctx_token_s: 39e-9,
            scheduler_s: 0.002,
            arrivals: ArrivalHandling::WhileWaiting,
        }
    }
}

/// The external store. Defaults: 512 GiB of DRAM in Mooncake Store (8192 blocks of
/// 64 MiB), loads over one 200 Gb/s RDMA NIC (~25 GB/s: 2.7 ms per block).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StoreParams {
    /// Capacity in 512-token blocks; least recently used evicted first. Default 8192.
    pub capacity_blocks: u64,
    /// Fixed cost of one load (seconds). Default 0.
    pub load_fixed_s: f64,
    /// Load cost per block (seconds). Default 0.0027.
    pub load_block_s: f64,
}

impl Default for StoreParams {
    fn default() -> Self {
        Self {
            capacity_blocks: 8192,
            load_fixed_s: 0.0,
            load_block_s: 0.0027,
        }
    }
}

/// Everything a run needs besides the trace and the mode.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SimParams {
    /// Engine and cost model.
    pub engine: EngineParams,
    /// External store.
    pub store: StoreParams,
    /// Lookup server.
    pub server: ServerParams,
    /// Lookup settings.
    pub lookup: LookupParams,
    /// Arrival rate multiplier: timestamps are divided by it (2.0 = twice the rate).
    pub rate_scale: f64,
    /// Seed of the server's jitter.
    pub seed: u64,
}

/// What one mode's run measured. Times in nanoseconds of virtual time.
#[derive(Clone, Debug, PartialEq)]
pub struct ModeResult {
    /// The mode.
    pub mode: Mode,
    /// TTFT of each request, in trace order (ns).
    pub ttft_ns: Vec<u64>,
    /// Queue wait of each request (arrival to first scheduling), in trace order (ns).
    pub queue_wait_ns: Vec<u64>,
    /// Engine-thread time blocked on lookups (sync probes), ns.
    pub blocked_ns: u64,
    /// GPU busy time, ns.
    pub gpu_busy_ns: u64,
    /// Time the last request finished, ns from the trace start.
    pub makespan_ns: u64,
    /// Steps run.
    pub steps: u64,
    /// Probes answered `Pending` that deferred a request to a later step.
    pub deferred: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Tokens served from the GPU prefix cache at scheduling.
    pub local_hit_tokens: u64,
    /// Tokens loaded from the external store.
    pub external_hit_tokens: u64,
    /// The core's counters.
    pub stats: Stats,
    /// RPCs sent whose answer was of no use (see the connector).
    pub rpcs_wasted: u64,
    /// Blocks in the external store at the end.
    pub store_blocks: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    Loading { done_at: u64, tokens: u32 },
    Running,
    Finished,
}

#[derive(Debug)]
struct Req {
    core: Request,
    hashes: Vec<u64>,
    arrival: u64,
    /// Positions to compute in all: prompt + outputs − 1.
    target: u32,
    /// Prompt to (re)compute: the input, plus outputs already produced after a preemption.
    prefill_len: u32,
    /// Positions scheduled (vLLM `num_computed_tokens`, advanced at scheduling).
    num_computed: u32,
    /// Output tokens processed.
    outputs: u32,
    /// Bumped on preemption: outputs of steps scheduled before are dropped.
    epoch: u32,
    phase: Phase,
    held_hashed: Vec<u64>,
    held_anonymous: u64,
    prefetch_rpc: Option<RpcId>,
    probed: bool,
    first_scheduled: Option<u64>,
    ttft: Option<u64>,
}

#[derive(Debug)]
struct Entry {
    req: usize,
    epoch: u32,
    /// Positions computed before this step.
    before: u32,
    new: u32,
}

#[derive(Debug)]
struct Step {
    end: u64,
    entries: Vec<Entry>,
}

fn blocks_for(tokens: u32) -> u64 {
    u64::from(tokens.div_ceil(TRACE_BLOCK_TOKENS))
}

/// Runs `trace` through the engine in `mode`. `on_finished` is called once per
/// finished request (for a progress bar).
///
/// # Errors
/// A request that cannot fit the GPU KV cache even alone (naming its 1-based index,
/// the trace line); an invalid lookup configuration; a rate scale that is not a
/// finite positive number; a stalled simulation (a bug, reported rather than hung).
pub fn simulate(
    trace: &[TraceRequest],
    mode: Mode,
    params: &SimParams,
    on_finished: &dyn Fn(),
) -> anyhow::Result<ModeResult> {
    if !(params.rate_scale.is_finite() && params.rate_scale > 0.0) {
        bail!("--rate-scale must be a finite number > 0, got {}", params.rate_scale);
    }
    if params.engine.max_num_batched_tokens == 0 || params.engine.max_num_seqs == 0 {
        bail!("--max-num-batched-tokens and --max-num-seqs must be at least 1");
    }
    for (i, r) in trace.iter().enumerate() {
        let need = blocks_for(r.input_length + r.output_length - 1);
        if need > params.engine.gpu_kv_blocks {
            bail!(
                "request {} ({} input + {} output tokens) needs {need} KV blocks of {TRACE_BLOCK_TOKENS} tokens; \
                 the GPU has {} (--gpu-kv-blocks)",
                i + 1,
                r.input_length,
                r.output_length,
                params.engine.gpu_kv_blocks
            );
        }
    }
    let config = mode.config(&params.lookup, params.server.concurrency.max(1));
    let server = LookupServer::new(params.server.clone(), params.seed);
    let conn = Connector::new(config, server).context("lookup configuration")?;
    let mut sim = Sim::new(trace, mode, params, conn);
    sim.run(on_finished)?;
    Ok(sim.result())
}

struct Sim<'a> {
    trace: &'a [TraceRequest],
    mode: Mode,
    p: &'a SimParams,
    arrival_ns: Vec<u64>,
    next_arrival: usize,
    reqs: Vec<Req>,
    waiting: VecDeque<usize>,
    running: Vec<usize>,
    in_flight: VecDeque<Step>,
    local: LocalCache,
    store: ExternalStore,
    conn: Connector,
    /// Engine-thread clock (ns).
    t: u64,
    gpu_free: u64,
    load_free: u64,
    finished: usize,
    blocked_ns: u64,
    gpu_busy_ns: u64,
    makespan_ns: u64,
    steps: u64,
    deferred: u64,
    preemptions: u64,
    local_hit_tokens: u64,
    external_hit_tokens: u64,
}

impl<'a> Sim<'a> {
    fn new(trace: &'a [TraceRequest], mode: Mode, p: &'a SimParams, conn: Connector) -> Self {
        let arrival_ns = trace
            .iter()
            .map(|r| (r.timestamp as f64 * 1e6 / p.rate_scale).round() as u64)
            .collect();
        Self {
            trace,
            mode,
            p,
            arrival_ns,
            next_arrival: 0,
            reqs: Vec::with_capacity(trace.len()),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight: VecDeque::new(),
            local: LocalCache::new(p.engine.gpu_kv_blocks),
            store: ExternalStore::new(p.store.capacity_blocks),
            conn,
            t: 0,
            gpu_free: 0,
            load_free: 0,
            finished: 0,
            blocked_ns: 0,
            gpu_busy_ns: 0,
            makespan_ns: 0,
            steps: 0,
            deferred: 0,
            preemptions: 0,
            local_hit_tokens: 0,
            external_hit_tokens: 0,
        }
    }

    fn result(self) -> ModeResult {
        let ttft_ns = self.reqs.iter().map(|r| r.ttft.unwrap_or(0)).collect();
        let queue_wait_ns = self
            .reqs
            .iter()
            .map(|r| r.first_scheduled.map_or(0, |s| s - r.arrival))
            .collect();
        ModeResult {
            mode: self.mode,
            ttft_ns,
            queue_wait_ns,
            blocked_ns: self.blocked_ns,
            gpu_busy_ns: self.gpu_busy_ns,
            makespan_ns: self.makespan_ns,
            steps: self.steps,
            deferred: self.deferred,
            preemptions: self.preemptions,
            local_hit_tokens: self.local_hit_tokens,
            external_hit_tokens: self.external_hit_tokens,
            stats: self.conn.stats().clone(),
            rpcs_wasted: ConnectorCounts::clone(self.conn.counts()).rpcs_wasted,
            store_blocks: self.store.len() as u64,
        }
    }

    fn run(&mut self, on_finished: &dyn Fn()) -> anyhow::Result<()> {
        let total = self.trace.len();
        while self.finished < total {
            self.handle_arrivals_until(self.t);
            self.conn.advance_to(self.t, &self.store);
            let mut scheduled = false;
            if self.in_flight.len() < 2 && !(self.running.is_empty() && self.waiting.is_empty()) {
                if let Some(step) = self.schedule()? {
                    self.launch(step);
                    scheduled = true;
                }
            }
            if scheduled && self.in_flight.len() < 2 {
                // Async scheduling: prepare the next step while this one runs.
                continue;
            }
            if let Some(step) = self.in_flight.pop_front() {
                self.wait_until(step.end);
                self.process_output(step, on_finished);
                continue;
            }
            // Idle: nothing on the GPU and nothing schedulable now.
            let lookup_event = self.conn.next_event();
            if lookup_event.is_some_and(|n| n <= self.t) {
                // A reply due now (a zero-latency server): deliver it and schedule again.
                continue;
            }
            // A load already done can only be waiting behind a request that does not
            // fit; it changes nothing until something else happens.
            let load_done = self.next_load_done().filter(|&n| n > self.t);
            let next = [self.arrival_ns.get(self.next_arrival).copied(), lookup_event, load_done]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(n) => self.wait_until(n),
                None => bail!(
                    "{} mode stalled at {:.3} s with {} requests waiting and {} running \
                     (KV cache held by requests that cannot proceed)",
                    self.mode,
                    self.t as f64 / 1e9,
                    self.waiting.len(),
                    self.running.len()
                ),
            }
        }
        Ok(())
    }

    fn next_load_done(&self) -> Option<u64> {
        self.waiting
            .iter()
            .filter_map(|&i| match self.reqs[i].phase {
                Phase::Loading { done_at, .. } => Some(done_at),
                _ => None,
            })
            .min()
    }

    /// The engine thread waits (for a step's output, or idle) until `until`; lookup
    /// replies arrive meanwhile, and new requests too when they are handled while
    /// waiting.
    fn wait_until(&mut self, until: u64) {
        if self.p.engine.arrivals == ArrivalHandling::WhileWaiting {
            while let Some(&a) = self.arrival_ns.get(self.next_arrival) {
                if a > until {
                    break;
                }
                let a = a.max(self.t);
                self.conn.advance_to(a, &self.store);
                self.handle_arrival(a);
            }
        }
        self.conn.advance_to(until, &self.store);
        self.t = self.t.max(until);
    }

    fn handle_arrivals_until(&mut self, now: u64) {
        while self.arrival_ns.get(self.next_arrival).is_some_and(|&a| a <= now) {
            self.handle_arrival(now);
        }
    }

    /// vLLM `add_request`: into the waiting queue, and the connector's `on_new_request`.
    fn handle_arrival(&mut self, now: u64) {
        let idx = self.next_arrival;
        self.next_arrival += 1;
        let tr = &self.trace[idx];
        let hashes = tr.hash_ids[..tr.full_blocks()].to_vec();
        let core = Request {
            request_id: RequestId(idx as u64),
            num_tokens: tr.input_length,
            block_hashes: BlockHashes::from_u64s(&hashes),
            skip_reading_external_kv: false,
        };
        let prefetch_rpc = self.conn.on_new_request(&core, now, &self.store);
        self.reqs.push(Req {
            core,
            hashes,
            arrival: self.arrival_ns[idx],
            target: tr.input_length + tr.output_length - 1,
            prefill_len: tr.input_length,
            num_computed: 0,
            outputs: 0,
            epoch: 0,
            phase: Phase::Waiting,
            held_hashed: Vec::new(),
            held_anonymous: 0,
            prefetch_rpc,
            probed: false,
            first_scheduled: None,
            ttft: None,
        });
        self.waiting.push_back(idx);
    }

    /// Makes `req` hold blocks for its first `end` positions, reusing the local hit
    /// `hits` (only when it holds nothing yet). Full prompt blocks join the prefix
    /// cache unless `promote` is false (blocks still being loaded). False, with nothing
    /// changed, when the blocks do not fit.
    fn allocate(&mut self, idx: usize, hits: &[u64], end: u32, promote: bool) -> bool {
        let r = &mut self.reqs[idx];
        let held = r.held_hashed.len() as u64 + r.held_anonymous;
        let new = blocks_for(end).saturating_sub(held + hits.len() as u64);
        if !self.local.can_allocate(hits, new) {
            return false;
        }
        self.local.reference(hits);
        r.held_hashed.extend_from_slice(hits);
        let ok = self.local.allocate(new);
        debug_assert!(ok);
        r.held_anonymous += new;
        if promote {
            Self::promote_full(&mut self.local, r, end);
        }
        true
    }

    /// The request's anonymous blocks that are now full prompt blocks join the cache.
    fn promote_full(local: &mut LocalCache, r: &mut Req, end: u32) {
        let full = ((end / TRACE_BLOCK_TOKENS) as usize).min(r.hashes.len());
        while r.held_hashed.len() < full && r.held_anonymous > 0 {
            let h = r.hashes[r.held_hashed.len()];
            local.promote(h);
            r.held_anonymous -= 1;
            r.held_hashed.push(h);
        }
    }

    fn release(&mut self, idx: usize) {
        let r = &mut self.reqs[idx];
        self.local.release(&r.held_hashed, r.held_anonymous);
        r.held_hashed.clear();
        r.held_anonymous = 0;
    }

    /// Recompute preemption (vLLM `_preempt_request`): blocks freed, back to the head
    /// of the waiting queue, its prompt now includes the outputs produced so far.
    fn preempt(&mut self, idx: usize, now: u64) {
        self.release(idx);
        let r = &mut self.reqs[idx];
        r.num_computed = 0;
        r.prefill_len = r.core.num_tokens.max(self.trace[idx].input_length + r.outputs);
        r.core.num_tokens = r.prefill_len;
        r.epoch += 1;
        r.phase = Phase::Waiting;
        self.preemptions += 1;
        self.waiting.push_front(idx);
        self.conn.on_preempted(RequestId(idx as u64), now, &self.store);
    }

    /// One call of vLLM's `Scheduler.schedule` at the engine thread's time. Advances
    /// the engine clock by the time blocked on sync lookups and, when a step is built,
    /// by the scheduler's cost.
    fn schedule(&mut self) -> anyhow::Result<Option<Step>> {
        let mut now = self.t;
        let mut budget = self.p.engine.max_num_batched_tokens;
        let mut entries = Vec::new();
        let mut preempted = false;

        // Running requests first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let idx = self.running[i];
            let r = &self.reqs[idx];
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
            while !self.allocate(idx, &[], end, true) {
                let victim = self.running.pop().expect("the request itself is running");
                self.preempt(victim, now);
                preempted = true;
                if victim == idx {
                    fits = false;
                    break;
                }
            }
            if !fits {
                break;
            }
            let r = &mut self.reqs[idx];
            entries.push(Entry {
                req: idx,
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
            while budget > 0 && !self.waiting.is_empty() {
                if self.running.len() >= self.p.engine.max_num_seqs as usize {
                    break;
                }
                let idx = *self.waiting.front().expect("non-empty");
                let mut computed = self.reqs[idx].num_computed;
                let mut hits: Vec<u64> = Vec::new();
                let mut local_tokens = 0;
                let mut external_tokens = 0;
                match self.reqs[idx].phase {
                    Phase::Loading { done_at, .. } if done_at > now => {
                        self.waiting.pop_front();
                        skipped.push(idx);
                        continue;
                    }
                    Phase::Loading { tokens, .. } => {
                        let r = &mut self.reqs[idx];
                        Self::promote_full(&mut self.local, r, tokens);
                        r.num_computed = tokens;
                        r.phase = Phase::Waiting;
                        computed = tokens;
                    }
                    _ => {}
                }
                if computed == 0 {
                    let r = &mut self.reqs[idx];
                    let cap_blocks = ((r.prefill_len - 1) / TRACE_BLOCK_TOKENS) as usize;
                    let hit_blocks = self.local.hit_blocks(&r.hashes, cap_blocks);
                    local_tokens = hit_blocks as u32 * TRACE_BLOCK_TOKENS;
                    hits = r.hashes[..hit_blocks].to_vec();
                    let first_probe = !r.probed;
                    r.probed = true;
                    if first_probe
                        && let Some(rpc) = r.prefetch_rpc
                        && local_tokens >= cap_blocks as u32 * TRACE_BLOCK_TOKENS
                    {
                        self.conn.prefetch_useless(rpc);
                    }
                    let mut answer = self.conn.probe(&self.reqs[idx].core, local_tokens, now, &self.store);
                    if answer == Probe::Pending {
                        if self.mode == Mode::Sync {
                            let (ready, at) =
                                self.conn
                                    .wait_ready(&self.reqs[idx].core, local_tokens, now, &self.store)?;
                            self.blocked_ns += at - now;
                            now = at;
                            answer = ready;
                        } else {
                            self.deferred += 1;
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
                let id = RequestId(idx as u64);
                if external_tokens > 0 {
                    // Load asynchronously: blocks now, compute once loaded.
                    let end = local_tokens + external_tokens;
                    if !self.allocate(idx, &hits, end, false) {
                        break;
                    }
                    self.conn.on_allocated(id, now, &self.store);
                    let blocks = u64::from(external_tokens / TRACE_BLOCK_TOKENS);
                    let start = now.max(self.load_free);
                    let done_at =
                        start + nanos(self.p.store.load_fixed_s) + blocks * nanos(self.p.store.load_block_s);
                    self.load_free = done_at;
                    let r = &mut self.reqs[idx];
                    let first = hits.len();
                    self.store.touch(&r.hashes[first..first + blocks as usize]);
                    r.phase = Phase::Loading { done_at, tokens: end };
                    r.first_scheduled.get_or_insert(now);
                    self.local_hit_tokens += u64::from(local_tokens);
                    self.external_hit_tokens += u64::from(external_tokens);
                    self.waiting.pop_front();
                    skipped.push(idx);
                    continue;
                }
                let r = &self.reqs[idx];
                let new = (r.prefill_len - computed).min(budget);
                let end = computed + new;
                if !self.allocate(idx, &hits, end, true) {
                    break;
                }
                self.conn.on_allocated(id, now, &self.store);
                self.local_hit_tokens += u64::from(local_tokens);
                let r = &mut self.reqs[idx];
                r.first_scheduled.get_or_insert(now);
                r.phase = Phase::Running;
                entries.push(Entry {
                    req: idx,
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

        self.t = now;
        if entries.is_empty() {
            return Ok(None);
        }
        self.t += nanos(self.p.engine.scheduler_s);
        let cost = self.step_cost(&entries);
        let start = self.t.max(self.gpu_free);
        Ok(Some(Step {
            end: start + cost,
            entries,
        }))
    }

    fn step_cost(&self, entries: &[Entry]) -> u64 {
        let e = &self.p.engine;
        let mut s = e.step_fixed_s;
        for en in entries {
            let r = &self.reqs[en.req];
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

    fn launch(&mut self, step: Step) {
        let start = self.t.max(self.gpu_free);
        self.gpu_busy_ns += step.end - start;
        self.gpu_free = step.end;
        self.steps += 1;
        self.in_flight.push_back(step);
    }

    /// vLLM `update_from_output` at the engine thread's time: first tokens, prefill
    /// ends (blocks written to the store), finished requests.
    fn process_output(&mut self, step: Step, on_finished: &dyn Fn()) {
        let now = self.t;
        for en in step.entries {
            let r = &mut self.reqs[en.req];
            if r.epoch != en.epoch || r.phase != Phase::Running {
                continue;
            }
            let after = en.before + en.new;
            if after < r.prefill_len {
                continue;
            }
            r.outputs += 1;
            if en.before < r.prefill_len {
                // Prefill ended: the first token (unless recomputing after preemption),
                // and the prompt's full blocks are written to the store.
                if r.ttft.is_none() {
                    r.ttft = Some(now - r.arrival);
                }
                self.store.put(&r.hashes);
            }
            if after >= r.target {
                r.phase = Phase::Finished;
                self.release(en.req);
                if let Some(pos) = self.running.iter().position(|&x| x == en.req) {
                    self.running.remove(pos);
                }
                self.conn.on_finished(RequestId(en.req as u64), now, &self.store);
                self.finished += 1;
                self.makespan_ns = self.makespan_ns.max(now);
                on_finished();
            }
        }
    }
}
