//! Where a rate sweep's modes give way (`--sweep rate-scale=...`): per mode, and per
//! combination of the other swept parameters, a rate *gives way* when the mode is
//! unhealthy in any rerun there (the overload detector, [`crate::health`]) or its
//! median TTFT p99 over the reruns exceeds `factor` (`--knee-factor`, 2 by default)
//! times its median p99 at the lowest rate swept. The *knee* is the lowest rate that
//! gives way with a margin: clearly (a sign at least [`CLEAR_MARGIN`] times its
//! threshold, or a p99 ratio at least [`CLEAR_MARGIN`] times `factor`), or again at
//! the next rate swept. One rerun a hair past a threshold (a waiting-queue slope of
//! 0.51 against 0.5) is not a knee; the line says so. The table marks the knee's row,
//! the plot its point (when the rate scale is the plot's x axis), and a line per mode
//! says where it is and why.

use std::fmt::Write as _;

use serde::Serialize;

use super::budget::BudgetArg;
use super::mode::Mode;
use super::sweep::{Axis, Cell, Param, Point, label};

/// How far past its threshold a sign must be for one rate to make a knee alone.
pub const CLEAR_MARGIN: f64 = 1.5;

/// Why the knee is where it is.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Reason {
    /// Runs collapsed there.
    Collapsed {
        /// Runs collapsed, of `runs`.
        collapsed: usize,
        /// Runs.
        runs: usize,
    },
    /// The median p99 rose past the factor.
    P99 {
        /// Median p99 there over the median p99 at the lowest rate.
        ratio: f64,
    },
}

/// One mode's knee along the rate scale.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Knee {
    /// The other swept parameters' values (`param=value, ...`; empty with one axis).
    pub group: String,
    /// The mode.
    pub mode: Mode,
    /// The lowest rate scale swept.
    pub base_rate: f64,
    /// The median TTFT p99 there (ms).
    pub base_p99_ms: f64,
    /// The highest rate scale swept.
    pub top_rate: f64,
    /// The knee's rate scale, if any rate swept reached it.
    pub rate_scale: Option<f64>,
    /// Why (`None` with no knee).
    pub reason: Option<Reason>,
    /// The knee's margin: `true` when its rate gave way clearly, `false` when it
    /// did by a small margin and the next rate swept gave way too.
    pub clear: bool,
    /// A rate that gave way by a small margin only, with the next rate swept
    /// healthy or none swept above it: no knee there (the lowest such rate below
    /// the knee, if any).
    pub marginal: Option<(f64, Reason)>,
    /// Index of the knee's cell in the sweep's cells.
    #[serde(skip)]
    pub cell: Option<usize>,
}

fn rate_of(v: BudgetArg) -> f64 {
    match v {
        BudgetArg::Ms(x) => x,
        BudgetArg::Auto => 0.0,
    }
}

