//! `prefetch+wait`'s wait budget: how long the engine thread waits for a probe's
//! lookup already queued or on the wire before deferring the request. Fixed, or
//! adapted to the lookup time the client observes (its recent on-wire p90, within
//! bounds), so it neither blocks longer than lookups take nor gives up on one that a
//! short wait would have caught. Shared by `simulate` and `replay`.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// Lookups remembered for the adaptive budget.
pub const WINDOW: usize = 64;

/// The wait budget of `prefetch+wait`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WaitBudget {
    /// Always this long (seconds).
    Fixed {
        /// The budget (seconds).
        s: f64,
    },
    /// The 90th percentile of the on-wire time (send to answer) of the client's last
    /// [`WINDOW`] answered lookups, clamped to `[min_s, max_s]`; `max_s` before the
    /// first answer.
    Adaptive {
        /// Lower bound (seconds): waiting less is never worth a check.
        min_s: f64,
        /// Upper bound (seconds): about a decode step, the cost of a deferral.
        max_s: f64,
    },
}

impl Default for WaitBudget {
    /// Adaptive within [0.5 ms, 10 ms]: a decode step of the modelled engine takes
    /// 10-20 ms, and a deferral costs at least one.
    fn default() -> Self {
        Self::Adaptive {
            min_s: 0.000_5,
            max_s: 0.010,
        }
    }
}

impl WaitBudget {
    /// The budget now (seconds), given the client's recent lookups.
    #[must_use]
    pub fn seconds(&self, recent: &RecentLatency) -> f64 {
        match *self {
            Self::Fixed { s } => s,
            Self::Adaptive { min_s, max_s } => {
                recent.p90_s().map_or(max_s, |p90| p90.clamp(min_s, max_s))
            }
        }
    }

    /// Checks the values.
    ///
    /// # Errors
    /// A negative, NaN or infinite duration, or bounds in the wrong order.
    pub fn validate(&self) -> anyhow::Result<()> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        match *self {
            Self::Fixed { s } if !ok(s) => {
                anyhow::bail!(
                    "--wait-budget-ms must be a finite number >= 0 or auto, got {}",
                    s * 1e3
                )
            }
            Self::Adaptive { min_s, max_s } if !(ok(min_s) && ok(max_s) && min_s <= max_s) => {
                anyhow::bail!(
                    "--wait-budget-bounds-ms must be two finite numbers 0 <= MIN <= MAX, got {},{}",
                    min_s * 1e3,
                    max_s * 1e3
                )
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for WaitBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Fixed { s } => write!(f, "{} ms", s * 1e3),
            Self::Adaptive { min_s, max_s } => {
                write!(
                    f,
                    "auto (on-wire p90 in [{}, {}] ms)",
                    min_s * 1e3,
                    max_s * 1e3
                )
            }
        }
    }
}

/// A budget as written on the command line: `auto` or milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BudgetArg {
    /// Adaptive (bounds from `--wait-budget-bounds-ms`).
    Auto,
    /// Fixed, in milliseconds.
    Ms(f64),
}

impl FromStr for BudgetArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(Self::Auto);
        }
        s.parse::<f64>()
            .map(Self::Ms)
            .map_err(|_| format!("expected `auto` or milliseconds, got {s:?}"))
    }
}

impl fmt::Display for BudgetArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Ms(ms) => write!(f, "{ms}"),
        }
    }
}

impl BudgetArg {
    /// The budget, with `bounds_ms` (min, max) for `auto`.
    #[must_use]
    pub fn budget(self, bounds_ms: (f64, f64)) -> WaitBudget {
        match self {
            Self::Auto => WaitBudget::Adaptive {
                min_s: bounds_ms.0 / 1e3,
                max_s: bounds_ms.1 / 1e3,
            },
            Self::Ms(ms) => WaitBudget::Fixed { s: ms / 1e3 },
        }
    }
}

/// The on-wire times of a client's last [`WINDOW`] answered lookups, with their 90th
/// percentile kept up to date.
#[derive(Clone, Debug, Default)]
pub struct RecentLatency {
    ring: Vec<u64>,
    next: usize,
    p90_ns: Option<u64>,
}

impl RecentLatency {
    /// An answered lookup spent `on_wire_ns` from its send to its answer.
    pub fn record(&mut self, on_wire_ns: u64) {
        if self.ring.len() < WINDOW {
            self.ring.push(on_wire_ns);
        } else {
            self.ring[self.next] = on_wire_ns;
        }
        self.next = (self.next + 1) % WINDOW;
        let mut sorted = self.ring.clone();
        sorted.sort_unstable();
        // Nearest rank: the smallest value with at least 90 % of the window at or below.
        let rank = (sorted.len() * 9).div_ceil(10).max(1);
        self.p90_ns = Some(sorted[rank - 1]);
    }

    /// The 90th percentile (seconds); `None` before the first answer.
    #[must_use]
    pub fn p90_s(&self) -> Option<f64> {
        self.p90_ns.map(|ns| ns as f64 / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_budget_is_the_recent_p90_within_bounds() {
        let auto = WaitBudget::default();
        let mut recent = RecentLatency::default();
        assert_eq!(auto.seconds(&recent), 0.010);
        // Ten lookups of 1..=10 ms: p90 = 9 ms.
        for ms in 1..=10 {
            recent.record(ms * 1_000_000);
        }
        assert_eq!(auto.seconds(&recent), 0.009);
        // 64 more of 0.1 ms push the old ones out: p90 = 0.1 ms, clamped to 0.5 ms.
        for _ in 0..WINDOW {
            recent.record(100_000);
        }
        assert_eq!(auto.seconds(&recent), 0.000_5);
        // Slow lookups: clamped to the upper bound.
        for _ in 0..WINDOW {
            recent.record(50_000_000);
        }
        assert_eq!(auto.seconds(&recent), 0.010);
        assert_eq!(WaitBudget::Fixed { s: 0.005 }.seconds(&recent), 0.005);
        assert_eq!("auto".parse::<BudgetArg>(), Ok(BudgetArg::Auto));
        assert_eq!("2.5".parse::<BudgetArg>(), Ok(BudgetArg::Ms(2.5)));
        assert!("fast".parse::<BudgetArg>().is_err());
        assert_eq!(
            WaitBudget::Fixed { s: -1.0 }
                .validate()
                .unwrap_err()
                .to_string(),
            "--wait-budget-ms must be a finite number >= 0 or auto, got -1000"
        );
    }
}
