//! `cargo xtask bench`: the lookup channel's performance, side by side, in one run
//! (the throughput and caller-cost goals of `bench/README.md`). `bench/README.md` explains every row.
//!
//! Every row sends the same lookup ([`payload::Payload`]: 64 block hashes of 32 bytes,
//! `num_tokens` 64 × 16 + 1, `tagged-blob`) over ipc in a temporary directory, to a
//! server on a thread of its own, and checks every answer:
//!
//! 1. caller cost: how long the scheduler's call takes, ours
//!    ([`LookupClient::probe`](lookup_tokio::LookupClient::probe), async mode) against
//!    the Python design's `lookup(..., non_block=True)`, per kind of call, in a
//!    scheduler-like loop against the slow index (so lookups stay pending across
//!    steps);
//! 2. lookups per second against an in-memory index: a bare tmq REQ/REP loop (the
//!    reference), our client with `max_in_flight` 1 and 4, the Python design, and two
//!    rows that split our loop's cost between client and server;
//! 3. lookups per second against an index that takes `--index-ms` per call;
//! 4. the caller's cost while tracked requests grow to 100,000 ([`growth`]), with
//!    the caller-cost limits as the tracked requests grow.
//!
//! Each measurement is repeated `--reps` times, the rows interleaved, and the table
//! shows medians. `--json PATH` writes every run too.
//!
//! `--python` runs another section alone ([`dropin`]): the Python package's drop-in
//! against vLLM's own client, both called from Python.
//!
//! `--step` runs another section alone ([`step`]): the lookup time of whole scheduler
//! steps at 32, 256 and 1,024 waiting requests, against a floor measured in the same
//! loop. Its figures lead; the per-call rows above are diagnostics.

pub mod dropin;
pub mod growth;
pub mod ours;
pub mod payload;
mod peers;
pub mod python;
pub mod report;
pub mod stats;
pub mod step;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lookup_server::{Endpoint, KeyLayout, ServerConfig};

use ours::Placement;
pub use peers::DelayKind;
use peers::{ServerThread, SlowIndex};
use python::{Python, PythonMode};
use report::{Report, Row, Settings};

/// Command-line flags of `cargo xtask bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Repetitions of every measurement; the table shows the median. Many short runs,
    /// interleaved, meet the same background load more evenly than a few long ones.
    #[arg(long, default_value_t = 9)]
    pub reps: usize,
    /// Lookups per throughput run against the in-memory index.
    #[arg(long, value_name = "N", default_value_t = 5_000)]
    pub count: usize,
    /// Lookups per throughput run against the slow index.
    #[arg(long, value_name = "N", default_value_t = 600)]
    pub slow_count: usize,
    /// Requests per run of the caller-cost loop (against the slow index, so that
    /// lookups stay pending across steps).
    #[arg(long, value_name = "N", default_value_t = 400)]
    pub probe_count: usize,
    /// Caller-cost loop: new requests per scheduler step.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub arrivals_per_step: usize,
    /// Caller-cost loop: the wait between two steps (µs), standing for the model's
    /// forward pass.
    #[arg(long, value_name = "US", default_value_t = 1_000)]
    pub step_us: u64,
    /// Requests that arrive together in the async (prefetch) throughput rows.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub batch: usize,
    /// Unmeasured lookups at the start of every run (connection set-up, warm caches).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub warmup: usize,
    /// Latency of the slow index per existence call (ms).
    #[arg(long, value_name = "MS", default_value_t = 1.0)]
    pub index_ms: f64,
    /// How the slow index waits: `precise` (a blocking-pool thread sleeps; about
    /// 0.1 ms late) or `tokio` (`DelayedIndex`; tokio timers round up to whole ms).
    #[arg(long, value_enum, default_value_t = DelayKind::Precise)]
    pub delay: DelayKind,
    /// A smoke run of a few seconds: 2 repetitions and a tenth of every count.
    #[arg(long)]
    pub quick: bool,
    /// Run only these sections (comma-separated); goals that need another show n/a.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "caller,fast,slow"
    )]
    pub only: Vec<Section>,
    /// Also write every figure and setting as JSON to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// The Python interpreter that runs the Python design (needs pyzmq).
    #[arg(long, value_name = "PATH", default_value = "python3")]
    pub python_bin: PathBuf,
    /// Run only the Python section: `mooncake_lookup`'s drop-in (release wheel)
    /// against vLLM 0.33.0's own `LookupKeyClient`, both called from Python, same
    /// `lookup-server` (`scripts/python/bench.sh`; `--reps` and `--quick` apply).
    #[arg(long)]
    pub python: bool,
    /// Skip the Python design's rows (and the goals that need them).
    #[arg(long)]
    pub no_python: bool,
    /// Run only the step section ([`step`]): lookup time per scheduler step against
    /// a floor measured in the same loop (`--reps` and `--quick` apply).
    #[arg(long)]
    pub step: bool,
    /// Step section: the queue lengths (waiting requests, and burst sizes).
    #[arg(long, value_delimiter = ',', default_value = "32,256,1024")]
    pub step_queues: Vec<usize>,
    /// Step section: measured steps per steady run.
    #[arg(long, value_name = "N", default_value_t = 300)]
    pub step_steps: usize,
    /// Step section: requests admitted (and, steady, arriving) per step.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub step_admit: usize,
    /// Step section: the index's latency per existence call (µs; a blocking-pool
    /// thread sleeps it).
    #[arg(long, value_name = "US", default_value_t = 500)]
    pub step_index_us: u64,
}

