//! The run's parameters: the engines and their cost model, the external store, and
//! the whole run's [`SimParams`].

use anyhow::bail;
use serde::Serialize;

use crate::mode::LookupParams;
use crate::server::ServerParams;
use crate::store::KV_BLOCK_TOKENS;
use crate::trace::TRACE_BLOCK_TOKENS;

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
    /// GPU KV-cache capacity per engine, in vLLM's 16-token KV blocks. Default
    /// 26,624: (80 GiB × 0.9 `gpu_memory_utilization` − 15 GiB of weights − ~5 GiB of
    /// activations and CUDA graphs) / 2 MiB per block (832 blocks of 512 tokens).
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
    /// Engine-thread time per probe of a waiting request in a step (seconds), on top
    /// of `scheduler_s`: each probe is one `get_computed_blocks` walk of the prefix
    /// cache and one `get_num_new_matched_tokens` call into the connector (vLLM
    /// `Scheduler.schedule`'s waiting loop), so a step that probes the whole waiting
    /// queue (the async modes, whose pending requests are skipped and probed again
    /// every step) costs more than one that probes the head. Default 20e-6, an
    /// estimate: two Python calls per waiting request, at the scale of #23622's ~2 ms
    /// per `schedule` call.
    pub scheduler_probe_s: f64,
    /// When new requests are handled.
    pub arrivals: ArrivalHandling,
    /// What a `Pending` probe does to the waiting loop.
    pub on_pending: PendingPolicy,
    /// Steps scheduled ahead: 2 is vLLM's async scheduling (step n+1 is scheduled
    /// while step n runs), 1 schedules after each step's output (as `cargo xtask
    /// replay`'s engine does). Default 2.
    pub batch_queue: u32,
    /// Output tokens per request at most (the trace's `output_length` capped);
    /// `None` keeps the trace's. Default `None`.
    pub max_output_tokens: Option<u32>,
    /// The GPU's prefix cache: off, no request reuses another's blocks on the GPU
    /// (every prefix comes from the external store, as in `cargo xtask replay`).
    /// Default on.
    pub local_prefix_cache: bool,
    /// Tokens under one hash of the GPU's prefix cache: 16 is vLLM's own (every full
    /// 16-token block hashed, `BlockPool.cache_full_blocks`, vllm/v1/core/block_pool.py;
    /// a trace's 512-token block then holds 32 hashes derived from its id), 512 the
    /// trace's coarser groups (hit and evicted whole). A multiple of 16 dividing 512.
    /// Default 512: on the default run 16 costs about ten times the CPU time (one
    /// map entry per 16 tokens held, cached and freed), while the step-by-step
    /// comparison with vLLM (`cargo xtask fidelity --against vllm`) runs at 16.
    pub prefix_hash_tokens: u32,
    /// vLLM 0.33's admission gate `scheduler_reserve_full_isl` (vllm/config/scheduler.py,
    /// default true): a waiting request is admitted only when the KV blocks of its
    /// whole prompt (beyond its local hit) fit in the free blocks, not only its first
    /// chunk's (`allocate_slots(..., full_sequence_must_fit=True)`, vLLM PR #37307).
    /// Default true.
    pub scheduler_reserve_full_isl: bool,
    /// External tokens load asynchronously (vLLM `load_kv_async`: the request waits
    /// in `WAITING_FOR_REMOTE_KVS` until loaded, then is scheduled) or synchronously
    /// (counted as computed at allocation and scheduled in the same step). Default
    /// true, the Mooncake connector's.
    pub load_kv_async: bool,
}

