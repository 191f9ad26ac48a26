//! `cargo xtask simulate`: replays a Mooncake trace through a model of vLLM-like
//! engines (four data-parallel replicas by default, sharing one external store), each
//! with the real `lookup-core` connector on a virtual clock, in the lookup modes
//! `sync`, `async`, `prefetch` and `prefetch+`, side by side. `xtask/SIMULATE.md`
//! explains the output.
//!
//! Modules: [`trace`] (JSONL input), [`generator`] (the embedded default trace),
//! [`engine`] (the discrete-event engine model and its cost model), `store` (GPU
//! prefix cache and external store), [`server`] (the lookup server model),
//! `connector` (the core on the virtual clock), [`mode`] (the four configurations),
//! [`report`] (table, JSON, plot).

mod connector;
pub mod engine;
pub mod generator;
pub mod mode;
pub mod report;
pub mod server;
mod store;
pub mod trace;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use engine::{ArrivalHandling, EngineParams, PendingPolicy, Router, SimParams, StoreParams};
use mode::{LookupParams, Mode};
use server::ServerParams;

/// Command-line flags of `cargo xtask simulate`. Durations are given in the unit their
/// name says; defaults and their sources are documented on [`EngineParams`],
/// [`StoreParams`], [`ServerParams`] and [`LookupParams`].
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Mooncake-format JSONL trace (`timestamp` ms, `input_length`, `output_length`,
    /// `hash_ids`). Without it, a generated trace shaped like the conversation trace.
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
    /// Also write every figure and parameter as JSON to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Where to draw the TTFT CDF (PNG). Default: `target/simulate/ttft_cdf.png` in
    /// the workspace.
    #[arg(long, value_name = "PATH")]
    pub plot: Option<PathBuf>,
    /// Do not draw the plot.
    #[arg(long)]
    pub no_plot: bool,
    /// Also write the replayed requests (after `--limit`) to this file as JSONL, for
    /// example to inspect the generated trace.
    #[arg(long, value_name = "PATH")]
    pub write_trace: Option<PathBuf>,

    /// Lookup server: fixed time per lookup (ms).
    #[arg(long, default_value_t = ServerParams::default().fixed_s * 1e3)]
    pub server_fixed_ms: f64,
    /// Lookup server: time per block key (µs).
    #[arg(long, default_value_t = ServerParams::default().per_key_s * 1e6)]
    pub server_per_key_us: f64,
    /// Lookup server: lookups served at once (1 = vLLM's REQ/REP); the client keeps as
    /// many on the wire (`max_in_flight`).
    #[arg(long, default_value_t = ServerParams::default().concurrency)]
    pub server_concurrency: u32,
    /// Lookup server: upper bound of a uniform random delay per lookup (ms).
    #[arg(long, default_value_t = ServerParams::default().jitter_s * 1e3)]
    pub server_jitter_ms: f64,

    /// `lookup_prefetch_limit` of the prefetch modes.
    #[arg(long, default_value_t = LookupParams::default().prefetch_limit)]
    pub prefetch_limit: u32,
    /// `lookup_prefetch_ttl_s` (seconds).
    #[arg(long, default_value_t = LookupParams::default().prefetch_ttl_s)]
    pub prefetch_ttl_s: f64,
    /// `lookup_timeout_s` (seconds).
    #[arg(long, default_value_t = LookupParams::default().timeout_s)]
    pub lookup_timeout_s: f64,
    /// `prefetch+wait`: longest wait for a lookup already queued or on the wire (ms).
    #[arg(long, default_value_t = LookupParams::default().wait_budget_s * 1e3)]
    pub wait_budget_ms: f64,

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
    /// Engine: GPU KV-cache capacity in 512-token blocks.
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
    /// When new requests are handled: while waiting for a step's output (vLLM #65466)
    /// or between steps.
    #[arg(long, value_enum, default_value_t = ArrivalHandling::WhileWaiting)]
    pub arrivals: ArrivalHandling,
    /// What a `Pending` probe does: skip the request and continue down the waiting
    /// queue (vLLM V1), or wait, scheduling nobody behind it (strict FCFS).
    #[arg(long, value_enum, default_value_t = PendingPolicy::Skip)]
    pub on_pending: PendingPolicy,

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
    /// The run's parameters, in seconds.
    ///
    /// # Errors
    /// A duration that is negative, NaN or infinite (naming the flag); a rate scale
    /// that is not above 0; no mode; a server concurrency of 0.
    pub fn params(&self) -> anyhow::Result<SimParams> {
        let checks = [
            ("--server-fixed-ms", self.server_fixed_ms),
            ("--server-per-key-us", self.server_per_key_us),
            ("--server-jitter-ms", self.server_jitter_ms),
            ("--prefetch-ttl-s", self.prefetch_ttl_s),
            ("--lookup-timeout-s", self.lookup_timeout_s),
            ("--wait-budget-ms", self.wait_budget_ms),
            ("--step-fixed-ms", self.step_fixed_ms),
            ("--prefill-token-us", self.prefill_token_us),
            ("--prefill-pair-ns", self.prefill_pair_ns),
            ("--decode-seq-us", self.decode_seq_us),
            ("--decode-ctx-ns", self.decode_ctx_ns),
            ("--scheduler-ms", self.scheduler_ms),
            ("--load-block-ms", self.load_block_ms),
            ("--load-fixed-ms", self.load_fixed_ms),
        ];
        for (flag, v) in checks {
            if !v.is_finite() || v < 0.0 {
                bail!("{flag} must be a finite number >= 0, got {v}");
            }
        }
        if self.lookup_timeout_s == 0.0 {
            bail!("--lookup-timeout-s must be > 0 (an RPC needs time to answer), got 0");
        }
        if !(self.rate_scale.is_finite() && self.rate_scale > 0.0) {
            bail!(
                "--rate-scale must be a finite number > 0, got {}",
                self.rate_scale
            );
        }
        if self.modes.is_empty() {
            bail!("--modes names no mode");
        }
        if self.engines == 0 {
            bail!("--engines must be at least 1");
        }
        if self.server_concurrency == 0 {
            bail!("--server-concurrency must be at least 1");
        }
        Ok(SimParams {
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
                arrivals: self.arrivals,
                on_pending: self.on_pending,
            },
            store: StoreParams {
                capacity_blocks: self.store_blocks,
                load_fixed_s: self.load_fixed_ms / 1e3,
                load_block_s: self.load_block_ms / 1e3,
            },
            server: ServerParams {
                fixed_s: self.server_fixed_ms / 1e3,
                per_key_s: self.server_per_key_us / 1e6,
                concurrency: self.server_concurrency,
                jitter_s: self.server_jitter_ms / 1e3,
            },
            lookup: LookupParams {
                prefetch_limit: self.prefetch_limit,
                prefetch_ttl_s: self.prefetch_ttl_s,
                timeout_s: self.lookup_timeout_s,
                wait_budget_s: self.wait_budget_ms / 1e3,
            },
            rate_scale: self.rate_scale,
            seed: self.seed,
        })
    }
}

