//! `cargo xtask fidelity`: the simulator checked against the real thing. One slice of
//! a trace goes through `cargo xtask replay` (real time, real Mooncake master, our
//! lookup server over ZeroMQ, measured lookups) and through `cargo xtask simulate`
//! with comparable settings, and the two are printed side by side with the agreement
//! targets.
//!
//! Comparable: the same requests, rate, engines, outputs cap, step and load costs,
//! lookup settings and vLLM block size, and the same GPU: both model the KV cache's
//! capacity (`--gpu-kv-blocks`, 16-token blocks), the prefix cache (full blocks
//! cached, freed blocks evictable in vLLM's order, hashes kept until the block is
//! reused, generated blocks hashed) and recompute preemption of the most recently
//! admitted running request, with one implementation: the replay's engine uses the
//! simulator's block pool (`lookup_sim::store::{LocalCache, Held}`) and mirrors its
//! scheduler's running pass (`replay::gpu`). `--no-kv-limits` gives the older
//! comparison (no capacity, no prefix cache, so no preemption, in both). What replay
//! does not model is turned off in the simulator (async scheduling, the scheduler's
//! own time) and the simulator's lookup server is the calibration's
//! `lookup-server-mooncake` profile, the server replay runs. The simulator runs
//! `--repeats` perturbed times, so its column shows its own spread.
//!
//! `--against vllm` ([`vllm`]) compares the engine model with vLLM 0.33's own
//! scheduler instead, step by step (the harness loads vLLM's scheduling code from
//! its wheel with stand-ins for what needs torch); this replay comparison keeps what
//! it measures for real (lookups over ZeroMQ against a real master, real-time
//! arrivals) with the GPU modelled as the simulator models it, so a difference
//! between its two columns is the lookup path's and the clock's, not two block
//! pools'.
//!
//! Printed side by side: the figures' table, preemptions (total and the most of one
//! request) and the queue over time (waiting, running and KV blocks held, summed over
//! the engines, every `--series-every-s`; the full per-engine series, one sample a
//! second, in the JSON).
//!
//! Targets: sync TTFT p50 and p99 within 15 %, ready-at-first-probe within 5 points
//! (every mode), the modelled on-wire lookup latency (p50) within 25 % of the
//! measured one; with KV limits, preemptions (total) within 25 % or 5, and the
//! time-averaged KV blocks held and waiting requests within 20 % (or 1 request).

mod compare;
pub mod scenario;
mod series;
pub mod vllm;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, bail};
use serde::Serialize;

pub use self::series::series_table;
use self::series::{means, span_of, totals};
use crate::replay::engine::EngineModel;
use crate::replay::report::RunSummary;
use crate::replay::{MasterSource, ReplayParams, Transport, peers, replay};
use crate::simulate::calibration::Calibration;
use crate::simulate::engine::SimParams;
use crate::simulate::engine::{Sample, StoreParams};
use crate::simulate::generator;
use crate::simulate::mode::{LookupParams, Mode};
use crate::simulate::report::{ModeSummary, summarise};
use crate::simulate::runner::{Job, perturbed, run_jobs};
use crate::simulate::stability::Range;
use crate::simulate::trace::{self, TraceRequest, TraceSource};

/// What the simulator is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Against {
    /// `cargo xtask replay` (real lookups, the same block pool).
    Replay,
    /// vLLM 0.33's own scheduler from its wheel, step by step ([`vllm`]).
    Vllm,
}