impl Args {
    /// The settings in force: `--quick` divides the counts by 10 (at least 10 each,
    /// 20 warm-up lookups) and runs at most 2 repetitions.
    ///
    /// # Errors
    /// When a count or the repetitions are 0, or the index latency is not a positive
    /// number of milliseconds.
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let shrink = |n: usize| if self.quick { (n / 10).max(10) } else { n };
        let settings = Settings {
            reps: if self.quick {
                self.reps.min(2)
            } else {
                self.reps
            },
            count: shrink(self.count),
            slow_count: shrink(self.slow_count),
            probe_count: shrink(self.probe_count),
            arrivals_per_step: self.arrivals_per_step,
            step_us: self.step_us,
            batch: self.batch,
            warmup: if self.quick {
                self.warmup.min(20)
            } else {
                self.warmup
            },
            index_ms: self.index_ms,
            delay: self.delay,
            blocks: 64,
            hash_len: 32,
            block_size: 16,
            growth_requests: if self.quick {
                growth::GROWTH_REQUESTS / 10
            } else {
                growth::GROWTH_REQUESTS
            },
            python: !self.no_python,
            sections: self.only.clone(),
        };
        for (name, value) in [
            ("--reps", settings.reps),
            ("--count", settings.count),
            ("--slow-count", settings.slow_count),
            ("--probe-count", settings.probe_count),
            ("--arrivals-per-step", settings.arrivals_per_step),
            ("--batch", settings.batch),
        ] {
            anyhow::ensure!(value > 0, "{name} must be at least 1");
        }
        anyhow::ensure!(
            settings.index_ms.is_finite() && settings.index_ms > 0.0,
            "--index-ms must be a positive number of milliseconds"
        );
        Ok(settings)
    }
}

/// A section of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Section {
    /// 1: caller cost per call.
    Caller,
    /// 2: lookups per second against the in-memory index.
    Fast,
    /// 3: lookups per second against the slow index.
    Slow,
}

/// The checkout this runs in (found at run time, not where it was built).
fn root() -> PathBuf {
    mooncake_peers::workspace_root()
}

