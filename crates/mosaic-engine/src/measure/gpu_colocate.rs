//! Co-located runs on a GPU (`mosaic measure colocations --device cuda`): the samples of
//! [`super::colocate`] — the same random draws, alone then together, the same kept iterations
//! — with every module of a colocation in one stage's green-context slots (disjoint SMs, as a
//! plan's stage gets them: `GpuDevice::create_stage`), each driven from its own host thread, as
//! the engine's trainer drives a stage.
//!
//! - **Quotas**: whole partitions of the device from the profile sweep's smallest (16, 24, …,
//!   128 of an H100's 132 SMs), drawn as steps of one partition; a colocation takes at most
//!   what one split hands out.
//! - **The model** is built afresh for each colocation, the drawn modules on their slots'
//!   devices and the others on one device over the whole GPU, which only makes the drawn
//!   modules' inputs (same seed, same values).
//! - **Memory**: a colocation that runs out of memory is measured again with its modules
//!   recomputing their activations, as the trainer runs such a stage.
//! - **Busy shares**: of each module's launching thread (its CPU time over the wall time); a
//!   GPU is not shared with other processes on the machines this runs on, so each colocation
//!   is measured once.

use mosaic_profile::SmGranularity;

use super::colocate::{ColocationConfig, MeasuredColocation};
use super::gpu_info::{gpu_sm_grid, GpuInfo};
use super::machine::Machine;
use super::profiler::ProfileConfig;
use crate::error::EngineError;

/// One paragraph on what GPU colocation samples are, for the colocations file's `source`.
pub fn gpu_colocation_source(
    gpu: &GpuInfo,
    model: &str,
    config: &ProfileConfig,
    colocations: &ColocationConfig,
) -> String {
    format!(
        "mosaic-engine: {} random colocations of {model} (size {}, seed {}, batch {}) on CUDA \
         device {}, {}: the modules of a colocation in one stage's green contexts (disjoint \
         whole partitions of its {} SMs), each one data-parallel replica of batch/dp samples \
         on candle's CUDA backend, driven from its own host thread; time_ms is the median of a \
         module's iterations after {} warm-up that ran while all the others were running (at \
         least {} each), every iteration ended by a stream synchronisation.",
        colocations.samples,
        config.size,
        colocations.seed,
        config.batch,
        gpu.ordinal,
        gpu.name,
        gpu.sms,
        config.warmup,
        config.reps
    )
}

/// The quotas a colocation on a GPU of `sms` SMs draws its modules' from, a partition step
/// each (`quotas[s − 1]` is `s` steps: whole partitions up to what one split hands out), and
/// the fewest steps a module takes: the profile sweep's smallest partition, so that `mosaic
/// fit` can hold every module against the profile (it never extrapolates below the sweep's
/// lowest quota: an H100's 8-SM partition lies under its 16-SM decile).
#[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))] // the GPU colocations'
pub(super) fn colocation_quotas(sms: u32, partition: SmGranularity) -> (Vec<f64>, usize) {
    let step = partition.step_sms.max(1);
    let capacity = partition.largest_within(sms).unwrap_or(0);
    let least = (gpu_sm_grid(sms, partition)[0].div_ceil(step) as usize).max(1);
    let quotas = (1..=capacity / step)
        .map(|k| (k * step) as f64 / sms as f64)
        .collect();
    (quotas, least)
}

/// The error of a build without GPU compute.
#[cfg(not(all(feature = "cuda", mosaic_gpu)))]
pub fn colocations_gpu(
    _model: &str,
    _config: ProfileConfig,
    _host: Machine,
    ordinal: usize,
    _colocations: &ColocationConfig,
    _on_sample: impl FnMut(usize, &MeasuredColocation),
) -> Result<(GpuInfo, Vec<MeasuredColocation>), EngineError> {
    Err(crate::runtime::on_gpu::needs_gpu_build(&format!(
        "measuring colocations on CUDA device {ordinal}"
    )))
}

