//! The trace-replay simulator behind `cargo xtask simulate` (`xtask` parses the flags
//! and calls [`run`]): replays a Mooncake trace through a model of vLLM-like
//! engines (four data-parallel replicas by default, sharing one external store), each
//! with the real `lookup-core` connector on a virtual clock, in the lookup modes
//! `sync`, `async`, `prefetch`, `prefetch+` and `prefetch+wait`, side by side; checks
//! that the result is stable over perturbed reruns, and ends with a recommendation.
//!
//! Modules: [`args`] (flags), [`request`] (a trace's record), [`trace`] (streamed
//! JSONL input), [`generator`] (the embedded default trace), [`engine`] (the
//! discrete-event engine model and its cost model), [`store`] (GPU prefix cache and
//! external store), [`server`] (the lookup server model: keys, calls, costs),
//! [`calibration`] (measured server costs), `connector` (the core on the virtual
//! clock), [`mode`] (the five configurations), [`budget`] (`prefetch+wait`'s wait
//! budget), [`runner`] (many runs on every core, perturbed reruns), [`stability`],
//! [`health`] (the overload detector), [`counters`] (what names a mechanism),
//! [`recommend`] with [`margin`] (paired p99 ratios) and [`mechanism`] (why a setting
//! lost), [`sweep`] with [`knee`] (where a rate sweep's modes give way), [`report`]
//! (table, plots), [`progress`] (stderr). The program's steps are [`run_to`]'s;
//! `setup`, `output` and `sweep_run` hold what they share, write, and the sweep.
//!
//! No module imports from one that imports from it (`tests/structure.rs`).

pub mod args;
pub mod budget;
pub mod calibration;
mod connector;
pub mod counters;
pub mod engine;
pub mod generator;
mod hash;
pub mod health;
pub mod knee;
pub mod margin;
pub mod mechanism;
pub mod mode;
mod output;
pub mod progress;
pub mod recommend;
pub mod report;
pub mod request;
pub mod runner;
pub mod server;
mod setup;
pub mod stability;
pub mod store;
pub mod sweep;
mod sweep_run;
pub mod trace;

use std::time::{Duration, Instant};

use serde::Serialize;

pub use self::args::Args;
use self::engine::ModeResult;
use self::mode::Mode;
use self::output::{RequestsOut, default_plot_path, header, title, write_json, write_timeseries};
use self::recommend::{Problem, Recommendation, Scored, Setting};
use self::report::{ModeSummary, summarise};
pub use self::runner::run_modes;
use self::runner::{Job, perturbed, run_jobs};
use self::setup::Setup;
use self::stability::Verdict;

/// What `--json` holds after the modes' figures.
#[derive(Serialize)]
struct Analysis<'a> {
    stability: &'a [Verdict],
    prefetch_plus_merged: bool,
    recommendation: Option<&'a Recommendation>,
}

/// `cargo xtask simulate`: streams or generates the trace, runs every mode (and its
/// perturbed reruns) on every core, prints the table, the stability verdict and the
/// recommendation; or, with `--sweep`, the sweep. Writes the JSON and the plots.
/// Progress goes to stderr when it is a terminal (not with `--quiet`).
///
/// # Errors
/// A bad flag, an unreadable or malformed trace (naming the line), a request that
/// cannot fit the GPU, an output folder that cannot be made (before the run), a file
/// that cannot be written. A plot that cannot be drawn is reported as a warning only.
pub fn run(args: &Args) -> anyhow::Result<()> {
    run_to(args, &mut std::io::stdout().lock())
}

