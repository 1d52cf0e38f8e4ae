//! Non-negative least squares for a handful of unknowns, on nalgebra's SVD.

use nalgebra::{DMatrix, DVector};

/// Most unknowns [`nnls`] accepts: it solves `2^N` small least-squares problems.
pub const MAX_UNKNOWNS: usize = 16;

/// Solves `min ‖A x − y‖²` subject to `x ≥ 0`, where `rows[r]` is row `r` of `A`.
///
/// **Exact by enumeration.** An optimum of a non-negative least-squares problem is the
/// unconstrained least-squares solution on its support, and there is always an optimum whose
/// support columns are linearly independent (Lawson & Hanson, *Solving Least Squares
/// Problems*, 1974, ch. 23). So for every subset of the columns (the empty one included) this
/// solves the unconstrained problem on those columns with nalgebra's SVD (minimum-norm, so
/// rank-deficient subsets are fine), keeps the solutions that are non-negative, and returns
/// the one with the smallest residual (ties: the earlier subset, so the answer is
/// deterministic). With `N` ≤ [`MAX_UNKNOWNS`] unknowns — Eq. 8 has three — that is at most
/// 2^N tiny SVDs, and no iterative active-set method with its tolerances is needed.
///
/// Returns zeros when there are no rows. The targets are scaled by a power of two (exactly)
/// so that their squares neither overflow nor underflow: targets as large as 10³⁰⁰ give their
/// solution (scaled back, which may overflow to infinity) rather than zeros.
///
/// # Panics
/// If `N` exceeds [`MAX_UNKNOWNS`] or `rows` and `y` differ in length.
pub fn nnls<const N: usize>(rows: &[[f64; N]], y: &[f64]) -> [f64; N] {
    assert!(
        N <= MAX_UNKNOWNS,
        "nnls: {N} unknowns, at most {MAX_UNKNOWNS}"
    );
    assert_eq!(
        rows.len(),
        y.len(),
        "nnls: rows and targets differ in length"
    );
    let top = y.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if !(top.is_finite() && top > 0.0) || (1e-100..=1e100).contains(&top) {
        return nnls_unscaled(rows, y);
    }
    // 2^-⌊log2 top⌋: the largest target becomes [1, 2), and every target keeps its digits.
    let scale = 2f64.powi(-(top.log2().floor() as i32));
    let scaled: Vec<f64> = y.iter().map(|v| v * scale).collect();
    nnls_unscaled(rows, &scaled).map(|x| x / scale)
}

/// [`nnls`] on targets whose squares are representable.
fn nnls_unscaled<const N: usize>(rows: &[[f64; N]], y: &[f64]) -> [f64; N] {
    let mut best = [0.0; N];
    if rows.is_empty() {
        return best;
    }
    let a = DMatrix::from_fn(rows.len(), N, |r, c| rows[r][c]);
    let b = DVector::from_column_slice(y);
    let residual = |x: &[f64; N]| {
        let xv = DVector::from_column_slice(x);
        (&a * xv - &b).norm_squared()
    };
    let mut best_ssr = residual(&best);
    for mask in 1u32..(1 << N) {
        let cols: Vec<usize> = (0..N).filter(|&c| mask >> c & 1 == 1).collect();
        let sub = a.select_columns(cols.iter());
        let Some(x) = least_squares(sub, &b) else {
            continue;
        };
        let scale = x.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        if x.iter().any(|&v| !v.is_finite() || v < -1e-12 * scale) {
            continue;
        }
        let mut full = [0.0; N];
        for (k, &c) in cols.iter().enumerate() {
            full[c] = x[k].max(0.0);
        }
        let ssr = residual(&full);
        if ssr < best_ssr {
            best_ssr = ssr;
            best = full;
        }
    }
    best
}

