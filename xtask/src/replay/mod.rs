//! `cargo xtask replay`: a slice of a Mooncake trace in real time, against a real
//! Mooncake master, through the real [`LookupClient`] in a lookup mode and over a
//! transport, with lookup latency measured rather than modelled.
//!
//! For each (mode, transport) run, one after another:
//!
//! 1. a fresh `mooncake_master` on free loopback ports (or the one given with
//!    `--master`), and the Python store client (`scripts/mooncake/writer.py`) that
//!    writes blocks, under a model name of the run's own, so runs never see each
//!    other's blocks;
//! 2. the transport: `zmq`, our [`LookupServer`] with a [`MooncakeIndex`] on that
//!    master, in this process, over ipc; or `direct`, each client asking the master
//!    itself ([`Transport::Direct`](lookup_tokio::Transport::Direct));
//! 3. `--engines` real-time engine models ([`engine`]), one [`LookupClient`] each
//!    (the mode's configuration is the simulator's, [`Mode::config`]), requests routed
//!    round robin, arrivals at the trace's timestamps divided by `--rate-scale`;
//! 4. when a request's prefill ends its blocks are put into Mooncake for real (one key
//!    per block and rank namespace, the layout's key format), so later requests with
//!    the same prefix hit;
//! 5. the table: TTFT, readiness at first probe, lookup latency from the clients'
//!    events (`on_wire`: send to answer; `total`: submission to answer), and the
//!    master's own counters scraped from its metrics port.

pub mod engine;
pub mod peers;
pub mod report;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lookup_server::{LookupServer, MooncakeIndex, ServerConfig};
use lookup_tokio::mooncake_master::MasterConfig;
use lookup_tokio::{ClientConfig, DirectConfig, Endpoint, KeyLayout, LookupClient, RankNamespace};
use serde::Serialize;

use self::engine::{BlockSink, Engine, EngineModel, EngineResult, Prepared};
use self::peers::{Master, Writer};
use self::report::{LatencyUs, RunSummary};
use crate::simulate::generator;
use crate::simulate::mode::{LookupParams, Mode};
use crate::simulate::report::Percentiles;
use crate::simulate::trace::{self, TRACE_BLOCK_TOKENS, TraceRequest};

/// How the replay's clients reach the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// Our `LookupServer` (with `MooncakeIndex`) in this process, over ZeroMQ ipc: the
    /// vLLM path (scheduler → worker → master).
    Zmq,
    /// Each client asks the master itself (scheduler → master).
    Direct,
}

impl Transport {
    /// The name on the command line and in reports.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Zmq => "zmq",
            Self::Direct => "direct",
        }
    }
}

