//! The profile sweep on a GPU (`mosaic measure profile --device cuda`; Mosaic §3.3 and §4,
//! "Performance Model"): every module of an engine model at every grid point (dp as the
//! per-GPU batch, SM partition) on candle's CUDA backend, each partition a green-context slot,
//! written as a `mosaic-profiles/1` file whose device is the GPU ([`super::profile_file`]).
//!
//! - **Grid**: [`gpu_sm_grid`] — the deciles of the device rounded to partitions the hardware
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

use std::time::Duration;

use mosaic_profile::{sms_for, SmGranularity};
use serde::Serialize;

use super::machine::Machine;
use super::profiler::ProfileConfig;
use super::sweep::{EngineProfile, Point};
use crate::error::EngineError;

/// How long a grid point's iterations run while NVML samples them: 0.5 s, above the longest
/// sample period of the devices profiled (1/6 s on Hopper) and the 0.35 s of the team's H100
/// profile (`measurements/h100/measure.py`).
pub const BUSY_WINDOW: Duration = Duration::from_millis(500);

/// The GPU a profile was measured on: the profile file's device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuInfo {
    /// Its CUDA ordinal.
    pub ordinal: usize,
    /// Its name (e.g. `NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Its SMs.
    pub sms: u32,
    /// The partitions a green context may hold (8/8 on Hopper).
    pub partition: SmGranularity,
    /// Its memory, in GiB (NVML).
    pub memory_gib: f64,
    /// Its peak memory bandwidth, in GB/s (NVML's memory clock × bus width).
    pub peak_gbps: f64,
}

/// The SM counts profiled on a device of `sms` SMs whose partitions follow `g`: the deciles
/// 0.1 … 0.9 of the device rounded to an allowed partition ([`sms_for`]), and the whole
/// device. On an H100: 16, 24, 40, 56, 64, 80, 96, 104, 120 and 132 — the grid of the team's
/// measured H100 profile. The planner reads the quotas between them off the profile's curve.
pub fn gpu_sm_grid(sms: u32, g: SmGranularity) -> Vec<u32> {
    let mut out: Vec<u32> = (1..=9)
        .filter_map(|k| sms_for(k as f64 / 10.0, sms, g))
        .collect();
    out.push(sms);
    out.dedup();
    out
}

/// The error of a build without GPU compute.
#[cfg(not(all(feature = "cuda", mosaic_gpu)))]
pub fn sweep_gpu(
    _model: &str,
    _config: ProfileConfig,
    _host: Machine,
    ordinal: usize,
    _on_point: impl FnMut(&Point),
) -> Result<EngineProfile, EngineError> {
    Err(crate::runtime::on_gpu::needs_gpu_build(&format!(
        "profiling on CUDA device {ordinal}"
    )))
}

/// Measures every module of the engine model `model` at every grid point on CUDA device
/// `ordinal` (see the module documentation), partition by partition, calling `on_point` after
/// each; returns the points by module, then dp, then quota. `host` is the machine the GPU is
/// in. Fails before measuring on a bad setting, a device without green contexts or without
/// NVML.
#[cfg(all(feature = "cuda", mosaic_gpu))]
pub fn sweep_gpu(
    model: &str,
    config: ProfileConfig,
    host: Machine,
    ordinal: usize,
    mut on_point: impl FnMut(&Point),
) -> Result<EngineProfile, EngineError> {
    use super::profiler::Profiler;
    use crate::runtime::slot::cuda::Binding;

    let (gpu, nvml, info) = open(ordinal)?;
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
        {
            // SAFETY: the profiler holds every tensor on the device and is dropped at the end
            // of this block, before the slot; it runs on this thread only.
            let device = unsafe { slot.candle_device(Binding::Primary)? };
            let profiler = Profiler::on(model, config.clone(), host.clone(), &|_| device.clone())?;
            for m in 0..profiler.model().modules.len() {
                for dp in profiler.dps() {
                    let point = on_device::point(&profiler, m, dp, quota, sms, &nvml)?;
                    on_point(&point);
                    points.push(point);
                }
            }
            profile.get_or_insert_with(|| profiler.profile(Some(info.clone()), Vec::new()));
        }
    }
    let mut profile = profile.expect("every device has its whole SMs as a partition");
    let module = |p: &Point| profile.modules.iter().position(|m| m.name == p.module);
    // Measured partition by partition; a stable sort keeps the quotas ascending.
    points.sort_by_key(|p| (module(p), p.dp));
    profile.points = points;
    Ok(profile)
}

/// CUDA device `ordinal` opened for green-context slots, NVML on it, and what the profile
/// files say of it.
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

    use super::super::nvml::{now_us, Nvml};
    use super::super::profiler::Profiler;
    use super::super::sweep::{Point, Run};
    use super::BUSY_WINDOW;
    use crate::error::EngineError;

    /// Module `m` at data-parallel degree `dp` on the profiler's slot of `sms` SMs (`quota`
    /// of the device): warm-up, the timed iterations, more until NVML has sampled
    /// [`BUSY_WINDOW`] of them. A point that runs out of memory is measured again with the
    /// module recomputing its activations, as the trainer would run it
    /// ([`crate::models::recompute`]).
    pub(super) fn point(
        profiler: &Profiler,
        m: usize,
        dp: usize,
        quota: f64,
        sms: u32,
        nvml: &Nvml,
    ) -> Result<Point, EngineError> {
        let measure = || -> Result<Point, EngineError> {
            let run = Run::new(profiler, m, dp)?;
            let memory = run.warm_up()?;
            let since = now_us();
            let start = Instant::now();
            let runs = run.timed(profiler.config().reps)?;
            while start.elapsed() < BUSY_WINDOW {
                run.once()?;
            }
            let busy = nvml.busy_since(since)?;
            let mut point = run.point(quota, sms as usize, memory, runs);
            point.sm_util = busy.kernels;
            point.bw_util = busy.memory;
            Ok(point)
        };
        let net = &profiler.model().modules[m].net;
        match measure() {
            Err(e) if e.is_out_of_memory() && net.set_recompute(true) => {
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
    fn the_grid_is_what_the_hardware_grants() {
        let hopper = SmGranularity::for_compute_capability(9);
        assert_eq!(
            gpu_sm_grid(132, hopper),
            [16, 24, 40, 56, 64, 80, 96, 104, 120, 132]
        );
        let ampere = SmGranularity::for_compute_capability(8);
        let a100 = gpu_sm_grid(108, ampere);
        assert_eq!(a100.first(), Some(&10));
        assert_eq!(a100.last(), Some(&108));
        for g in [hopper, ampere] {
            for sms in [8, 20, 66, 108, 132, 144] {
                let grid = gpu_sm_grid(sms, g);
                assert!(grid.windows(2).all(|w| w[0] < w[1]), "{grid:?}");
                assert_eq!(grid.last(), Some(&sms));
                let split = &grid[..grid.len() - 1];
                assert!(split.iter().all(|&n| g.allows(n) && n < sms), "{grid:?}");
            }
        }
    }

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