/// The minimum-norm least-squares solution of `a x = b` by SVD, singular values below a
/// relative threshold treated as zero.
fn least_squares(a: DMatrix<f64>, b: &DVector<f64>) -> Option<DVector<f64>> {
    let dims = a.nrows().max(a.ncols()) as f64;
    let svd = a.svd(true, true);
    let top = svd.singular_values.iter().fold(0.0f64, |m, &s| m.max(s));
    if top == 0.0 {
        return None;
    }
    svd.solve(b, top * dims * f64::EPSILON * 16.0).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unconstrained_optimum_is_returned_when_non_negative() {
        // y = 1 + 2 x exactly.
        let rows: Vec<[f64; 2]> = (0..5).map(|i| [1.0, i as f64]).collect();
        let y: Vec<f64> = (0..5).map(|i| 1.0 + 2.0 * i as f64).collect();
        let x = nnls(&rows, &y);
        assert!(
            (x[0] - 1.0).abs() < 1e-10 && (x[1] - 2.0).abs() < 1e-10,
            "{x:?}"
        );
    }

    #[test]
    fn huge_and_tiny_targets_are_solved_not_dropped() {
        // y = 1 + 2 x scaled by 10³⁰⁰: the squares overflow unscaled, which used to leave the
        // zero solution (every residual infinite) and so silently ignore the data.
        let rows: Vec<[f64; 2]> = (0..5).map(|i| [1.0, i as f64]).collect();
        for scale in [1e300, 1e-300, 1e160] {
            let y: Vec<f64> = (0..5).map(|i| (1.0 + 2.0 * i as f64) * scale).collect();
            let x = nnls(&rows, &y);
            assert!(
                (x[0] / scale - 1.0).abs() < 1e-10 && (x[1] / scale - 2.0).abs() < 1e-10,
                "{scale}: {x:?}"
            );
        }
    }

    #[test]
    fn negative_coefficients_are_clamped_to_the_constrained_optimum() {
        // y = 3 − x: unconstrained (3, −1); with x ≥ 0 the best is the constant 1.5 (the
        // mean of y on x = 0..3 is 1.5), with the slope at 0.
        let rows: Vec<[f64; 2]> = (0..4).map(|i| [1.0, i as f64]).collect();
        let y: Vec<f64> = (0..4).map(|i| 3.0 - i as f64).collect();
        let x = nnls(&rows, &y);
        assert_eq!(x[1], 0.0);
        assert!((x[0] - 1.5).abs() < 1e-10, "{x:?}");
        // All-negative targets: zero is optimal.
        let neg: Vec<f64> = y.iter().map(|v| -v - 1.0).collect();
        assert_eq!(nnls(&rows, &neg), [0.0, 0.0]);
    }

    #[test]
    fn matches_a_brute_force_grid_search() {
        // Three unknowns, noisy data whose unconstrained optimum has a negative coefficient.
        let rows: Vec<[f64; 3]> = (0..12)
            .map(|i| {
                let t = i as f64 / 11.0;
                [1.0, t, t * t]
            })
            .collect();
        let y: Vec<f64> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| 0.2 + 0.5 * r[1] - 0.3 * r[2] + if i % 2 == 0 { 0.01 } else { -0.01 })
            .collect();
        let x = nnls(&rows, &y);
        assert!(x.iter().all(|&v| v >= 0.0));
        let ssr = |x: &[f64; 3]| -> f64 {
            rows.iter()
                .zip(&y)
                .map(|(r, y)| (r[0] * x[0] + r[1] * x[1] + r[2] * x[2] - y).powi(2))
                .sum()
        };
        let got = ssr(&x);
        for a in 0..=40 {
            for b in 0..=40 {
                for c in 0..=10 {
                    let cand = [a as f64 * 0.01, b as f64 * 0.01, c as f64 * 0.01];
                    assert!(got <= ssr(&cand) + 1e-12, "{cand:?} beats {x:?}");
                }
            }
        }
    }

    #[test]
    fn collinear_columns_and_no_rows_are_handled() {
        // Two identical columns: any split of the coefficient is optimal; the answer must be
        // non-negative and fit exactly.
        let rows: Vec<[f64; 2]> = (1..5).map(|i| [i as f64, i as f64]).collect();
        let y: Vec<f64> = (1..5).map(|i| 2.0 * i as f64).collect();
        let x = nnls(&rows, &y);
        assert!(x.iter().all(|&v| v >= 0.0));
        assert!((x[0] + x[1] - 2.0).abs() < 1e-9, "{x:?}");
        assert_eq!(nnls::<3>(&[], &[]), [0.0; 3]);
    }
}
