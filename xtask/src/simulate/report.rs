//! Summaries of the runs: the terminal table, the JSON document and the TTFT CDF plot.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;

use super::engine::{FirstPending, ModeResult, SimParams};
use super::mode::Mode;

/// Percentiles of a latency, milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median (ms).
    pub p50: f64,
    /// 90th percentile (ms).
    pub p90: f64,
    /// 99th percentile (ms).
    pub p99: f64,
    /// Mean (ms).
    pub mean: f64,
    /// Maximum (ms).
    pub max: f64,
}

/// One mode's figures, as printed and written to JSON.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModeSummary {
    /// The mode.
    pub mode: Mode,
    /// Requests served.
    pub requests: u64,
    /// Time to first token (hdrhistogram, 3 significant digits, recorded in µs).
    pub ttft_ms: Percentiles,
    /// Mean time from arrival to first scheduling (ms).
    pub queue_wait_mean_ms: f64,
    /// Engine-thread time blocked on lookup RPCs (seconds; sync mode only).
    pub engine_blocked_s: f64,
    /// Eligible requests whose lookup was ready at their first probe, as a fraction
    /// of eligible requests probed (`Stats::first_probes_ready / (first_probes_ready +
    /// first_probes_pending)`); `None` when none was probed. In sync mode a probe that
    /// had to block counts as not ready.
    pub ready_at_first_probe: Option<f64>,
    /// Why first probes were not ready.
    pub first_probes_pending: FirstPending,
    /// Probes answered `Pending` that deferred a request to a later step.
    pub lookups_deferred: u64,
    /// Lookup RPCs put on the wire.
    pub rpcs_sent: u64,
    /// Lookups that joined an RPC already queued or in flight (rule 16).
    pub rpcs_shared: u64,
    /// RPCs sent whose answer was of no use: every asker was gone when it ended
    /// (finished, preempted or already scheduled), or a prefetch whose request's local
    /// hit reached the cap at its first probe.
    pub rpcs_wasted: u64,
    /// RPCs cancelled before they were sent (rule 9).
    pub rpcs_cancelled: u64,
    /// Tokens loaded from the external store instead of recomputed.
    pub external_hit_tokens: u64,
    /// Tokens served by the GPU prefix cache.
    pub local_hit_tokens: u64,
    /// Results looked up again after the TTL (rule 6).
    pub ttl_refreshes: u64,
    /// Arrivals not prefetched because every prefetch slot was taken (rule 2).
    pub prefetch_cap_full: u64,
    /// Preemptions (recompute).
    pub preemptions: u64,
    /// Steps run.
    pub steps: u64,
    /// GPU busy time over the run's span, averaged over the engines (fraction).
    pub gpu_utilisation: f64,
    /// Time the last request finished (seconds from the trace start).
    pub makespan_s: f64,
}

/// The JSON document of `--json`.
#[derive(Debug, Serialize)]
pub struct Report<'a> {
    /// Where the trace came from (a path, or the generator and its seed).
    pub trace: String,
    /// Requests replayed.
    pub requests: usize,
    /// Every parameter of the run.
    pub params: &'a SimParams,
    /// One entry per mode, in the order run.
    pub modes: &'a [ModeSummary],
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Summarises one run.
///
/// # Errors
/// Never in practice: a TTFT too large for the histogram (over a year) is an error.
pub fn summarise(r: &ModeResult) -> anyhow::Result<ModeSummary> {
    let mut h = Histogram::<u64>::new(3).context("histogram")?;
    for &t in &r.ttft_ns {
        h.record(t / 1_000)
            .context("TTFT out of the histogram's range")?;
    }
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1e3;
    let n = r.ttft_ns.len() as u64;
    let ttft_ms = Percentiles {
        p50: q(0.5),
        p90: q(0.9),
        p99: q(0.99),
        mean: if n == 0 {
            0.0
        } else {
            ms(r.ttft_ns.iter().sum::<u64>()) / n as f64
        },
        max: ms(r.ttft_ns.iter().copied().max().unwrap_or(0)),
    };
    let s = &r.stats;
    let probed = s.first_probes_ready + s.first_probes_pending;
    let span = r.makespan_ns.max(1) as f64 * f64::from(r.engines.max(1));
    Ok(ModeSummary {
        mode: r.mode,
        requests: n,
        ttft_ms,
        queue_wait_mean_ms: if n == 0 {
            0.0
        } else {
            ms(r.queue_wait_ns.iter().sum::<u64>()) / n as f64
        },
        engine_blocked_s: r.blocked_ns as f64 / 1e9,
        ready_at_first_probe: (probed > 0).then(|| s.first_probes_ready as f64 / probed as f64),
        first_probes_pending: r.first_pending,
        lookups_deferred: r.deferred,
        rpcs_sent: r.rpcs_sent,
        rpcs_shared: s.rpcs_shared,
        rpcs_wasted: r.rpcs_wasted,
        rpcs_cancelled: s.rpcs_cancelled,
        external_hit_tokens: r.external_hit_tokens,
        local_hit_tokens: r.local_hit_tokens,
        ttl_refreshes: s.ttl_refreshes,
        prefetch_cap_full: s.prefetch_cap_full,
        preemptions: r.preemptions,
        steps: r.steps,
        gpu_utilisation: r.gpu_busy_ns as f64 / span,
        makespan_s: r.makespan_ns as f64 / 1e9,
    })
}

