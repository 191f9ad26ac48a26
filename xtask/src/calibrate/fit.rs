//! Least squares with non-negative coefficients, small enough to write out: the cost
//! of a lookup is a sum of non-negative costs (fixed, per call, per key), so a
//! coefficient the noise drives below 0 is dropped and the others refitted.

/// Coefficients `x >= 0` minimising `Σ (rows[i] · x − y[i])²`; a feature whose
/// coefficient would be negative is left out (0). Rows must all have the same length.
///
/// Returns `None` when there are fewer rows than features, or the rows do not pin the
/// features down (a singular system).
#[must_use]
pub fn nonnegative_least_squares(rows: &[Vec<f64>], y: &[f64]) -> Option<Vec<f64>> {
    let n = rows.first()?.len();
    if rows.len() < n || rows.len() != y.len() || rows.iter().any(|r| r.len() != n) {
        return None;
    }
    let mut active: Vec<usize> = (0..n).collect();
    loop {
        let sub = least_squares(rows, y, &active)?;
        let worst = sub
            .iter()
            .enumerate()
            .filter(|(_, v)| **v < 0.0)
            .min_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i);
        match worst {
            Some(i) => {
                active.remove(i);
                if active.is_empty() {
                    return Some(vec![0.0; n]);
                }
            }
            None => {
                let mut x = vec![0.0; n];
                for (k, &j) in active.iter().enumerate() {
                    x[j] = sub[k];
                }
                return Some(x);
            }
        }
    }
}

/// Ordinary least squares on the `cols` features, through the normal equations
/// (Gaussian elimination with partial pivoting).
fn least_squares(rows: &[Vec<f64>], y: &[f64], cols: &[usize]) -> Option<Vec<f64>> {
    let m = cols.len();
    let mut a = vec![vec![0.0; m + 1]; m];
    for (row, &yi) in rows.iter().zip(y) {
        for (i, &ci) in cols.iter().enumerate() {
            for (j, &cj) in cols.iter().enumerate() {
                a[i][j] += row[ci] * row[cj];
            }
            a[i][m] += row[ci] * yi;
        }
    }
    for c in 0..m {
        let pivot = (c..m).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
        if a[pivot][c].abs() < 1e-12 {
            return None;
        }
        a.swap(c, pivot);
        let pivot_row = a[c].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != c {
                let f = row[c] / pivot_row[c];
                for (v, p) in row[c..].iter_mut().zip(&pivot_row[c..]) {
                    *v -= f * p;
                }
            }
        }
    }
    Some((0..m).map(|i| a[i][m] / a[i][i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_costs_and_drops_a_negative_one() {
        // y = 80 + 0.75 present + 0.4 absent, exactly.
        let pts = [
            (16.0, 0.0),
            (1024.0, 0.0),
            (0.0, 16.0),
            (0.0, 1024.0),
            (64.0, 0.0),
        ];
        let rows: Vec<Vec<f64>> = pts.iter().map(|&(p, a)| vec![1.0, p, a]).collect();
        let y: Vec<f64> = pts
            .iter()
            .map(|&(p, a)| 80.0 + 0.75 * p + 0.4 * a)
            .collect();
        let x = nonnegative_least_squares(&rows, &y).unwrap();
        for (got, want) in x.iter().zip([80.0, 0.75, 0.4]) {
            assert!((got - want).abs() < 1e-9, "{x:?}");
        }
        // Absent keys that cost nothing measurable, with noise that makes them look
        // negative: the coefficient is dropped, the others refitted.
        let y: Vec<f64> = pts
            .iter()
            .map(|&(p, a)| 80.0 + 0.75 * p - 0.001 * a)
            .collect();
        let x = nonnegative_least_squares(&rows, &y).unwrap();
        assert_eq!(x[2], 0.0);
        // The refit is the simple regression of y on the present keys, in closed form.
        let n = pts.len() as f64;
        let (sp, sy) = (pts.iter().map(|q| q.0).sum::<f64>(), y.iter().sum::<f64>());
        let spp: f64 = pts.iter().map(|q| q.0 * q.0).sum();
        let spy: f64 = pts.iter().zip(&y).map(|(q, y)| q.0 * y).sum();
        let b1 = (n * spy - sp * sy) / (n * spp - sp * sp);
        let b0 = (sy - b1 * sp) / n;
        assert!(
            (x[0] - b0).abs() < 1e-9 && (x[1] - b1).abs() < 1e-12,
            "{x:?}"
        );
        // Two identical rows cannot pin two features.
        assert_eq!(
            nonnegative_least_squares(&[vec![1.0, 1.0], vec![1.0, 1.0]], &[1.0, 1.0]),
            None
        );
        assert_eq!(nonnegative_least_squares(&[vec![1.0, 2.0]], &[1.0]), None);
    }
}
