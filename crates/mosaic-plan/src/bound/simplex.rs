//! A small dense simplex for the packing bound's linear programme: maximise Σ x subject to
//! rows a·x ≤ b with b ≥ 0 and x ≥ 0, where rows arrive over time (cutting planes).
//!
//! x = 0 is feasible, so the primal simplex starts from the slack basis without a first phase;
//! a row added to an optimal tableau keeps its reduced costs optimal, so the dual simplex
//! restores feasibility in a few pivots. Both pick pivots by Bland's rule (the least index),
//! which cannot cycle. The answer need not be exact: `packing.rs` scales whatever x it gets
//! back into the feasible region before using it, so rounding costs tightness, never
//! soundness.

use std::time::Instant;

/// A relative tolerance on pivots, reduced costs and right-hand sides.
const EPS: f64 = 1e-9;

/// The most pivots one call makes; past it the call returns the current basis' x.
const MAX_PIVOTS: usize = 1_000;

/// The tableau of max Σ x, rows ≤ b, x ≥ 0 (module docs).
pub(super) struct Simplex {
    /// Structural variables.
    n: usize,
    /// Columns per row: the n structural, one slack per row so far, and the right-hand side.
    width: usize,
    /// The rows, `width` wide, the right-hand side last.
    rows: Vec<Vec<f64>>,
    /// Per row, its basic variable (a column).
    basis: Vec<usize>,
    /// Reduced costs z_j − c_j per column (≥ 0 everywhere at an optimum), then −objective.
    cost: Vec<f64>,
}

impl Simplex {
    /// The programme over `n` variables with room for `max_rows` rows.
    pub(super) fn new(n: usize, max_rows: usize) -> Self {
        let width = n + max_rows + 1;
        let mut cost = vec![0.0; width];
        cost[..n].fill(-1.0);
        Simplex {
            n,
            width,
            rows: Vec::new(),
            basis: Vec::new(),
            cost,
        }
    }

    /// Whether another row fits.
    pub(super) fn has_room(&self) -> bool {
        self.n + self.rows.len() + 1 < self.width
    }

    /// Adds the row Σ_{j ∈ vars} x_j ≤ `rhs` (`rhs` ≥ 0; ignored without room).
    pub(super) fn add_row(&mut self, vars: &[usize], rhs: f64) {
        if !self.has_room() {
            return;
        }
        let slack = self.n + self.rows.len();
        let mut row = vec![0.0; self.width];
        for &j in vars {
            row[j] = 1.0;
        }
        row[slack] = 1.0;
        *row.last_mut().expect("width ≥ 1") = rhs;
        // Express the row in the current basis: eliminate every basic structural variable.
        for (r, &b) in self.basis.iter().enumerate() {
            let f = row[b];
            if f != 0.0 {
                for (x, y) in row.iter_mut().zip(&self.rows[r]) {
                    *x -= f * y;
                }
            }
        }
        self.rows.push(row);
        self.basis.push(slack);
    }

    /// Optimises from the current basis (dual simplex while some right-hand side is negative,
    /// then primal) and returns x, each at least 0; stopped at `deadline` (looked at every 32
    /// pivots) or after [`MAX_PIVOTS`], x is the current basis'.
    pub(super) fn solve(&mut self, deadline: Option<Instant>) -> Vec<f64> {
        let rhs = self.width - 1;
        let columns = self.n + self.rows.len();
        for pivots in 0..MAX_PIVOTS {
            if pivots % 32 == 31 && deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            // Dual simplex: a row with a negative right-hand side leaves (least basic index).
            let leaving = (0..self.rows.len())
                .filter(|&r| self.rows[r][rhs] < -EPS * (1.0 + self.rows[r][rhs].abs()))
                .min_by_key(|&r| self.basis[r]);
            if let Some(r) = leaving {
                let ratios = (0..columns)
                    .filter(|&j| self.rows[r][j] < -EPS)
                    .map(|j| (self.cost[j].max(0.0) / -self.rows[r][j], j));
                match least_ratio(ratios, |j| j) {
                    Some(j) => self.pivot(r, j),
                    // Infeasible rows cannot arise (x = 0 satisfies them all); stop.
                    None => break,
                }
                continue;
            }
            // Primal simplex: the least column with a negative reduced cost enters.
            let Some(j) = (0..columns).find(|&j| self.cost[j] < -EPS) else {
                break;
            };
            let ratios = (0..self.rows.len())
                .filter(|&r| self.rows[r][j] > EPS)
                .map(|r| (self.rows[r][rhs].max(0.0) / self.rows[r][j], r));
            let leaving = least_ratio(ratios, |r| self.basis[r]);
            match leaving {
                Some(r) => self.pivot(r, j),
                // Unbounded: the caller's rows bound every variable, so only rounding gets here.
                None => break,
            }
        }
        let mut x = vec![0.0; self.n];
        for (r, &b) in self.basis.iter().enumerate() {
            if b < self.n {
                x[b] = self.rows[r][rhs].max(0.0);
            }
        }
        x
    }

    /// Makes column `j` basic in row `r`.
    fn pivot(&mut self, r: usize, j: usize) {
        let p = self.rows[r][j];
        for x in self.rows[r].iter_mut() {
            *x /= p;
        }
        // The pivot row's non-zero entries: rows are mostly zeros, and slack columns of rows
        // not yet added are zero everywhere.
        let pivot_row = std::mem::take(&mut self.rows[r]);
        let entries: Vec<(usize, f64)> = pivot_row
            .iter()
            .enumerate()
            .filter(|e| *e.1 != 0.0)
            .map(|(k, &v)| (k, v))
            .collect();
        let eliminate = |row: &mut Vec<f64>| {
            // The pivot row itself is out (taken) and has no entries.
            let f = row.get(j).copied().unwrap_or(0.0);
            if f != 0.0 {
                for &(k, v) in &entries {
                    row[k] -= f * v;
                }
            }
        };
        self.rows.iter_mut().for_each(eliminate);
        eliminate(&mut self.cost);
        self.rows[r] = pivot_row;
        self.basis[r] = j;
    }
}