impl Default for EngineParams {
    fn default() -> Self {
        Self {
            engines: 4,
            router: Router::RoundRobin,
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            gpu_kv_blocks: 26_624,
            step_fixed_s: 0.005,
            prefill_token_s: 30e-6,
            prefill_pair_s: 1e-9,
            decode_seq_s: 20e-6,
            decode_ctx_token_s: 39e-9,
            scheduler_s: 0.002,
            scheduler_probe_s: 20e-6,
            arrivals: ArrivalHandling::WhileWaiting,
            on_pending: PendingPolicy::Skip,
            batch_queue: 2,
            max_output_tokens: None,
            local_prefix_cache: true,
            prefix_hash_tokens: TRACE_BLOCK_TOKENS,
            scheduler_reserve_full_isl: true,
            load_kv_async: true,
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
    /// Shuffles the requests that arrive at the same timestamp (a burst) with this
    /// seed; 0 keeps the trace's order. A rerun's perturbation
    /// ([`perturbed`](crate::runner::perturbed)).
    pub order_seed: u64,
    /// Added to the engine a request is routed to (mod the engines): another
    /// assignment of the same requests. A rerun's perturbation. Default 0.
    pub route_offset: u32,
    /// Keep every engine's state once per second of virtual time
    /// ([`ModeResult::timeseries`](super::ModeResult::timeseries), `--timeseries`).
    pub timeseries: bool,
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
            order_seed: 0,
            route_offset: 0,
            timeseries: false,
        }
    }
}

impl SimParams {
    /// Checks what a run cannot work with.
    ///
    /// # Errors
    /// A duration that is negative, NaN or infinite, a rate scale that is not above 0,
    /// no engine, a token budget or sequence limit of 0, a timeout of 0, or a server
    /// or wait budget that does not validate ([`ServerParams::validate`],
    /// [`WaitBudget::validate`](crate::budget::WaitBudget::validate)). Each
    /// message names the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        let e = &self.engine;
        for (flag, v) in [
            ("--prefetch-ttl-s", self.lookup.prefetch_ttl_s),
            ("--lookup-timeout-s", self.lookup.timeout_s),
            ("--step-fixed-ms", e.step_fixed_s * 1e3),
            ("--prefill-token-us", e.prefill_token_s * 1e6),
            ("--prefill-pair-ns", e.prefill_pair_s * 1e9),
            ("--decode-seq-us", e.decode_seq_s * 1e6),
            ("--decode-ctx-ns", e.decode_ctx_token_s * 1e9),
            ("--scheduler-ms", e.scheduler_s * 1e3),
            ("--scheduler-probe-us", e.scheduler_probe_s * 1e6),
            ("--load-block-ms", self.store.load_block_s * 1e3),
            ("--load-fixed-ms", self.store.load_fixed_s * 1e3),
        ] {
            if !v.is_finite() || v < 0.0 {
                bail!("{flag} must be a finite number >= 0, got {v}");
            }
        }
        if self.lookup.timeout_s == 0.0 {
            bail!("--lookup-timeout-s must be > 0 (an RPC needs time to answer), got 0");
        }
        if !(self.rate_scale.is_finite() && self.rate_scale > 0.0) {
            bail!(
                "--rate-scale must be a finite number > 0, got {}",
                self.rate_scale
            );
        }
        if e.engines == 0 {
            bail!("--engines must be at least 1");
        }
        if e.max_num_batched_tokens == 0 || e.max_num_seqs == 0 {
            bail!("--max-num-batched-tokens and --max-num-seqs must be at least 1");
        }
        if e.batch_queue == 0 {
            bail!("--batch-queue must be at least 1");
        }
        if e.prefix_hash_tokens == 0
            || e.prefix_hash_tokens % KV_BLOCK_TOKENS != 0
            || TRACE_BLOCK_TOKENS % e.prefix_hash_tokens != 0
        {
            bail!(
                "--prefix-hash-tokens must be a multiple of {KV_BLOCK_TOKENS} dividing {TRACE_BLOCK_TOKENS}, got {}",
                e.prefix_hash_tokens
            );
        }
        if e.max_output_tokens == Some(0) {
            bail!("--max-output-tokens must be at least 1");
        }
        self.server.validate()?;
        self.lookup.wait_budget.validate()
    }
}
