//! The rows of the regression: every module of every colocation sample, with the performance
//! model's interference-free prediction and the bandwidth utilisations Eq. 8 needs.

use std::path::Path;

use mosaic_profile::{ColocationFile, Interference, PerfModel};
use serde::Serialize;

use crate::error::FitError;

/// The quota grid colocation samples are looked up on: build the [`PerfModel`] passed to
/// [`observations`] with this granularity so that any quota that is a multiple of 1 % inside a
/// module's profiled range (at a profiled dp) is a candidate. A profile whose device has a
/// partition rule ignores it: its grid is the device's SM partitions (and the whole GPU), which
/// are exactly the quotas a colocation on that device can have measured (`0.6061` = 80/132).
pub const LOOKUP_GRANULARITY: f64 = 0.01;

/// The longest time a colocation sample's module may state, ms: the limit of a profile
/// sample's `time_ms` (`mosaic-profiles/1`: 10⁷ ms, about 2.8 hours for one iteration). A
/// colocated time is a profiled time slowed down, so it has the same range.
pub const MAX_COLOCATED_MS: f64 = mosaic_profile::MAX_SAMPLE_MS;

/// One module of one colocation sample: what the performance model predicts for it and what
/// was measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Observation {
    /// Index of its sample in the colocations file.
    pub sample: usize,
    /// Module name.
    pub module: String,
    /// Number of modules co-located in the sample (2 or more).
    pub modules: usize,
    /// Data-parallel degree.
    pub dp: u32,
    /// SM quota per GPU.
    pub sm: f64,
    /// The scaling surface's time alone, f_m(dp, sm), in ms (the interference-unaware model).
    pub base_ms: f64,
    /// Its bandwidth utilisation B(m, sm).
    pub bw_util: f64,
    /// The bandwidth utilisations of every module of the sample (this one included), in file
    /// order: the modules sharing its GPUs.
    pub sample_bw: Vec<f64>,
    /// Measured time while co-located, in ms.
    pub measured_ms: f64,
}

impl Observation {
    /// ΣB over the sample's modules.
    pub fn sum_bw(&self) -> f64 {
        self.sample_bw.iter().sum()
    }

    /// ΠB over the sample's modules.
    pub fn prod_bw(&self) -> f64 {
        self.sample_bw.iter().product()
    }

    /// The observed relative slowdown `measured / f_m(dp, sm) − 1`: what Eq. 8's Δ predicts.
    pub fn slowdown(&self) -> f64 {
        self.measured_ms / self.base_ms - 1.0
    }

    /// The predicted time with coefficients `e`: `f_m(dp, sm) · (1 + Δ)`, Δ from
    /// [`Interference::delta`] exactly as the planner computes it.
    pub fn predict(&self, e: &Interference) -> f64 {
        self.base_ms * (1.0 + e.delta(self.sample_bw.iter().copied()))
    }
}

