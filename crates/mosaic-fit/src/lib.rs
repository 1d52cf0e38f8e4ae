//! Fitting the interference term of Mosaic's performance model to measurements, and how
//! accurate the model is (Mosaic §3.3, Eq. 7–8, Fig. 8; §5.3.2, Fig. 12a).
//!
//! The planner predicts a module co-located with others on a GPU as `f_m(dp, sm) · (1 + Δ)`
//! with `Δ = e1 + e2·ΣB + e3·ΠB` over the bandwidth utilisations B of the GPU's modules. This
//! crate takes colocation measurements (`mosaic-colocations/1`, from the simulator or the
//! engine) and:
//! - turns each module of each sample into an [`Observation`]: the scaling surface's time
//!   alone, its B, the sample's ΣB and ΠB, the measured time ([`observations`]);
//! - fits the coefficients of three models — interference-unaware (Δ = 0), additive only
//!   (e3 = 0) and the full Eq. 8 — by exact non-negative least squares on the observed
//!   slowdowns ([`fit`], [`nnls`] on nalgebra's SVD);
//! - measures each on held-out samples: R² of predicted vs measured times, mean and max
//!   relative error, also by number of co-located modules ([`evaluate`]);
//! - checks the sparse scaling surface itself: leave-one-out and dense-truth interpolation
//!   errors, and the profiling cost the sparse grid saves ([`leave_one_out`], [`dense_error`],
//!   [`profiling_cost`]);
//! - writes the fitted coefficients back into a profile file ([`write_fitted`]) and draws
//!   predicted vs measured ([`scatter_svg`]).
//!
//! ```
//! use mosaic_profile::{parse, parse_colocations, PerfModel};
//! let profile = parse(r#"{"format": "mosaic-profiles/1",
//!   "device": {"name": "gpu", "sm_count": 100, "memory_gib": 80.0},
//!   "modules": [
//!     {"name": "a", "after": [], "samples": [
//!       {"dp": 1, "sm": 0.5, "time_ms": 10.0, "mem_gib": 1.0, "sm_util": 0.5, "bw_util": 0.5}]},
//!     {"name": "b", "after": [], "samples": [
//!       {"dp": 1, "sm": 0.5, "time_ms": 20.0, "mem_gib": 1.0, "sm_util": 0.5, "bw_util": 0.4}]}],
//!   "interference": {"e1": 0.0, "e2": 0.0, "e3": 0.0}}"#, "p.json").unwrap();
//! // Both modules at half a GPU, each measured 20 % slower than alone.
//! let colocations = parse_colocations(r#"{"format": "mosaic-colocations/1", "device": "gpu",
//!   "samples": [{"modules": [{"name": "a", "dp": 1, "sm": 0.5, "time_ms": 12.0},
//!                            {"name": "b", "dp": 1, "sm": 0.5, "time_ms": 24.0}]}]}"#,
//!   "c.json").unwrap();
//! let perf = PerfModel::new(&profile, mosaic_fit::LOOKUP_GRANULARITY, "p.json").unwrap();
//! let obs = mosaic_fit::observations(&perf, &colocations, "c.json").unwrap();
//! assert_eq!(obs.len(), 2);
//! assert!((obs[0].slowdown() - 0.2).abs() < 1e-12 && (obs[0].sum_bw() - 0.9).abs() < 1e-12);
//! // One sample cannot separate e1 from e2: the exact NNLS picks a non-negative fit of 0.2.
//! let e = mosaic_fit::fit(&obs, mosaic_fit::Model::Additive);
//! assert!((e.e1 + e.e2 * 0.9 - 0.2).abs() < 1e-9 && e.e1 >= 0.0 && e.e2 >= 0.0);
//! let fitted = mosaic_fit::write_fitted(&profile, e);
//! assert_eq!(fitted.interference, e);
//! ```

#![warn(missing_docs)]

pub mod calibrate;
mod error;
mod nnls;
mod observe;
mod regression;
mod scatter;
mod surface;

use mosaic_profile::{Interference, ProfileFile};

pub use error::FitError;
pub use nnls::{nnls, MAX_UNKNOWNS};
pub use observe::{observations, Observation, LOOKUP_GRANULARITY, MAX_COLOCATED_MS};
pub use regression::{
    accuracy, check_fitted, evaluate, fit, fit_holdable, is_held_out, test_set, Accuracy,
    ByModules, FitReport, Model, ModelFit, HOLDOUT_EVERY, MAX_COEFFICIENT, REPORT_FORMAT,
};
pub use scatter::{scatter_series, scatter_svg, ScatterPoint, Series};
pub use surface::{
    dense_error, estimate, interpolate, leave_one_out, profiling_cost, ProfilingCost,
    SurfaceAccuracy, SurfacePoint, DENSE_STEP, PROFILED_ITERATIONS,
};

/// Marks the note [`write_fitted`] appends to a profile's `source`.
const FITTED_NOTE: &str = "interference e1 = ";

/// `profile` with its interference coefficients replaced by `e`, and its `source` saying so
/// (replacing the zoo's "coefficients assumed" and any earlier fit note). Coefficients must be
/// non-negative for the planner, which [`fit`] guarantees, and at most [`MAX_COEFFICIENT`] for
/// the profile reader, which [`check_fitted`] checks.
pub fn write_fitted(profile: &ProfileFile, e: Interference) -> ProfileFile {
    let mut out = profile.clone();
    out.interference = e;
    let base = profile
        .source
        .as_deref()
        .map(|s| {
            let s = s.split(FITTED_NOTE).next().unwrap_or_default();
            s.replace("; interference coefficients assumed", "")
                .trim_end_matches([';', ' '])
                .to_string()
        })
        .filter(|s| !s.is_empty());
    let note = format!(
        "{FITTED_NOTE}{:.6}, e2 = {:.6}, e3 = {:.6} fitted to colocation measurements (mosaic fit: \
         Eq. 8, non-negative least squares)",
        e.e1, e.e2, e.e3
    );
    out.source = Some(match base {
        Some(b) => format!("{b}; {note}"),
        None => note,
    });
    out
}
