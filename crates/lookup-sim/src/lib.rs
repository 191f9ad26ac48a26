//! The trace-replay simulator behind `cargo xtask simulate` (`xtask` parses the flags
//! and calls [`run`]): replays a Mooncake trace through a model of vLLM-like
//! engines (four data-parallel replicas by default, sharing one external store), each
//! with the real `lookup-core` connector on a virtual clock, in the lookup modes
//! `sync`, `async`, `prefetch`, `prefetch+` and `prefetch+wait`, side by side; checks
//! that the result is stable over perturbed reruns, and ends with a recommendation.
//!
//! Modules: [`args`] (flags), [`trace`] (streamed JSONL input), [`generator`] (the
//! embedded default trace), [`engine`] (the discrete-event engine model and its cost
//! model), [`store`] (GPU prefix cache and external store), [`server`] (the lookup
//! server model: keys, calls, costs), [`calibration`] (measured server costs),
//! `connector` (the core on the virtual clock), [`mode`] (the five configurations),
//! [`budget`] (`prefetch+wait`'s wait budget), [`runner`] (many runs on every core,
//! perturbed reruns), [`stability`], [`health`] (the overload detector),
//! [`recommend`] with [`margin`] (paired p99 ratios) and [`mechanism`] (why a setting
//! lost), [`sweep`] with [`knee`] (where a rate sweep's modes give way), [`report`]
//! (table, JSON, plots).

pub mod args;
pub mod budget;
pub mod calibration;
mod connector;
pub mod engine;
pub mod generator;
pub mod health;
pub mod knee;
pub mod margin;
pub mod mechanism;
pub mod mode;
pub mod recommend;
pub mod report;
pub mod runner;
pub mod server;
pub mod stability;
pub mod store;
pub mod sweep;
pub mod trace;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

pub use self::args::Args;
use self::engine::{ModeResult, RequestRecord, SimParams};
use self::mode::Mode;
use self::recommend::{Recommendation, Scored, Setting};
use self::report::{ModeSummary, summarise};
pub use self::runner::run_modes;
use self::runner::{Job, perturbed, run_jobs};
use self::stability::Verdict;
use self::trace::TraceSource;

fn default_plot_path() -> PathBuf {
    // The workspace's `target/`: this crate sits at `crates/lookup-sim`.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .unwrap_or(manifest)
        .join("target/simulate/ttft_cdf.png")
}

/// `path` with `suffix` before its extension (`a/b.png` + `_sweep` = `a/b_sweep.png`).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let ext = path
        .extension()
        .map_or_else(String::new, |e| format!(".{}", e.to_string_lossy()));
    path.with_file_name(format!("{stem}{suffix}{ext}"))
}

/// A progress bar on stderr for runs longer than a second (hidden when not a terminal).
struct Progress {
    bar: ProgressBar,
    started: Instant,
    shown: AtomicBool,
}

impl Progress {
    fn new(total: Option<u64>) -> anyhow::Result<Self> {
        let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::hidden());
        let template = if total.is_some() {
            "{elapsed_precise} [{bar:40}] {pos}/{len} requests simulated ({eta} left)"
        } else {
            "{elapsed_precise} {pos} requests simulated"
        };
        bar.set_style(
            ProgressStyle::with_template(template)
                .context("progress template")?
                .progress_chars("=> "),
        );
        Ok(Self {
            bar,
            started: Instant::now(),
            shown: AtomicBool::new(false),
        })
    }

    fn tick(&self) {
        self.bar.inc(1);
        if !self.shown.load(Ordering::Relaxed) && self.started.elapsed().as_secs_f64() > 1.0 {
            self.shown.store(true, Ordering::Relaxed);
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }
}

/// Requests the source will give (when known without reading it).
fn known_len(source: &TraceSource, limit: Option<usize>) -> Option<u64> {
    let n = match source {
        TraceSource::Generated { requests, .. } => *requests,
        TraceSource::Memory(reqs) => reqs.len(),
        TraceSource::File(_) => return None,
    };
    Some(limit.map_or(n, |l| l.min(n)) as u64)
}

/// One line of `--requests-out`.
#[derive(Serialize)]
struct RequestLine<'a> {
    mode: Mode,
    #[serde(flatten)]
    record: &'a RequestRecord,
}

