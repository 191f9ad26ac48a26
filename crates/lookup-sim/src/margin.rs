//! The winning margin with its uncertainty: a setting against another as the paired
//! ratio of their TTFT p99 rerun by rerun (rerun i of both ran with the same
//! perturbation: seed, arrival rate, order within bursts, routing offset), its median,
//! a distribution-free 95 % interval of that median from order statistics (the sign
//! test's: no assumption on how the ratios are distributed), and the min-max.
//!
//! A margin is *inside the noise* when that interval holds 1: the reruns do not tell
//! the two settings apart at 95 %. With 10 reruns the interval runs from the 2nd to
//! the 9th smallest ratio (coverage 97.9 %), so the winner must be ahead in at least 9
//! of 10 paired reruns for its margin to count.

use serde::Serialize;

use super::stability::Verdict;

/// The paired ratios of one setting's p99 over another's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Paired {
    /// Per rerun: the other's TTFT p99 over the winner's (above 1: the winner is
    /// faster), in rerun order.
    pub ratios: Vec<f64>,
    /// Median of `ratios`.
    pub median: f64,
    /// 95 % interval of the median: order statistics `k` and `n + 1 - k` of the
    /// sorted ratios, `k` the largest with a coverage of at least 95 %
    /// ([`median_interval`]).
    pub interval: (f64, f64),
    /// The interval's exact coverage under the sign test (fraction); below 0.95
    /// only with fewer than 6 reruns, where the interval is the min-max.
    pub coverage: f64,
    /// Smallest and largest ratio.
    pub min_max: (f64, f64),
    /// Reruns in which the winner's p99 was lower.
    pub wins: usize,
    /// Reruns paired.
    pub runs: usize,
    /// The interval holds 1: the reruns do not tell the two apart.
    pub within_noise: bool,
}

impl Paired {
    /// `(median - 1)` in percent: how much slower the other is than the winner.
    #[must_use]
    pub fn slower_pct(&self) -> f64 {
        (self.median - 1.0) * 100.0
    }

    /// In words: `1.026x (95 % interval 0.99-1.05x, min-max 0.97-1.08x), lower in 7
    /// of 10 reruns`.
    #[must_use]
    pub fn describe(&self) -> String {
        format!(
            "{:.3}x (95 % interval {:.3}-{:.3}x, min-max {:.3}-{:.3}x), lower in {} of {} reruns",
            self.median,
            self.interval.0,
            self.interval.1,
            self.min_max.0,
            self.min_max.1,
            self.wins,
            self.runs
        )
    }
}

/// The median of `v` (0 when empty).
#[must_use]
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// P(B <= j) for B ~ Binomial(n, 1/2), summed in the log domain (any n).
fn binomial_cdf_half(n: usize, j: usize) -> f64 {
    let mut ln_pmf = -(n as f64) * std::f64::consts::LN_2;
    let mut sum = ln_pmf.exp();
    for k in 0..j.min(n) {
        ln_pmf += ((n - k) as f64).ln() - ((k + 1) as f64).ln();
        sum += ln_pmf.exp();
    }
    sum.min(1.0)
}

/// The 95 % order-statistic interval of the median of `v`: `((low, high),
/// coverage)`, the `k`-th smallest and `k`-th largest value for the largest `k` whose
/// coverage `1 - 2 P(B <= k - 1)`, B ~ Binomial(n, 1/2), is at least 0.95; the
/// min-max (k = 1) with its smaller coverage when none reaches it (n < 6); `((0, 0),
/// 0)` when `v` is empty.
#[must_use]
pub fn median_interval(v: &[f64]) -> ((f64, f64), f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return ((0.0, 0.0), 0.0);
    }
    let coverage = |k: usize| 1.0 - 2.0 * binomial_cdf_half(n, k - 1);
    let mut k = 1;
    while k < n.div_ceil(2) && coverage(k + 1) >= 0.95 {
        k += 1;
    }
    ((s[k - 1], s[n - k]), coverage(k))
}

/// `other` against `winner`, rerun by rerun. `None` when they did not run the same
/// perturbations (a screened-out setting, another rerun count) or a p99 is 0.
#[must_use]
pub fn paired(winner: &Verdict, other: &Verdict) -> Option<Paired> {
    if winner.reruns.len() != other.reruns.len() || winner.reruns.is_empty() {
        return None;
    }
    let mut ratios = Vec::with_capacity(winner.reruns.len());
    for (w, o) in winner.reruns.iter().zip(&other.reruns) {
        if w.perturbation != o.perturbation || w.p99_ms <= 0.0 {
            return None;
        }
        ratios.push(o.p99_ms / w.p99_ms);
    }
    let (interval, coverage) = median_interval(&ratios);
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(Paired {
        median: median(&ratios),
        interval,
        coverage,
        min_max: (min, max),
        wins: ratios.iter().filter(|&&r| r > 1.0).count(),
        runs: ratios.len(),
        within_noise: interval.0 <= 1.0 && 1.0 <= interval.1,
        ratios,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_interval_takes_the_order_statistics_of_the_sign_test() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        let ((lo, hi), c) = median_interval(&v);
        // n = 10: k = 2, coverage 1 - 2 * 11/1024.
        assert_eq!((lo, hi), (2.0, 9.0));
        assert!((c - (1.0 - 22.0 / 1024.0)).abs() < 1e-12, "{c}");
        // n = 5: no k reaches 95 %, the min-max covers 1 - 2/32.
        let ((lo, hi), c) = median_interval(&[5.0, 1.0, 4.0, 2.0, 3.0]);
        assert_eq!((lo, hi), (1.0, 5.0));
        assert!((c - (1.0 - 2.0 / 32.0)).abs() < 1e-12, "{c}");
        // n = 6: k = 1, coverage 1 - 2/64 = 96.9 %.
        let ((lo, hi), c) = median_interval(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!((lo, hi), (1.0, 6.0));
        assert!((c - (1.0 - 2.0 / 64.0)).abs() < 1e-12, "{c}");
        // n = 20: k = 6, coverage 1 - 2 * P(B <= 5) = 1 - 2 * 21700/2^20.
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        let ((lo, hi), c) = median_interval(&v);
        assert_eq!((lo, hi), (6.0, 15.0));
        assert!(
            (c - (1.0 - 2.0 * 21_700.0 / 1_048_576.0)).abs() < 1e-12,
            "{c}"
        );
        assert_eq!(median_interval(&[]), ((0.0, 0.0), 0.0));
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
    }
}
