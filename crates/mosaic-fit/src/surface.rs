//! How good the sparse scaling surface of §3.3 is: the interpolation error at unprofiled
//! quotas, and what profiling the sparse grid saves against a dense one.
//!
//! The planner interpolates a module's time linearly in the quota between profiled quotas of
//! the same data-parallel degree, never extrapolates, and never interpolates across degrees
//! (an unprofiled dp is not a candidate). The checks here follow the same rule.

use std::collections::BTreeMap;

use mosaic_profile::{ModuleProfile, ProfileFile};
use serde::Serialize;

/// Iterations timed per profiled point in [`profiling_cost`] (e.g. 5 warm-up + 15 measured).
/// The sparse / dense ratio does not depend on it.
pub const PROFILED_ITERATIONS: u32 = 20;

/// The dense grid's quota step: every 1 %.
pub const DENSE_STEP: f64 = 0.01;

/// One checked point of a scaling surface.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SurfacePoint {
    /// Module name.
    pub module: String,
    /// Data-parallel degree.
    pub dp: u32,
    /// SM quota.
    pub sm: f64,
    /// The interpolated time, ms.
    pub interpolated_ms: f64,
    /// The profiled (or true) time, ms.
    pub actual_ms: f64,
    /// |interpolated − actual| / actual.
    pub rel_err: f64,
}

/// The interpolation error over a set of points.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SurfaceAccuracy {
    /// Points checked.
    pub points: usize,
    /// Mean relative error (0 without points).
    pub mean_rel_err: f64,
    /// Largest relative error (0 without points).
    pub max_rel_err: f64,
    /// The point with the largest error.
    pub worst: Option<SurfacePoint>,
}

impl SurfaceAccuracy {
    fn of(points: Vec<SurfacePoint>) -> Self {
        let n = points.len();
        let mean = if n == 0 {
            0.0
        } else {
            points.iter().map(|p| p.rel_err).sum::<f64>() / n as f64
        };
        let worst = points
            .into_iter()
            .max_by(|a, b| a.rel_err.total_cmp(&b.rel_err));
        SurfaceAccuracy {
            points: n,
            mean_rel_err: mean,
            max_rel_err: worst.as_ref().map_or(0.0, |w| w.rel_err),
            worst,
        }
    }
}

/// A module's profiled (sm, time) rows by dp, each sorted by quota.
fn rows(m: &ModuleProfile) -> BTreeMap<u32, Vec<(f64, f64)>> {
    let mut by_dp: BTreeMap<u32, Vec<(f64, f64)>> = BTreeMap::new();
    for s in &m.samples {
        by_dp.entry(s.dp).or_default().push((s.sm, s.time_ms));
    }
    for row in by_dp.values_mut() {
        row.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    by_dp
}

/// The time at quota `sm` interpolated linearly between the profiled `(sm, time)` points of
/// `row` (sorted by quota), as the planner does: `None` outside the profiled range.
pub fn interpolate(row: &[(f64, f64)], sm: f64) -> Option<f64> {
    let eps = 1e-9;
    let k = row.iter().position(|p| p.0 >= sm - eps)?;
    let hi = row[k];
    if (hi.0 - sm).abs() <= eps {
        return Some(hi.1);
    }
    let lo = *row.get(k.checked_sub(1)?)?;
    Some(lo.1 + (sm - lo.0) / (hi.0 - lo.0) * (hi.1 - lo.1))
}

fn point(module: &str, dp: u32, sm: f64, interpolated_ms: f64, actual_ms: f64) -> SurfacePoint {
    SurfacePoint {
        module: module.to_string(),
        dp,
        sm,
        interpolated_ms,
        actual_ms,
        rel_err: (interpolated_ms - actual_ms).abs() / actual_ms,
    }
}

/// Leave-one-out error of the scaling surface: for every module, every profiled dp and every
/// profiled quota strictly inside that dp's profiled range, drop the sample and interpolate
/// its time from its neighbours at the same dp; compare with the profiled time. (The end
/// points cannot be checked: the planner never extrapolates.) On the paper's decile grid this
/// is the error at quotas 0.1 away from a sample, twice the spacing the planner actually
/// interpolates over, so it bounds the real error from above for smooth surfaces.
pub fn leave_one_out(profile: &ProfileFile) -> SurfaceAccuracy {
    let mut points = Vec::new();
    for m in &profile.modules {
        for (dp, row) in rows(m) {
            for i in 1..row.len().saturating_sub(1) {
                let mut rest = row.clone();
                let (sm, actual) = rest.remove(i);
                if let Some(t) = interpolate(&rest, sm) {
                    points.push(point(&m.name, dp, sm, t, actual));
                }
            }
        }
    }
    SurfaceAccuracy::of(points)
}

/// Error of the interpolated surface against a dense ground truth: for every module (by index
/// into `profile.modules`), every profiled dp, and every multiple of `step` inside that dp's
/// profiled quota range that was not profiled, the interpolated time against `truth(module,
/// dp, sm)` — e.g. the analytical device model that produced the sparse profile, asked at
/// 1 % steps.
pub fn dense_error(
    profile: &ProfileFile,
    step: f64,
    truth: impl Fn(usize, u32, f64) -> f64,
) -> SurfaceAccuracy {
    let steps = (1.0 / step).round() as u32;
    let mut points = Vec::new();
    for (i, m) in profile.modules.iter().enumerate() {
        for (dp, row) in rows(m) {
            for k in 1..=steps {
                let sm = k as f64 / steps as f64;
                if row.iter().any(|p| (p.0 - sm).abs() <= 1e-9) {
                    continue;
                }
                if let Some(t) = interpolate(&row, sm) {
                    points.push(point(&m.name, dp, sm, t, truth(i, dp, sm)));
                }
            }
        }
    }
    SurfaceAccuracy::of(points)
}

/// What profiling the sparse grid costs against a dense one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfilingCost {
    /// Iterations timed per point.
    pub iterations: u32,
    /// The dense grid: every dp in `1..=max_dp` ...
    pub max_dp: u32,
    /// ... and every multiple of this quota step.
    pub dense_step: f64,
    /// Points of the sparse grid (the profile's samples).
    pub sparse_points: usize,
    /// Points of the dense grid.
    pub dense_points: usize,
    /// Seconds to profile the sparse grid one point after another: Σ time × iterations.
    pub sparse_s: f64,
    /// The same for the dense grid.
    pub dense_s: f64,
    /// `dense_s / sparse_s`: how many times more the dense grid costs.
    pub time_ratio: f64,
    /// `dense_points / sparse_points`.
    pub point_ratio: f64,
    /// Whether the dense times were estimated from the sparse surface (no truth given).
    pub dense_estimated: bool,
}

