//! A discrete-event model of vLLM-V1-like engines on a virtual clock.
//!
//! # What is modelled
//!
//! - **A deployment of `engines` data-parallel engines** behind a router (round
//!   robin by default, or prefix affinity), sharing one external store. Each engine has
//!   its own GPU, KV cache, scheduler, connector and lookup server (vLLM runs the
//!   lookup server in each engine's worker). Engines interact only through the store;
//!   their actions are interleaved in virtual-time order.
//! - **Engine loop with async scheduling** (vLLM `EngineCore.step_with_batch_queue`,
//!   batch queue of 2): the engine thread schedules step n+1 and hands it to the GPU
//!   while step n runs, then waits for step n's output and processes it. The GPU runs
//!   steps back to back; engine-thread time beyond a step's GPU time is GPU idle time.
//! - **Scheduler** (vLLM `Scheduler.schedule`, FCFS): a token budget
//!   (`max_num_batched_tokens`) and `max_num_seqs`; running requests first (chunked
//!   prefill, one token per decode), preempting the last running request when KV
//!   blocks run out (recompute); then the waiting queue, probed only while budget is
//!   left and no request was preempted in the step. A waiting request's local
//!   prefix-cache hit is computed, then the connector is probed. A `Pending` probe
//!   skips the request and the scheduler **continues with the next waiting request**:
//!   vLLM's `ext_tokens is None` branch pops the request into
//!   `skipped_waiting_requests` and `continue`s, and skipped requests go back to the
//!   head of the queue, in order, after the loop. So a deferred request does not block
//!   those behind it, which may overtake it. A request with external tokens allocates
//!   its blocks and waits for the load (`WAITING_FOR_REMOTE_KVS`, the default
//!   `load_async = true`), keeping its place; once loaded it is scheduled without a
//!   new probe. An allocation failure ends the waiting loop (`break`).
//! - **GPU KV cache** (`store::LocalCache`): 512-token blocks with a prefix cache of
//!   full prompt blocks.
//! - **Step cost** ([`EngineParams`]): fixed + per prefill token + per attended
//!   (query, context) pair of prefill + per decode sequence + per context token read
//!   by decode.
//! - **New requests** are handled while the engine thread waits for a step's output
//!   (vLLM #65466, the default) or only between steps; an idle engine handles them at
//!   once. `on_new_request` runs when the request is handled, so with prefetch the
//!   lookup starts then.
//! - **External store** (`store::ExternalStore`): full prompt blocks written when a
//!   request's prefill ends (at the output of its last prefill chunk); loads
//!   serialised on each engine's link at a cost per block.
//! - **Lookup server** ([`server`](super::server)) and the **real connector**
//!   (`lookup_core::Lookups` + `Dispatcher`, `connector`).
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

use super::connector::Connector;
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

/// Which engine a request goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Router {
    /// Request i goes to engine i mod N, whatever its prompt (a plain load balancer).
    /// Turns of one conversation land on different engines, so their shared prefix
    /// is found in the external store rather than in a GPU's cache. The default.
    RoundRobin,
    /// Requests of one conversation (same second block id, the first after the shared
    /// system prompt) go to the same engine; single-block prompts round robin.
    Prefix,
}

/// What the scheduler does with a waiting request whose probe answers `Pending`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PendingPolicy {
    /// vLLM V1: skip it for this step and continue with the next waiting request
    /// (`skipped_waiting_requests`); it keeps its place at the head of the queue but
    /// requests behind it may be scheduled first. The default.
    Skip,
    /// Strict FCFS: stop the waiting loop; nobody behind it is scheduled this step.
    Wait,
}