/// The observations of every module of every sample of `colocations` (read from `file`, which
/// errors name), predicted by `perf` — a performance model of the same device, built at
/// [`LOOKUP_GRANULARITY`] (or any grid the samples' quotas lie on).
///
/// A sample's modules are taken to share the same GPUs, as the `mosaic-colocations/1` format
/// says, so all of them see the same ΣB and ΠB (Eq. 8 on one GPU). Fails, naming the field,
/// when the file's `device` is not the profiles' device, a module is not in the profiles
/// (`samples[k].modules[j].name`), or a module's (dp, sm) is not one of its candidates — an
/// unprofiled dp, a quota off the grid or outside the profiled range, or more memory than the
/// device has (`samples[k].modules[j]`), or its measured time is above [`MAX_COLOCATED_MS`] or
/// so far above the profiled time that the slowdown is not a finite number
/// (`samples[k].modules[j].time_ms`).
pub fn observations(
    perf: &PerfModel,
    colocations: &ColocationFile,
    file: impl AsRef<Path>,
) -> Result<Vec<Observation>, FitError> {
    let file = file.as_ref();
    if colocations.device != perf.device.name {
        return Err(FitError::invalid(
            file,
            "device",
            format!(
                "measured on {} but the profiles are of {}",
                colocations.device, perf.device.name
            ),
        ));
    }
    let upg = perf.units_per_gpu as f64;
    // Files round quotas (80/132 as 0.6061): on an SM grid, a quota names the nearest SM count.
    let tolerance = match perf.device.partition {
        Some(_) => mosaic_profile::SM_QUOTA_TOLERANCE,
        None => 1e-6,
    };
    let mut out = Vec::new();
    for (k, s) in colocations.samples.iter().enumerate() {
        let mut rows = Vec::with_capacity(s.modules.len());
        for (j, m) in s.modules.iter().enumerate() {
            let field = format!("samples[{k}].modules[{j}]");
            if !(m.time_ms.is_finite() && m.time_ms > 0.0 && m.time_ms <= MAX_COLOCATED_MS) {
                return Err(FitError::invalid(
                    file,
                    format!("{field}.time_ms"),
                    format!(
                        "expected a positive time in ms, at most {MAX_COLOCATED_MS:e} (a \
                         profile's limit), found {:e}",
                        m.time_ms
                    ),
                ));
            }
            let Some(i) = perf.index_of(&m.name) else {
                let names: Vec<&str> = perf.modules.iter().map(|m| m.name.as_str()).collect();
                return Err(FitError::invalid(
                    file,
                    format!("{field}.name"),
                    format!(
                        "unknown module \"{}\"; the profiles have {}",
                        m.name,
                        names.join(", ")
                    ),
                ));
            };
            let module = &perf.modules[i];
            let units = (m.sm * upg).round();
            let option = module
                .options
                .iter()
                .find(|o| o.dp == m.dp && o.units as f64 == units)
                .filter(|_| (units / upg - m.sm).abs() <= tolerance);
            let Some(o) = option else {
                return Err(FitError::invalid(
                    file,
                    field,
                    not_a_candidate(perf, module, m.dp, m.sm),
                ));
            };
            if !(m.time_ms / o.time_ms).is_finite() {
                return Err(FitError::invalid(
                    file,
                    format!("{field}.time_ms"),
                    format!(
                        "{:e} ms measured against {:e} ms profiled for \"{}\" at (dp {}, \
                         quota {}): a slowdown past any number",
                        m.time_ms, o.time_ms, m.name, m.dp, m.sm
                    ),
                ));
            }
            rows.push((i, o.time_ms, o.bw_util, m));
        }
        let sample_bw: Vec<f64> = rows.iter().map(|r| r.2).collect();
        for (_, base_ms, bw_util, m) in rows {
            out.push(Observation {
                sample: k,
                module: m.name.clone(),
                modules: s.modules.len(),
                dp: m.dp,
                sm: m.sm,
                base_ms,
                bw_util,
                sample_bw: sample_bw.clone(),
                measured_ms: m.time_ms,
            });
        }
    }
    Ok(out)
}

/// Why (dp, sm) is not a candidate of `module` of `perf`, and what is.
fn not_a_candidate(
    perf: &PerfModel,
    module: &mosaic_profile::ModuleModel,
    dp: u32,
    sm: f64,
) -> String {
    let mut dps: Vec<u32> = module.options.iter().map(|o| o.dp).collect();
    dps.dedup();
    let at_dp: Vec<f64> = module
        .options
        .iter()
        .filter(|o| o.dp == dp)
        .map(|o| o.sm)
        .collect();
    let what = format!(
        "(dp {dp}, quota {sm}) is not a candidate of module \"{}\"",
        module.name
    );
    if at_dp.is_empty() {
        let list: Vec<String> = dps.iter().map(u32::to_string).collect();
        format!(
            "{what}: dp {dp} was not profiled or does not fit the device's memory (candidate \
             dp: {})",
            list.join(", ")
        )
    } else {
        let (lo, hi) = (at_dp[0], at_dp[at_dp.len() - 1]);
        match perf.device.partition {
            Some(rule) => {
                let n = perf.device.sm_count;
                format!(
                    "{what}: on the device's {n} SMs in partitions of {} (at least {}), the \
                     candidate quotas at dp {dp} are k × {}/{n} from {lo:.4} to {hi:.4} (1.0 \
                     alone), each within {} of a whole SM count",
                    rule.step_sms,
                    rule.min_sms,
                    rule.step_sms,
                    mosaic_profile::SM_QUOTA_TOLERANCE
                )
            }
            None => format!(
                "{what}: at dp {dp} the candidate quotas are the multiples of {} from {lo:.2} to \
                 {hi:.2}",
                perf.granularity()
            ),
        }
    }
}