/// The profiling cost of the profile's (sparse) samples against the dense grid of every dp in
/// `1..=max_dp` (the profile's largest dp when `None`) and every multiple of `step`, each point
/// timed for `iterations` iterations: Σ over points of time_ms × iterations, in seconds.
/// Dense times come from `dense_time(module, dp, sm)` (module by index into `profile.modules`)
/// when given, else from [`estimate`] on the sparse surface.
pub fn profiling_cost(
    profile: &ProfileFile,
    step: f64,
    max_dp: Option<u32>,
    iterations: u32,
    dense_time: Option<&dyn Fn(usize, u32, f64) -> f64>,
) -> ProfilingCost {
    let max_dp = max_dp.unwrap_or_else(|| {
        profile
            .modules
            .iter()
            .flat_map(|m| m.samples.iter().map(|s| s.dp))
            .max()
            .unwrap_or(1)
    });
    let it = iterations as f64;
    let sparse_points: usize = profile.modules.iter().map(|m| m.samples.len()).sum();
    let sparse_s: f64 = profile
        .modules
        .iter()
        .flat_map(|m| m.samples.iter().map(|s| s.time_ms))
        .sum::<f64>()
        * it
        / 1e3;
    let steps = (1.0 / step).round() as u32;
    let mut dense_points = 0;
    let mut dense_ms = 0.0;
    for (i, m) in profile.modules.iter().enumerate() {
        let r = rows(m);
        for dp in 1..=max_dp {
            for k in 1..=steps {
                let sm = k as f64 / steps as f64;
                dense_points += 1;
                dense_ms += match dense_time {
                    Some(f) => f(i, dp, sm),
                    None => estimate_rows(&r, dp, sm),
                };
            }
        }
    }
    let dense_s = dense_ms * it / 1e3;
    ProfilingCost {
        iterations,
        max_dp,
        dense_step: step,
        sparse_points,
        dense_points,
        sparse_s,
        dense_s,
        time_ratio: dense_s / sparse_s,
        point_ratio: dense_points as f64 / sparse_points as f64,
        dense_estimated: dense_time.is_none(),
    }
}

/// A rough estimate of a module's time anywhere on the (dp, sm) plane from its sparse samples,
/// for [`profiling_cost`] only: linear in the quota inside a profiled row, `∝ 1/sm` below its
/// smallest quota and flat above its largest; between profiled degrees linear in `1/dp`, and
/// `∝ 1/dp` outside them. Panics if the module has no samples.
pub fn estimate(module: &ModuleProfile, dp: u32, sm: f64) -> f64 {
    estimate_rows(&rows(module), dp, sm)
}

fn estimate_rows(rows: &BTreeMap<u32, Vec<(f64, f64)>>, dp: u32, sm: f64) -> f64 {
    let at = |row: &[(f64, f64)]| {
        let (first, last) = (row[0], row[row.len() - 1]);
        if sm < first.0 {
            first.1 * first.0 / sm
        } else if sm > last.0 {
            last.1
        } else {
            interpolate(row, sm).unwrap_or(last.1)
        }
    };
    let below = rows.range(..=dp).next_back();
    let above = rows.range(dp..).next();
    match (below, above) {
        (Some((&d, row)), _) if d == dp => at(row),
        (Some((&lo, rlo)), Some((&hi, rhi))) => {
            let (tlo, thi) = (at(rlo), at(rhi));
            let x = (1.0 / dp as f64 - 1.0 / lo as f64) / (1.0 / hi as f64 - 1.0 / lo as f64);
            tlo + x * (thi - tlo)
        }
        (Some((&lo, rlo)), None) => at(rlo) * lo as f64 / dp as f64,
        (None, Some((&hi, rhi))) => at(rhi) * hi as f64 / dp as f64,
        (None, None) => panic!("estimate: a module without samples"),
    }
}