/// The knees of a sweep whose `axes` include `rate-scale` (`None` otherwise): one per
/// mode and combination of the other axes, in the cells' order. `cells` are
/// `points` x `modes`, the modes fastest.
#[must_use]
pub fn knees(
    axes: &[Axis],
    points: &[Point],
    cells: &[Cell],
    modes: &[Mode],
    factor: f64,
) -> Option<Vec<Knee>> {
    let r = axes.iter().position(|a| a.param == Param::RateScale)?;
    let others: Vec<Axis> = axes
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != r)
        .map(|(_, a)| a.clone())
        .collect();
    let rest = |p: &Point| -> Vec<usize> {
        p.at.iter()
            .enumerate()
            .filter(|&(i, _)| i != r)
            .map(|(_, &v)| v)
            .collect()
    };
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for p in points {
        let g = rest(p);
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    let mut out = Vec::new();
    for g in groups {
        let mut at: Vec<usize> = (0..points.len())
            .filter(|&i| rest(&points[i]) == g)
            .collect();
        at.sort_by(|&a, &b| {
            rate_of(axes[r].values[points[a].at[r]])
                .total_cmp(&rate_of(axes[r].values[points[b].at[r]]))
        });
        for (m, &mode) in modes.iter().enumerate() {
            let cell = |p: usize| p * modes.len() + m;
            let rate = |p: usize| rate_of(axes[r].values[points[p].at[r]]);
            let base = super::margin::median(&cells[cell(at[0])].p99_ms);
            let mut knee = Knee {
                group: label(&others, &g),
                mode,
                base_rate: rate(at[0]),
                base_p99_ms: base,
                top_rate: rate(at[at.len() - 1]),
                rate_scale: None,
                reason: None,
                clear: false,
                marginal: None,
                cell: None,
            };
            let gives = |p: usize| -> Option<(Reason, bool)> {
                let c = &cells[cell(p)];
                let ratio = super::margin::median(&c.p99_ms) / base.max(1e-9);
                if c.verdict.collapsed_runs > 0 {
                    let severity = c
                        .verdict
                        .reruns
                        .iter()
                        .map(|r| r.health.severity)
                        .fold(0.0, f64::max);
                    Some((
                        Reason::Collapsed {
                            collapsed: c.verdict.collapsed_runs,
                            runs: c.verdict.runs,
                        },
                        severity >= CLEAR_MARGIN || ratio >= factor * CLEAR_MARGIN,
                    ))
                } else if ratio > factor {
                    Some((Reason::P99 { ratio }, ratio >= factor * CLEAR_MARGIN))
                } else {
                    None
                }
            };
            for (j, &p) in at.iter().enumerate() {
                let Some((reason, clear)) = gives(p) else {
                    continue;
                };
                let again = at.get(j + 1).is_some_and(|&q| gives(q).is_some());
                if clear || again {
                    knee.rate_scale = Some(rate(p));
                    knee.reason = Some(reason);
                    knee.clear = clear;
                    knee.cell = Some(cell(p));
                    break;
                }
                if knee.marginal.is_none() {
                    knee.marginal = Some((rate(p), reason));
                }
            }
            out.push(knee);
        }
    }
    Some(out)
}

fn why(reason: &Reason, k: &Knee) -> String {
    match reason {
        Reason::Collapsed { collapsed, runs } => {
            format!("unhealthy in {collapsed} of {runs} runs")
        }
        Reason::P99 { ratio } => format!(
            "median p99 {ratio:.2}x its {:.0} ms at x{}",
            k.base_p99_ms, k.base_rate
        ),
    }
}

/// The knees in words: a heading stating the rule, then one line per knee.
#[must_use]
pub fn describe(knees: &[Knee], factor: f64) -> String {
    let mut out = format!(
        "knee: the lowest rate scale at which a mode is unhealthy in any rerun or its median TTFT p99 exceeds {factor}x its value at the lowest rate, by a clear margin ({CLEAR_MARGIN}x the threshold) or at the next rate too\n"
    );
    for k in knees {
        let group = if k.group.is_empty() {
            String::new()
        } else {
            format!("[{}] ", k.group)
        };
        let _ = write!(out, "  {group}{:<14} ", k.mode.name());
        match (&k.rate_scale, &k.reason) {
            (Some(rate), Some(reason)) => {
                let _ = write!(out, "knee at x{rate}: {}", why(reason, k));
                if *rate <= k.base_rate {
                    out.push_str(" (already at the lowest rate swept)");
                }
                out.push_str(if k.clear {
                    ", clearly"
                } else {
                    ", and again at the next rate"
                });
            }
            _ => {
                let _ = write!(
                    out,
                    "no knee up to x{} (median p99 {:.0} ms at x{})",
                    k.top_rate, k.base_p99_ms, k.base_rate
                );
            }
        }
        if let Some((rate, reason)) = &k.marginal {
            let _ = write!(
                out,
                "; x{rate} gave way by a small margin only ({}), not at the next rate or none swept above it",
                why(reason, k)
            );
        }
        out.push('\n');
    }
    out
}