/// Draws `colocations.samples` random colocations of the engine model `model` and measures
/// each on CUDA device `ordinal` (see the module documentation), calling `on_sample` with its
/// index after each; returns the device and the samples. `host` is the machine the GPU is in.
#[cfg(all(feature = "cuda", mosaic_gpu))]
pub fn colocations_gpu(
    model: &str,
    config: ProfileConfig,
    host: Machine,
    ordinal: usize,
    colocations: &ColocationConfig,
    mut on_sample: impl FnMut(usize, &MeasuredColocation),
) -> Result<(GpuInfo, Vec<MeasuredColocation>), EngineError> {
    use candle_core::Device;
    use mosaic_kit::rng::SplitMix64;

    use super::colocate::{draw, MAX_COLOCATED};
    use super::profiler::{dp_grid, Profiler};
    use crate::models::{self, Recipe};
    use crate::runtime::slot::cuda::Binding;

    let (gpu, _nvml, info) = super::gpu_sweep::open(ordinal)?;
    // The module names, from the cheapest build of the model.
    let names: Vec<&str> = models::build_placed(&Recipe::smallest(model), &|_| Device::Cpu)?
        .modules
        .iter()
        .map(|m| m.name)
        .collect();
    let (quotas, least) = colocation_quotas(info.sms, info.partition);
    let k_max = MAX_COLOCATED.min(names.len()).min(quotas.len() / least);
    if k_max < 2 {
        return Err(EngineError::BadSetting {
            setting: "mosaic measure colocations".into(),
            message: format!(
                "no two modules can share {}: {} partition step(s) and {} module(s)",
                info.name,
                quotas.len(),
                names.len()
            ),
        });
    }
    let dps = dp_grid(config.batch, config.max_dp);
    let rest = Device::new_cuda(ordinal).map_err(EngineError::tensor("colocations"))?;
    let mut out = Vec::with_capacity(colocations.samples);
    for s in 0..colocations.samples {
        let mut rng = SplitMix64::stream(colocations.seed, "profile/colocations", s as u64);
        let picks = draw(&mut rng, names.len(), &dps, k_max, &quotas, least);
        let stage: Vec<(&str, f64)> = picks.iter().map(|&(m, _, q)| (names[m], q)).collect();
        let slots = gpu.create_stage(&stage)?;
        // On a thread that ends before the slots do (`graphed::on_own_thread`).
        let sample = crate::runtime::graphed::on_own_thread("measuring a colocation", || {
            let devices = slots
                .iter()
                // SAFETY: the devices and the profiler holding every tensor on them are
                // dropped at the end of this closure, before the slots.
                .map(|slot| unsafe { slot.candle_device(Binding::Primary) })
                .collect::<Result<Vec<_>, _>>()?;
            let place = |name: &str| match stage.iter().position(|&(n, _)| n == name) {
                Some(j) => devices[j].clone(),
                None => rest.clone(),
            };
            let profiler = Profiler::on(model, config.clone(), host.clone(), &place)?;
            let sms: Vec<usize> = slots.iter().map(|s| s.sms() as usize).collect();
            match on_device::measure(&profiler, &picks, sms.clone()) {
                // As the trainer runs a stage that does not fit: recomputing activations.
                Err(e) if e.is_out_of_memory() => {
                    let mut all = devices.clone();
                    all.push(rest.clone());
                    crate::runtime::memory::release_pool(&all, ordinal);
                    for &(m, _, _) in &picks {
                        profiler.model().modules[m].net.set_recompute(true);
                    }
                    on_device::measure(&profiler, &picks, sms)
                }
                other => other,
            }
        })?;
        // The slots' streams are waited for as they go, then what the sample's tensors held
        // goes back to the driver before the next slots.
        drop(slots);
        crate::runtime::memory::release_pool(std::slice::from_ref(&rest), ordinal);
        on_sample(s, &sample);
        out.push(sample);
    }
    Ok((info, out))
}

#[cfg(all(feature = "cuda", mosaic_gpu))]
mod on_device {
    use std::sync::atomic::Ordering::SeqCst;

    use mosaic_kit::stats::median_high;

    use super::super::colocate::{Ends, MeasuredColocation, Pick, Race};
    use super::super::machine::thread_busy;
    use super::super::profiler::{Profiler, Timing};
    use super::super::sweep::{Launched, Run};
    use crate::error::EngineError;

