//! What one replica of a module has to do per iteration, split back out of the zoo's device
//! model ([`Calibration::estimate`]): matmul FLOPs and their bytes, memory-bound bytes, the
//! host's floor and the gradient bytes (the crate documentation's "Work").
//!
//! The compute rate `R(a)` is recovered by asking the device model again with unlimited
//! bandwidth (its matmul time is then `F / R(a)` alone), so the matmul efficiency formula is
//! not copied here; the memory-bound bytes are `memory_ms × BW(a)`, the rest of the HBM bytes
//! belong to the matmuls.

use mosaic_zoo::{Calibration, ClusterSpec, Estimate, ModelSpec};

/// Bytes per bf16 gradient value.
const BF16: f64 = 2.0;

/// One segment of a replica's step: FLOPs and the HBM bytes they move.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Segment {
    /// FLOPs (0 for a memory-bound segment).
    pub flops: f64,
    /// HBM bytes read and written.
    pub bytes: f64,
}

/// A module's per-replica work at one (dp, quota), on one cluster.
#[derive(Debug, Clone)]
pub(crate) struct Work {
    /// The device model's prediction at the same (dp, quota), for comparison.
    pub estimate: Estimate,
    /// Matmul/attention FLOPs per GPU per iteration.
    pub flops: f64,
    /// HBM bytes of matmul/attention kernels.
    pub gemm_bytes: f64,
    /// HBM bytes of memory-bound kernels.
    pub memory_bytes: f64,
    /// FLOP/s at the quota (matmul efficiency included); infinite without FLOPs.
    pub compute_rate: f64,
    /// HBM bandwidth the quota's SMs can reach alone: `BW × min(1, a / a_sat)`, bytes/s.
    pub bw_cap: f64,
    /// The host's floor, seconds: the device model's step alone, the smooth maximum of its GPU
    /// and launch times ([`Calibration::overlap`]). The host releases the chunks over it and
    /// the step ends no earlier, so a replica alone takes exactly the device model's time.
    pub floor_s: f64,
    /// Chunks the step is cut into.
    pub chunks: usize,
    /// Gradient bytes each replica all-reduces (0: frozen or a single replica).
    pub grad_bytes: f64,
}

impl Work {
    /// The work of module `module` of `model` on `dp` GPUs of `cluster` at quota `sm`.
    pub(crate) fn new(
        cal: &Calibration,
        model: &ModelSpec,
        module: usize,
        cluster: &ClusterSpec,
        dp: u32,
        sm: f64,
    ) -> Work {
        let e = cal.estimate(model, module, cluster, dp, sm);
        let bw_cap = hbm_bandwidth(cal, cluster) * (sm / cal.bw_saturation).min(1.0);
        // memory_ms is exactly memory bytes / BW(a) in the device model.
        let memory_bytes = (e.memory_ms * 1e-3 * bw_cap).min(e.hbm_bytes);
        let gemm_bytes = (e.hbm_bytes - memory_bytes).max(0.0);
        // With unlimited bandwidth the matmul time is F / R(a) alone.
        let unlimited = Calibration {
            hbm_efficiency: 1e30,
            ..*cal
        };
        let probe = unlimited.estimate(model, module, cluster, dp, sm);
        let compute_rate = if e.flops > 0.0 && probe.gemm_ms > 0.0 {
            e.flops / (probe.gemm_ms * 1e-3)
        } else {
            f64::INFINITY
        };
        let spec = &model.modules[module];
        let layers = (spec.layers + spec.decoder_layers) as usize;
        let grad_bytes = if spec.trainable && dp > 1 {
            BF16 * spec.params as f64
        } else {
            0.0
        };
        Work {
            flops: e.flops,
            gemm_bytes,
            memory_bytes,
            compute_rate,
            bw_cap,
            floor_s: (e.time_ms - e.comm_ms) * 1e-3,
            chunks: (2 * layers).clamp(2, 512),
            grad_bytes,
            estimate: e,
        }
    }

    /// The segments of the step in execution order: per chunk a matmul then a memory segment.
    pub(crate) fn segments(&self) -> Vec<Segment> {
        let n = self.chunks as f64;
        (0..self.chunks)
            .flat_map(|_| {
                [
                    Segment {
                        flops: self.flops / n,
                        bytes: self.gemm_bytes / n,
                    },
                    Segment {
                        flops: 0.0,
                        bytes: self.memory_bytes / n,
                    },
                ]
            })
            .collect()
    }

    /// Time of `seg` with HBM share `share` (bytes/s) and its compute slowed by the factor
    /// `slow` ≥ 1 (compute contention, 1 alone): the roofline of the quota's compute rate over
    /// `slow` and the share.
    pub(crate) fn segment_time(&self, seg: &Segment, share: f64, slow: f64) -> f64 {
        let compute = if seg.flops > 0.0 {
            seg.flops / self.compute_rate * slow
        } else {
            0.0
        };
        let memory = if seg.bytes > 0.0 {
            seg.bytes / share
        } else {
            0.0
        };
        compute.max(memory)
    }

    /// HBM bandwidth `seg` asks for: what it needs to run at the compute rate slowed by `slow`,
    /// at most what the quota's SMs reach.
    pub(crate) fn demand(&self, seg: &Segment, slow: f64) -> f64 {
        if seg.bytes <= 0.0 {
            0.0
        } else if seg.flops > 0.0 && self.compute_rate.is_finite() {
            (seg.bytes * self.compute_rate / slow / seg.flops).min(self.bw_cap)
        } else {
            self.bw_cap
        }
    }

    /// Seconds alone on the quota: the roofline segments' time, at least the host's floor — the
    /// device model's compute time.
    pub(crate) fn alone_s(&self) -> f64 {
        let seg = self
            .segments()
            .iter()
            .map(|s| self.segment_time(s, self.bw_cap, 1.0))
            .sum::<f64>();
        seg.max(self.floor_s)
    }
}

/// HBM bandwidth streaming kernels reach on a whole GPU, bytes/s.
pub(crate) fn hbm_bandwidth(cal: &Calibration, cluster: &ClusterSpec) -> f64 {
    cluster.device.hbm_tbps * 1e12 * cal.hbm_efficiency
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alone_time_is_the_device_models_compute_time() {
        let cal = Calibration::default();
        for (m, c) in [
            ("ofasys", "h100x8"),
            ("clip", "h100x32"),
            ("qwen3-vl", "a100x8"),
        ] {
            let model = mosaic_zoo::model(m).unwrap();
            let cluster = mosaic_zoo::cluster(c).unwrap();
            for i in 0..model.modules.len() {
                for (dp, sm) in [(1, 0.1), (2, 0.3), (4, 0.5), (8, 1.0)] {
                    let w = Work::new(&cal, &model, i, &cluster, dp, sm);
                    let e = &w.estimate;
                    let want = e.time_ms - e.comm_ms;
                    let got = w.alone_s() * 1e3;
                    assert!(
                        (got - want).abs() <= 1e-6 * want.max(1.0),
                        "{m}/{} dp {dp} sm {sm}: {got} vs {want}",
                        model.modules[i].name
                    );
                    assert!(w.compute_rate > 0.0 && w.bw_cap > 0.0);
                }
            }
        }
    }
}