/// The engines and their cost model. Defaults: four engines, each one H100 SXM 80 GB
/// serving an 8B dense model (Llama-3.1-8B: 32 layers, hidden 4096, 8 KV heads of
/// 128, BF16 weights and KV cache: 128 KiB of KV per token, 64 MiB per 512-token
/// block).
///
/// Why four: the conversation trace is one hour of a production cluster's traffic
/// (3.4 requests/s, 12k-token prompts on average, ~41k prompt tokens/s); one such
/// engine prefills ~30k tokens/s at best, so a single one would be overloaded about
/// twofold and every mode would measure an ever-growing queue. Four keep each engine
/// busy most of the time without an unbounded backlog.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EngineParams {
    /// Engines (data-parallel replicas) sharing the external store. Default 4.
    pub engines: u32,
    /// How requests are spread over the engines.
    pub router: Router,
    /// Token budget of one step (`max_num_batched_tokens`). Default 8192, vLLM V1's
    /// default for the OpenAI server with chunked prefill.
    pub max_num_batched_tokens: u32,
    /// Most running requests (`max_num_seqs`). Default 256, vLLM's default.
    pub max_num_seqs: u32,
    /// GPU KV-cache capacity per engine, in 512-token blocks. Default 832: (80 GiB ×
    /// 0.9 `gpu_memory_utilization` − 15 GiB of weights − ~5 GiB of activations and
    /// CUDA graphs) / 64 MiB per block.
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
    /// What a `Pending` probe does to the waiting loop.
    pub on_pending: PendingPolicy,
}

impl Default for EngineParams {
    fn default() -> Self {
        Self {
            engines: 4,
            router: Router::RoundRobin,
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
            on_pending: PendingPolicy::Skip,
        }
    }
}

/// The external store, shared by the engines. Defaults: 1 TiB of DRAM in Mooncake
/// Store (16,384 blocks of 64 MiB), loads over one 200 Gb/s RDMA NIC per engine
/// (~25 GB/s: 2.7 ms per block).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StoreParams {
    /// Capacity in 512-token blocks; least recently used evicted first. Default 16,384.
    pub capacity_blocks: u64,
    /// Fixed cost of one load (seconds). Default 0.
    pub load_fixed_s: f64,
    /// Load cost per block (seconds). Default 0.0027.
    pub load_block_s: f64,
}

impl Default for StoreParams {
    fn default() -> Self {
        Self {
            capacity_blocks: 16_384,
            load_fixed_s: 0.0,
            load_block_s: 0.0027,
        }
    }
}

/// Everything a run needs besides the trace and the mode.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimParams {
    /// Engines and cost model.
    pub engine: EngineParams,
    /// External store.
    pub store: StoreParams,
    /// Lookup server (one per engine).
    pub server: ServerParams,
    /// Lookup settings.
    pub lookup: LookupParams,
    /// Arrival rate multiplier: timestamps are divided by it (2.0 = twice the rate).
    /// Default 1.
    pub rate_scale: f64,
    /// Seed of the servers' jitter.
    pub seed: u64,
}

impl Default for SimParams {
    fn default() -> Self {
        Self {
            engine: EngineParams::default(),
            store: StoreParams::default(),
            server: ServerParams::default(),
            lookup: LookupParams::default(),
            rate_scale: 1.0,
            seed: 0,
        }
    }
}

/// What one mode's run measured, summed over the engines. Times in nanoseconds of
/// virtual time.
#[derive(Clone, Debug, PartialEq)]
pub struct ModeResult {
    /// The mode.
    pub mode: Mode,
    /// Engines.
    pub engines: u32,
    /// TTFT of each request, in trace order (ns).
    pub ttft_ns: Vec<u64>,
    /// Queue wait of each request (arrival to first scheduling), in trace order (ns).
    pub queue_wait_ns: Vec<u64>,
    /// Engine-thread time blocked on lookups (sync probes), ns.
    pub blocked_ns: u64,
    /// GPU busy time, all engines, ns.
    pub gpu_busy_ns: u64,
    /// Time the last request finished, ns from the trace start.
    pub makespan_ns: u64,
    /// Steps run.
    pub steps: u64,
    /// Probes answered `Pending` that deferred a request to a later step.
    pub deferred: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Tokens served from the GPU prefix caches at scheduling.
    pub local_hit_tokens: u64,
    /// Tokens loaded from the external store.
    pub external_hit_tokens: u64,
    /// The core's counters, summed over the engines' connectors.
    pub stats: Stats,
    /// RPCs sent whose answer was of no use (see `ModeSummary::rpcs_wasted`).
    pub rpcs_wasted: u64,
    /// RPCs sent to the lookup server, summed over the engines' dispatchers.
    pub rpcs_sent: u64,
    /// Why first probes answered `Pending`.
    pub first_pending: FirstPending,
    /// Blocks in the external store at the end.
    pub store_blocks: u64,
}