/// The run's header: trace, engines, server model, lookup settings.
fn header(source: &str, requests: u64, p: &SimParams, calibration: &str) -> String {
    let s = &p.server;
    format!(
        "trace: {source}, {requests} requests, rate scale {}\n\
         {} engines ({:?}): budget {} tokens, {} seqs, {} GPU KV blocks of 16 tokens each; store {} blocks of 512; arrivals {:?}\n\
         lookup server ({calibration}): {:.3} ms + {:.1} µs/call + {:.2} µs/present key + {:.2} µs/absent key, \
         jitter {:.3} ms, concurrency {}; keys: block size {}, {} namespace(s), {}\n\
         lookups: prefetch limit {}, TTL {} s, timeout {} s, wait budget {}, on preemption {} (wait {} s)",
        p.rate_scale,
        p.engine.engines,
        p.engine.router,
        p.engine.max_num_batched_tokens,
        p.engine.max_num_seqs,
        p.engine.gpu_kv_blocks,
        p.store.capacity_blocks,
        p.engine.arrivals,
        s.fixed_s * 1e3,
        s.per_call_s * 1e6,
        s.present_key_s * 1e6,
        s.absent_key_s * 1e6,
        s.jitter_s * 1e3,
        s.concurrency,
        s.block_size,
        s.namespaces,
        if s.chunk_keys == 0 {
            "one store call per lookup".to_owned()
        } else {
            format!("calls of {} keys with early stop", s.chunk_keys)
        },
        p.lookup.prefetch_limit,
        p.lookup.prefetch_ttl_s,
        p.lookup.timeout_s,
        p.lookup.wait_budget,
        p.lookup.on_preemption,
        p.lookup.preempted_wait_s,
    )
}

/// The short form of the settings, for plot titles (a trace file by its name).
fn title(source: &str, p: &SimParams) -> String {
    let s = &p.server;
    let source = source.rsplit('/').next().unwrap_or(source);
    format!(
        "{source}: {} engines, rate x{}, server {:.2} ms + {:.2}/{:.2} us per key, block size {} x {} namespace(s), concurrency {}; prefetch {} TTL {} s, wait {}",
        p.engine.engines,
        p.rate_scale,
        s.fixed_s * 1e3 + s.per_call_s * 1e3,
        s.present_key_s * 1e6,
        s.absent_key_s * 1e6,
        s.block_size,
        s.namespaces,
        s.concurrency,
        p.lookup.prefetch_limit,
        p.lookup.prefetch_ttl_s,
        sweep::budget_label(&p.lookup.wait_budget),
    )
}

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
///
/// # Errors
/// A bad flag, an unreadable or malformed trace (naming the line), a request that
/// cannot fit the GPU, a file that cannot be written. A plot that cannot be drawn is
/// reported as a warning only.
pub fn run(args: &Args) -> anyhow::Result<()> {
    run_to(args, &mut std::io::stdout().lock())
}