/// The side-by-side table printed on the terminal: one row per figure, one column
/// per mode.
#[must_use]
pub fn table(summaries: &[ModeSummary]) -> String {
    type Row = (&'static str, fn(&ModeSummary) -> String);
    let rows: [Row; 21] = [
        ("requests", |s| s.requests.to_string()),
        ("TTFT p50 (ms)", |s| format!("{:.1}", s.ttft_ms.p50)),
        ("TTFT p90 (ms)", |s| format!("{:.1}", s.ttft_ms.p90)),
        ("TTFT p99 (ms)", |s| format!("{:.1}", s.ttft_ms.p99)),
        ("TTFT mean (ms)", |s| format!("{:.1}", s.ttft_ms.mean)),
        ("queue wait mean (ms)", |s| {
            format!("{:.1}", s.queue_wait_mean_ms)
        }),
        ("engine blocked on lookups (s)", |s| {
            format!("{:.3}", s.engine_blocked_s)
        }),
        ("ready at first probe", |s| {
            s.ready_at_first_probe
                .map_or_else(|| "-".into(), |f| format!("{:.1}%", f * 100.0))
        }),
        ("  not ready: lookup on the wire", |s| {
            let p = &s.first_probes_pending;
            format!("{} ({} idle)", p.on_the_wire, p.on_the_wire_idle)
        }),
        ("  not ready: result expired (TTL)", |s| {
            s.first_probes_pending.expired.to_string()
        }),
        ("  not ready: not prefetched", |s| {
            s.first_probes_pending.not_prefetched.to_string()
        }),
        ("lookups deferred", |s| s.lookups_deferred.to_string()),
        ("RPCs sent", |s| s.rpcs_sent.to_string()),
        ("RPCs shared", |s| s.rpcs_shared.to_string()),
        ("RPCs wasted", |s| s.rpcs_wasted.to_string()),
        ("external hit tokens", |s| s.external_hit_tokens.to_string()),
        ("local hit tokens", |s| s.local_hit_tokens.to_string()),
        ("TTL refreshes", |s| s.ttl_refreshes.to_string()),
        ("preemptions", |s| s.preemptions.to_string()),
        ("GPU utilisation", |s| {
            format!("{:.1}%", s.gpu_utilisation * 100.0)
        }),
        ("makespan (s)", |s| format!("{:.1}", s.makespan_s)),
    ];
    let label_w = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(_, f)| summaries.iter().map(f).collect())
        .collect();
    let col_w: Vec<usize> = (0..summaries.len())
        .map(|c| {
            cells
                .iter()
                .map(|row| row[c].len())
                .chain(std::iter::once(summaries[c].mode.name().len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let _ = write!(out, "{:label_w$}", "");
    for (s, w) in summaries.iter().zip(&col_w) {
        let _ = write!(out, "  {:>w$}", s.mode.name());
    }
    out.push('\n');
    for ((label, _), row) in rows.iter().zip(&cells) {
        let _ = write!(out, "{label:label_w$}");
        for (cell, w) in row.iter().zip(&col_w) {
            let _ = write!(out, "  {cell:>w$}");
        }
        out.push('\n');
    }
    out
}

/// Draws the TTFT CDF of every mode (log-scale seconds) into a PNG at `path`,
/// creating its directory.
///
/// # Errors
/// The directory cannot be created, or drawing fails (no usable font, I/O).
pub fn plot_cdf(results: &[ModeResult], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;

    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let curves: Vec<(Mode, Vec<(f64, f64)>)> = results
        .iter()
        .map(|r| {
            let mut v: Vec<f64> = r
                .ttft_ns
                .iter()
                .map(|&t| (t as f64 / 1e9).max(1e-3))
                .collect();
            v.sort_by(f64::total_cmp);
            let n = v.len().max(1);
            let stride = (n / 2_000).max(1);
            let mut pts: Vec<(f64, f64)> = v
                .iter()
                .enumerate()
                .filter(|(i, _)| i % stride == 0 || *i == n - 1)
                .map(|(i, &x)| (x, (i + 1) as f64 / n as f64))
                .collect();
            pts.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
            (r.mode, pts)
        })
        .collect();
    let lo = curves
        .iter()
        .flat_map(|(_, p)| p.first().map(|x| x.0))
        .fold(f64::INFINITY, f64::min)
        .min(0.1);
    let hi = curves
        .iter()
        .flat_map(|(_, p)| p.last().map(|x| x.0))
        .fold(0.0, f64::max)
        .max(lo * 10.0);
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = BitMapBackend::new(path, (1000, 600)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("TTFT CDF per lookup mode", ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)?;
        chart
            .configure_mesh()
            .x_desc("TTFT (s, log scale)")
            .y_desc("fraction of requests")
            .draw()?;
        for (mode, pts) in curves {
            // One colour per mode, whatever subset is drawn.
            let colour = match mode {
                Mode::Sync => RED,
                Mode::Async => BLUE,
                Mode::Prefetch => GREEN,
                Mode::PrefetchPlus => MAGENTA,
                Mode::PrefetchWait => BLACK,
            };
            let style = colour.stroke_width(2);
            // prefetch+ often coincides with prefetch, and prefetch+wait with sync:
            // dashed, so both stay visible.
            let series = if matches!(mode, Mode::PrefetchPlus | Mode::PrefetchWait) {
                chart.draw_series(DashedLineSeries::new(pts.iter().copied(), 8, 6, style))?
            } else {
                chart.draw_series(LineSeries::new(pts.iter().copied(), style))?
            };
            series
                .label(mode.name())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("drawing {}: {e}", path.display()))
}