/// Why first probes answered `Pending` (each eligible request's first probe at most
/// once). In sync mode these are the probes that blocked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FirstPending {
    /// Not prefetched (a mode without prefetch, every slot taken, backlog full): the
    /// probe started the lookup.
    pub not_prefetched: u64,
    /// Prefetched, but its lookup was still queued or on the wire: the probe came
    /// sooner after arrival than the lookup took.
    pub on_the_wire: u64,
    /// Of `on_the_wire`: the engine had nothing running and no step in flight, so it
    /// scheduled at once on arrival.
    pub on_the_wire_idle: u64,
    /// Prefetched and answered, but older than `lookup_prefetch_ttl_s` by the first
    /// probe: looked up again (rule 6).
    pub expired: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    NotArrived,
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
    input: u32,
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
    /// A lookup was started at arrival (its own RPC or a shared one).
    prefetched: bool,
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

/// A stable 64-bit mix (SplitMix64's finaliser) for prefix routing.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The engine each request goes to.
fn route(trace: &[TraceRequest], engines: u32, router: Router) -> Vec<usize> {
    let n = engines as usize;
    trace
        .iter()
        .enumerate()
        .map(|(i, r)| match (router, r.hash_ids.get(1)) {
            (Router::Prefix, Some(&id)) => (mix(id) % engines as u64) as usize,
            _ => i % n,
        })
        .collect()
}

/// Runs `trace` through the engines in `mode`. `on_finished` is called once per
/// finished request (for a progress bar).
///
/// # Errors
/// A request that cannot fit a GPU's KV cache even alone, or arrives later than 10^18
/// ns (naming its 1-based position in the trace); an invalid lookup configuration; a rate scale that is not a
/// finite positive number; no engine; a stalled simulation (a bug, reported rather
/// than hung).
pub fn simulate(
    trace: &[TraceRequest],
    mode: Mode,
    params: &SimParams,
    on_finished: &dyn Fn(),
) -> anyhow::Result<ModeResult> {
    let e = &params.engine;
    if !(params.rate_scale.is_finite() && params.rate_scale > 0.0) {
        bail!(
            "--rate-scale must be a finite number > 0, got {}",
            params.rate_scale
        );
    }
    if e.engines == 0 || e.max_num_batched_tokens == 0 || e.max_num_seqs == 0 {
        bail!("--engines, --max-num-batched-tokens and --max-num-seqs must be at least 1");
    }
    for (i, r) in trace.iter().enumerate() {
        let positions = u64::from(r.input_length) + u64::from(r.output_length) - 1;
        let need = positions.div_ceil(u64::from(TRACE_BLOCK_TOKENS));
        if need > e.gpu_kv_blocks || positions > u64::from(u32::MAX) {
            bail!(
                "request {} ({} input + {} output tokens) needs {need} KV blocks of {TRACE_BLOCK_TOKENS} tokens; \
                 a GPU has {} (--gpu-kv-blocks)",
                i + 1,
                r.input_length,
                r.output_length,
                e.gpu_kv_blocks
            );
        }
        // Virtual time is u64 nanoseconds: keep arrivals far from overflowing it.
        if r.timestamp as f64 * 1e6 / params.rate_scale > 1e18 {
            bail!(
                "request {} arrives at {} ms, beyond what the simulator's clock holds at rate scale {}",
                i + 1,
                r.timestamp,
                params.rate_scale
            );
        }
    }
    let routes = route(trace, e.engines, e.router);
    let mut engines = Vec::with_capacity(e.engines as usize);
    for id in 0..e.engines as usize {
        let config = mode.config(&params.lookup, params.server.concurrency.max(1));
        let server = LookupServer::new(params.server.clone(), mix(params.seed ^ mix(id as u64)));
        let conn = Connector::new(config, server).context("lookup configuration")?;
        let arrivals: VecDeque<usize> = (0..trace.len()).filter(|&i| routes[i] == id).collect();
        engines.push(Engine::new(arrivals, conn, e.gpu_kv_blocks));
    }
    let mut world = World::new(trace, mode, params);
    loop {
        let next = engines
            .iter()
            .enumerate()
            .filter_map(|(i, en)| en.next_time(&world).map(|t| (t, i)))
            .min();
        let Some((t, i)) = next else { break };
        engines[i].act(t, &mut world, on_finished)?;
    }
    Ok(world.result(mode, &engines))
}