/// [`run`], printing to `out` (the progress bar and warnings still go to stderr).
///
/// # Errors
/// As [`run`], and a failed write to `out`.
pub fn run_to(args: &Args, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let params = args.params()?;
    let calibration = args.calibration()?;
    let profile = calibration.profile(args.server_profile.as_deref())?;
    let cal_name = format!(
        "{}, calibrated {} on {}",
        profile.name, calibration.date, calibration.machine
    );
    let mut modes = args.modes.clone();
    modes.dedup();
    if args.limit == Some(0) {
        bail!("--limit 0 leaves no request to replay");
    }
    if args.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    let source = args.source();
    let limit = args.limit;
    let described = match limit {
        Some(n) => format!("{} (first {n})", source.describe()),
        None => source.describe(),
    };
    if let Some(path) = &args.write_trace {
        let file =
            std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
        let mut out = std::io::BufWriter::new(file);
        for r in source.open(limit)? {
            serde_json::to_writer(&mut out, &r?).context("encoding a request")?;
            out.write_all(b"\n")
                .with_context(|| format!("writing {}", path.display()))?;
        }
        out.flush()
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if !args.sweep.is_empty() {
        return run_sweep(args, &source, &described, &params, &modes, &cal_name, out);
    }

    let started = Instant::now();
    let repeats = args.repeats;
    let jobs: Vec<Job> = (0..repeats)
        .flat_map(|i| {
            let p = perturbed(&params, i);
            modes.iter().map(move |&mode| Job {
                params: p.clone(),
                mode,
            })
        })
        .collect();
    let progress = Progress::new(known_len(&source, limit).map(|n| n * jobs.len() as u64))?;
    let requests_out = match &args.requests_out {
        Some(path) => Some(Mutex::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?,
        ))),
        None => None,
    };
    let write_failed = AtomicBool::new(false);
    let on_finished = |job: usize, r: &RequestRecord| {
        progress.tick();
        if let Some(out) = requests_out.as_ref().filter(|_| job < modes.len()) {
            let line = RequestLine {
                mode: modes[job],
                record: r,
            };
            let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
            if serde_json::to_writer(&mut *out, &line).is_err() || out.write_all(b"\n").is_err() {
                write_failed.store(true, Ordering::Relaxed);
            }
        }
    };
    let results = run_jobs(&source, limit, &jobs, &on_finished)?;
    progress.bar.finish_and_clear();
    if let (Some(out), Some(path)) = (requests_out, &args.requests_out) {
        let mut out = out.into_inner().unwrap_or_else(|e| e.into_inner());
        if write_failed.load(Ordering::Relaxed) || out.flush().is_err() {
            bail!("writing {}", path.display());
        }
    }
    let wall = started.elapsed();
    if let Some(path) = &args.timeseries {
        write_timeseries(path, &results[..modes.len()])?;
    }
    let kv = params.engine.gpu_kv_blocks;
    let summaries: Vec<ModeSummary> = results.iter().map(|r| summarise(r, kv)).collect();
    let base = &summaries[..modes.len()];
    let requests = base.first().map_or(0, |s| s.requests);
    if requests == 0 {
        bail!("the trace has no requests");
    }
    writeln!(
        out,
        "{}",
        header(&source.describe(), requests, &params, &cal_name)
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
    let verdicts: Vec<Verdict> = modes
        .iter()
        .enumerate()
        .map(|(i, &m)| {
            let runs: Vec<ModeSummary> = summaries
                .iter()
                .skip(i)
                .step_by(modes.len())
                .cloned()
                .collect();
            Verdict::of(m, &runs)
        })
        .collect();
    write!(out, "{}", stability::describe(&verdicts))?;
    writeln!(
        out,
        "simulated {} requests x {} modes x {} runs in {:.1} s on {} threads",
        requests,
        modes.len(),
        repeats,
        wall.as_secs_f64(),
        runner::workers(jobs.len())
    )?;
    let recommendation = if args.no_recommend {
        None
    } else {
        let started = Instant::now();
        let known: Vec<Scored> = modes
            .iter()
            .zip(&verdicts)
            .map(|(&m, v)| Scored {
                setting: Setting::of(m, &params),
                verdict: v.clone(),
                screened_out: false,
            })
            .collect();
        let search: Vec<Mode> = modes
            .iter()
            .copied()
            .filter(|&m| !(merged && m == Mode::PrefetchPlus))
            .collect();
        let known: Vec<Scored> = known
            .into_iter()
            .filter(|k| search.contains(&k.setting.mode))
            .collect();
        let r = recommend::search(&source, limit, &params, &search, repeats, known)?;
        writeln!(out)?;
        write!(out, "{}", recommend::describe(&r, repeats))?;
        writeln!(
            out,
            "  (searched in {:.1} s)",
            started.elapsed().as_secs_f64()
        )?;
        Some(r)
    };
    if let Some(path) = &args.json {
        let doc = report::Report {
            trace: described.clone(),
            requests,
            params: &params,
            calibration: cal_name.clone(),
            modes: base,
            analysis: Analysis {
                stability: &verdicts,
                prefetch_plus_merged: merged,
                recommendation: recommendation.as_ref(),
            },
        };
        write_json(path, &doc, out)?;
    }
    if !args.no_plot {
        let path = args.plot.clone().unwrap_or_else(default_plot_path);
        let curves: Vec<(Mode, &hdrhistogram::Histogram<u64>)> = results[..modes.len()]
            .iter()
            .map(|r| (r.mode, &r.ttft_us))
            .collect();
        match report::plot::plot_ttft(&curves, &title(&described, &params), &path) {
            Ok(()) => writeln!(out, "TTFT CDF and tail plot: {}", path.display())?,
            Err(e) => eprintln!("warning: no plot ({e:#}); the figures above are complete"),
        }
    }
    Ok(())
}

/// `--timeseries`: every engine's samples of each mode's first run, one JSON line each.
fn write_timeseries(path: &Path, results: &[ModeResult]) -> anyhow::Result<()> {
    #[derive(Serialize)]
    struct Line<'a> {
        mode: Mode,
        #[serde(flatten)]
        sample: &'a engine::Sample,
    }
    let file =
        std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for r in results {
        for sample in &r.timeseries {
            serde_json::to_writer(
                &mut out,
                &Line {
                    mode: r.mode,
                    sample,
                },
            )
            .context("encoding a sample")?;
            out.write_all(b"\n")
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))
}

fn write_json(
    path: &Path,
    doc: &impl Serialize,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(doc).context("encoding JSON")?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    writeln!(out, "JSON: {}", path.display())?;
    Ok(())
}

