//! The plots: the TTFT distribution per mode (CDF, and the tail as 1 − CDF on a log
//! scale, where the modes differ), and a sweep's p50 and p99 against its parameter
//! with min-max bands over the perturbed reruns.
//!
//! Curves that coincide stay distinguishable: each mode has its own colour, line
//! width and dash pattern, wider lines are drawn first, so a narrow dashed line on top
//! of a wide solid one shows both, and the two thin ones carry markers.

use std::path::Path;

use anyhow::Context;
use hdrhistogram::Histogram;
use plotters::prelude::*;

use crate::mode::Mode;

/// Colour, width and dash (0: solid) of a mode's lines.
fn style_of(mode: Mode) -> (RGBColor, u32, u32) {
    match mode {
        Mode::Sync => (RED, 5, 0),
        Mode::Async => (BLUE, 4, 12),
        Mode::Prefetch => (RGBColor(0, 150, 0), 3, 0),
        Mode::PrefetchPlus => (MAGENTA, 2, 7),
        Mode::PrefetchWait => (BLACK, 1, 3),
    }
}

/// The marker of a mode's line: radius (0: none) and style (hollow for `prefetch+`,
/// filled for `prefetch+wait`).
fn marker_of(mode: Mode) -> (i32, ShapeStyle) {
    let (colour, _, _) = style_of(mode);
    match mode {
        Mode::PrefetchPlus => (5, colour.stroke_width(1)),
        Mode::PrefetchWait => (3, colour.filled()),
        _ => (0, colour.stroke_width(1)),
    }
}

fn ensure_dir(path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Ok(())
}

/// The first point of `pts` at or past each of `levels` in y, rising (`up`) or falling.
fn at_levels(pts: &[(f64, f64)], levels: &[f64], up: bool) -> Vec<(f64, f64)> {
    levels
        .iter()
        .filter_map(|&l| {
            pts.iter()
                .find(|p| if up { p.1 >= l } else { p.1 <= l })
                .copied()
        })
        .collect()
}

/// (TTFT s, fraction of requests at or below) at each recorded value (µs histogram).
fn cdf(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    let n = h.len().max(1) as f64;
    let mut seen = 0u64;
    h.iter_recorded()
        .map(|v| {
            seen += v.count_at_value();
            let x = (h.highest_equivalent(v.value_iterated_to()) as f64 / 1e6).max(1e-3);
            (x, seen as f64 / n)
        })
        .collect()
}

fn draw_line<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    mode: Mode,
    pts: Vec<(f64, f64)>,
    marked: &[(f64, f64)],
    label: bool,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: CoordTranslate<From = (f64, f64)>,
{
    let (colour, width, dash) = style_of(mode);
    let style = colour.stroke_width(width);
    let (radius, mark) = marker_of(mode);
    if radius > 0 {
        chart.draw_series(marked.iter().map(|&p| Circle::new(p, radius, mark)))?;
    }
    let series = if dash == 0 {
        chart.draw_series(LineSeries::new(pts, style))?
    } else {
        chart.draw_series(DashedLineSeries::new(pts, dash, dash, style))?
    };
    if label {
        series.label(mode.name()).legend(move |(x, y)| {
            EmptyElement::at((x, y))
                + PathElement::new(vec![(0, 0), (24, 0)], style)
                + Circle::new((12, 0), radius, mark)
        });
    }
    Ok(())
}