/// What the engines share: the trace, the requests' states, the external store.
struct World<'a> {
    p: &'a SimParams,
    mode: Mode,
    arrival_ns: Vec<u64>,
    reqs: Vec<Req>,
    store: ExternalStore,
}

impl<'a> World<'a> {
    fn new(trace: &'a [TraceRequest], mode: Mode, p: &'a SimParams) -> Self {
        let arrival_ns: Vec<u64> = trace
            .iter()
            .map(|r| (r.timestamp as f64 * 1e6 / p.rate_scale).round() as u64)
            .collect();
        let reqs = trace
            .iter()
            .enumerate()
            .map(|(i, tr)| {
                let hashes = tr.hash_ids[..tr.full_blocks()].to_vec();
                Req {
                    core: Request {
                        request_id: RequestId(i as u64),
                        num_tokens: tr.input_length,
                        block_hashes: BlockHashes::from_u64s(&hashes),
                        skip_reading_external_kv: false,
                    },
                    hashes,
                    arrival: arrival_ns[i],
                    input: tr.input_length,
                    target: tr.input_length + tr.output_length - 1,
                    prefill_len: tr.input_length,
                    num_computed: 0,
                    outputs: 0,
                    epoch: 0,
                    phase: Phase::NotArrived,
                    held_hashed: Vec::new(),
                    held_anonymous: 0,
                    prefetch_rpc: None,
                    prefetched: false,
                    probed: false,
                    first_scheduled: None,
                    ttft: None,
                }
            })
            .collect();
        Self {
            p,
            mode,
            arrival_ns,
            reqs,
            store: ExternalStore::new(p.store.capacity_blocks),
        }
    }

    fn result(self, mode: Mode, engines: &[Engine]) -> ModeResult {
        let mut stats = Stats::default();
        let mut r = ModeResult {
            mode,
            engines: engines.len() as u32,
            ttft_ns: self.reqs.iter().map(|r| r.ttft.unwrap_or(0)).collect(),
            queue_wait_ns: self
                .reqs
                .iter()
                .map(|r| r.first_scheduled.map_or(0, |s| s - r.arrival))
                .collect(),
            blocked_ns: 0,
            gpu_busy_ns: 0,
            makespan_ns: 0,
            steps: 0,
            deferred: 0,
            preemptions: 0,
            local_hit_tokens: 0,
            external_hit_tokens: 0,
            stats: Stats::default(),
            rpcs_wasted: 0,
            rpcs_sent: 0,
            first_pending: FirstPending::default(),
            store_blocks: self.store.len() as u64,
        };
        for e in engines {
            r.blocked_ns += e.blocked_ns;
            r.gpu_busy_ns += e.gpu_busy_ns;
            r.makespan_ns = r.makespan_ns.max(e.makespan_ns);
            r.steps += e.steps;
            r.deferred += e.deferred;
            r.preemptions += e.preemptions;
            r.local_hit_tokens += e.local_hit_tokens;
            r.external_hit_tokens += e.external_hit_tokens;
            r.rpcs_wasted += e.conn.counts().rpcs_wasted;
            r.rpcs_sent += e.conn.counts().rpcs_sent;
            r.first_pending.expired += e.first_pending.expired;
            r.first_pending.on_the_wire += e.first_pending.on_the_wire;
            r.first_pending.on_the_wire_idle += e.first_pending.on_the_wire_idle;
            r.first_pending.not_prefetched += e.first_pending.not_prefetched;
            add_stats(&mut stats, e.conn.stats());
        }
        r.stats = stats;
        r
    }
}

/// Field-wise sum of the core's counters.
fn add_stats(to: &mut Stats, s: &Stats) {
    to.lookups_arrival += s.lookups_arrival;
    to.lookups_probe += s.lookups_probe;
    to.prefetch_ineligible += s.prefetch_ineligible;
    to.prefetch_cap_full += s.prefetch_cap_full;
    to.prefetch_backlog_full += s.prefetch_backlog_full;
    to.rpcs_created += s.rpcs_created;
    to.rpcs_shared += s.rpcs_shared;
    to.rpcs_cancelled += s.rpcs_cancelled;
    to.replies_stale += s.replies_stale;
    to.hits += s.hits;
    to.misses += s.misses;
    to.failed_timed_out += s.failed_timed_out;
    to.failed_malformed += s.failed_malformed;
    to.failed_transport += s.failed_transport;
    to.ttl_refreshes += s.ttl_refreshes;
    to.chain_refreshes += s.chain_refreshes;
    to.promotions += s.promotions;
    to.probes_pending += s.probes_pending;
    to.probes_ready += s.probes_ready;
    to.first_probes_ready += s.first_probes_ready;
    to.first_probes_pending += s.first_probes_pending;
    to.resets += s.resets;
}