/// The candidate of the least ratio, ties (within a relative [`EPS`], so that rounding does
/// not break them) to the least `index` — Bland's rule, which cannot cycle.
fn least_ratio(
    ratios: impl Iterator<Item = (f64, usize)>,
    index: impl Fn(usize) -> usize,
) -> Option<usize> {
    let ratios: Vec<(f64, usize)> = ratios.collect();
    let least = ratios.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
    ratios
        .into_iter()
        .filter(|r| r.0 <= least + EPS * (1.0 + least.abs()))
        .min_by_key(|r| index(r.1))
        .map(|r| r.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    /// The programme x_j ≤ `bounds[j]`, with room for 8 rows.
    fn bounded(bounds: &[f64]) -> Simplex {
        let mut lp = Simplex::new(bounds.len(), 8);
        for (j, &b) in bounds.iter().enumerate() {
            lp.add_row(&[j], b);
        }
        lp
    }

    /// Bounds alone: every variable at its bound.
    #[test]
    fn bounds_alone_put_every_variable_at_its_bound() {
        let mut lp = bounded(&[2.0, 3.0, 5.0]);
        assert!(close(&lp.solve(None), &[2.0, 3.0, 5.0]));
    }

    /// Rows added after an optimum: x0 + x1 ≤ 4 and x1 + x2 ≤ 6 under bounds 3, 3, 5 give
    /// Σ x = 9 at (3, 1, 5) — the dual simplex from the earlier optimum finds it.
    #[test]
    fn rows_added_later_are_met_by_the_dual_simplex() {
        let mut lp = bounded(&[3.0, 3.0, 5.0]);
        assert!(close(&lp.solve(None), &[3.0, 3.0, 5.0]));
        lp.add_row(&[0, 1], 4.0);
        lp.add_row(&[1, 2], 6.0);
        let x = lp.solve(None);
        assert!((x.iter().sum::<f64>() - 9.0).abs() < 1e-9, "{x:?}");
        assert!(
            x[0] + x[1] <= 4.0 + 1e-9 && x[1] + x[2] <= 6.0 + 1e-9,
            "{x:?}"
        );
    }

    /// The fractional optimum of the triangle: pairs ≤ 1 give 1/2 each.
    #[test]
    fn the_triangle_has_its_fractional_optimum() {
        let mut lp = bounded(&[1.0, 1.0, 1.0]);
        lp.solve(None);
        for pair in [[0, 1], [1, 2], [0, 2]] {
            lp.add_row(&pair, 1.0);
        }
        assert!(close(&lp.solve(None), &[0.5, 0.5, 0.5]));
    }

    proptest::proptest! {
        /// The dual simplex from each earlier optimum (rows one by one) and the primal
        /// simplex from the slack basis (all rows at once) reach feasible points of the same
        /// objective; the dual's value only falls as rows are added; and no row's variables
        /// sum above the least right-hand side of a row holding them all.
        #[test]
        fn rows_one_by_one_meet_rows_all_at_once(
            bounds in proptest::collection::vec(0.0f64..100.0, 1..6),
            rows in proptest::collection::vec((1u32..64, 0.0f64..150.0), 0..12),
        ) {
            let n = bounds.len();
            let vars = |mask: u32| (0..n).filter(|&j| mask >> j & 1 == 1).collect::<Vec<_>>();
            let rows: Vec<(Vec<usize>, f64)> = rows
                .into_iter()
                .map(|(mask, b)| (vars(mask % (1 << n)), b))
                .filter(|(v, _)| !v.is_empty())
                .collect();
            let mut one_by_one = Simplex::new(n, n + rows.len());
            let mut all_at_once = Simplex::new(n, n + rows.len());
            for (j, &b) in bounds.iter().enumerate() {
                one_by_one.add_row(&[j], b);
                all_at_once.add_row(&[j], b);
            }
            let mut value = one_by_one.solve(None).iter().sum::<f64>();
            for (v, b) in &rows {
                one_by_one.add_row(v, *b);
                all_at_once.add_row(v, *b);
                let next: f64 = one_by_one.solve(None).iter().sum();
                proptest::prop_assert!(next <= value + 1e-9, "{next} after {value}");
                value = next;
            }
            let x = one_by_one.solve(None);
            let y = all_at_once.solve(None);
            let tol = 1e-7;
            for point in [&x, &y] {
                for (j, &b) in bounds.iter().enumerate() {
                    proptest::prop_assert!(point[j] >= 0.0 && point[j] <= b + tol, "{point:?}");
                }
                for (v, b) in &rows {
                    let sum: f64 = v.iter().map(|&j| point[j]).sum();
                    proptest::prop_assert!(sum <= b + tol, "{point:?} breaks {v:?} ≤ {b}");
                }
            }
            let (sx, sy): (f64, f64) = (x.iter().sum(), y.iter().sum());
            proptest::prop_assert!((sx - sy).abs() <= tol * (1.0 + sx.abs()), "{sx} vs {sy}");
        }
    }

    /// Rows beyond the room are dropped, not a panic.
    #[test]
    fn rows_beyond_the_room_are_dropped() {
        let mut lp = Simplex::new(1, 1);
        lp.add_row(&[0], 2.0);
        assert!(!lp.has_room());
        lp.add_row(&[0], 1.0);
        assert!(close(&lp.solve(None), &[2.0]));
    }
}