/// Command-line flags of `cargo xtask replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Mooncake-format JSONL trace. Without it, the simulator's generated trace
    /// (shaped like the conversation trace).
    #[arg(long, value_name = "PATH")]
    pub trace: Option<PathBuf>,
    /// Replay the first N requests (real time: the whole conversation trace is an hour).
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub limit: usize,
    /// Arrival rate multiplier: timestamps are divided by X. Only arrivals are
    /// compressed; steps, loads and lookups take their real (or modelled) time.
    #[arg(long, value_name = "X", default_value_t = 4.0)]
    pub rate_scale: f64,
    /// Lookup modes, comma-separated, each run over every transport.
    #[arg(
        long,
        alias = "mode",
        value_delimiter = ',',
        default_value = "prefetch"
    )]
    pub modes: Vec<Mode>,
    /// Transports, comma-separated, run back to back in this order.
    #[arg(long, value_delimiter = ',', default_value = "zmq,direct")]
    pub transport: Vec<Transport>,
    /// Use this running master (`HOST:PORT` of its RPC service) instead of starting
    /// one per run.
    #[arg(long, value_name = "HOST:PORT")]
    pub master: Option<String>,
    /// With `--master`: its metrics HTTP service (`--metrics_port`), for its counters.
    #[arg(long, value_name = "HOST:PORT", requires = "master")]
    pub master_metrics: Option<String>,
    /// The `mooncake_master` to start. Default: `$MOONCAKE_MASTER_BIN`, else
    /// `.venv/bin/mooncake_master` (from `scripts/mooncake/install.sh`).
    #[arg(long, value_name = "PATH")]
    pub master_bin: Option<PathBuf>,
    /// The Python with the `mooncake` package. Default: `$MOONCAKE_PYTHON`, else
    /// `.venv/bin/python`.
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Seed of the generated trace (without `--trace`).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write every figure as JSON to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,

    /// Engines (data-parallel replicas), one lookup client each. The default keeps
    /// the prefill load of the conversation trace at 4x its rate near 60%.
    #[arg(long, default_value_t = 8)]
    pub engines: u32,
    /// Rank namespaces (tensor-parallel ranks) per block: keys written and asked.
    #[arg(long, default_value_t = 1)]
    pub tp_size: u32,
    /// Lookup RPCs each client keeps on the wire at once (`max_in_flight`; 1 is
    /// vLLM's REQ socket).
    #[arg(long, default_value_t = 1)]
    pub max_in_flight: u32,
    /// `lookup_prefetch_limit` of the prefetch modes.
    #[arg(long, default_value_t = LookupParams::default().prefetch_limit)]
    pub prefetch_limit: u32,
    /// `lookup_prefetch_ttl_s` (seconds; keep it below the master's 10 s read lease).
    #[arg(long, default_value_t = LookupParams::default().prefetch_ttl_s)]
    pub prefetch_ttl_s: f64,
    /// `lookup_timeout_s` (seconds).
    #[arg(long, default_value_t = LookupParams::default().timeout_s)]
    pub lookup_timeout_s: f64,
    /// `prefetch+wait`: longest wait for a lookup already queued or on the wire (ms).
    #[arg(long, default_value_t = LookupParams::default().wait_budget_s * 1e3)]
    pub wait_budget_ms: f64,

    /// Engine: token budget per step.
    #[arg(long, default_value_t = EngineModel::default().max_num_batched_tokens)]
    pub max_num_batched_tokens: u32,
    /// Engine: most requests running or loading.
    #[arg(long, default_value_t = EngineModel::default().max_num_seqs)]
    pub max_num_seqs: u32,
    /// Step cost: fixed part (ms).
    #[arg(long, default_value_t = EngineModel::default().step_fixed_s * 1e3)]
    pub step_fixed_ms: f64,
    /// Step cost: per prefill token (µs).
    #[arg(long, default_value_t = EngineModel::default().prefill_token_s * 1e6)]
    pub prefill_token_us: f64,
    /// Step cost: per attended (query, context) token pair of prefill (ns).
    #[arg(long, default_value_t = EngineModel::default().prefill_pair_s * 1e9)]
    pub prefill_pair_ns: f64,
    /// Step cost: per decoding request (µs).
    #[arg(long, default_value_t = EngineModel::default().decode_seq_s * 1e6)]
    pub decode_seq_us: f64,
    /// Step cost: per context token read by a decoding request (ns).
    #[arg(long, default_value_t = EngineModel::default().decode_ctx_token_s * 1e9)]
    pub decode_ctx_ns: f64,
    /// Store load time per 512-token block (ms).
    #[arg(long, default_value_t = EngineModel::default().load_block_s * 1e3)]
    pub load_block_ms: f64,
    /// Output tokens per request at most (1: requests end with their first token,
    /// only prefill is modelled).
    #[arg(long, default_value_t = EngineModel::default().max_output_tokens)]
    pub max_output_tokens: u32,
}

/// Where the runs find their master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MasterSource {
    /// Start this `mooncake_master` on free loopback ports, a fresh one per run.
    Start(PathBuf),
    /// A running master: RPC `addr`, metrics at `metrics` if known.
    External {
        /// `host:port` of its RPC service.
        addr: String,
        /// `host:port` of its metrics service.
        metrics: Option<String>,
    },
}

/// Everything a replay needs besides the trace.
#[derive(Clone, Debug)]
pub struct ReplayParams {
    /// Modes to run.
    pub modes: Vec<Mode>,
    /// Transports to run each mode over, in order.
    pub transports: Vec<Transport>,
    /// Arrival rate multiplier (timestamps divided by it).
    pub rate_scale: f64,
    /// Engines, one client each.
    pub engines: u32,
    /// Rank namespaces per block.
    pub tp_size: u32,
    /// `max_in_flight` of each client.
    pub max_in_flight: u32,
    /// The simulator's lookup settings (prefetch limit, TTL, timeout, wait budget).
    pub lookup: LookupParams,
    /// The engine model.
    pub engine: EngineModel,
    /// The master.
    pub master: MasterSource,
    /// The Python interpreter of the store client.
    pub python: PathBuf,
    /// Show a progress bar on a terminal.
    pub progress: bool,
}