/// Where an engine's thread is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// About to run its loop (handle new requests, schedule) at its clock.
    Top,
    /// Waiting until `until` for the output of `awaiting` (or, idle, for something to
    /// happen); lookup replies and, by default, new requests are handled meanwhile.
    Wait { until: u64 },
    /// Every request routed here finished.
    Done,
}

struct Engine {
    conn: Connector,
    local: LocalCache,
    arrivals: VecDeque<usize>,
    unfinished: usize,
    waiting: VecDeque<usize>,
    running: Vec<usize>,
    in_flight: VecDeque<Step>,
    awaiting: Option<Step>,
    state: State,
    /// Engine-thread clock (ns).
    t: u64,
    gpu_free: u64,
    load_free: u64,
    blocked_ns: u64,
    gpu_busy_ns: u64,
    makespan_ns: u64,
    steps: u64,
    deferred: u64,
    preemptions: u64,
    local_hit_tokens: u64,
    external_hit_tokens: u64,
    first_pending: FirstPending,
}

impl Engine {
    fn new(arrivals: VecDeque<usize>, conn: Connector, gpu_kv_blocks: u64) -> Self {
        Self {
            conn,
            local: LocalCache::new(gpu_kv_blocks),
            unfinished: arrivals.len(),
            state: if arrivals.is_empty() {
                State::Done
            } else {
                State::Top
            },
            arrivals,
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
        }
    }

    fn next_arrival(&self, w: &World<'_>) -> Option<u64> {
        self.arrivals.front().map(|&i| w.arrival_ns[i])
    }

