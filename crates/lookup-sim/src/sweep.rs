//! `cargo xtask simulate --sweep PARAM=v1,v2,...`: every mode at every point of a
//! grid of parameters, each point run `--repeats` times (perturbed) so it shows its
//! spread; a table, and a PNG of p50 and p99 against the first parameter, one line
//! per mode with min-max bands (one panel pair per combination of the others).

use std::fmt::Write as _;

use anyhow::{Context, bail};
use serde::Serialize;

use super::args::set_per_key;
use super::budget::{BudgetArg, WaitBudget};
use super::engine::SimParams;
use super::mode::Mode;
use super::report::ModeSummary;
use super::report::plot::{SweepLine, SweepPanel};
use super::stability::Verdict;

/// A parameter a sweep can move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Param {
    /// Present-key cost (µs); absent keys keep the calibration's ratio to it.
    PerKeyUs,
    /// Present-key cost only (µs).
    PresentKeyUs,
    /// Absent-key cost only (µs).
    AbsentKeyUs,
    /// The server's fixed cost per lookup (ms).
    ServerFixedMs,
    /// Server concurrency (and `max_in_flight`).
    ServerConcurrency,
    /// vLLM block size (tokens).
    BlockSize,
    /// Rank namespaces.
    Namespaces,
    /// Keys per store call (0: one call).
    ChunkKeys,
    /// Arrival rate multiplier.
    RateScale,
    /// Engines.
    Engines,
    /// `lookup_prefetch_ttl_s`.
    TtlS,
    /// `lookup_prefetch_limit`.
    PrefetchLimit,
    /// `prefetch+wait`'s budget (`auto` or ms).
    WaitBudgetMs,
}

const NAMES: [(&str, Param); 13] = [
    ("per-key-us", Param::PerKeyUs),
    ("present-key-us", Param::PresentKeyUs),
    ("absent-key-us", Param::AbsentKeyUs),
    ("server-fixed-ms", Param::ServerFixedMs),
    ("server-concurrency", Param::ServerConcurrency),
    ("block-size", Param::BlockSize),
    ("namespaces", Param::Namespaces),
    ("chunk-keys", Param::ChunkKeys),
    ("rate-scale", Param::RateScale),
    ("engines", Param::Engines),
    ("ttl-s", Param::TtlS),
    ("prefetch-limit", Param::PrefetchLimit),
    ("wait-budget-ms", Param::WaitBudgetMs),
];

impl Param {
    /// Its name on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(_, p)| *p == self)
            .map_or("?", |(n, _)| n)
    }

    fn whole(self) -> bool {
        matches!(
            self,
            Self::ServerConcurrency
                | Self::BlockSize
                | Self::Namespaces
                | Self::ChunkKeys
                | Self::Engines
                | Self::PrefetchLimit
        )
    }

    /// Sets this parameter of `p` to `v`; `bounds_ms` are the `auto` budget's.
    fn apply(self, p: &mut SimParams, v: BudgetArg, bounds: (f64, f64)) {
        let x = match v {
            BudgetArg::Ms(x) => x,
            BudgetArg::Auto => 0.0,
        };
        let n = x as u32;
        match self {
            Self::PerKeyUs => set_per_key(&mut p.server, x),
            Self::PresentKeyUs => p.server.present_key_s = x / 1e6,
            Self::AbsentKeyUs => p.server.absent_key_s = x / 1e6,
            Self::ServerFixedMs => p.server.fixed_s = x / 1e3,
            Self::ServerConcurrency => p.server.concurrency = n,
            Self::BlockSize => p.server.block_size = n,
            Self::Namespaces => p.server.namespaces = n,
            Self::ChunkKeys => p.server.chunk_keys = n,
            Self::RateScale => p.rate_scale = x,
            Self::Engines => p.engine.engines = n,
            Self::TtlS => p.lookup.prefetch_ttl_s = x,
            Self::PrefetchLimit => p.lookup.prefetch_limit = n,
            Self::WaitBudgetMs => p.lookup.wait_budget = v.budget(bounds),
        }
    }
}

/// One swept parameter and its values.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// The parameter.
    pub param: Param,
    /// Its values, in the order given.
    pub values: Vec<BudgetArg>,
}

impl Axis {
    /// Parses `PARAM=v1,v2,...`.
    ///
    /// # Errors
    /// No `=`, an unknown parameter (the message lists them), no value, a value that
    /// is not a number (or `auto` for `wait-budget-ms`), a whole-number parameter given
    /// a fraction, or a repeated value.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let Some((name, values)) = text.split_once('=') else {
            bail!("--sweep {text:?}: expected PARAM=v1,v2,...");
        };
        let Some(&(_, param)) = NAMES.iter().find(|(n, _)| *n == name.trim()) else {
            bail!(
                "--sweep {text:?}: unknown parameter {name:?}; one of {}",
                NAMES.map(|(n, _)| n).join(", ")
            );
        };
        let mut out = Vec::new();
        for v in values.split(',').map(str::trim).filter(|v| !v.is_empty()) {
            let value: BudgetArg = v
                .parse()
                .map_err(|e| anyhow::anyhow!("--sweep {name}: {e}"))?;
            match value {
                BudgetArg::Auto if param != Param::WaitBudgetMs => {
                    bail!("--sweep {name}: `auto` is for wait-budget-ms only")
                }
                BudgetArg::Ms(x) if param.whole() && (x.fract() != 0.0 || x < 0.0) => {
                    bail!("--sweep {name}: {v} is not a whole number")
                }
                _ => {}
            }
            if out.contains(&value) {
                bail!("--sweep {name}: {v} given twice");
            }
            out.push(value);
        }
        if out.is_empty() {
            bail!("--sweep {name}: no value");
        }
        Ok(Self { param, values: out })
    }
}