/// [`run`], printing to `out` (progress and warnings still go to stderr). The
/// steps: set up, simulate the modes and their reruns, print the table, judge the
/// reruns, recommend, write the files.
///
/// # Errors
/// As [`run`], and a failed write to `out`.
pub fn run_to(args: &Args, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    for path in [&args.json, &args.timeseries, &args.write_trace]
        .into_iter()
        .flatten()
    {
        output::prepare_output(path)?;
    }
    let setup = Setup::of(args)?;
    if let Some(path) = &args.write_trace {
        setup.write_trace(path)?;
    }
    if !args.sweep.is_empty() {
        return sweep_run::run_sweep(args, &setup, out);
    }
    let sim = simulate_modes(args, &setup)?;
    if let Some(path) = &args.timeseries {
        write_timeseries(path, &sim.results[..setup.modes.len()])?;
    }
    let merged = print_modes(&setup, &sim, out)?;
    let (verdicts, best_median_ms) = judge(&setup, &sim, out)?;
    let recommendation = if args.no_recommend {
        None
    } else {
        Some(recommend_settings(
            &setup,
            merged,
            &verdicts,
            best_median_ms,
            out,
        )?)
    };
    if let Some(path) = &args.json {
        let doc = report::Report {
            trace: setup.described.clone(),
            requests: sim.requests,
            params: &setup.params,
            calibration: setup.cal_name.clone(),
            modes: &sim.summaries[..setup.modes.len()],
            analysis: Analysis {
                stability: &verdicts,
                prefetch_plus_merged: merged,
                recommendation: recommendation.as_ref(),
            },
        };
        write_json(path, &doc, out)?;
    }
    if !args.no_plot {
        plot(args, &setup, &sim.results, out)?;
    }
    Ok(())
}

/// The modes' runs: rerun `i` of mode `m` is job `i * modes + m`.
struct Simulated {
    results: Vec<ModeResult>,
    summaries: Vec<ModeSummary>,
    requests: u64,
    jobs: usize,
    wall: Duration,
}

/// Step 1: every mode and its perturbed reruns on every core (`--requests-out` gets
/// the first run of each mode).
fn simulate_modes(args: &Args, setup: &Setup) -> anyhow::Result<Simulated> {
    let started = Instant::now();
    let modes = &setup.modes;
    let jobs: Vec<Job> = (0..args.repeats)
        .flat_map(|i| {
            let p = perturbed(&setup.params, i);
            modes.iter().map(move |&mode| Job {
                params: p.clone(),
                mode,
            })
        })
        .collect();
    let labels = jobs
        .iter()
        .enumerate()
        .map(|(j, job)| format!("{} rerun {}", job.mode, j / modes.len()))
        .collect();
    let stage = setup.progress.stage(
        &format!("modes: {} x {} runs", modes.len(), args.repeats),
        labels,
        setup.requests,
    );
    let requests_out = args
        .requests_out
        .as_deref()
        .map(RequestsOut::create)
        .transpose()?;
    let results = run_jobs(&setup.source, setup.limit, &jobs, &|job, r| {
        stage.on_request(job);
        if let Some(out) = requests_out.as_ref().filter(|_| job < modes.len()) {
            out.write(modes[job], r);
        }
    })?;
    stage.finish();
    if let Some(out) = requests_out {
        out.finish()?;
    }
    let kv = setup.params.engine.gpu_kv_blocks;
    let summaries: Vec<ModeSummary> = results.iter().map(|r| summarise(r, kv)).collect();
    let requests = summaries.first().map_or(0, |s| s.requests);
    anyhow::ensure!(requests > 0, "the trace has no requests");
    Ok(Simulated {
        results,
        summaries,
        requests,
        jobs: jobs.len(),
        wall: started.elapsed(),
    })
}

