//! The flags of `cargo xtask simulate` ([`Args`]) and how they become a run's
//! parameters: the server model comes from a calibration profile (the built-in one,
//! or `--calibration FILE`), then the flags that override it.

use std::path::PathBuf;

use anyhow::bail;

use super::budget::BudgetArg;
use super::calibration::Calibration;
use super::engine::{ArrivalHandling, EngineParams, PendingPolicy, Router, SimParams, StoreParams};
use super::mode::{LookupParams, Mode};
use super::server::ServerParams;
use super::trace::TraceSource;

/// Command-line flags of `cargo xtask simulate`. Durations are given in the unit their
/// name says; defaults and their sources are documented on [`EngineParams`],
/// [`StoreParams`], [`ServerParams`] and [`LookupParams`].
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Mooncake-format JSONL trace (`timestamp` ms, `input_length`, `output_length`,
    /// `hash_ids`), streamed. Without it, a generated trace shaped like the
    /// conversation trace.
    #[arg(long, value_name = "PATH")]
    pub trace: Option<PathBuf>,
    /// Modes to compare, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sync,async,prefetch,prefetch+,prefetch+wait"
    )]
    pub modes: Vec<Mode>,
    /// Replay only the first N requests.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Arrival rate multiplier: timestamps are divided by X (2 = twice as fast).
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub rate_scale: f64,
    /// Seed of the generated trace and of the server's jitter.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Requests of the generated trace (without `--trace`).
    #[arg(long, value_name = "N", default_value_t = 4_000)]
    pub gen_requests: usize,
    /// Also write every figure and parameter as JSON to this file (its folder is made
    /// before the run when missing).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Where to draw the plots (PNG): the TTFT CDF and tail here, a sweep's p50/p99
    /// beside it (`_sweep` added to the name). Default:
    /// `target/simulate/ttft_cdf.png` in the workspace.
    #[arg(long, value_name = "PATH")]
    pub plot: Option<PathBuf>,
    /// Also write every engine's state once per virtual second (waiting, running, KV
    /// held, preemptions, lookups in flight) of the first run of each mode to this
    /// file (JSONL; its folder is made before the run when missing).
    #[arg(long, value_name = "PATH")]
    pub timeseries: Option<PathBuf>,
    /// Do not draw the plots.
    #[arg(long)]
    pub no_plot: bool,
    /// Also write the replayed requests (after `--limit`) to this file as JSONL, for
    /// example to inspect the generated trace.
    #[arg(long, value_name = "PATH")]
    pub write_trace: Option<PathBuf>,
    /// Also stream every finished request of the first run of each mode to this file
    /// (JSONL: mode, TTFT and its breakdown, hits, preemptions).
    #[arg(long, value_name = "PATH")]
    pub requests_out: Option<PathBuf>,

    /// Sweep a parameter over values: `PARAM=v1,v2,...`; repeat the flag to sweep a
    /// grid. PARAM: per-key-us, present-key-us, absent-key-us, server-fixed-ms,
    /// server-concurrency, block-size, namespaces, chunk-keys, rate-scale, engines,
    /// ttl-s, prefetch-limit, wait-budget-ms (`auto` or ms).
    #[arg(long, value_name = "PARAM=V,...")]
    pub sweep: Vec<String>,
    /// With `--sweep rate-scale=...`: a mode's knee is the lowest rate scale at which
    /// it collapses in any rerun or its median TTFT p99 exceeds this factor times its
    /// value at the lowest rate swept (marked in the table and the plot).
    #[arg(long, value_name = "X", default_value_t = 2.0)]
    pub knee_factor: f64,
    /// Runs per setting: the first as given, the others perturbed (seed + i, arrival
    /// rate +1 %, −1 %, +0.5 %, ..., the order within bursts and the routing offset
    /// drawn on their own), so each figure shows its spread, its collapse rate (the
    /// overload detector) with a 95 % interval, and a setting whose p99 moves more
    /// than 2x or that collapses in any run is flagged unstable. 1 turns the check off.
    #[arg(long, value_name = "K", default_value_t = 10)]
    pub repeats: u32,
    /// Skip the recommendation (a search over the lookup settings, mode,
    /// `lookup_on_preemption`, prefetch limit, TTL, wait budget and server
    /// concurrency, confirmed on as many fresh reruns, at the end of a run without
    /// `--sweep`).
    #[arg(long)]
    pub no_recommend: bool,
    /// No progress on stderr (it is drawn only when stderr is a terminal anyway).
    #[arg(long)]
    pub quiet: bool,

    /// Calibration file (`cargo xtask calibrate --out FILE`) for the server model.
    /// Default: the built-in `crates/lookup-sim/calibration.json`.
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    /// Server profile of the calibration to model (default: the file's default,
    /// `vllm-python` in the built-in one: what a vLLM deployment pays today).
    #[arg(long, value_name = "NAME")]
    pub server_profile: Option<String>,
    /// Lookup server: fixed time per lookup (ms) [default: from the calibration].
    #[arg(long)]
    pub server_fixed_ms: Option<f64>,
    /// Lookup server: time per store call (µs) [default: from the calibration].
    #[arg(long)]
    pub server_per_call_us: Option<f64>,
    /// Lookup server: time per present key (µs), absent keys costing the
    /// calibration's absent/present ratio of it [default: from the calibration].
    #[arg(long)]
    pub server_per_key_us: Option<f64>,
    /// Lookup server: time per present key (µs), leaving the absent one.
    #[arg(long)]
    pub present_key_us: Option<f64>,
    /// Lookup server: time per absent key (µs) [default: from the calibration].
    #[arg(long)]
    pub absent_key_us: Option<f64>,
    /// Lookup server: keys per store call, with an early stop at the call that ends
    /// the leading run; 0 = one call with every key (vLLM's worker) [default: from the
    /// calibration].
    #[arg(long)]
    pub chunk_keys: Option<u32>,
    /// Lookup server: upper bound of a uniform random delay per lookup (ms) [default:
    /// from the calibration].
    #[arg(long)]
    pub server_jitter_ms: Option<f64>,
    /// vLLM block size (tokens per store key and namespace); must divide 512.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// Rank namespaces (tensor/pipeline-parallel ranks) per block: keys per vLLM block.
    #[arg(long, default_value_t = 1)]
    pub namespaces: u32,
    /// Lookup server: lookups served at once (1 = vLLM's REQ/REP); the client keeps as
    /// many on the wire (`max_in_flight`).
    #[arg(long, default_value_t = 1)]
    pub server_concurrency: u32,
    /// One lookup server for every engine (as `cargo xtask replay` runs it) instead of
    /// one per engine (vLLM's worker in each).
    #[arg(long)]
    pub shared_server: bool,

    /// `lookup_prefetch_limit` of the prefetch modes.
    #[arg(long, default_value_t = LookupParams::default().prefetch_limit)]
    pub prefetch_limit: u32,
    /// `lookup_prefetch_ttl_s` (seconds).
    #[arg(long, default_value_t = LookupParams::default().prefetch_ttl_s, value_parser = crate::mode::seconds_arg)]
    pub prefetch_ttl_s: f64,
    /// `lookup_timeout_s` (seconds).
    #[arg(long, default_value_t = LookupParams::default().timeout_s, value_parser = crate::mode::seconds_arg)]
    pub lookup_timeout_s: f64,
    /// `prefetch+wait`: longest wait for a lookup already queued or on the wire: `auto`
    /// (the client's recent on-wire p90, within `--wait-budget-bounds-ms`) or ms.
    #[arg(long, default_value = "auto")]
    pub wait_budget_ms: BudgetArg,
    /// `lookup_on_preemption`: what a preemption does to the request's lookup
    /// (`discard`, vLLM's; `keep`; `wait`; `keep_wait`: `spec/behaviour.md` rule 8).
    #[arg(long, default_value_t = LookupParams::default().on_preemption, value_parser = crate::mode::policy_arg)]
    pub on_preemption: lookup_core::OnPreemption,
    /// `lookup_preempted_wait_s` (seconds): with `wait` or `keep_wait`, the longest
    /// wait for a preempted request's probe.
    #[arg(long, default_value_t = LookupParams::default().preempted_wait_s, value_parser = crate::mode::seconds_arg)]
    pub preempted_wait_s: f64,
    /// Bounds of the `auto` wait budget (ms): MIN,MAX.
    #[arg(long, value_delimiter = ',', default_value = "0.5,10")]
    pub wait_budget_bounds_ms: Vec<f64>,

    /// Engines (data-parallel replicas, one GPU each) sharing the external store.
    #[arg(long, default_value_t = EngineParams::default().engines)]
    pub engines: u32,
    /// How requests are spread over the engines.
    #[arg(long, value_enum, default_value_t = Router::RoundRobin)]
    pub router: Router,
    /// Engine: token budget per step.
    #[arg(long, default_value_t = EngineParams::default().max_num_batched_tokens)]
    pub max_num_batched_tokens: u32,
    /// Engine: most running requests.
    #[arg(long, default_value_t = EngineParams::default().max_num_seqs)]
    pub max_num_seqs: u32,
    /// Engine: GPU KV-cache capacity in vLLM's 16-token KV blocks (a 512-token trace
    /// block is 32).
    #[arg(long, default_value_t = EngineParams::default().gpu_kv_blocks)]
    pub gpu_kv_blocks: u64,
    /// Step cost: fixed part (ms).
    #[arg(long, default_value_t = EngineParams::default().step_fixed_s * 1e3)]
    pub step_fixed_ms: f64,
    /// Step cost: per prefill token (µs).
    #[arg(long, default_value_t = EngineParams::default().prefill_token_s * 1e6)]
    pub prefill_token_us: f64,
    /// Step cost: per attended (query, context) token pair of prefill (ns).
    #[arg(long, default_value_t = EngineParams::default().prefill_pair_s * 1e9)]
    pub prefill_pair_ns: f64,
    /// Step cost: per decoding request (µs).
    #[arg(long, default_value_t = EngineParams::default().decode_seq_s * 1e6)]
    pub decode_seq_us: f64,
    /// Step cost: per context token read by a decoding request (ns).
    #[arg(long, default_value_t = EngineParams::default().decode_ctx_token_s * 1e9)]
    pub decode_ctx_ns: f64,
    /// Engine-thread time per scheduled step (ms).
    #[arg(long, default_value_t = EngineParams::default().scheduler_s * 1e3)]
    pub scheduler_ms: f64,
    /// Engine-thread time per probe of a waiting request in a step (µs).
    #[arg(long, default_value_t = EngineParams::default().scheduler_probe_s * 1e6)]
    pub scheduler_probe_us: f64,
    /// When new requests are handled: while waiting for a step's output (vLLM #65466)
    /// or between steps.
    #[arg(long, value_enum, default_value_t = ArrivalHandling::WhileWaiting)]
    pub arrivals: ArrivalHandling,
    /// What a `Pending` probe does: skip the request and continue down the waiting
    /// queue (vLLM V1), or wait, scheduling nobody behind it (strict FCFS).
    #[arg(long, value_enum, default_value_t = PendingPolicy::Skip)]
    pub on_pending: PendingPolicy,
    /// Steps scheduled ahead: 2 = vLLM's async scheduling, 1 = schedule after each
    /// step's output (as `cargo xtask replay`'s engine).
    #[arg(long, default_value_t = EngineParams::default().batch_queue)]
    pub batch_queue: u32,
    /// Output tokens per request at most (the trace's `output_length` capped).
    #[arg(long, value_name = "N")]
    pub max_output_tokens: Option<u32>,
    /// Turn the GPU's prefix cache off: every prefix comes from the external store (as
    /// in `cargo xtask replay`).
    #[arg(long)]
    pub no_local_prefix_cache: bool,
    /// Tokens under one hash of the GPU's prefix cache: 16 (vLLM's own blocks) or a
    /// multiple of 16 dividing 512 (coarser groups, hit and evicted whole).
    #[arg(long, value_name = "TOKENS", default_value_t = EngineParams::default().prefix_hash_tokens)]
    pub prefix_hash_tokens: u32,
    /// vLLM 0.33's `scheduler_reserve_full_isl`: admit a waiting request only when
    /// its whole prompt fits in free KV blocks (true, vLLM's default) or when its
    /// first chunk does (false).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub scheduler_reserve_full_isl: bool,

    /// External store capacity in 512-token blocks.
    #[arg(long, default_value_t = StoreParams::default().capacity_blocks)]
    pub store_blocks: u64,
    /// External store: load time per block (ms).
    #[arg(long, default_value_t = StoreParams::default().load_block_s * 1e3)]
    pub load_block_ms: f64,
    /// External store: fixed time per load (ms).
    #[arg(long, default_value_t = StoreParams::default().load_fixed_s * 1e3)]
    pub load_fixed_ms: f64,
}

