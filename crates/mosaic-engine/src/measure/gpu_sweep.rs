//! The profile sweep on a GPU (`mosaic measure profile --device cuda`; Mosaic §3.3 and §4,
//! "Performance Model"): every module of an engine model at every grid point (dp as the
//! per-GPU batch, SM partition) on candle's CUDA backend, each partition a green-context slot,
//! written as a `mosaic-profiles/1` file whose device is the GPU ([`super::profile_file`]).
//!
//! - **Grid**: [`super::gpu_sm_grid`] — the deciles of the device rounded to partitions the hardware
//!   grants, and the whole device — × the powers of two up to `max_dp`
//!   ([`super::dp_grid`]).
//! - **A point** is one replica's iteration ([`super::profiler`]) with every phase ended by a
//!   stream synchronisation, so host timers measure the GPU's work; the median of the timed
//!   iterations. The model is built afresh on each partition's slot (its tensors live on the
//!   slot's stream), with the same seed and so the same values.
//! - **sm_util, bw_util**: NVML's kernel-busy and memory-controller busy fractions, averaged
//!   over the timed iterations, run on back to back until [`BUSY_WINDOW`] has passed
//!   (`super::nvml`).
//! - **mem_gib**: counted from the replica's tensors, as on the CPU ([`super::Memory`]).
//! - **Launches**: as the trainer launches the module. Where the host spent at least
//!   [`LAUNCH_BOUND`](crate::runtime::graphed::LAUNCH_BOUND) of the op-by-op passes' time
//!   issuing them, the forward and backward passes are captured as CUDA graphs and the timed
//!   iterations (and NVML's) replay them; the all-reduce and AdamW stay op by op, as in the
//!   trainer. [`super::Point::launched`] says which, and why a launch-bound point was not
//!   graphed.

#[cfg(all(feature = "cuda", mosaic_gpu))]
use super::gpu_info::{gpu_sm_grid, GpuInfo};
use super::machine::Machine;
use super::profiler::ProfileConfig;
use super::sweep::{EngineProfile, Point};
use crate::error::EngineError;

/// The error of a build without GPU compute.
#[cfg(not(all(feature = "cuda", mosaic_gpu)))]
pub fn sweep_gpu(
    _model: &str,
    _config: ProfileConfig,
    _host: Machine,
    ordinal: usize,
    _on_point: impl FnMut(&Point) + Send,
) -> Result<EngineProfile, EngineError> {
    Err(crate::runtime::on_gpu::needs_gpu_build(&format!(
        "profiling on CUDA device {ordinal}"
    )))
}

/// Measures every module of the engine model `model` at every grid point on CUDA device
/// `ordinal` (see the module documentation), partition by partition, calling `on_point` after
/// each (from the thread measuring the partition); returns the points by module, then dp, then
/// quota. `host` is the machine the GPU is in. Fails before measuring on a bad setting, a
/// device without green contexts or without NVML.
#[cfg(all(feature = "cuda", mosaic_gpu))]
pub fn sweep_gpu(
    model: &str,
    config: ProfileConfig,
    host: Machine,
    ordinal: usize,
    mut on_point: impl FnMut(&Point) + Send,
) -> Result<EngineProfile, EngineError> {
    use super::profiler::Profiler;
    use crate::runtime::slot::cuda::Binding;

    let (gpu, nvml, info) = open(ordinal)?;
    // What an earlier run in this process left in the pool goes back first (`bench engine`
    // sweeps after training).
    crate::runtime::memory::release_pool(&[], ordinal);
    let mut points = Vec::new();
    let mut profile = None;
    for sms in gpu_sm_grid(info.sms, info.partition) {
        let quota = sms as f64 / info.sms as f64;
        let slot = gpu.create_slot("profile", quota)?;
        if slot.sms() != sms {
            return Err(EngineError::Cuda {
                what: format!("a green context of {sms} SMs on device {ordinal}"),
                message: format!("the driver granted {} SMs", slot.sms()),
            });
        }
        // The partition's points on a thread that ends before the slot does
        // (`graphed::on_own_thread`).
        let measured =
            crate::runtime::graphed::on_own_thread(&format!("profiling on {sms} SMs"), || {
                // SAFETY: the profiler holds every tensor on the device and is dropped at the end
                // of this closure, before the slot; they are used on this thread only.
                let device = unsafe { slot.candle_device(Binding::Primary)? };
                let profiler =
                    Profiler::on(model, config.clone(), host.clone(), &|_| device.clone())?;
                let release =
                    || crate::runtime::memory::release_pool(std::slice::from_ref(&device), ordinal);
                for m in 0..profiler.model().modules.len() {
                    for dp in profiler.dps() {
                        let point =
                            on_device::point(&profiler, m, dp, quota, sms, &nvml, &release)?;
                        on_point(&point);
                        points.push(point);
                    }
                }
                Ok(profiler.profile(Some(info.clone()), Vec::new()))
            })?;
        profile.get_or_insert(measured);
        // The slot's stream is waited for as it goes, then what the partition's tensors held
        // goes back to the driver before the next slot.
        drop(slot);
        crate::runtime::memory::release_pool(&[], ordinal);
    }
    let mut profile = profile.expect("every device has its whole SMs as a partition");
    let module = |p: &Point| profile.modules.iter().position(|m| m.name == p.module);
    // Measured partition by partition; a stable sort keeps the quotas ascending.
    points.sort_by_key(|p| (module(p), p.dp));
    profile.points = points;
    Ok(profile)
}