/// Flags of `cargo xtask fidelity`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// What to compare with: replay (the default) or vLLM 0.33's own scheduler.
    #[arg(long, value_enum, default_value_t = Against::Replay)]
    pub against: Against,
    /// Flags of `--against vllm`.
    #[command(flatten)]
    pub vllm: vllm::VllmArgs,
    /// Mooncake-format JSONL trace (without it, the generated one).
    #[arg(long, value_name = "PATH")]
    pub trace: Option<PathBuf>,
    /// Requests of the slice (the first N). Default 600: on 200 bursty requests the
    /// TTFT median falls on a step boundary, so one step's shift moves it by 15 %
    /// while the mean, queue wait, steps and makespan agree within 4 %.
    #[arg(long, value_name = "N", default_value_t = 600)]
    pub limit: usize,
    /// Arrival rate multiplier.
    #[arg(long, value_name = "X", default_value_t = 4.0)]
    pub rate_scale: f64,
    /// Engines.
    #[arg(long, default_value_t = 8)]
    pub engines: u32,
    /// Modes, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sync,prefetch,prefetch+wait"
    )]
    pub modes: Vec<Mode>,
    /// Output tokens per request at most.
    #[arg(long, default_value_t = 1)]
    pub max_output_tokens: u32,
    /// Simulator runs (perturbed reruns after the first).
    #[arg(long, default_value_t = 3)]
    pub repeats: u32,
    /// Calibration for the simulator's server (default: the built-in one).
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    /// Seed of the generated trace.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The `mooncake_master` to start (default as `cargo xtask replay`).
    #[arg(long, value_name = "PATH")]
    pub master_bin: Option<PathBuf>,
    /// The Python with the `mooncake` package (default as `cargo xtask replay`).
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Also write both sides' figures as JSON to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// GPU KV-cache capacity per engine in 16-token blocks (both sides).
    #[arg(long, default_value_t = EngineModel::default().gpu_kv_blocks)]
    pub gpu_kv_blocks: u64,
    /// The older comparison: no KV capacity, no prefix cache, no preemption.
    #[arg(long)]
    pub no_kv_limits: bool,
    /// Rows of the printed queue series every this many seconds (0: about 12 rows).
    #[arg(long, default_value_t = 0)]
    pub series_every_s: u64,
}

/// The simulator's settings comparable with `replay` (see the module docs).
///
/// # Errors
/// The calibration has no `lookup-server-mooncake` profile.
pub fn comparable(r: &ReplayParams, calibration: &Calibration) -> anyhow::Result<SimParams> {
    let m = &r.engine;
    let mut server = calibration
        .profile(Some("lookup-server-mooncake"))?
        .server_params();
    server.block_size = r.block_size;
    server.namespaces = r.tp_size;
    server.concurrency = r.max_in_flight;
    // Replay runs one lookup server (and one master) for all its engines, on the same
    // two cores as everything else: its lookups queue there.
    server.shared = true;
    Ok(SimParams {
        engine: m.sim_engine(r.engines, Some(m.max_output_tokens.max(1))),
        store: StoreParams {
            capacity_blocks: 1 << 40,
            load_fixed_s: m.load_fixed_s,
            load_block_s: m.load_block_s,
        },
        server,
        lookup: r.lookup.clone(),
        rate_scale: r.rate_scale,
        seed: 0,
        order_seed: 0,
        route_offset: 0,
        timeseries: true,
    })
}

/// One mode's two sides.
#[derive(Debug, Serialize)]
pub struct Side {
    /// The mode.
    pub mode: Mode,
    /// `cargo xtask replay`.
    pub replay: RunSummary,
    /// `cargo xtask simulate`, every run (the first unperturbed).
    pub simulate: Vec<ModeSummary>,
    /// The simulator's most preemptions of one request, per run.
    pub simulate_preemptions_max: Vec<u32>,
    /// The simulator's first run: every engine's state once a second.
    pub simulate_timeseries: Vec<Sample>,
}

/// A row: label, the replay's value, the simulator's values, and how to print them.
type Row = (
    &'static str,
    fn(&RunSummary) -> f64,
    fn(&ModeSummary) -> f64,
    usize,
);