/// `--sweep`: every point × mode × rerun on every core; the table, the plot, the JSON.
fn run_sweep(
    args: &Args,
    source: &TraceSource,
    described: &str,
    params: &SimParams,
    modes: &[Mode],
    cal_name: &str,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    if !(args.knee_factor.is_finite() && args.knee_factor > 1.0) {
        bail!(
            "--knee-factor must be a finite number > 1, got {}",
            args.knee_factor
        );
    }
    let axes = args
        .sweep
        .iter()
        .map(|s| sweep::Axis::parse(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let bounds = (args.wait_budget_bounds_ms[0], args.wait_budget_bounds_ms[1]);
    let points = sweep::grid(&axes, params, bounds)?;
    let repeats = args.repeats;
    let jobs: Vec<Job> = points
        .iter()
        .flat_map(|pt| {
            modes.iter().flat_map(move |&mode| {
                (0..repeats).map(move |i| Job {
                    params: perturbed(&pt.params, i),
                    mode,
                })
            })
        })
        .collect();
    let started = Instant::now();
    let progress = Progress::new(known_len(source, args.limit).map(|n| n * jobs.len() as u64))?;
    let results: Vec<ModeResult> = run_jobs(source, args.limit, &jobs, &|_, _| progress.tick())?;
    progress.bar.finish_and_clear();
    let wall = started.elapsed();
    let kv = params.engine.gpu_kv_blocks;
    let summaries: Vec<ModeSummary> = results.iter().map(|r| summarise(r, kv)).collect();
    let mut cells = Vec::new();
    let per_point = modes.len() * repeats as usize;
    for (pt, runs) in points.iter().zip(summaries.chunks(per_point)) {
        for (&mode, runs) in modes.iter().zip(runs.chunks(repeats as usize)) {
            cells.push(sweep::cell(sweep::label(&axes, &pt.at), mode, runs));
        }
    }
    let knees = knee::knees(&axes, &points, &cells, modes, args.knee_factor);
    for k in knees.iter().flatten() {
        if let Some(i) = k.cell {
            cells[i].knee = true;
        }
    }
    let requests = summaries.first().map_or(0, |s| s.requests);
    writeln!(out, "{}", header(described, requests, params, cal_name))?;
    writeln!(out)?;
    write!(out, "{}", sweep::table(&cells))?;
    if let Some(knees) = &knees {
        writeln!(out)?;
        write!(out, "{}", knee::describe(knees, args.knee_factor))?;
    }
    let unstable = cells.iter().filter(|c| !c.verdict.stable).count();
    writeln!(out)?;
    writeln!(
        out,
        "sweep: {} points x {} modes x {} runs = {} simulations of {} requests in {:.1} s on {} threads; \
         {unstable} of {} cells UNSTABLE (p99 moves more than {}x over the reruns)",
        points.len(),
        modes.len(),
        repeats,
        jobs.len(),
        requests,
        wall.as_secs_f64(),
        runner::workers(jobs.len()),
        cells.len(),
        stability::MAX_SPREAD,
    )?;
    if let Some(path) = &args.json {
        #[derive(Serialize)]
        struct SweepDoc<'a> {
            trace: String,
            requests: u64,
            params: &'a SimParams,
            calibration: &'a str,
            axes: Vec<(&'static str, Vec<String>)>,
            cells: &'a [sweep::Cell],
            knee_factor: f64,
            knees: Option<&'a [knee::Knee]>,
        }
        let doc = SweepDoc {
            trace: described.to_owned(),
            requests,
            params,
            calibration: cal_name,
            axes: axes
                .iter()
                .map(|a| {
                    (
                        a.param.name(),
                        a.values.iter().map(ToString::to_string).collect(),
                    )
                })
                .collect(),
            cells: &cells,
            knee_factor: args.knee_factor,
            knees: knees.as_deref(),
        };
        write_json(path, &doc, out)?;
    }
    if !args.no_plot {
        let path = with_suffix(
            &args.plot.clone().unwrap_or_else(default_plot_path),
            "_sweep",
        );
        let panels = sweep::panels(&axes, &points, &cells, modes);
        let x_labels: Vec<String> = axes[0].values.iter().map(ToString::to_string).collect();
        let t = format!(
            "{} ({} runs a point, bands min-max)",
            title(described, params),
            repeats
        );
        match report::plot::plot_sweep(&panels, axes[0].param.name(), &x_labels, &t, &path) {
            Ok(()) => writeln!(out, "sweep plot: {}", path.display())?,
            Err(e) => eprintln!("warning: no plot ({e:#}); the figures above are complete"),
        }
    }
    Ok(())
}