/// CUDA device `ordinal` opened for green-context slots, NVML on it, and what the profile
/// files say of it; first, `MOSAIC_KERNELS` and `MOSAIC_GRAPHS` refused where they hold a value
/// they do not take, as training refuses them.
#[cfg(all(feature = "cuda", mosaic_gpu))]
pub(super) fn open(
    ordinal: usize,
) -> Result<
    (
        crate::runtime::slot::cuda::GpuDevice,
        super::nvml::Nvml,
        GpuInfo,
    ),
    EngineError,
> {
    crate::kernels::KERNELS.check()?;
    crate::runtime::graphed::GRAPHS.check()?;
    let gpu = crate::runtime::slot::cuda::GpuDevice::open(ordinal)?;
    let nvml = super::nvml::Nvml::open(gpu.pci_bus_id())?;
    let info = GpuInfo {
        ordinal,
        name: gpu.name().to_string(),
        sms: gpu.sms(),
        partition: gpu.granularity(),
        memory_gib: nvml.memory_gib()?,
        peak_gbps: nvml.peak_gbps()?,
    };
    Ok((gpu, nvml, info))
}

#[cfg(all(feature = "cuda", mosaic_gpu))]
mod on_device {
    use std::time::Instant;

    use super::super::gpu_info::BUSY_WINDOW;
    use super::super::nvml::{now_us, Nvml};
    use super::super::profiler::Profiler;
    use super::super::sweep::{Launched, Point, Run};
    use crate::error::EngineError;

    /// Module `m` at data-parallel degree `dp` on the profiler's slot of `sms` SMs (`quota`
    /// of the device): warm-up, the timed iterations op by op, the same replayed from CUDA
    /// graphs where those were launch-bound, more until NVML has sampled [`BUSY_WINDOW`] of
    /// them. A point that runs out of memory is measured again with the
    /// module recomputing its activations, as the trainer would run it
    /// ([`crate::models::recompute`]), once `release` has handed the failed run's memory back.
    pub(super) fn point(
        profiler: &Profiler,
        m: usize,
        dp: usize,
        quota: f64,
        sms: u32,
        nvml: &Nvml,
        release: &dyn Fn(),
    ) -> Result<Point, EngineError> {
        let measure = || -> Result<Point, EngineError> {
            let run = Run::new(profiler, m, dp)?;
            let memory = run.warm_up()?;
            let reps = profiler.config().reps;
            // Op by op first, which says whether the trainer would replay graphs here.
            let op_by_op = run.timed(reps)?;
            let launch = run.launch(&op_by_op)?;
            let since = now_us();
            let start = Instant::now();
            let runs = match launch.launched {
                Launched::Graphed => run.timed_as(&launch, reps)?,
                _ => op_by_op,
            };
            while start.elapsed() < BUSY_WINDOW {
                run.once_as(&launch)?;
            }
            let busy = nvml.busy_since(since)?;
            let mut point = run.point(quota, sms as usize, memory, runs);
            point.sm_util = busy.kernels;
            point.bw_util = busy.memory;
            point.launched = launch.launched.clone();
            Ok(point)
        };
        let net = &profiler.model().modules[m].net;
        match measure() {
            Err(e) if e.is_out_of_memory() && net.set_recompute(true) => {
                release();
                let point = measure();
                net.set_recompute(false);
                Ok(Point {
                    recomputed: true,
                    ..point?
                })
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_build_says_how_to_get_a_gpu_one() {
        if cfg!(all(feature = "cuda", mosaic_gpu)) {
            return;
        }
        let host = crate::measure::machine::tests::machine(2);
        let e = sweep_gpu("clip-tiny", ProfileConfig::default(), host, 0, |_| {}).unwrap_err();
        assert!(e.is_bad_input(), "{e}");
        assert!(e.to_string().contains("scripts/cuda-cargo"), "{e}");
    }
}