const ROWS: [Row; 12] = [
    ("TTFT p50 (ms)", |r| r.ttft_ms.p50, |s| s.ttft_ms.p50, 1),
    ("TTFT p99 (ms)", |r| r.ttft_ms.p99, |s| s.ttft_ms.p99, 1),
    ("TTFT mean (ms)", |r| r.ttft_ms.mean, |s| s.ttft_ms.mean, 1),
    (
        "ready at first probe (%)",
        |r| r.ready_at_first_probe.unwrap_or(0.0) * 100.0,
        |s| s.ready_at_first_probe.unwrap_or(0.0) * 100.0,
        1,
    ),
    (
        "lookup on the wire p50 (µs)",
        |r| r.lookup_on_wire_us.p50,
        |s| s.lookups.on_wire_ms.p50 * 1e3,
        0,
    ),
    (
        "lookup on the wire p99 (µs)",
        |r| r.lookup_on_wire_us.p99,
        |s| s.lookups.on_wire_ms.p99 * 1e3,
        0,
    ),
    (
        "lookup total p50 (µs)",
        |r| r.lookup_total_us.p50,
        |s| s.lookups.total_ms.p50 * 1e3,
        0,
    ),
    (
        "lookup total p99 (µs)",
        |r| r.lookup_total_us.p99,
        |s| s.lookups.total_ms.p99 * 1e3,
        0,
    ),
    (
        "RPCs sent",
        |r| r.rpcs_sent as f64,
        |s| s.rpcs_sent as f64,
        0,
    ),
    (
        "lookups deferred",
        |r| r.lookups_deferred as f64,
        |s| s.lookups_deferred as f64,
        0,
    ),
    (
        "preemptions",
        |r| r.preemptions as f64,
        |s| s.preemptions as f64,
        0,
    ),
    (
        "engine blocked on lookups (s)",
        |r| r.engine_blocked_s,
        |s| s.engine_blocked_s,
        3,
    ),
];

/// The side-by-side table: per mode, replay, the simulator (first run, and min-max
/// over its reruns), and the difference of the first run from replay.
#[must_use]
pub fn table(sides: &[Side]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:<30} {:>12} {:>12} {:>22} {:>9}",
        "mode", "figure", "replay", "simulate", "simulate min-max", "diff"
    );
    for side in sides {
        for (label, of_replay, of_sim, digits) in ROWS {
            let r = of_replay(&side.replay);
            let first = side.simulate.first().map_or(0.0, of_sim);
            let range = Range::of(side.simulate.iter().map(of_sim));
            let diff = if label.starts_with("ready") {
                format!("{:+.1} pt", first - r)
            } else if r.abs() > 1e-12 {
                format!("{:+.1} %", (first - r) / r * 100.0)
            } else {
                "-".to_owned()
            };
            let _ = writeln!(
                out,
                "{:<16} {:<30} {:>12.digits$} {:>12.digits$} {:>22} {:>9}",
                side.mode.name(),
                label,
                r,
                first,
                format!("{:.digits$}-{:.digits$}", range.min, range.max),
                diff,
            );
        }
        let r = side.replay.preemptions_max;
        let first = side.simulate_preemptions_max.first().copied().unwrap_or(0);
        let range = Range::of(side.simulate_preemptions_max.iter().map(|&m| f64::from(m)));
        let _ = writeln!(
            out,
            "{:<16} {:<30} {:>12} {:>12} {:>22} {:>9}",
            side.mode.name(),
            "preemptions per request, max",
            r,
            first,
            format!("{:.0}-{:.0}", range.min, range.max),
            format!("{:+}", i64::from(first) - i64::from(r)),
        );
    }
    out
}

/// One agreement target and how it went.
#[derive(Debug, Serialize)]
pub struct Target {
    /// What is compared.
    pub what: String,
    /// The simulator's first run against replay: relative difference (fraction),
    /// points, or a difference of counts.
    pub got: f64,
    /// The bound.
    pub bound: f64,
    /// `|got| <= bound`.
    pub met: bool,
}