/// Runs every mode on `trace` (in parallel, one thread per mode; each run is
/// deterministic and independent), calling `on_finished` once per finished request.
///
/// # Errors
/// The first failing mode's error (see [`engine::simulate`]).
pub fn run_modes(
    trace: &[trace::TraceRequest],
    modes: &[Mode],
    params: &SimParams,
    on_finished: &(dyn Fn() + Sync),
) -> anyhow::Result<Vec<engine::ModeResult>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = modes
            .iter()
            .map(|&mode| s.spawn(move || engine::simulate(trace, mode, params, on_finished)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a simulation thread panicked"))?
            })
            .collect()
    })
}

fn default_plot_path() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or(manifest.clone(), PathBuf::from)
        .join("target/simulate/ttft_cdf.png")
}

/// `cargo xtask simulate`: loads or generates the trace, runs the modes, prints the
/// table, writes the JSON and the plot.
///
/// # Errors
/// A bad flag, an unreadable or malformed trace (naming the line), a request that
/// cannot fit the GPU, or a JSON file that cannot be written. A plot that cannot be
/// drawn is reported as a warning only.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let params = args.params()?;
    let mut modes = args.modes.clone();
    modes.dedup();
    let (mut requests, source) = match &args.trace {
        Some(path) => (trace::load(path)?, path.display().to_string()),
        None => (
            generator::generate(args.seed, args.gen_requests),
            format!(
                "generated (conversation-trace shape, seed {}, {} requests)",
                args.seed, args.gen_requests
            ),
        ),
    };
    if let Some(limit) = args.limit {
        if limit == 0 {
            bail!("--limit 0 leaves no request to replay");
        }
        requests.truncate(limit);
    }
    if requests.is_empty() {
        bail!("the trace has no requests");
    }
    if let Some(path) = &args.write_trace {
        let mut text = String::new();
        for r in &requests {
            text.push_str(&serde_json::to_string(r).context("encoding a request")?);
            text.push('\n');
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }

    let started = Instant::now();
    let total = (requests.len() * modes.len()) as u64;
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} requests ({eta} left)",
        )
        .context("progress template")?
        .progress_chars("=> "),
    );
    let shown = AtomicBool::new(false);
    let on_finished = || {
        bar.inc(1);
        // Only runs longer than a second get a bar (hidden anyway when not a terminal).
        if !shown.load(Ordering::Relaxed) && started.elapsed().as_secs_f64() > 1.0 {
            shown.store(true, Ordering::Relaxed);
            bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    };
    let results = run_modes(&requests, &modes, &params, &on_finished)?;
    bar.finish_and_clear();
    let wall = started.elapsed();

    let summaries = results
        .iter()
        .map(report::summarise)
        .collect::<anyhow::Result<Vec<_>>>()?;
    println!(
        "trace: {source}, {} requests, rate scale {}",
        requests.len(),
        params.rate_scale
    );
    println!(
        "{} engines ({:?}): budget {} tokens, {} seqs, {} GPU blocks each; store {} blocks; lookup server {:.2} ms + {:.1} µs/key, \
         concurrency {}; prefetch limit {}, TTL {} s; arrivals {:?}",
        params.engine.engines,
        params.engine.router,
        params.engine.max_num_batched_tokens,
        params.engine.max_num_seqs,
        params.engine.gpu_kv_blocks,
        params.store.capacity_blocks,
        params.server.fixed_s * 1e3,
        params.server.per_key_s * 1e6,
        params.server.concurrency,
        params.lookup.prefetch_limit,
        params.lookup.prefetch_ttl_s,
        params.engine.arrivals,
    );
    println!();
    print!("{}", report::table(&summaries));
    println!();
    println!(
        "simulated {} requests x {} modes in {:.1} s",
        requests.len(),
        modes.len(),
        wall.as_secs_f64()
    );
    if let Some(path) = &args.json {
        let doc = report::Report {
            trace: source,
            requests: requests.len(),
            params: &params,
            modes: &summaries,
        };
        let text = serde_json::to_string_pretty(&doc).context("encoding JSON")?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        println!("JSON: {}", path.display());
    }
    if !args.no_plot {
        let path = args.plot.clone().unwrap_or_else(default_plot_path);
        match report::plot_cdf(&results, &path) {
            Ok(()) => println!("TTFT CDF plot: {}", path.display()),
            Err(e) => eprintln!("warning: no plot ({e:#}); the figures above are complete"),
        }
    }
    Ok(())
}
