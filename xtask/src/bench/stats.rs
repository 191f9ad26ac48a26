//! The benchmark's arithmetic, free of I/O: percentiles of call times, medians over
//! repetitions, ratios and goal verdicts.

use serde::{Deserialize, Serialize};

/// The value at quantile `q` (0 to 1) of `sorted` (ascending), by nearest rank: the
/// element at index `round(q × (len − 1))`. The Python script uses the same rule, so
/// both sides' p50 and p99 mean the same thing. `None` when `sorted` is empty; `q`
/// outside 0..=1 is clamped.
#[must_use]
pub fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    let last = sorted.len().checked_sub(1)?;
    let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
    // Exact for any slice that fits in memory: `last` is far below 2^52.
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    #[allow(clippy::cast_sign_loss)]
    let index = (q * last as f64).round() as usize;
    sorted.get(index.min(last)).copied()
}

/// The median of `values`: the middle one, or the mean of the two middle ones for an
/// even count. NaN values are ignored; `None` when nothing is left.
#[must_use]
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        f64::midpoint(v[mid - 1], v[mid])
    })
}

/// The median of integer `values` (nanoseconds), rounded to the nearest integer;
/// `None` when empty.
#[must_use]
pub fn median_u64(values: &[u64]) -> Option<u64> {
    let mut v = values.to_vec();
    v.sort_unstable();
    let mid = v.len() / 2;
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[mid]),
        _ => Some(v[mid - 1] / 2 + v[mid] / 2 + (v[mid - 1] % 2 + v[mid] % 2).div_ceil(2)),
    }
}

/// `numerator / denominator`; `None` when either is not finite or the denominator is
/// not positive (a run that measured nothing has no ratio).
#[must_use]
pub fn ratio(numerator: f64, denominator: f64) -> Option<f64> {
    (numerator.is_finite() && denominator.is_finite() && denominator > 0.0)
        .then(|| numerator / denominator)
}

/// The median of the per-repetition ratios `numerators[i] / denominators[i]`: runs of
/// one repetition ran seconds apart under the same background load, so pairing them
/// cancels the load's drift that a ratio of two medians would keep. Pairs without a
/// ratio (see [`ratio`]) are skipped; `None` when none is left.
#[must_use]
pub fn paired_ratio(numerators: &[f64], denominators: &[f64]) -> Option<f64> {
    median(&paired_ratios(numerators, denominators))
}

/// The per-repetition ratios `numerators[i] / denominators[i]` of [`paired_ratio`], in
/// repetition order, pairs without a ratio (see [`ratio`]) left out.
#[must_use]
pub fn paired_ratios(numerators: &[f64], denominators: &[f64]) -> Vec<f64> {
    numerators
        .iter()
        .zip(denominators)
        .filter_map(|(&n, &d)| ratio(n, d))
        .collect()
}

/// The smallest and the largest of `values` (NaN left out); `None` when none is left.
#[must_use]
pub fn min_max(values: &[f64]) -> Option<(f64, f64)> {
    values
        .iter()
        .copied()
        .filter(|x| !x.is_nan())
        .fold(None, |acc, x| match acc {
            None => Some((x, x)),
            Some((lo, hi)) => Some((lo.min(x), hi.max(x))),
        })
}

/// How long one kind of caller call took: the number of calls and two nearest-rank
/// percentiles, in nanoseconds of wall-clock time around the call (one clock read
/// included). The same shape as each entry of the Python script's `calls` object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallCost {
    /// Calls timed.
    pub n: u64,
    /// Median call time (ns).
    pub p50_ns: u64,
    /// 99th percentile call time (ns).
    pub p99_ns: u64,
}

impl CallCost {
    /// The cost of `samples` (ns, any order; sorted in place); `None` when empty.
    #[must_use]
    pub fn from_samples(samples: &mut [u64]) -> Option<Self> {
        samples.sort_unstable();
        Some(Self {
            n: samples.len() as u64,
            p50_ns: percentile(samples, 0.5)?,
            p99_ns: percentile(samples, 0.99)?,
        })
    }

    /// Across repetitions: the median of the runs' p50s and of their p99s (each
    /// percentile separately, so one noisy run decides neither), and the calls of all
    /// runs added up. `None` when `runs` is empty.
    #[must_use]
    pub fn median_of(runs: &[Self]) -> Option<Self> {
        let p50: Vec<u64> = runs.iter().map(|r| r.p50_ns).collect();
        let p99: Vec<u64> = runs.iter().map(|r| r.p99_ns).collect();
        Some(Self {
            n: runs.iter().map(|r| r.n).sum(),
            p50_ns: median_u64(&p50)?,
            p99_ns: median_u64(&p99)?,
        })
    }
}

/// One throughput figure over repetitions: every run's value and their median,
/// minimum and maximum (lookups per second).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Median over the runs: the figure the table shows.
    pub median: f64,
    /// Lowest run.
    pub min: f64,
    /// Highest run.
    pub max: f64,
    /// Every run, in the order they ran.
    pub runs: Vec<f64>,
}

impl Summary {
    /// The summary of `runs`; `None` when there is no finite value.
    #[must_use]
    pub fn of(runs: &[f64]) -> Option<Self> {
        let finite = runs.iter().copied().filter(|x| x.is_finite());
        Some(Self {
            median: median(runs)?,
            min: finite.clone().reduce(f64::min)?,
            max: finite.reduce(f64::max)?,
            runs: runs.to_vec(),
        })
    }
}

/// A goal (`bench/README.md`) and whether the measured ratio reaches it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Goal {
    /// What is compared, for the table (for example "N=4 / N=1, 1 ms index").
    pub name: String,
    /// What kind of goal it is (throughput, the caller's cost).
    pub source: &'static str,
    /// The measured ratio; `None` when a side was not measured.
    pub value: Option<f64>,
    /// The ratio the goal asks for, at least.
    pub target: f64,
}

impl Goal {
    /// True when the measured ratio is at least the target; false when it is below
    /// or was not measured.
    #[must_use]
    pub fn met(&self) -> bool {
        self.value.is_some_and(|v| v >= self.target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        // round(0.5 × 99) = round(49.5) = 50 → the 51st value.
        assert_eq!(percentile(&v, 0.5), Some(51));
        // round(0.99 × 99) = round(98.01) = 98 → the 99th value.
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&v, 7.0), Some(100));
        assert_eq!(percentile(&[42], 0.99), Some(42));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn median_u64_rounds_to_nearest() {
        assert_eq!(median_u64(&[3, 1, 2]), Some(2));
        assert_eq!(median_u64(&[1, 2]), Some(2));
        assert_eq!(median_u64(&[10, 20, 31, 41]), Some(26));
        assert_eq!(median_u64(&[u64::MAX, u64::MAX]), Some(u64::MAX));
        assert_eq!(median_u64(&[]), None);
    }
}