/// Draws the TTFT CDF and its tail (1 − CDF, log scale) of every `(mode, TTFT
/// histogram in µs)` side by side into a PNG at `path`, creating its directory.
/// `title` carries the run's parameters.
///
/// # Errors
/// The directory cannot be created, or drawing fails (no usable font, I/O).
pub fn plot_ttft(
    curves: &[(Mode, &Histogram<u64>)],
    title: &str,
    path: &Path,
) -> anyhow::Result<()> {
    ensure_dir(path)?;
    let mut data: Vec<(Mode, Vec<(f64, f64)>)> = curves.iter().map(|(m, h)| (*m, cdf(h))).collect();
    // Widest first, so narrower lines stay visible on top.
    data.sort_by_key(|(m, _)| std::cmp::Reverse(style_of(*m).1));
    let lo = data
        .iter()
        .filter_map(|(_, p)| p.first().map(|x| x.0))
        .fold(f64::INFINITY, f64::min)
        .min(0.1);
    let hi = data
        .iter()
        .filter_map(|(_, p)| p.last().map(|x| x.0))
        .fold(0.0, f64::max)
        .max(lo * 10.0);
    let n = curves
        .iter()
        .map(|(_, h)| h.len())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let floor = (0.5 / n).min(1e-2);
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = BitMapBackend::new(path, (1500, 650)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(title, ("sans-serif", 18))?;
        let (left, right) = root.split_horizontally(750);
        let mut chart = ChartBuilder::on(&left)
            .caption("TTFT CDF", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)?;
        chart
            .configure_mesh()
            .x_desc("TTFT (s, log scale)")
            .y_desc("fraction of requests")
            .draw()?;
        let levels: Vec<f64> = (1..20).map(|k| f64::from(k) / 20.0).collect();
        for (mode, pts) in &data {
            let marks = at_levels(pts, &levels, true);
            draw_line(&mut chart, *mode, pts.clone(), &marks, true)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        let mut tail = ChartBuilder::on(&right)
            .caption("tail: 1 - CDF (log scale)", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d((lo..hi).log_scale(), (floor..1.0).log_scale())?;
        tail.configure_mesh()
            .x_desc("TTFT (s, log scale)")
            .y_desc("fraction of requests above")
            .draw()?;
        for (mode, pts) in &data {
            // Just below each recorded value, 1 - CDF of the value before it.
            let mut above = Vec::with_capacity(pts.len());
            let mut prev: f64 = 1.0;
            for &(x, f) in pts {
                above.push((x, prev.max(floor)));
                prev = 1.0 - f;
            }
            let levels: Vec<f64> = (0..30)
                .map(|k| 10f64.powf(-f64::from(k) / 5.0))
                .filter(|&l| l >= floor)
                .collect();
            let marks = at_levels(&above, &levels, false);
            draw_line(&mut tail, *mode, above, &marks, true)?;
        }
        tail.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("drawing {}: {e}", path.display()))
}

/// One mode's line in a sweep panel: per x, the median and the min-max band (ms).
#[derive(Clone, Debug, PartialEq)]
pub struct SweepLine {
    /// The mode.
    pub mode: Mode,
    /// `(x, median, min, max)`, in x order.
    pub points: Vec<(f64, f64, f64, f64)>,
    /// `(x, median)` of its knee along the rate scale ([`crate::knee`]), marked.
    pub knee: Option<(f64, f64)>,
}

/// One panel of a sweep plot: a figure (p50 or p99) for one combination of the other
/// swept parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepPanel {
    /// Its caption (the figure and the other parameters' values).
    pub caption: String,
    /// One line per mode.
    pub lines: Vec<SweepLine>,
}

/// Draws sweep panels in a grid of two columns (p50, p99) into a PNG at `path`:
/// x is the swept parameter's values (`x_labels`, evenly spaced; a point's x is the
/// value's index), y the TTFT in seconds (log scale), each mode's median as a line
/// over its shaded min-max band, and its knee, if any, as a labelled cross.
///
/// # Errors
/// The directory cannot be created, or drawing fails.
pub fn plot_sweep(
    panels: &[SweepPanel],
    x_desc: &str,
    x_labels: &[String],
    title: &str,
    path: &Path,
) -> anyhow::Result<()> {
    ensure_dir(path)?;
    let rows = panels.len().div_ceil(2).max(1);
    let x_hi = x_labels.len().max(1) as f64 - 0.5;
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = BitMapBackend::new(path, (1400, 80 + 420 * rows as u32)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(title, ("sans-serif", 18))?;
        let areas = root.split_evenly((rows, 2));
        for (panel, area) in panels.iter().zip(areas) {
            let ys = panel
                .lines
                .iter()
                .flat_map(|l| l.points.iter().flat_map(|q| [q.2, q.3]));
            let (y_lo, y_hi) = ys.fold((f64::INFINITY, 0.0_f64), |(a, b), y| (a.min(y), b.max(y)));
            let y_lo = (y_lo / 1e3).max(1e-3) * 0.8;
            let y_hi = (y_hi / 1e3).max(y_lo * 2.0) * 1.25;
            let mut chart = ChartBuilder::on(&area)
                .caption(&panel.caption, ("sans-serif", 17))
                .margin(10)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(-0.5..x_hi, (y_lo..y_hi).log_scale())?;
            let label = |x: &f64| {
                let i = x.round();
                if (x - i).abs() < 0.01 && i >= 0.0 {
                    x_labels.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            };
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc("TTFT (s, log scale)")
                .x_labels(x_labels.len() * 2 + 1)
                .x_label_formatter(&label)
                .draw()?;
            let mut lines = panel.lines.clone();
            lines.sort_by_key(|l| std::cmp::Reverse(style_of(l.mode).1));
            for line in &lines {
                let (colour, _, _) = style_of(line.mode);
                let band: Vec<(f64, f64)> = line
                    .points
                    .iter()
                    .map(|q| (q.0, q.3 / 1e3))
                    .chain(line.points.iter().rev().map(|q| (q.0, q.2 / 1e3)))
                    .collect();
                chart.draw_series(std::iter::once(Polygon::new(band, colour.mix(0.15))))?;
            }
            for line in &lines {
                let pts: Vec<(f64, f64)> = line.points.iter().map(|q| (q.0, q.1 / 1e3)).collect();
                let (colour, _, _) = style_of(line.mode);
                chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
                draw_line(&mut chart, line.mode, pts.clone(), &pts, true)?;
            }
            for line in &lines {
                if let Some((x, y)) = line.knee {
                    let (colour, _, _) = style_of(line.mode);
                    let at = (x, y / 1e3);
                    chart.draw_series(std::iter::once(Cross::new(
                        at,
                        12,
                        colour.stroke_width(3),
                    )))?;
                    chart.draw_series(std::iter::once(Text::new(
                        format!("knee: {}", line.mode.name()),
                        at,
                        ("sans-serif", 15).into_font().color(&colour),
                    )))?;
                }
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("drawing {}: {e}", path.display()))
}