/// The targets of the module docs, for the modes present; those of the KV cache
/// only with `kv_limits`.
#[must_use]
pub fn targets(sides: &[Side], kv_limits: bool) -> Vec<Target> {
    let mut out = Vec::new();
    let rel = |a: f64, b: f64| if b.abs() > 1e-12 { (a - b) / b } else { 0.0 };
    for side in sides {
        let Some(sim) = side.simulate.first() else {
            continue;
        };
        let r = &side.replay;
        let mut push = |what: String, got: f64, bound: f64| {
            out.push(Target {
                what,
                got,
                bound,
                met: got.abs() <= bound,
            });
        };
        if side.mode == Mode::Sync {
            push(
                "sync TTFT p50 (relative)".into(),
                rel(sim.ttft_ms.p50, r.ttft_ms.p50),
                0.15,
            );
            push(
                "sync TTFT p99 (relative)".into(),
                rel(sim.ttft_ms.p99, r.ttft_ms.p99),
                0.15,
            );
        }
        push(
            format!("{} ready at first probe (points)", side.mode),
            (sim.ready_at_first_probe.unwrap_or(0.0) - r.ready_at_first_probe.unwrap_or(0.0))
                * 100.0,
            5.0,
        );
        push(
            format!("{} lookup on the wire p50 (relative)", side.mode),
            rel(sim.lookups.on_wire_ms.p50 * 1e3, r.lookup_on_wire_us.p50),
            0.25,
        );
        if !kv_limits {
            continue;
        }
        // Preemptions: 25 %, or 5 when there are few.
        let (a, b) = (sim.preemptions as f64, r.preemptions as f64);
        let bound = (b * 0.25).max(5.0);
        out.push(Target {
            what: format!("{} preemptions (count)", side.mode),
            got: a - b,
            bound,
            met: (a - b).abs() <= bound,
        });
        let (rt, st) = (
            totals(&side.replay.timeseries),
            totals(&side.simulate_timeseries),
        );
        let span = span_of(&rt).max(span_of(&st));
        let ((rw, rk), (sw, sk)) = (means(&rt, span), means(&st, span));
        out.push(Target {
            what: format!("{} KV held, time average (relative)", side.mode),
            got: rel(sk, rk),
            bound: 0.2,
            met: rel(sk, rk).abs() <= 0.2,
        });
        // Waiting: 20 %, or 1 request when the queue is short.
        let bound = (rw * 0.2).max(1.0);
        out.push(Target {
            what: format!("{} waiting, time average (count)", side.mode),
            got: sw - rw,
            bound,
            met: (sw - rw).abs() <= bound,
        });
    }
    out
}