impl Default for ReplayParams {
    fn default() -> Self {
        Self {
            modes: vec![Mode::Prefetch],
            transports: vec![Transport::Zmq, Transport::Direct],
            rate_scale: 4.0,
            engines: 8,
            tp_size: 1,
            max_in_flight: 1,
            lookup: LookupParams::default(),
            engine: EngineModel::default(),
            master: MasterSource::Start(peers::default_master_bin()),
            python: peers::default_python(),
            progress: false,
        }
    }
}

impl Args {
    /// The replay's parameters.
    ///
    /// # Errors
    /// A duration or rate that is negative, NaN or infinite (naming the flag); no
    /// mode or transport; 0 engines, namespaces, `max_in_flight` or token budget.
    pub fn params(&self) -> anyhow::Result<ReplayParams> {
        for (flag, v) in [
            ("--prefetch-ttl-s", self.prefetch_ttl_s),
            ("--lookup-timeout-s", self.lookup_timeout_s),
            ("--wait-budget-ms", self.wait_budget_ms),
            ("--step-fixed-ms", self.step_fixed_ms),
            ("--prefill-token-us", self.prefill_token_us),
            ("--prefill-pair-ns", self.prefill_pair_ns),
            ("--decode-seq-us", self.decode_seq_us),
            ("--decode-ctx-ns", self.decode_ctx_ns),
            ("--load-block-ms", self.load_block_ms),
        ] {
            if !v.is_finite() || v < 0.0 {
                bail!("{flag} must be a finite number >= 0, got {v}");
            }
        }
        let master = match &self.master {
            Some(addr) => MasterSource::External {
                addr: addr.clone(),
                metrics: self.master_metrics.clone(),
            },
            None => MasterSource::Start(
                self.master_bin
                    .clone()
                    .unwrap_or_else(peers::default_master_bin),
            ),
        };
        let params = ReplayParams {
            modes: self.modes.clone(),
            transports: self.transport.clone(),
            rate_scale: self.rate_scale,
            engines: self.engines,
            tp_size: self.tp_size,
            max_in_flight: self.max_in_flight,
            lookup: LookupParams {
                prefetch_limit: self.prefetch_limit,
                prefetch_ttl_s: self.prefetch_ttl_s,
                timeout_s: self.lookup_timeout_s,
                wait_budget_s: self.wait_budget_ms / 1e3,
            },
            engine: EngineModel {
                max_num_batched_tokens: self.max_num_batched_tokens,
                max_num_seqs: self.max_num_seqs,
                step_fixed_s: self.step_fixed_ms / 1e3,
                prefill_token_s: self.prefill_token_us / 1e6,
                prefill_pair_s: self.prefill_pair_ns / 1e9,
                decode_seq_s: self.decode_seq_us / 1e6,
                decode_ctx_token_s: self.decode_ctx_ns / 1e9,
                load_fixed_s: EngineModel::default().load_fixed_s,
                load_block_s: self.load_block_ms / 1e3,
                max_output_tokens: self.max_output_tokens,
            },
            master,
            python: self.python.clone().unwrap_or_else(peers::default_python),
            progress: true,
        };
        params.validate()?;
        Ok(params)
    }
}

impl ReplayParams {
    /// Checks what [`replay`] cannot run with.
    ///
    /// # Errors
    /// A rate scale that is not a finite number above 0; no mode or transport; 0
    /// engines, namespaces, `max_in_flight`, token budget or `max_num_seqs`.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(self.rate_scale.is_finite() && self.rate_scale > 0.0) {
            bail!(
                "--rate-scale must be a finite number > 0, got {}",
                self.rate_scale
            );
        }
        if self.modes.is_empty() {
            bail!("--modes names no mode");
        }
        if self.transports.is_empty() {
            bail!("--transport names no transport");
        }
        for (flag, v) in [
            ("--engines", self.engines),
            ("--tp-size", self.tp_size),
            ("--max-in-flight", self.max_in_flight),
            (
                "--max-num-batched-tokens",
                self.engine.max_num_batched_tokens,
            ),
            ("--max-num-seqs", self.engine.max_num_seqs),
        ] {
            if v == 0 {
                bail!("{flag} must be at least 1");
            }
        }
        Ok(())
    }
}

