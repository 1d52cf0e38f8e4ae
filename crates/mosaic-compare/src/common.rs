//! What every strategy shares: whole-GPU options, the utilisation ledger, one-line plan
//! summaries and the trivial lower bound.

use mosaic_plan::Plan;
use mosaic_profile::{PerfModel, QuotaOption};

use crate::CompareError;

/// Module `m`'s whole-GPU options (SM quota 1.0) with `dp ≤ gpus`, by ascending dp (one per
/// profiled dp that fits the device's memory; `dp` values that were not profiled are absent).
pub(crate) fn whole_gpu(model: &PerfModel, m: usize, gpus: u32) -> Vec<QuotaOption> {
    model.modules[m]
        .options
        .iter()
        .filter(|o| o.units == model.units_per_gpu && o.dp <= gpus)
        .copied()
        .collect()
}

/// Every module's whole-GPU options on `gpus` GPUs; fails naming the first module that has
/// none (no quota-1.0 sample with a dp ≤ `gpus` that fits in memory).
pub(crate) fn whole_gpu_all(
    model: &PerfModel,
    gpus: u32,
) -> Result<Vec<Vec<QuotaOption>>, CompareError> {
    if gpus == 0 {
        return Err(CompareError::NoGpus);
    }
    (0..model.modules.len())
        .map(|m| {
            let opts = whole_gpu(model, m, gpus);
            if opts.is_empty() {
                Err(CompareError::NoWholeGpu {
                    module: model.modules[m].name.clone(),
                    gpus,
                    memory_gib: model.device.memory_gib,
                })
            } else {
                Ok(opts)
            }
        })
        .collect()
}

/// The trivial lower bound of any whole-GPU schedule: every module's least GPU-time over its
/// whole-GPU options (`dp × T(dp, 1.0)`), summed, spread perfectly over the `gpus` GPUs.
/// Infinite when some module has no whole-GPU option on the pool.
pub fn whole_gpu_lower_bound(model: &PerfModel, gpus: u32) -> f64 {
    if gpus == 0 {
        return f64::INFINITY;
    }
    let total: f64 = (0..model.modules.len())
        .map(|m| {
            whole_gpu(model, m, gpus)
                .iter()
                .map(|o| o.dp as f64 * o.time_ms)
                .fold(f64::INFINITY, f64::min)
        })
        .sum();
    total / gpus as f64
}

/// Useful SM-time per GPU over one iteration (ms × fraction of the GPU's SMs).
pub(crate) struct Ledger {
    busy: Vec<f64>,
}

/// Mean, minimum and per-GPU utilisation.
pub(crate) struct Util {
    pub mean: f64,
    pub min: f64,
    pub per_gpu: Vec<f64>,
}

impl Ledger {
    pub fn new(gpus: u32) -> Self {
        Ledger {
            busy: vec![0.0; gpus as usize],
        }
    }

    /// Adds one execution of a module's replicas: on each of `gpus`, quota × time × sm_util.
    pub fn add(&mut self, gpus: &[u32], quota: f64, time_ms: f64, sm_util: f64) {
        for &g in gpus {
            self.busy[g as usize] += quota * time_ms * sm_util;
        }
    }

    /// Utilisation over an iteration of `iteration_ms`. Values are clamped into [0, 1]: they
    /// can only exceed 1 by the µs rounding of plan times (half a µs, whatever the iteration).
    pub fn utilisation(&self, iteration_ms: f64) -> Util {
        let per_gpu: Vec<f64> = self
            .busy
            .iter()
            .map(|&b| {
                debug_assert!(
                    b <= iteration_ms * (1.0 + 1e-9) + 5e-4,
                    "busy {b} ms in an iteration of {iteration_ms} ms"
                );
                let u = if iteration_ms > 0.0 {
                    b / iteration_ms
                } else {
                    0.0
                };
                u.clamp(0.0, 1.0)
            })
            .collect();
        let mean = per_gpu.iter().sum::<f64>() / per_gpu.len().max(1) as f64;
        let min = per_gpu.iter().copied().fold(f64::INFINITY, f64::min);
        Util {
            mean,
            min: if min.is_finite() { min } else { 0.0 },
            per_gpu,
        }
    }
}

/// The option a plan's module uses: by name, dp and quota.
pub(crate) fn option_of(model: &PerfModel, name: &str, dp: u32, sm: f64) -> Option<QuotaOption> {
    let m = model.index_of(name)?;
    let units = (sm * model.units_per_gpu as f64).round() as u32;
    model.modules[m]
        .options
        .iter()
        .find(|o| o.dp == dp && o.units == units)
        .copied()
}

/// The utilisation of a staged plan: each module's replicas use quota × f_m(d, a) × sm_util on
/// each of their GPUs (the profiled time without interference: a slowdown does no more work).
pub(crate) fn plan_util(model: &PerfModel, plan: &Plan) -> Util {
    let mut ledger = Ledger::new(plan.gpus);
    for stage in &plan.stages {
        for pm in &stage.modules {
            match option_of(model, &pm.name, pm.dp, pm.sm) {
                Some(o) => ledger.add(&pm.gpus, o.sm, o.time_ms, o.sm_util),
                None => debug_assert!(false, "plan module {} not in the model", pm.name),
            }
        }
    }
    ledger.utilisation(plan.iteration_ms)
}

/// A quota as short text: `0.4`, `0.35`.
pub(crate) fn quota_text(sm: f64) -> String {
    let s = format!("{sm:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `name dpD`, with `@quota` when the quota is below a whole GPU.
pub(crate) fn module_text(name: &str, dp: u32, sm: f64) -> String {
    if sm < 1.0 - 1e-9 {
        format!("{name} dp{dp}@{}", quota_text(sm))
    } else {
        format!("{name} dp{dp}")
    }
}

/// A staged plan in one line: stages separated by ` | `, parallel modules by ` ∥ `.
pub(crate) fn plan_line(plan: &Plan) -> String {
    plan.stages
        .iter()
        .map(|s| {
            s.modules
                .iter()
                .map(|m| module_text(&m.name, m.dp, m.sm))
                .collect::<Vec<_>>()
                .join(" ∥ ")
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Rounds a time to µs, as plan files do.
pub(crate) fn round_ms(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

/// A staged plan's shape for [`crate::with_data`]: each stage's modules as (dp, time).
pub(crate) fn plan_shape(plan: &Plan) -> crate::Shape {
    crate::Shape::Staged(
        plan.stages
            .iter()
            .map(|s| s.modules.iter().map(|m| (m.dp, m.time_ms)).collect())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utilisation_forgives_the_rounding_of_plan_times_to_the_microsecond() {
        // A 0.4 ms iteration, rounded down by 0.4 µs: 1.001 before the clamp, 1 after it.
        let mut ledger = Ledger::new(2);
        ledger.add(&[0], 1.0, 0.4004, 1.0);
        ledger.add(&[1], 0.5, 0.4, 1.0);
        let u = ledger.utilisation(round_ms(0.4004));
        assert_eq!(u.per_gpu, vec![1.0, 0.5]);
        assert_eq!((u.mean, u.min), (0.75, 0.5));
    }
}
