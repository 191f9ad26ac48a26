//! The replay's flags ([`Args`]) and parameters ([`ReplayParams`], [`MasterSource`]).

use std::path::PathBuf;

use anyhow::bail;

use super::Transport;
use super::engine::EngineModel;
use super::peers;
use crate::simulate::budget::BudgetArg;
use crate::simulate::mode::{LookupParams, Mode};

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
    /// vLLM block size (tokens per hash and store key); must divide 512, the trace's
    /// block.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// Lookup RPCs each client keeps on the wire at once (`max_in_flight`; 1 is
    /// vLLM's REQ socket).
    #[arg(long, default_value_t = 1)]
    pub max_in_flight: u32,
    /// `lookup_prefetch_limit` of the prefetch modes.
    #[arg(long, default_value_t = LookupParams::default().prefetch_limit)]
    pub prefetch_limit: u32,
    /// `lookup_prefetch_ttl_s` (seconds; keep it below the master's 10 s read lease).
    #[arg(long, default_value_t = LookupParams::default().prefetch_ttl_s, value_parser = crate::simulate::mode::seconds_arg)]
    pub prefetch_ttl_s: f64,
    /// `lookup_timeout_s` (seconds).
    #[arg(long, default_value_t = LookupParams::default().timeout_s, value_parser = crate::simulate::mode::seconds_arg)]
    pub lookup_timeout_s: f64,
    /// `prefetch+wait`: longest wait for a lookup already queued or on the wire: `auto`
    /// (the client's recent on-wire p90, within `--wait-budget-bounds-ms`) or ms.
    #[arg(long, default_value = "auto")]
    pub wait_budget_ms: BudgetArg,
    /// Bounds of the `auto` wait budget (ms): MIN,MAX.
    #[arg(long, value_delimiter = ',', default_value = "0.5,10")]
    pub wait_budget_bounds_ms: Vec<f64>,

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
    /// Engine: GPU KV-cache capacity in 16-token blocks (the simulator's default: one
    /// H100 with an 8B model); requests that do not fit preempt others.
    #[arg(long, default_value_t = EngineModel::default().gpu_kv_blocks)]
    pub gpu_kv_blocks: u64,
    /// Engine: no GPU prefix cache (every probe passes `num_computed_tokens` = 0).
    #[arg(long)]
    pub no_prefix_cache: bool,
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
    /// vLLM block size (tokens per hash and store key), a divisor of 512.
    pub block_size: u32,
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
            block_size: 16,
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
        let [min_ms, max_ms] = self.wait_budget_bounds_ms[..] else {
            bail!("--wait-budget-bounds-ms takes two numbers MIN,MAX");
        };
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
            block_size: self.block_size,
            max_in_flight: self.max_in_flight,
            lookup: LookupParams {
                prefetch_limit: self.prefetch_limit,
                prefetch_ttl_s: self.prefetch_ttl_s,
                timeout_s: self.lookup_timeout_s,
                wait_budget: self.wait_budget_ms.budget((min_ms, max_ms)),
                ..LookupParams::default()
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
                gpu_kv_blocks: self.gpu_kv_blocks,
                prefix_cache: !self.no_prefix_cache,
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
    /// Checks what [`replay`](super::replay) cannot run with.
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
        self.lookup.wait_budget.validate()?;
        if self.block_size == 0 || 512 % self.block_size != 0 {
            bail!(
                "--block-size must divide the trace's 512-token block, got {}",
                self.block_size
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
        if self.engine.gpu_kv_blocks == 0 {
            bail!("--gpu-kv-blocks must be at least 1");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