/// One point of the grid: a value per axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Indices into each axis's values.
    pub at: Vec<usize>,
    /// The settings.
    pub params: SimParams,
}

/// Every point of the grid of `axes` from `base` (first axis fastest), each checked.
///
/// # Errors
/// A point whose settings do not validate ([`SimParams::validate`]), naming it.
pub fn grid(axes: &[Axis], base: &SimParams, bounds: (f64, f64)) -> anyhow::Result<Vec<Point>> {
    let mut points = vec![Vec::new()];
    for axis in axes.iter().rev() {
        points = points
            .into_iter()
            .flat_map(|rest: Vec<usize>| {
                (0..axis.values.len()).map(move |i| {
                    let mut at = vec![i];
                    at.extend(&rest);
                    at
                })
            })
            .collect();
    }
    points
        .into_iter()
        .map(|at| {
            let mut params = base.clone();
            for (axis, &i) in axes.iter().zip(&at) {
                axis.param.apply(&mut params, axis.values[i], bounds);
            }
            params
                .validate()
                .with_context(|| format!("sweep point {}", label(axes, &at)))?;
            Ok(Point { at, params })
        })
        .collect()
}

/// `param=value, ...` of a point.
#[must_use]
pub fn label(axes: &[Axis], at: &[usize]) -> String {
    axes.iter()
        .zip(at)
        .map(|(a, &i)| format!("{}={}", a.param.name(), a.values[i]))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One (point, mode) of a sweep, over its reruns.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cell {
    /// `param=value, ...`.
    pub point: String,
    /// The mode.
    pub mode: Mode,
    /// The reruns' verdict (p50/p99 ranges, spread, preemptions, KV).
    pub verdict: Verdict,
    /// TTFT p50 of each run (ms).
    pub p50_ms: Vec<f64>,
    /// TTFT p99 of each run (ms).
    pub p99_ms: Vec<f64>,
    /// Lookup p99, submission to answer, of the first run (ms).
    pub lookup_p99_ms: f64,
    /// Keys asked per lookup, mean, of the first run.
    pub keys_asked_mean: f64,
    /// This cell is its mode's knee along the rate scale ([`crate::knee`]).
    pub knee: bool,
}

use super::margin::median;

/// The cell of one (point, mode) from its reruns.
#[must_use]
pub fn cell(point: String, mode: Mode, runs: &[ModeSummary]) -> Cell {
    Cell {
        point,
        mode,
        verdict: Verdict::of(mode, runs),
        p50_ms: runs.iter().map(|s| s.ttft_ms.p50).collect(),
        p99_ms: runs.iter().map(|s| s.ttft_ms.p99).collect(),
        lookup_p99_ms: runs.first().map_or(0.0, |s| s.lookups.total_ms.p99),
        keys_asked_mean: runs.first().map_or(0.0, |s| s.lookups.keys_asked_mean),
        knee: false,
    }
}

/// The sweep table: one row per (point, mode), medians with min-max over the reruns.
#[must_use]
pub fn table(cells: &[Cell]) -> String {
    let head = [
        "point",
        "mode",
        "TTFT p50 ms (min-max)",
        "TTFT p99 ms (min-max)",
        "p99 spread",
        "lookup p99 ms",
        "keys/lookup",
        "preemptions",
        "KV mean",
        "verdict",
    ];
    let rows: Vec<[String; 10]> = cells
        .iter()
        .map(|c| {
            let v = &c.verdict;
            [
                c.point.clone(),
                c.mode.name().to_owned(),
                format!(
                    "{:.0} ({:.0}-{:.0})",
                    median(&c.p50_ms),
                    v.p50_ms.min,
                    v.p50_ms.max
                ),
                format!(
                    "{:.0} ({:.0}-{:.0})",
                    median(&c.p99_ms),
                    v.p99_ms.min,
                    v.p99_ms.max
                ),
                format!("{:.2}x", v.spread),
                format!("{:.2}", c.lookup_p99_ms),
                format!("{:.0}", c.keys_asked_mean),
                format!("{:.0}-{:.0}", v.preemptions.min, v.preemptions.max),
                format!("{:.0}-{:.0}%", v.kv_mean.min * 100.0, v.kv_mean.max * 100.0),
                format!(
                    "{} ({}/{} collapsed){}",
                    if v.stable { "stable" } else { "UNSTABLE" },
                    v.collapsed_runs,
                    v.runs,
                    if c.knee { " <- knee" } else { "" }
                ),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..head.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([head[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |out: &mut String, cells: &[&str]| {
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i < 2 {
                let _ = write!(out, "{c:<w$}  ");
            } else {
                let _ = write!(out, "{c:>w$}  ");
            }
        }
        let trimmed = out.trim_end().len();
        out.truncate(trimmed);
        out.push('\n');
    };
    line(&mut out, &head);
    for r in &rows {
        let cells: Vec<&str> = r.iter().map(String::as_str).collect();
        line(&mut out, &cells);
    }
    out
}

/// The plot's panels: for each combination of the axes after the first, a p50 and a
/// p99 panel, x = the first axis's value index; a p99 line carries its knee (the cell
/// marked [`Cell::knee`]), if any.
#[must_use]
pub fn panels(axes: &[Axis], points: &[Point], cells: &[Cell], modes: &[Mode]) -> Vec<SweepPanel> {
    let mut out = Vec::new();
    let mut others: Vec<Vec<usize>> = points.iter().map(|p| p.at[1..].to_vec()).collect();
    others.dedup();
    for rest in others {
        let caption = label(&axes[1..], &rest);
        for (figure, pick) in [("p50", true), ("p99", false)] {
            let lines = modes
                .iter()
                .map(|&mode| SweepLine {
                    mode,
                    knee: if pick {
                        None
                    } else {
                        points
                            .iter()
                            .zip(cells.chunks(modes.len()))
                            .filter(|(p, _)| p.at[1..] == rest[..])
                            .find_map(|(p, row)| {
                                let c = row.iter().find(|c| c.mode == mode && c.knee)?;
                                Some((p.at[0] as f64, median(&c.p99_ms)))
                            })
                    },
                    points: points
                        .iter()
                        .zip(cells.chunks(modes.len()))
                        .filter(|(p, _)| p.at[1..] == rest[..])
                        .filter_map(|(p, row)| {
                            let c = row.iter().find(|c| c.mode == mode)?;
                            let (v, r) = if pick {
                                (&c.p50_ms, c.verdict.p50_ms)
                            } else {
                                (&c.p99_ms, c.verdict.p99_ms)
                            };
                            Some((p.at[0] as f64, median(v), r.min, r.max))
                        })
                        .collect(),
                })
                .collect();
            let caption = if caption.is_empty() {
                format!("TTFT {figure}")
            } else {
                format!("TTFT {figure}, {caption}")
            };
            out.push(SweepPanel { caption, lines });
        }
    }
    out
}

/// The wait budget as a sweep value names it.
#[must_use]
pub fn budget_label(w: &WaitBudget) -> String {
    match w {
        WaitBudget::Fixed { s } => format!("{}", s * 1e3),
        WaitBudget::Adaptive { .. } => "auto".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_parse_and_the_grid_varies_the_first_fastest() {
        let a = Axis::parse("per-key-us=4,32").unwrap();
        let b = Axis::parse("server-concurrency=1,4,8").unwrap();
        assert_eq!(a.values, [BudgetArg::Ms(4.0), BudgetArg::Ms(32.0)]);
        let base = SimParams::default();
        let g = grid(&[a.clone(), b.clone()], &base, (0.5, 10.0)).unwrap();
        let at: Vec<Vec<usize>> = g.iter().map(|p| p.at.clone()).collect();
        assert_eq!(
            at,
            [[0, 0], [1, 0], [0, 1], [1, 1], [0, 2], [1, 2]].map(|x| x.to_vec())
        );
        assert_eq!(g[3].params.server.present_key_s, 32e-6);
        assert_eq!(g[3].params.server.concurrency, 4);
        assert_eq!(
            label(&[a, b], &[1, 2]),
            "per-key-us=32, server-concurrency=8"
        );
        let w = Axis::parse("wait-budget-ms=auto,2").unwrap();
        assert_eq!(w.values, [BudgetArg::Auto, BudgetArg::Ms(2.0)]);
        let err = |t: &str| Axis::parse(t).unwrap_err().to_string();
        assert_eq!(
            err("engines=2.5"),
            "--sweep engines: 2.5 is not a whole number"
        );
        assert_eq!(
            err("ttl-s=auto"),
            "--sweep ttl-s: `auto` is for wait-budget-ms only"
        );
        assert_eq!(err("ttl-s="), "--sweep ttl-s: no value");
        assert_eq!(err("ttl-s=1,1"), "--sweep ttl-s: 1 given twice");
        assert!(
            err("speed=1")
                .starts_with("--sweep \"speed=1\": unknown parameter \"speed\"; one of per-key-us")
        );
        let bad = Axis::parse("engines=0").unwrap();
        assert_eq!(
            format!("{:#}", grid(&[bad], &base, (0.5, 10.0)).unwrap_err()),
            "sweep point engines=0: --engines must be at least 1"
        );
    }
}
