//! The `--sweep` program: every point x mode x rerun on every core, then the table,
//! the knees, the plot and the JSON.

use std::time::Instant;

use anyhow::bail;
use serde::Serialize;

use crate::args::Args;
use crate::engine::{ModeResult, SimParams};
use crate::output::{default_plot_path, header, title, with_suffix, write_json};
use crate::report::{self, ModeSummary, summarise};
use crate::runner::{self, Job, perturbed, run_jobs};
use crate::setup::Setup;
use crate::{knee, stability, sweep};

/// `--sweep`: every point × mode × rerun on every core; the table, the plot, the JSON.
pub(crate) fn run_sweep(
    args: &Args,
    setup: &Setup,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let (source, described, params, modes, cal_name) = (
        &setup.source,
        setup.described.as_str(),
        &setup.params,
        setup.modes.as_slice(),
        setup.cal_name.as_str(),
    );
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
    let labels = jobs
        .iter()
        .enumerate()
        .map(|(j, job)| {
            let pt = j / (modes.len() * repeats as usize);
            format!(
                "{} {} rerun {}",
                sweep::label(&axes, &points[pt].at),
                job.mode,
                j % repeats as usize
            )
        })
        .collect();
    let stage = setup.progress.stage(
        &format!(
            "sweep: {} points x {} modes x {repeats} runs",
            points.len(),
            modes.len()
        ),
        labels,
        setup.requests,
    );
    let results: Vec<ModeResult> =
        run_jobs(source, args.limit, &jobs, &|j, _| stage.on_request(j))?;
    stage.finish();
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