/// Step 2: the header and the table of the modes' first runs. Returns whether
/// `prefetch+` was merged into `prefetch`'s column.
fn print_modes(
    setup: &Setup,
    sim: &Simulated,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<bool> {
    let modes = &setup.modes;
    let base = &sim.summaries[..modes.len()];
    writeln!(
        out,
        "{}",
        header(
            &setup.source.describe(),
            sim.requests,
            &setup.params,
            &setup.cal_name
        )
    )?;
    writeln!(out)?;
    // prefetch+ earns its column only where priority or sharing changed something.
    let pos = |m: Mode| modes.iter().position(|&x| x == m);
    let merged = match (pos(Mode::Prefetch), pos(Mode::PrefetchPlus)) {
        (Some(a), Some(b)) => report::same_as(&base[a], &base[b]),
        _ => false,
    };
    let shown: Vec<ModeSummary> = base
        .iter()
        .filter(|s| !(merged && s.mode == Mode::PrefetchPlus))
        .cloned()
        .collect();
    let labels: Vec<String> = shown
        .iter()
        .map(|s| match s.mode {
            Mode::Prefetch if merged => "prefetch(+)".to_owned(),
            m => m.name().to_owned(),
        })
        .collect();
    write!(out, "{}", report::labelled(&shown, &labels))?;
    if merged {
        let plus = &base[pos(Mode::PrefetchPlus).unwrap_or(0)];
        writeln!(
            out,
            "prefetch(+): prefetch+ measured the same as prefetch (TTFT within 0.5 %), so its column is merged: \
             its priority promoted {} queued prefetches and sharing joined {} lookups. Priority matters when \
             waiting requests are probed out of arrival order (routers, retries, preemption), sharing with \
             identical prompts in flight at once; this trace has too few of either.",
            plus.promotions, plus.rpcs_shared
        )?;
    }
    writeln!(out)?;
    Ok(merged)
}

/// Step 3: each mode's verdict over its reruns, after the tail sign (a rerun's p99
/// over twice the best mode's median is unhealthy), printed. Returns the verdicts
/// and that median (ms).
fn judge(
    setup: &Setup,
    sim: &Simulated,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<(Vec<Verdict>, f64)> {
    let modes = &setup.modes;
    let of_mode = |i: usize| -> Vec<ModeSummary> {
        sim.summaries
            .iter()
            .skip(i)
            .step_by(modes.len())
            .cloned()
            .collect()
    };
    let best_median_ms = (0..modes.len())
        .map(|i| {
            let p99: Vec<f64> = of_mode(i).iter().map(|s| s.ttft_ms.p99).collect();
            margin::median(&p99)
        })
        .fold(f64::INFINITY, f64::min);
    let verdicts: Vec<Verdict> = modes
        .iter()
        .enumerate()
        .map(|(i, &m)| {
            let mut runs = of_mode(i);
            for s in &mut runs {
                s.health.judge_tail(s.ttft_ms.p99, best_median_ms);
            }
            Verdict::of(m, &runs)
        })
        .collect();
    write!(out, "{}", stability::describe(&verdicts))?;
    writeln!(
        out,
        "simulated {} requests x {} modes x {} runs in {:.1} s on {} threads",
        sim.requests,
        modes.len(),
        sim.jobs / modes.len().max(1),
        sim.wall.as_secs_f64(),
        runner::workers(sim.jobs)
    )?;
    Ok((verdicts, best_median_ms))
}

/// Step 4: the search over the lookup settings, from the modes' own runs, printed.
fn recommend_settings(
    setup: &Setup,
    merged: bool,
    verdicts: &[Verdict],
    best_median_ms: f64,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<Recommendation> {
    let started = Instant::now();
    let search: Vec<Mode> = setup
        .modes
        .iter()
        .copied()
        .filter(|&m| !(merged && m == Mode::PrefetchPlus))
        .collect();
    let known: Vec<Scored> = setup
        .modes
        .iter()
        .zip(verdicts)
        .filter(|(m, _)| search.contains(m))
        .map(|(&m, v)| Scored {
            setting: Setting::of(m, &setup.params),
            verdict: v.clone(),
            screened_out: false,
        })
        .collect();
    let problem = Problem {
        source: &setup.source,
        limit: setup.limit,
        base: &setup.params,
        modes: &search,
        repeats: verdicts.first().map_or(1, |v| v.runs) as u32,
        requests: setup.requests,
        best_median_ms,
        progress: setup.progress,
    };
    let r = recommend::search(&problem, known)?;
    writeln!(out)?;
    write!(out, "{}", recommend::describe(&r))?;
    writeln!(
        out,
        "  (searched in {:.1} s)",
        started.elapsed().as_secs_f64()
    )?;
    Ok(r)
}

/// Step 5: the TTFT CDF and tail plot of the modes' first runs (a warning when it
/// cannot be drawn).
fn plot(
    args: &Args,
    setup: &Setup,
    results: &[ModeResult],
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let path = args.plot.clone().unwrap_or_else(default_plot_path);
    let curves: Vec<(Mode, &hdrhistogram::Histogram<u64>)> = results[..setup.modes.len()]
        .iter()
        .map(|r| (r.mode, &r.ttft_us))
        .collect();
    match report::plot::plot_ttft(&curves, &title(&setup.described, &setup.params), &path) {
        Ok(()) => writeln!(out, "TTFT CDF and tail plot: {}", path.display())?,
        Err(e) => eprintln!("warning: no plot ({e:#}); the figures above are complete"),
    }
    Ok(())
}