/// What a replay measured: one summary per run, in the order run.
#[derive(Debug, Serialize)]
pub struct ReplayReport {
    /// Requests replayed per run.
    pub requests: usize,
    /// Arrival rate multiplier.
    pub rate_scale: f64,
    /// Engines.
    pub engines: u32,
    /// One per (mode, transport), in the order run.
    pub runs: Vec<RunSummary>,
}

/// Replays `trace` once per mode and transport (modes outer, transports inner).
///
/// # Errors
/// Invalid parameters; the master or the Python writer cannot be started (naming
/// `scripts/mooncake/install.sh` when missing) or the writer fails mid-run; the
/// lookup server or a client cannot be set up; an empty trace.
pub fn replay(trace: &[TraceRequest], params: &ReplayParams) -> anyhow::Result<ReplayReport> {
    params.validate()?;
    if trace.is_empty() {
        bail!("the trace has no requests");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let mut runs = Vec::new();
    for &mode in &params.modes {
        for &transport in &params.transports {
            let run = runtime.block_on(run_one(trace, params, mode, transport, runs.len()))?;
            runs.push(run);
        }
    }
    Ok(ReplayReport {
        requests: trace.len(),
        rate_scale: params.rate_scale,
        engines: params.engines,
        runs,
    })
}

/// One run of `mode` over `transport`.
async fn run_one(
    trace: &[TraceRequest],
    params: &ReplayParams,
    mode: Mode,
    transport: Transport,
    run_no: usize,
) -> anyhow::Result<RunSummary> {
    let dir = tempfile::Builder::new()
        .prefix("xtask-replay-")
        .tempdir()
        .context("creating a temp dir")?;
    let master = match &params.master {
        MasterSource::Start(bin) => Master::start(bin, dir.path())?,
        MasterSource::External { addr, metrics } => Master::external(addr.clone(), metrics.clone()),
    };
    let python = params.python.clone();
    let (addr, log_dir) = (master.addr.clone(), dir.path().to_path_buf());
    let writer = tokio::task::spawn_blocking(move || Writer::start(&python, &addr, &log_dir))
        .await
        .context("joining the writer's start")??;
    // A model name of the run's own: blocks of earlier runs (on a shared master) never
    // answer this run's lookups.
    let model = format!(
        "replay-{}-{run_no}-{}-{}",
        std::process::id(),
        mode,
        transport.name()
    );
    let layout = KeyLayout::new(model)
        .with_namespaces(RankNamespace::grid(params.tp_size, 1))
        .context("rank namespaces")?;
    // The transport's server side: our lookup server for `zmq`, nothing for `direct`.
    let mut server: Option<LookupServer> = None;
    let mut index: Option<Arc<MooncakeIndex>> = None;
    let mut configs = Vec::with_capacity(params.engines as usize);
    let core = mode.config(&params.lookup, params.max_in_flight);
    match transport {
        Transport::Zmq => {
            let mooncake = Arc::new(
                MooncakeIndex::connect(&master.addr, MasterConfig::default())
                    .await
                    .with_context(|| format!("connecting the index to {}", master.addr))?,
            );
            let endpoint = Endpoint::Ipc(dir.path().join("lookup.sock"));
            let bound = LookupServer::bind(
                &endpoint,
                ServerConfig::new(TRACE_BLOCK_TOKENS, layout.clone()),
                mooncake.clone(),
            )
            .context("binding the lookup server")?;
            for _ in 0..params.engines {
                let mut config =
                    ClientConfig::new(bound.local_endpoint().clone(), TRACE_BLOCK_TOKENS);
                config.core = core.clone();
                configs.push(config);
            }
            server = Some(bound);
            index = Some(mooncake);
        }
        Transport::Direct => {
            for _ in 0..params.engines {
                let direct = DirectConfig::new(master.addr.clone(), layout.clone());
                let mut config = ClientConfig::direct(direct, TRACE_BLOCK_TOKENS);
                config.core = core.clone();
                configs.push(config);
            }
        }
    }
    let before = scrape(&master).await;

    let label = format!("{}/{}", mode.name(), transport.name());
    let bar = progress_bar(params.progress, trace.len() as u64, &label)?;
    let on_finished = || bar.inc(1);
    // Clients connect before the clock starts, so that the first arrivals do not pay
    // for it.
    let mut clients = Vec::with_capacity(configs.len());
    for config in configs {
        clients.push(LookupClient::connect(config).context("connecting a lookup client")?);
    }
    let t0 = Instant::now() + Duration::from_millis(200);
    let reqs = Prepared::from_trace(
        trace,
        t0,
        params.rate_scale,
        params.engine.max_output_tokens,
    );
    let sink = BlockSink {
        tx: writer.sender().context("the writer's queue")?,
        written: Arc::new(Mutex::new(Default::default())),
        layout: layout.clone(),
    };
    let n = params.engines as usize;
    let engines: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(e, client)| {
            let arrivals: VecDeque<usize> = (e..reqs.len()).step_by(n).collect();
            Engine::new(
                &params.engine,
                mode,
                Duration::from_secs_f64(params.lookup.wait_budget_s),
                &reqs,
                arrivals,
                client,
                sink.clone(),
                &on_finished,
            )
            .run()
        })
        .collect();
    let results = join_all(engines).await;
    drop(sink);
    bar.finish_and_clear();
    let writer = tokio::task::spawn_blocking(move || writer.finish())
        .await
        .context("joining the writer")??;
    if let Some(failure) = &writer.failure {
        bail!("the Python store client failed during {label}: {failure}");
    }
    let after = scrape(&master).await;
    let batch_exist_calls = match &index {
        Some(index) => index.stats().master.batch_exist_calls,
        None => results
            .iter()
            .filter_map(|r| r.stats.master.map(|m| m.batch_exist_calls))
            .sum(),
    };
    if let Some(server) = server.take() {
        server.shutdown().await;
    }
    drop(master);
    Ok(summarise(
        mode,
        transport,
        trace.len(),
        t0,
        &results,
        &writer,
        batch_exist_calls,
        master_figures(before.as_ref(), after.as_ref()),
    ))
}