    /// `picks` (on their slots' devices, of `sms` SMs) alone, one after another, then together,
    /// one host thread each.
    pub(super) fn measure(
        profiler: &Profiler,
        picks: &[Pick],
        sms: Vec<usize>,
    ) -> Result<MeasuredColocation, EngineError> {
        let config = profiler.config();
        let median_ms = |times: &[Timing]| {
            let times: Vec<f64> = times.iter().map(Timing::total_ms).collect();
            median_high(&times).unwrap_or(0.0)
        };
        // Each alone, launched as the trainer would launch it there (its CUDA graphs where
        // launch-bound, as the profile sweep times it); together, the same.
        let mut runs = Vec::with_capacity(picks.len());
        let mut alone = Vec::with_capacity(picks.len());
        for &(m, dp, _) in picks {
            let run = Run::new(profiler, m, dp)?;
            for _ in 0..config.warmup {
                run.once()?;
            }
            let (op_by_op, busy) = thread_busy(|| run.timed(config.reps))?;
            let launch = run.launch(&op_by_op)?;
            alone.push(match launch.launched {
                Launched::Graphed => {
                    let (times, busy) = thread_busy(|| run.timed_as(&launch, config.reps))?;
                    (median_ms(&times), busy)
                }
                _ => (median_ms(&op_by_op), busy),
            });
            runs.push((run, launch));
        }
        let target = config.warmup + config.reps;
        let race = &Race::new(picks.len());
        let together: Vec<Ends> = std::thread::scope(|scope| {
            let handles: Vec<_> = (runs.iter().enumerate())
                .map(|(j, (run, launch))| {
                    scope.spawn(move || {
                        let _leaving = race.leaving();
                        thread_busy(|| run.until_all_done(j, target, race, launch))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(EngineError::Cuda {
                            what: "measuring a colocation".into(),
                            message: "a module's launching thread panicked".into(),
                        })
                    })
                })
                .collect()
        });
        profiler.assemble(picks, sms, alone, together, race.stop_at.load(SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::super::colocate::{draw, ColocatedRun, MAX_COLOCATED};
    use super::*;
    use crate::measure::gpu_info::tests::h100;
    use crate::measure::machine::tests::machine;
    use crate::measure::profiler::tests::quick;
    use crate::measure::{colocation_file, profile_file, Profiler};
    use mosaic_kit::rng::SplitMix64;

    /// Every colocation drawn on an H100 holds against a profile swept on its partitions, as
    /// `mosaic fit` reads them (an 8-SM module, below the sweep's lowest decile, did not).
    #[test]
    fn gpu_colocations_hold_against_the_gpu_profile_sweep() {
        let profiler = Profiler::new("omni-tiny", quick(2, 1), machine(2)).unwrap();
        let mut profile = profiler.sweep(|_| {}).unwrap();
        // As `sweep_gpu` writes it on an H100: each module at every SM count of the grid.
        let hopper = SmGranularity::for_compute_capability(9);
        let grid = gpu_sm_grid(132, hopper);
        let whole: Vec<_> = profile
            .points
            .iter()
            .filter(|p| p.sm == 1.0)
            .cloned()
            .collect();
        profile.points = (whole.iter())
            .flat_map(|p| {
                grid.iter().map(move |&sms| {
                    let mut p = p.clone();
                    p.sm = sms as f64 / 132.0;
                    p.cores = sms as usize;
                    p.time_ms *= 132.0 / sms as f64;
                    p.bw_util = 0.3;
                    p
                })
            })
            .collect();
        profile.gpu = Some(h100());
        let perf = mosaic_profile::PerfModel::new(
            &profile_file(&profile),
            mosaic_fit::LOOKUP_GRANULARITY,
            "p",
        )
        .unwrap();

        let (quotas, least) = colocation_quotas(132, hopper);
        assert_eq!((quotas.len(), least), (16, 2), "8 … 128 SMs, at least 16");
        let n = profiler.model().modules.len();
        let k_max = MAX_COLOCATED.min(n).min(quotas.len() / least);
        let measured: Vec<MeasuredColocation> = (0..50)
            .map(|s| {
                let mut rng = SplitMix64::stream(7, "profile/colocations", s);
                let picks = draw(&mut rng, n, &[1], k_max, &quotas, least);
                let modules = (picks.iter())
                    .map(|&(m, dp, q)| ColocatedRun {
                        module: profiler.model().modules[m].name.to_string(),
                        dp,
                        sm: q,
                        cores: (q * 132.0).round() as usize,
                        alone_ms: 1.0,
                        colocated_ms: 1.2,
                        iterations: 3,
                        alone_busy: 1.0,
                        together_busy: 1.0,
                    })
                    .collect();
                MeasuredColocation {
                    modules,
                    attempts: 1,
                }
            })
            .collect();
        let file = colocation_file("NVIDIA H100 80GB HBM3", &measured, String::new());
        let obs = mosaic_fit::observations(&perf, &file, "c.json").unwrap();
        assert_eq!(
            obs.len(),
            measured.iter().map(|s| s.modules.len()).sum::<usize>()
        );
    }
}