    /// When this engine next does something, if ever.
    fn next_time(&self, w: &World<'_>) -> Option<u64> {
        match self.state {
            State::Done => None,
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
                Some(next)
            }
        }
    }

    /// Does what is due at `now` (= [`next_time`](Self::next_time)).
    fn act(&mut self, now: u64, w: &mut World<'_>, on_finished: &dyn Fn()) -> anyhow::Result<()> {
        match self.state {
            State::Done => Ok(()),
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
                    self.process_output(step, w, on_finished);
                }
                Ok(())
            }
        }
    }

    /// One turn of the engine loop at the engine's clock.
    fn top(&mut self, w: &mut World<'_>) -> anyhow::Result<()> {
        if self.unfinished == 0 {
            self.state = State::Done;
            return Ok(());
        }
        while self.next_arrival(w).is_some_and(|a| a <= self.t) {
            self.handle_arrival(self.t, w);
        }
        self.conn.advance_to(self.t, &w.store);
        if self.in_flight.len() < 2 && !(self.running.is_empty() && self.waiting.is_empty()) {
            if let Some(step) = self.schedule(w)? {
                self.launch(step);
                if self.in_flight.len() < 2 {
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
        // A load already done can only be waiting behind a request that does not fit;
        // it changes nothing until something else happens.
        let load_done = self.next_load_done(w).filter(|&n| n > self.t);
        let next = [self.next_arrival(w), lookup_event, load_done]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(until) => {
                self.state = State::Wait { until };
                Ok(())
            }
            None => {
                bail!(
                    "{} mode stalled at {:.3} s with {} requests waiting and {} running \
                     (KV cache held by requests that cannot proceed)",
                    w.mode,
                    self.t as f64 / 1e9,
                    self.waiting.len(),
                    self.running.len()
                )
            }
        }
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
    fn handle_arrival(&mut self, now: u64, w: &mut World<'_>) {
        let idx = self.arrivals.pop_front().expect("an arrival is due");
        let submitted = self.conn.stats().lookups_arrival;
        let rpc = self.conn.on_new_request(&w.reqs[idx].core, now, &w.store);
        let r = &mut w.reqs[idx];
        r.prefetch_rpc = rpc;
        r.prefetched = self.conn.stats().lookups_arrival > submitted;
        r.phase = Phase::Waiting;
        self.waiting.push_back(idx);
    }

    /// Makes request `idx` hold blocks for its first `end` positions, reusing the local
    /// hit `hits` (only when it holds nothing yet). Full prompt blocks join the prefix
    /// cache unless `promote` is false (blocks still being loaded). False, with nothing
    /// changed, when the blocks do not fit.
    fn allocate(&mut self, r: &mut Req, hits: &[u64], end: u32, promote: bool) -> bool {
        let held = r.held_hashed.len() as u64 + r.held_anonymous;
        let new = blocks_for(end).saturating_sub(held + hits.len() as u64);
        if !self.local.can_allocate(hits, new) {
            return false;
        }
        self.local.reference(hits);
        r.held_hashed.extend_from_slice(hits);
        let ok = self.local.allocate(new);
        debug_assert!(ok, "can_allocate said it fits");
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

    fn release(local: &mut LocalCache, r: &mut Req) {
        local.release(&r.held_hashed, r.held_anonymous);
        r.held_hashed.clear();
        r.held_anonymous = 0;
    }

    /// Recompute preemption (vLLM `_preempt_request`): blocks freed, back to the head
    /// of the waiting queue; its prompt now includes the outputs produced so far.
    fn preempt(&mut self, idx: usize, now: u64, w: &mut World<'_>) {
        let r = &mut w.reqs[idx];
        Self::release(&mut self.local, r);
        r.num_computed = 0;
        r.prefill_len = r.input + r.outputs;
        r.core.num_tokens = r.prefill_len;
        r.epoch += 1;
        r.phase = Phase::Waiting;
        self.preemptions += 1;
        self.waiting.push_front(idx);
        self.conn.on_preempted(RequestId(idx as u64), now, &w.store);
    }

    /// One call of vLLM's `Scheduler.schedule` at the engine thread's time. Advances
    /// the engine clock by the time blocked on sync lookups and, when a step is built,
    /// by the scheduler's cost.
    fn schedule(&mut self, w: &mut World<'_>) -> anyhow::Result<Option<Step>> {
        let mut now = self.t;
        let mut budget = w.p.engine.max_num_batched_tokens;
        let mut entries = Vec::new();
        let mut preempted = false;

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
                        Self::promote_full(&mut self.local, r, tokens);
                        r.num_computed = tokens;
                        r.phase = Phase::Waiting;
                        computed = tokens;
                    }
                    _ => {}
                }
                if computed == 0 {
                    let r = &mut w.reqs[idx];
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
                    let refreshes = self.conn.stats().ttl_refreshes;
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
                    if answer == Probe::Pending && w.mode == Mode::PrefetchWait {
                        // Its lookup is queued or on the wire (a Pending probe always
                        // leaves one): a short wait beats deferring a whole step.
                        let deadline = now + nanos(w.p.lookup.wait_budget_s);
                        let (ready, at) = self.conn.wait_ready_until(
                            &w.reqs[idx].core,
                            local_tokens,
                            now,
                            deadline,
                            &w.store,
                        );
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
                let id = RequestId(idx as u64);
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
        self.t += nanos(w.p.engine.scheduler_s);
        let cost = Self::step_cost(&entries, w);
        let start = self.t.max(self.gpu_free);
        Ok(Some(Step {
            end: start + cost,
            entries,
        }))
    }

    fn step_cost(entries: &[Entry], w: &World<'_>) -> u64 {
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

    fn launch(&mut self, step: Step) {
        let start = self.t.max(self.gpu_free);
        self.gpu_busy_ns += step.end - start;
        self.gpu_free = step.end;
        self.steps += 1;
        self.in_flight.push_back(step);
    }

    /// vLLM `update_from_output` at the engine thread's time: first tokens, prefill
    /// ends (blocks written to the store), finished requests.
    fn process_output(&mut self, step: Step, w: &mut World<'_>, on_finished: &dyn Fn()) {
        let now = self.t;
        for en in step.entries {
            let r = &mut w.reqs[en.req];
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
                w.store.put(&r.hashes);
            }
            if after >= r.target {
                r.phase = Phase::Finished;
                Self::release(&mut self.local, r);
                if let Some(pos) = self.running.iter().position(|&x| x == en.req) {
                    self.running.remove(pos);
                }
                self.conn
                    .on_finished(RequestId(en.req as u64), now, &w.store);
                self.unfinished -= 1;
                self.makespan_ns = self.makespan_ns.max(now);
                on_finished();
            }
        }
    }
}
