//! What a GPU profile is measured on and at: the device ([`GpuInfo`]), the SM partitions of
//! the sweep ([`gpu_sm_grid`]) and how long NVML samples a point ([`BUSY_WINDOW`]).

use std::time::Duration;

use mosaic_profile::{sms_for, SmGranularity};
use serde::Serialize;

use super::profiler::ProfileConfig;

/// How long a grid point's iterations run while NVML samples them: 0.5 s, three sample periods
/// on Hopper (1/6 s), of which the first is left out (it began before the window: see
/// `super::nvml`), and above the 0.35 s of the team's H100 profile
/// (`measurements/h100/measure.py`).
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

impl GpuInfo {
    /// One paragraph on what a GPU sweep's numbers are, for the profile file's `source` field.
    pub fn sweep_source(&self, model: &str, c: &ProfileConfig) -> String {
        format!(
            "mosaic-engine: {model} (size {}, seed {}, batch {}) measured on CUDA device {}, {} \
             ({} SMs, {:.1} GiB, peak {:.0} GB/s from NVML's memory clock and bus width), \
             candle's CUDA backend (bf16 matrix products, fp32 master weights and AdamW). A \
             sample is one data-parallel replica's iteration on batch/dp samples in a green \
             context of round(sm x {}) SMs, launched from one host thread: forward, backward, \
             in-process gradient all-reduce of dp replicas, AdamW step, each phase ended by a \
             stream synchronisation; median of {} after {} warm-up. Where the host spent at least \
             {:.0} % of the forward and backward passes issuing them, both were timed replayed \
             from CUDA graphs, as the trainer runs such a module. mem_gib: parameters, \
             gradients, AdamW moments and the activations on the autograd tape, counted from \
             the tensors. sm_util and bw_util: NVML's kernel-busy and memory-controller busy \
             fractions over at least {} ms of the point's iterations. A point that did not fit \
             the GPU ran with the module recomputing its activations (one more forward pass per \
             block). Interference not fitted (mosaic fit --out).",
            c.size,
            c.seed,
            c.batch,
            self.ordinal,
            self.name,
            self.sms,
            self.memory_gib,
            self.peak_gbps,
            self.sms,
            c.reps,
            c.warmup.max(1),
            100.0 * crate::runtime::graphed::LAUNCH_BOUND,
            BUSY_WINDOW.as_millis(),
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An H100 SXM as NVML and the driver describe it (132 SMs, 8-SM partitions).
    pub(crate) fn h100() -> GpuInfo {
        GpuInfo {
            ordinal: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            sms: 132,
            partition: SmGranularity::for_compute_capability(9),
            memory_gib: 79.2,
            peak_gbps: 3352.0,
        }
    }

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
    fn the_source_names_the_device_and_the_method() {
        let gpu = h100();
        let text = gpu.sweep_source("clip", &ProfileConfig::default());
        assert!(text.contains("clip (size 1") && text.contains("NVIDIA H100 80GB HBM3"));
        assert!(text.contains("NVML") && !text.contains("  "), "{text}");
    }
}