/// `cargo xtask fidelity`: replay, then simulate, then the table and the targets.
///
/// # Errors
/// A bad flag or trace; the replay's peers cannot start (naming the install step); a
/// run fails; the JSON cannot be written.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.against == Against::Vllm {
        return vllm::run(&args.vllm, args.seed);
    }
    if args.limit == 0 || args.repeats == 0 {
        bail!("--limit and --repeats must be at least 1");
    }
    let (mut requests, source): (Vec<TraceRequest>, String) = match &args.trace {
        Some(path) => (trace::load(path)?, path.display().to_string()),
        None => (
            generator::generate(args.seed, args.limit),
            format!("generated (seed {})", args.seed),
        ),
    };
    requests.truncate(args.limit);
    let calibration = match &args.calibration {
        Some(path) => Calibration::load(path)?,
        None => Calibration::builtin().clone(),
    };
    let params = ReplayParams {
        modes: args.modes.clone(),
        transports: vec![Transport::Zmq],
        rate_scale: args.rate_scale,
        engines: args.engines,
        engine: EngineModel {
            max_output_tokens: args.max_output_tokens,
            gpu_kv_blocks: if args.no_kv_limits {
                1 << 32
            } else {
                args.gpu_kv_blocks
            },
            prefix_cache: !args.no_kv_limits,
            ..EngineModel::default()
        },
        lookup: LookupParams::default(),
        master: MasterSource::Start(
            args.master_bin
                .clone()
                .unwrap_or_else(peers::default_master_bin),
        ),
        python: args.python.clone().unwrap_or_else(peers::default_python),
        progress: true,
        ..ReplayParams::default()
    };
    let sim = comparable(&params, &calibration)?;
    let gpu = if args.no_kv_limits {
        "no KV limit, no prefix cache".to_owned()
    } else {
        format!(
            "{} KV blocks per engine, prefix cache and preemption on",
            args.gpu_kv_blocks
        )
    };
    println!(
        "fidelity: {source}, first {} requests, rate scale {}, {} engines, outputs capped at {}, block size {}, {gpu}; \
         simulate's server: lookup-server-mooncake of the calibration of {} ({})",
        requests.len(),
        args.rate_scale,
        args.engines,
        args.max_output_tokens,
        params.block_size,
        calibration.date,
        calibration.machine
    );
    eprintln!(
        "== replay (real time: about {:.0} s per mode)",
        span_s(&requests) / args.rate_scale + 5.0
    );
    let replayed = replay(&requests, &params).context("replay")?;
    eprintln!("== simulate");
    let memory = TraceSource::Memory(Arc::from(requests.clone()));
    let sim_ref = &sim;
    let jobs: Vec<Job> = args
        .modes
        .iter()
        .flat_map(|&mode| {
            (0..args.repeats).map(move |i| Job {
                params: perturbed(sim_ref, i),
                mode,
            })
        })
        .collect();
    let most: Vec<AtomicU32> = jobs.iter().map(|_| AtomicU32::new(0)).collect();
    let results = run_jobs(&memory, None, &jobs, &|job, r| {
        most[job].fetch_max(r.preemptions, Ordering::Relaxed);
    })?;
    let most: Vec<u32> = most.into_iter().map(AtomicU32::into_inner).collect();
    let summaries: Vec<ModeSummary> = results
        .iter()
        .map(|r| summarise(r, sim.engine.gpu_kv_blocks))
        .collect();
    let per = args.repeats as usize;
    let sides: Vec<Side> = args
        .modes
        .iter()
        .zip(replayed.runs)
        .enumerate()
        .map(|(k, (&mode, replay))| Side {
            mode,
            replay,
            simulate: summaries[k * per..(k + 1) * per].to_vec(),
            simulate_preemptions_max: most[k * per..(k + 1) * per].to_vec(),
            simulate_timeseries: results[k * per].timeseries.clone(),
        })
        .collect();
    println!();
    print!("{}", table(&sides));
    println!();
    print!("{}", series_table(&sides, args.series_every_s));
    println!();
    let goals = targets(&sides, !args.no_kv_limits);
    for t in &goals {
        let shown = if t.what.ends_with("(points)") {
            format!("{:+.1} points (target within {})", t.got, t.bound)
        } else if t.what.ends_with("(count)") {
            format!("{:+.1} (target within {:.1})", t.got, t.bound)
        } else {
            format!(
                "{:+.1} % (target within {:.0} %)",
                t.got * 100.0,
                t.bound * 100.0
            )
        };
        println!(
            "  {:<9} {:<44} {shown}",
            if t.met { "[met]" } else { "[not met]" },
            t.what
        );
    }
    if let Some(path) = &args.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            trace: String,
            requests: usize,
            simulate_params: &'a SimParams,
            sides: &'a [Side],
            targets: &'a [Target],
        }
        let doc = Doc {
            trace: source,
            requests: requests.len(),
            simulate_params: &sim,
            sides: &sides,
            targets: &goals,
        };
        let text = serde_json::to_string_pretty(&doc).context("encoding JSON")?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        println!("JSON: {}", path.display());
    }
    Ok(())
}

fn span_s(requests: &[TraceRequest]) -> f64 {
    requests
        .last()
        .zip(requests.first())
        .map_or(0.0, |(l, f)| (l.timestamp - f.timestamp) as f64 / 1e3)
}