impl Args {
    /// The calibration the server model starts from.
    ///
    /// # Errors
    /// `--calibration` names a file that cannot be read or is not a calibration.
    pub fn calibration(&self) -> anyhow::Result<Calibration> {
        match &self.calibration {
            Some(path) => Calibration::load(path),
            None => Ok(Calibration::builtin().clone()),
        }
    }

    /// Where the requests come from.
    #[must_use]
    pub fn source(&self) -> TraceSource {
        match &self.trace {
            Some(path) => TraceSource::File(path.clone()),
            None => TraceSource::Generated {
                seed: self.seed,
                requests: self.gen_requests,
            },
        }
    }

    /// The run's parameters, in seconds.
    ///
    /// # Errors
    /// An unknown server profile or unreadable calibration; no mode; a
    /// `--wait-budget-bounds-ms` that is not two numbers; and every error of
    /// [`SimParams::validate`].
    pub fn params(&self) -> anyhow::Result<SimParams> {
        if self.modes.is_empty() {
            bail!("--modes names no mode");
        }
        let calibration = self.calibration()?;
        let profile = calibration.profile(self.server_profile.as_deref())?;
        let mut server = profile.server_params();
        if let Some(ms) = self.server_fixed_ms {
            server.fixed_s = ms / 1e3;
        }
        if let Some(us) = self.server_per_call_us {
            server.per_call_s = us / 1e6;
        }
        if let Some(us) = self.server_per_key_us {
            set_per_key(&mut server, us);
        }
        if let Some(us) = self.present_key_us {
            server.present_key_s = us / 1e6;
        }
        if let Some(us) = self.absent_key_us {
            server.absent_key_s = us / 1e6;
        }
        if let Some(keys) = self.chunk_keys {
            server.chunk_keys = keys;
        }
        if let Some(ms) = self.server_jitter_ms {
            server.jitter_s = ms / 1e3;
        }
        server.block_size = self.block_size;
        server.namespaces = self.namespaces;
        server.concurrency = self.server_concurrency;
        server.shared = self.shared_server;
        let [min_ms, max_ms] = self.wait_budget_bounds_ms[..] else {
            bail!(
                "--wait-budget-bounds-ms takes two numbers MIN,MAX, got {} ",
                self.wait_budget_bounds_ms.len()
            );
        };
        let params = SimParams {
            engine: EngineParams {
                engines: self.engines,
                router: self.router,
                max_num_batched_tokens: self.max_num_batched_tokens,
                max_num_seqs: self.max_num_seqs,
                gpu_kv_blocks: self.gpu_kv_blocks,
                step_fixed_s: self.step_fixed_ms / 1e3,
                prefill_token_s: self.prefill_token_us / 1e6,
                prefill_pair_s: self.prefill_pair_ns / 1e9,
                decode_seq_s: self.decode_seq_us / 1e6,
                decode_ctx_token_s: self.decode_ctx_ns / 1e9,
                scheduler_s: self.scheduler_ms / 1e3,
                scheduler_probe_s: self.scheduler_probe_us / 1e6,
                arrivals: self.arrivals,
                on_pending: self.on_pending,
                batch_queue: self.batch_queue,
                max_output_tokens: self.max_output_tokens,
                local_prefix_cache: !self.no_local_prefix_cache,
                prefix_hash_tokens: self.prefix_hash_tokens,
                scheduler_reserve_full_isl: self.scheduler_reserve_full_isl,
                load_kv_async: true,
            },
            store: StoreParams {
                capacity_blocks: self.store_blocks,
                load_fixed_s: self.load_fixed_ms / 1e3,
                load_block_s: self.load_block_ms / 1e3,
            },
            server,
            lookup: LookupParams {
                prefetch_limit: self.prefetch_limit,
                prefetch_ttl_s: self.prefetch_ttl_s,
                timeout_s: self.lookup_timeout_s,
                wait_budget: self.wait_budget_ms.budget((min_ms, max_ms)),
                on_preemption: self.on_preemption,
                preempted_wait_s: self.preempted_wait_s,
            },
            rate_scale: self.rate_scale,
            seed: self.seed,
            order_seed: 0,
            route_offset: 0,
            timeseries: self.timeseries.is_some(),
        };
        params.validate()?;
        Ok(params)
    }
}

/// Sets the present-key cost to `us` µs and the absent-key cost to the same ratio of
/// it as before (the calibration's absent/present ratio); a present cost of 0 before
/// makes both `us`.
pub fn set_per_key(server: &mut ServerParams, us: f64) {
    let ratio = if server.present_key_s > 0.0 {
        server.absent_key_s / server.present_key_s
    } else {
        1.0
    };
    server.present_key_s = us / 1e6;
    server.absent_key_s = us / 1e6 * ratio;
}