/// Runs every engine to its end, concurrently, as futures of the calling task (they
/// borrow the run's requests, so they are not spawned); results in engine order.
async fn join_all<F: Future<Output = EngineResult>>(engines: Vec<F>) -> Vec<EngineResult> {
    let mut engines: Vec<Pin<Box<F>>> = engines.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<EngineResult>> = engines.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, engine) in done.iter_mut().zip(engines.iter_mut()) {
            if slot.is_none() {
                match engine.as_mut().poll(cx) {
                    Poll::Ready(result) => *slot = Some(result),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

/// The master's series, or nothing (with a warning) when its metrics cannot be read.
async fn scrape(master: &Master) -> Option<HashMap<String, f64>> {
    let metrics = master.metrics.clone()?;
    match tokio::task::spawn_blocking(move || peers::scrape(&metrics)).await {
        Ok(Ok(found)) => Some(found),
        Ok(Err(e)) => {
            eprintln!("warning: master metrics not read: {e:#}");
            None
        }
        Err(e) => {
            eprintln!("warning: master metrics not read: {e}");
            None
        }
    }
}

/// Counters as differences over the run, gauges as read at its end.
fn master_figures(
    before: Option<&HashMap<String, f64>>,
    after: Option<&HashMap<String, f64>>,
) -> BTreeMap<String, f64> {
    let Some(after) = after else {
        return BTreeMap::new();
    };
    after
        .iter()
        .map(|(name, &v)| {
            let was = if name.ends_with("_total") {
                before.and_then(|b| b.get(name)).copied().unwrap_or(0.0)
            } else {
                0.0
            };
            (name.clone(), v - was)
        })
        .collect()
}

fn progress_bar(show: bool, total: u64, label: &str) -> anyhow::Result<ProgressBar> {
    let target = if show {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{label} {{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} requests"
        ))
        .context("progress template")?
        .progress_chars("=> "),
    );
    Ok(bar)
}

/// Sums the engines' measurements into the run's summary.
#[allow(clippy::too_many_arguments)]
fn summarise(
    mode: Mode,
    transport: Transport,
    requests: usize,
    t0: Instant,
    results: &[EngineResult],
    writer: &peers::WriterStats,
    batch_exist_calls: u64,
    master: BTreeMap<String, f64>,
) -> RunSummary {
    let new = || Histogram::<u64>::new(3).expect("3 significant digits is a valid histogram");
    let (mut ttft, mut on_wire, mut total) = (new(), new(), new());
    let mut queue_wait = Duration::ZERO;
    let mut queued = 0u64;
    let mut s = RunSummary {
        mode,
        transport,
        requests: requests as u64,
        finished: 0,
        first_tokens: 0,
        ttft_ms: Percentiles {
            p50: 0.0,
            p90: 0.0,
            p99: 0.0,
            mean: 0.0,
            max: 0.0,
        },
        queue_wait_mean_ms: 0.0,
        engine_blocked_s: 0.0,
        ready_at_first_probe: None,
        lookups_deferred: 0,
        first_pending_idle: 0,
        lookup_on_wire_us: LatencyUs::default(),
        lookup_total_us: LatencyUs::default(),
        outcomes: engine::Outcomes::default(),
        rpcs_sent: 0,
        rpcs_shared: 0,
        rpcs_wasted: 0,
        rpcs_cancelled: 0,
        ttl_refreshes: 0,
        external_hit_tokens: 0,
        keys_written: writer.keys_written,
        put_errors: writer.put_errors,
        put_lag_ms: LatencyUs::default(),
        batch_exist_calls,
        master,
        steps: 0,
        makespan_s: 0.0,
    };
    let (mut ready, mut pending) = (0u64, 0u64);
    let mut last = t0;
    for r in results {
        for &(_, t) in &r.ttft {
            let _ = ttft.record(u64::try_from(t.as_micros()).unwrap_or(u64::MAX).max(1));
        }
        s.first_tokens += r.ttft.len() as u64;
        for w in &r.queue_wait {
            queue_wait += *w;
            queued += 1;
        }
        let _ = on_wire.add(&r.on_wire_us);
        let _ = total.add(&r.total_us);
        s.finished += r.finished;
        s.engine_blocked_s += r.blocked.as_secs_f64();
        s.lookups_deferred += r.deferred;
        s.first_pending_idle += r.first_pending_idle;
        s.steps += r.steps;
        s.external_hit_tokens += r.external_hit_tokens;
        let o = &mut s.outcomes;
        o.hit += r.outcomes.hit;
        o.miss += r.outcomes.miss;
        o.malformed += r.outcomes.malformed;
        o.timed_out += r.outcomes.timed_out;
        o.failed += r.outcomes.failed;
        let c = &r.stats.core;
        s.rpcs_sent += r.stats.rpcs_sent;
        s.rpcs_shared += c.rpcs_shared;
        s.rpcs_wasted += c.replies_stale;
        s.rpcs_cancelled += c.rpcs_cancelled;
        s.ttl_refreshes += c.ttl_refreshes;
        ready += c.first_probes_ready;
        pending += c.first_probes_pending;
        if let Some(at) = r.last_finish {
            last = last.max(at);
        }
    }
    if !ttft.is_empty() {
        let q = |p: f64| ttft.value_at_quantile(p) as f64 / 1e3;
        s.ttft_ms = Percentiles {
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            mean: ttft.mean() / 1e3,
            max: ttft.max() as f64 / 1e3,
        };
    }
    if queued > 0 {
        s.queue_wait_mean_ms = queue_wait.as_secs_f64() * 1e3 / queued as f64;
    }
    s.ready_at_first_probe = (ready + pending > 0).then(|| ready as f64 / (ready + pending) as f64);
    s.lookup_on_wire_us = LatencyUs::of(&on_wire);
    s.lookup_total_us = LatencyUs::of(&total);
    let lag = LatencyUs::of(&writer.lag_us);
    s.put_lag_ms = LatencyUs {
        count: lag.count,
        p50: lag.p50 / 1e3,
        p99: lag.p99 / 1e3,
        mean: lag.mean / 1e3,
    };
    s.makespan_s = last.saturating_duration_since(t0).as_secs_f64();
    s
}

/// `cargo xtask replay`: loads (or generates) the trace, runs every mode over every
/// transport, prints the table and the direct/zmq latency ratios.
///
/// # Errors
/// A bad flag, an unreadable or malformed trace (naming the line), or a failing run
/// (see [`replay`]); a JSON file that cannot be written.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let params = args.params()?;
    let (mut requests, source) = match &args.trace {
        Some(path) => (trace::load(path)?, path.display().to_string()),
        None => (
            generator::generate(args.seed, args.limit),
            format!("generated (conversation-trace shape, seed {})", args.seed),
        ),
    };
    requests.truncate(args.limit);
    let span_s = requests
        .last()
        .zip(requests.first())
        .map_or(0.0, |(l, f)| (l.timestamp - f.timestamp) as f64 / 1e3);
    println!(
        "trace: {source}, {} requests over {:.0} s, rate scale {} (arrivals over {:.0} s)",
        requests.len(),
        span_s,
        params.rate_scale,
        span_s / params.rate_scale
    );
    println!(
        "{} engines: budget {} tokens, {} seqs, step {:.1} ms + {:.0} µs/prefill token; \
         outputs capped at {}; clients: max_in_flight {}, prefetch limit {}, TTL {} s, timeout {} s; \
         {} rank namespace(s)",
        params.engines,
        params.engine.max_num_batched_tokens,
        params.engine.max_num_seqs,
        params.engine.step_fixed_s * 1e3,
        params.engine.prefill_token_s * 1e6,
        params.engine.max_output_tokens,
        params.max_in_flight,
        params.lookup.prefetch_limit,
        params.lookup.prefetch_ttl_s,
        params.lookup.timeout_s,
        params.tp_size,
    );
    let started = Instant::now();
    let report = replay(&requests, &params)?;
    println!();
    print!("{}", report::table(&report.runs));
    println!();
    print!("{}", report::ratios(&report.runs));
    println!(
        "replayed {} requests x {} runs in {:.1} s of wall time",
        requests.len(),
        report.runs.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).context("encoding JSON")?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        println!("JSON: {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_counters_are_differences_and_gauges_are_read_at_the_end() {
        let before: HashMap<String, f64> = [
            ("master_batch_exist_key_requests_total".to_owned(), 10.0),
            ("master_key_count".to_owned(), 5.0),
        ]
        .into();
        let after: HashMap<String, f64> = [
            ("master_batch_exist_key_requests_total".to_owned(), 35.0),
            ("master_key_count".to_owned(), 9.0),
            ("master_put_start_requests_total".to_owned(), 4.0),
        ]
        .into();
        let figures = master_figures(Some(&before), Some(&after));
        assert_eq!(
            figures.into_iter().collect::<Vec<_>>(),
            [
                ("master_batch_exist_key_requests_total".to_owned(), 25.0),
                ("master_key_count".to_owned(), 9.0),
                ("master_put_start_requests_total".to_owned(), 4.0),
            ]
        );
        assert!(master_figures(Some(&before), None).is_empty());
    }

    #[test]
    fn flags_are_checked() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let parse = |line: &[&str]| {
            let mut argv = vec!["replay"];
            argv.extend_from_slice(line);
            Cli::try_parse_from(argv).map(|c| c.args)
        };
        let args = parse(&["--mode", "sync,prefetch", "--transport", "direct"]).expect("parse");
        let params = args.params().expect("params");
        assert_eq!(params.modes, [Mode::Sync, Mode::Prefetch]);
        assert_eq!(params.transports, [Transport::Direct]);
        assert_eq!((params.rate_scale, params.engines), (4.0, 8));
        let err = parse(&["--rate-scale", "0"])
            .expect("parse")
            .params()
            .expect_err("rate scale 0");
        assert_eq!(
            err.to_string(),
            "--rate-scale must be a finite number > 0, got 0"
        );
        let err = parse(&["--engines", "0"])
            .expect("parse")
            .params()
            .expect_err("no engine");
        assert_eq!(err.to_string(), "--engines must be at least 1");
        let err = parse(&["--step-fixed-ms=-1"])
            .expect("parse")
            .params()
            .expect_err("negative");
        assert_eq!(
            err.to_string(),
            "--step-fixed-ms must be a finite number >= 0, got -1"
        );
        assert!(parse(&["--master-metrics", "127.0.0.1:1"]).is_err());
    }
}