/// Runs the benchmark, prints the table and writes the JSON.
///
/// # Errors
/// When Python or pyzmq is missing (unless `--no-python`), a server cannot start, a
/// lookup is answered wrongly or not at all, or the JSON cannot be written.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let settings = args.settings()?;
    if args.python {
        return run_drop_in(args, &settings);
    }
    if args.step {
        return run_step(args, &settings);
    }
    let python = Python {
        interpreter: args.python_bin.clone(),
        script: python::script_path(&root()),
    };
    let python_version = if settings.python {
        Some(python.check()?)
    } else {
        None
    };
    let payload = payload::Payload::new(settings.blocks, settings.hash_len, settings.block_size)?;
    let dir = tempfile::Builder::new()
        .prefix("lookup-bench")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let layout = KeyLayout::default();
    let server_config = ServerConfig::new(payload.block_size, layout.clone());

    let bare = ServerThread::bare_rep(
        "bench-bare-rep",
        Endpoint::Ipc(dir.path().join("bare.ipc")),
        payload.reply.clone(),
    )?;
    let fast = ServerThread::lookup_server(
        "bench-server",
        Endpoint::Ipc(dir.path().join("fast.ipc")),
        server_config.clone(),
        Arc::new(payload.index(&layout)),
    )?;
    let slow_index = Arc::new(SlowIndex::new(
        payload.index(&layout),
        Duration::from_secs_f64(settings.index_ms / 1e3),
        settings.delay,
    ));
    let slow = ServerThread::lookup_server(
        "bench-server-slow",
        Endpoint::Ipc(dir.path().join("slow.ipc")),
        server_config,
        Arc::clone(&slow_index) as _,
    )?;

    let mut report = Report::new(settings.clone(), python_version);
    let rows: Vec<Row> = Row::ALL
        .iter()
        .copied()
        .filter(|r| settings.python || !r.is_python())
        .filter(|r| {
            let section = if r.is_slow() {
                Section::Slow
            } else {
                Section::Fast
            };
            settings.sections.contains(&section)
        })
        .collect();
    let caller = settings.sections.contains(&Section::Caller);
    let client_runtime = peers::current_thread_runtime()?;
    for rep in 0..settings.reps {
        eprint!("run {}/{}:", rep + 1, settings.reps);
        let placements = if caller {
            &[Placement::OneThread, Placement::TwoThreads][..]
        } else {
            &[]
        };
        for &placement in placements {
            let costs = ours::probe_cost(
                placement,
                &slow.endpoint,
                &payload,
                settings.warmup.min(20),
                settings.probe_count,
                settings.arrivals_per_step,
                Duration::from_micros(settings.step_us),
            )
            .with_context(|| format!("caller cost, ours ({})", placement.label()))?;
            report.add_probe_costs(placement, costs);
        }
        if caller && settings.python {
            let run = python
                .run(
                    &slow.endpoint.url(),
                    &payload,
                    &PythonMode::Probe {
                        arrivals_per_step: settings.arrivals_per_step,
                        step_us: settings.step_us,
                    },
                    settings.warmup.min(20),
                    settings.probe_count,
                )
                .context("caller cost, Python design")?;
            report.add_python_probe_costs(run.probe_costs());
        }
        if caller {
            let growth = growth::growth_cost(&slow.endpoint, &payload, settings.growth_requests)
                .context("caller cost while the request table grows")?;
            report.add_growth(growth);
            eprint!(" caller cost");
        }
        for &row in &rows {
            let value = run_row(
                row,
                &settings,
                &payload,
                &python,
                &client_runtime,
                [&bare, &fast, &slow],
            )
            .with_context(|| format!("row `{}`", row.label()))?;
            report.add_throughput(row, value);
            eprint!(".");
        }
        eprintln!(" done");
    }
    report.slow_index_mean_s = slow_index.mean_call_s();
    bare.stop()?;
    fast.stop()?;
    slow.stop()?;

    let report = report.finish();
    print!("{}", report.table());
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// The `--python` section: runs it, prints its table, writes its JSON.
fn run_drop_in(args: &Args, settings: &Settings) -> anyhow::Result<()> {
    let run = dropin::run(&root(), settings.reps, args.quick)?;
    print!("{}", run.table());
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&run)?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// The `--step` section: every (workload, path, queue) cell `--reps` times,
/// interleaved, against one server whose index answers after `--step-index-us`;
/// prints its table, writes its JSON.
fn run_step(args: &Args, settings: &Settings) -> anyhow::Result<()> {
    let s = step::StepSettings {
        queues: args.step_queues.clone(),
        steps: if args.quick { 30 } else { args.step_steps },
        warmup_steps: 20,
        admit: args.step_admit,
        run: 20,
        step_us: settings.step_us,
        prefetch_limit: 64,
        max_in_flight: 16,
        reps: settings.reps,
    };
    anyhow::ensure!(
        s.admit > 0 && s.steps > 0,
        "--step-admit and --step-steps must be at least 1"
    );
    let payload = payload::Payload::new(settings.blocks, settings.hash_len, settings.block_size)?;
    let dir = tempfile::Builder::new()
        .prefix("lookup-bench-step")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let layout = KeyLayout::default();
    let mut server_config = ServerConfig::new(payload.block_size, layout.clone());
    server_config.max_concurrency = 1024;
    let index = Arc::new(SlowIndex::new(
        payload.index(&layout),
        Duration::from_micros(args.step_index_us),
        DelayKind::Precise,
    ));
    let server = ServerThread::lookup_server(
        "bench-server-step",
        Endpoint::Ipc(dir.path().join("step.ipc")),
        server_config,
        Arc::clone(&index) as _,
    )?;
    let mut cells = Vec::new();
    let mut grid = Vec::new();
    for workload in [step::Workload::Steady, step::Workload::Burst] {
        for path in [step::Path::PerCall, step::Path::Step] {
            for &queue in &s.queues {
                grid.push((workload, path, queue, Vec::new()));
            }
        }
    }
    for rep in 0..s.reps {
        eprint!("step run {}/{}:", rep + 1, s.reps);
        for (workload, path, queue, runs) in &mut grid {
            let run = step::run(&server.endpoint, &payload, &s, *workload, *path, *queue)
                .with_context(|| format!("step loop, {workload:?} {path:?} {queue}"))?;
            runs.push(run);
            eprint!(".");
        }
        eprintln!(" done");
    }
    for (workload, path, queue, runs) in grid {
        cells.push(step::Cell::of(workload, path, queue, runs));
    }
    server.stop()?;
    let report = step::StepReport {
        settings: s,
        index_mean_s: index.mean_call_s(),
        cells,
    };
    print!("{}", report.table());
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// One throughput run of `row`: lookups per second.
fn run_row(
    row: Row,
    settings: &Settings,
    payload: &payload::Payload,
    python: &Python,
    runtime: &tokio::runtime::Runtime,
    [bare, fast, slow]: [&ServerThread; 3],
) -> anyhow::Result<f64> {
    let (warmup, count) = if row.is_slow() {
        (settings.warmup.min(20), settings.slow_count)
    } else {
        (settings.warmup, settings.count)
    };
    let server = if row.is_slow() { slow } else { fast };
    let batch = settings.batch;
    match row {
        Row::Bare => runtime.block_on(peers::bare_req_loop(
            &bare.endpoint.url(),
            payload,
            warmup,
            count,
        )),
        Row::BareReqOurServer => runtime.block_on(peers::bare_req_loop(
            &fast.endpoint.url(),
            payload,
            warmup,
            count,
        )),
        Row::OursSyncBareRep => {
            ours::sync_loop(Placement::OneThread, &bare.endpoint, payload, warmup, count)
        }
        Row::OursSync | Row::SlowOursSync => ours::sync_loop(
            Placement::OneThread,
            &server.endpoint,
            payload,
            warmup,
            count,
        ),
        Row::OursSyncTwoThreads => ours::sync_loop(
            Placement::TwoThreads,
            &server.endpoint,
            payload,
            warmup,
            count,
        ),
        Row::OursBatch1 | Row::SlowOursBatch1 => {
            ours::batch_loop(&server.endpoint, payload, 1, batch, warmup, count)
        }
        Row::OursBatch4 | Row::SlowOursBatch4 => {
            ours::batch_loop(&server.endpoint, payload, 4, batch, warmup, count)
        }
        Row::PythonBatch | Row::SlowPythonBatch => python
            .run(
                &server.endpoint.url(),
                payload,
                &PythonMode::Batch { batch },
                warmup,
                count,
            )
            .map(|r| r.lookups_per_s),
    }
}
