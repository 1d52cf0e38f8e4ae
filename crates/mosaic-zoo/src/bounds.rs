//! What a calibration's constants may be (the `constants` of a `mosaic-calibration/1` file),
//! and the check that every profile the device model derives from them is one a
//! `mosaic-profiles/1` file may hold.
//!
//! Two layers. Each constant has a physical range ([`Bound`], [`Calibration::BOUNDS`]): what a
//! real GPU, link and host can be; the seven that `mosaic calibrate` fits are searched in
//! exactly these ranges ([`crate::FreeConstant::bounds`]), so every fit lies inside them. But
//! the device model multiplies its constants: a calibration with every constant at the slow
//! end of its range would give a step of CTVLM's LLM hours on end, past the profile format's
//! 10⁷ ms. So [`Calibration::check`] then computes, for every built-in model on every built-in
//! device, single node and multi-node, the slowest sample of its profile, and refuses constants
//! that make any of them leave the profile's limits. A calibration that passes thus yields only
//! profiles the planner reads back, whatever model and cluster it is used with.

use crate::analytic::Calibration;
use crate::device::{devices, make, GPUS_PER_NODE};
use crate::error::CalibrationError;
use crate::models::models;

/// The range a constant of [`Calibration`] may take, both ends included, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// The field of [`Calibration`] (and of a calibration file's `constants`).
    pub name: &'static str,
    /// The smallest value allowed.
    pub min: f64,
    /// The largest value allowed.
    pub max: f64,
    /// Why, in a few words (errors quote it).
    pub why: &'static str,
}

// The fitted constants: `mosaic calibrate` searches these ranges (FreeConstant::bounds), so a
// fit never leaves them.

/// Matmul efficiency: a fraction of the datasheet's peak (the fit to CLIP on an H100: 0.55).
pub(crate) const GEMM_EFFICIENCY: Bound = Bound {
    name: "gemm_efficiency",
    min: 0.01,
    max: 1.0,
    why: "a fraction of the datasheet's peak FLOP/s: above 1 is faster than the hardware, and \
          below 1 % of peak no matmul ran on a real GPU (fp32 without tensor cores reaches 7 %)",
};
/// Tokens per GPU at which matmul efficiency halves (fitted: 844).
pub(crate) const ROWS_HALF: Bound = Bound {
    name: "rows_half",
    min: 0.1,
    max: 1e5,
    why: "matmul rows (tokens per GPU) at which efficiency halves: above 10⁵, more than the \
          largest per-GPU batch holds, no step would reach half its efficiency",
};
/// Exponent γ of the matmul rate in the SM quota (fitted: 0.815).
pub(crate) const SM_EXPONENT: Bound = Bound {
    name: "sm_exponent",
    min: 0.3,
    max: 1.2,
    why: "1 is linear scaling in the SMs (measured: 0.82); below 0.3 a sixteenth of the GPU \
          would do a third of its work, above 1.2 an SM would gain more than its share",
};
/// SM fraction that saturates HBM (fitted: 0.485).
pub(crate) const BW_SATURATION: Bound = Bound {
    name: "bw_saturation",
    min: 0.02,
    max: 1.0,
    why: "a fraction of the SMs: below 2 % (3 of 132) no GPU saturates its HBM",
};
/// Host time per step outside the kernels, ms (fitted: 1.34).
pub(crate) const LAUNCH_STEP_MS: Bound = Bound {
    name: "launch_step_ms",
    min: 1e-3,
    max: 100.0,
    why: "host time per step in ms (measured: 1.3): at least a microsecond, and 100 ms is 75× \
          the measured host",
};
/// Host time per kernel launch, µs (fitted: 38).
pub(crate) const LAUNCH_US: Bound = Bound {
    name: "launch_us",
    min: 0.01,
    max: 1000.0,
    why: "host time per kernel launch in µs (measured: 38, CUDA's floor a few): a millisecond \
          a launch is 25× the slowest host measured",
};
/// Exponent p of the host/GPU overlap (fitted: 4.36).
pub(crate) const OVERLAP_EXPONENT: Bound = Bound {
    name: "overlap_exponent",
    min: 1.0,
    max: 64.0,
    why: "1 is no overlap (the sum of host and GPU times), 64 their maximum within 1.1 %; below \
          1 a step would take longer than both one after the other",
};

// The assumed constants: stated assumptions, which a calibration file may change within what
// real hardware can be.

/// Hidden size at which matmul efficiency halves (assumed: 450).
pub(crate) const HIDDEN_HALF: Bound = Bound {
    name: "hidden_half",
    min: 0.0,
    max: 16384.0,
    why: "a hidden size: 0 is no penalty for narrow layers, and above 16,384, four times the \
          widest layer of the zoo, every matmul would run below half its efficiency",
};
/// Fraction of peak HBM bandwidth (assumed: 0.85).
pub(crate) const HBM_EFFICIENCY: Bound = Bound {
    name: "hbm_efficiency",
    min: 0.01,
    max: 1.0,
    why: "a fraction of the datasheet's HBM bandwidth: above 1 is faster than the hardware, and \
          streaming kernels below 1 % of it are no calibration of a real GPU",
};
/// Fraction of the link bandwidth the ring all-reduce reaches (assumed: 0.8).
pub(crate) const LINK_EFFICIENCY: Bound = Bound {
    name: "link_efficiency",
    min: 0.05,
    max: 1.0,
    why: "a fraction of the link bandwidth (NCCL's ring reaches 70-90 %): below 5 % the A100 \
          node's 25 GB/s NIC would give less than the 1 GB/s a profile's `nodes` may state",
};
/// Latency of one ring step over NVLink, µs (assumed: 6).
pub(crate) const NVLINK_HOP_US: Bound = Bound {
    name: "nvlink_hop_us",
    min: 0.0,
    max: 1000.0,
    why: "a ring step's latency in µs (NCCL: a few): a millisecond is 100× any real link's",
};
/// Latency of one ring step over InfiniBand, µs (assumed: 15).
pub(crate) const IB_HOP_US: Bound = Bound {
    name: "ib_hop_us",
    min: 0.0,
    max: 1000.0,
    why: "a ring step's latency in µs (NCCL over InfiniBand: about 10): a millisecond is 100× \
          any real link's",
};
/// Fraction of the reduction hidden behind the backward pass (assumed: 0.5).
pub(crate) const COMM_OVERLAP: Bound = Bound {
    name: "comm_overlap",
    min: 0.0,
    max: 1.0,
    why: "a fraction of the reduction",
};
/// Memory per module outside weights, state and activations, GiB (assumed: 0.5).
pub(crate) const WORKSPACE_GIB: Bound = Bound {
    name: "workspace_gib",
    min: 0.0,
    max: 256.0,
    why: "memory in GiB beside weights and activations (cuBLAS workspace, allocator slack: \
          under 1): more than any GPU's whole memory (141 GB on an H200) is no workspace",
};
/// Each interference coefficient (assumed: 0.02, 0.05, 0.6), as a profile file's.
pub(crate) const INTERFERENCE: Bound = Bound {
    name: "interference",
    min: 0.0,
    max: PROFILE_MAX_INTERFERENCE,
    why: "what a profile's `interference` may hold: colocation never speeds a module up, and a \
          slowdown of 100× per unit of bandwidth is far past any measured colocation",
};

// The limits of a `mosaic-profiles/1` file that the device model's output must meet.
use mosaic_profile::{
    MAX_INTERFERENCE as PROFILE_MAX_INTERFERENCE, MAX_MEMORY_GIB as PROFILE_MAX_GIB,
    MAX_SAMPLE_MS as PROFILE_MAX_MS,
};

/// The range of a profile's `nodes.intra_gbps` and `inter_gbps`, GB/s.
const PROFILE_GBPS: (f64, f64) = (mosaic_profile::MIN_LINK_GBPS, mosaic_profile::MAX_LINK_GBPS);

impl Calibration {
    /// The range of every constant but the interference coefficients (each in
    /// [0, 100], as a profile's), in the order of the struct's fields.
    pub const BOUNDS: [Bound; 14] = [
        GEMM_EFFICIENCY,
        HIDDEN_HALF,
        ROWS_HALF,
        SM_EXPONENT,
        BW_SATURATION,
        HBM_EFFICIENCY,
        LINK_EFFICIENCY,
        NVLINK_HOP_US,
        IB_HOP_US,
        COMM_OVERLAP,
        LAUNCH_STEP_MS,
        LAUNCH_US,
        OVERLAP_EXPONENT,
        WORKSPACE_GIB,
    ];

    /// The constants of [`Self::BOUNDS`], in its order.
    fn bounded(&self) -> [f64; 14] {
        [
            self.gemm_efficiency,
            self.hidden_half,
            self.rows_half,
            self.sm_exponent,
            self.bw_saturation,
            self.hbm_efficiency,
            self.link_efficiency,
            self.nvlink_hop_us,
            self.ib_hop_us,
            self.comm_overlap,
            self.launch_step_ms,
            self.launch_us,
            self.overlap_exponent,
            self.workspace_gib,
        ]
    }

    /// Checks the constants: each within its [`Bound`], and together such that every profile
    /// of every built-in model on every built-in device (one node and many) stays within the
    /// `mosaic-profiles/1` limits — times at most 10⁷ ms, memory at most 10⁶ GiB, link
    /// bandwidths from 1 to 10⁵ GB/s. The error names the field (`constants.gemm_efficiency`;
    /// `constants` for constants that are each possible but together too slow, with the ones
    /// that dominate the slowest step).
    pub fn check(&self) -> Result<(), CalibrationError> {
        for (b, v) in Self::BOUNDS.iter().zip(self.bounded()) {
            if !(v.is_finite() && (b.min..=b.max).contains(&v)) {
                return Err(CalibrationError::new(
                    format!("constants.{}", b.name),
                    format!("{v:?} is not in [{}, {}]: {}", b.min, b.max, b.why),
                ));
            }
        }
        let e = self.interference;
        for (name, v) in [("e1", e.e1), ("e2", e.e2), ("e3", e.e3)] {
            if !(v.is_finite() && (INTERFERENCE.min..=INTERFERENCE.max).contains(&v)) {
                return Err(CalibrationError::new(
                    format!("constants.interference.{name}"),
                    format!(
                        "{v:?} is not in [{}, {}]: {}",
                        INTERFERENCE.min, INTERFERENCE.max, INTERFERENCE.why
                    ),
                ));
            }
        }
        self.check_profiles()
    }

    /// The joint check of [`Self::check`]: the slowest sample of every built-in model's profile
    /// on every built-in device, and the profile's link bandwidths. A module's time only falls
    /// as its quota grows (the matmul rate and the HBM bandwidth grow with it, the launch
    /// floor does not move) and its memory does not depend on the quota, so the device's
    /// smallest quota at every profiled dp covers the whole profile (a test checks this).
    fn check_profiles(&self) -> Result<(), CalibrationError> {
        let models = models();
        for device in devices() {
            let Some(&sm) = device.quota_grid().first() else {
                continue;
            };
            // One node (the models' one-node batch) and many (their global batch, dp up to
            // the largest pool).
            for gpus in [GPUS_PER_NODE, mosaic_profile::MAX_GPUS] {
                let Ok(cluster) = make(device.clone(), gpus) else {
                    continue;
                };
                let nodes = self.nodes(&cluster);
                for (name, v) in [("intra", nodes.intra_gbps), ("inter", nodes.inter_gbps)] {
                    let (lo, hi) = PROFILE_GBPS;
                    if !(v.is_finite() && (lo..=hi).contains(&v)) {
                        return Err(CalibrationError::new(
                            format!("constants.{}", LINK_EFFICIENCY.name),
                            format!(
                                "{} gives {}'s links {name}_gbps {v:.3} GB/s, outside the {lo} \
                                 to {hi:e} GB/s a profile's `nodes` may state",
                                self.link_efficiency, cluster.name
                            ),
                        ));
                    }
                }
                for model in &models {
                    for dp in crate::analytic::profiled_dps(model, &cluster) {
                        for i in 0..model.modules.len() {
                            let e = self.estimate(model, i, &cluster, dp, sm);
                            if !(e.time_ms.is_finite() && e.time_ms <= PROFILE_MAX_MS) {
                                return Err(self.too_slow(&e, &model.name, &device));
                            }
                            if !(e.mem_gib.is_finite() && e.mem_gib <= PROFILE_MAX_GIB) {
                                return Err(CalibrationError::new(
                                    format!("constants.{}", WORKSPACE_GIB.name),
                                    format!(
                                        "gives {}'s `{}` {:.3e} GiB a GPU at dp {dp}, above the \
                                         {PROFILE_MAX_GIB:e} GiB a profile may state",
                                        model.name, e.module, e.mem_gib
                                    ),
                                ));
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The error for estimate `e` of `model` on `device` past [`PROFILE_MAX_MS`]: which part
    /// of the step dominates, and the constants that make that part slow.
    fn too_slow(
        &self,
        e: &crate::Estimate,
        model: &str,
        device: &crate::DeviceSpec,
    ) -> CalibrationError {
        let parts: [(&str, f64, &[&str]); 4] = [
            (
                "matmuls",
                e.gemm_ms,
                &["gemm_efficiency", "hidden_half", "rows_half", "sm_exponent"],
            ),
            (
                "memory-bound kernels",
                e.memory_ms,
                &["hbm_efficiency", "bw_saturation"],
            ),
            (
                "host launches",
                e.launch_ms,
                &["launch_us", "launch_step_ms", "overlap_exponent"],
            ),
            (
                "the gradient all-reduce",
                e.comm_ms,
                &[
                    "link_efficiency",
                    "nvlink_hop_us",
                    "ib_hop_us",
                    "comm_overlap",
                ],
            ),
        ];
        let (part, ms, names) = parts
            .iter()
            .copied()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or(parts[0]);
        let values: Vec<String> = names
            .iter()
            .filter_map(|n| {
                let i = Self::BOUNDS.iter().position(|b| b.name == *n)?;
                Some(format!("{n} {:.4}", self.bounded()[i]))
            })
            .collect();
        let sms = (e.sm * device.sm_count as f64).round();
        CalibrationError::new(
            "constants",
            format!(
                "together these constants give {model}'s `{}` {:.3e} ms a step on {} (dp {}, {sms} \
                 of {} SMs), above the {PROFILE_MAX_MS:e} ms a profile may state; most of it \
                 ({ms:.3e} ms) is {part}, from {}: each may be possible, but together they are \
                 no calibration of a real GPU",
                e.module,
                e.time_ms,
                device.name,
                e.dp,
                device.sm_count,
                values.join(", ")
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cluster, FreeConstant};
    use proptest::prelude::*;

    /// Every constant at the end of its range that makes steps slowest.
    fn slowest() -> Calibration {
        Calibration {
            gemm_efficiency: GEMM_EFFICIENCY.min,
            hidden_half: HIDDEN_HALF.max,
            rows_half: ROWS_HALF.max,
            sm_exponent: SM_EXPONENT.max,
            bw_saturation: BW_SATURATION.max,
            hbm_efficiency: HBM_EFFICIENCY.min,
            link_efficiency: LINK_EFFICIENCY.min,
            nvlink_hop_us: NVLINK_HOP_US.max,
            ib_hop_us: IB_HOP_US.max,
            comm_overlap: COMM_OVERLAP.min,
            launch_step_ms: LAUNCH_STEP_MS.max,
            launch_us: LAUNCH_US.max,
            overlap_exponent: OVERLAP_EXPONENT.min,
            workspace_gib: WORKSPACE_GIB.max,
            ..Calibration::default()
        }
    }

    #[test]
    fn the_built_in_and_assumed_constants_pass() {
        Calibration::default().check().unwrap();
        Calibration::assumed().check().unwrap();
    }

    #[test]
    fn the_fit_searches_exactly_the_file_bounds() {
        for c in FreeConstant::ALL {
            let b = Calibration::BOUNDS
                .iter()
                .find(|b| b.name == c.name())
                .unwrap();
            assert_eq!(c.bounds(), (b.min, b.max), "{}", c.name());
        }
    }

    #[test]
    fn a_constant_outside_its_range_is_named() {
        for (i, b) in Calibration::BOUNDS.iter().enumerate() {
            for bad in [
                b.min - 1e-9 - b.min.abs() * 0.01,
                b.max * 1.01 + 1e-9,
                f64::NAN,
            ] {
                let mut cal = Calibration::default();
                let mut v = cal.bounded();
                v[i] = bad;
                set(&mut cal, v);
                let e = cal.check().unwrap_err();
                assert_eq!(e.field, format!("constants.{}", b.name), "{e}");
                assert!(e.to_string().contains(b.why), "{e}");
            }
        }
        // The audit's values: each refused by its own bound.
        for (field, cal) in [
            (
                "gemm_efficiency",
                Calibration {
                    gemm_efficiency: 1e-300,
                    ..Calibration::default()
                },
            ),
            (
                "hbm_efficiency",
                Calibration {
                    hbm_efficiency: 1e-300,
                    ..Calibration::default()
                },
            ),
            (
                "link_efficiency",
                Calibration {
                    link_efficiency: 1e-300,
                    ..Calibration::default()
                },
            ),
            (
                "workspace_gib",
                Calibration {
                    workspace_gib: 1e6,
                    ..Calibration::default()
                },
            ),
        ] {
            assert_eq!(cal.check().unwrap_err().field, format!("constants.{field}"));
        }
        let mut cal = Calibration::default();
        cal.interference.e3 = 101.0;
        assert_eq!(cal.check().unwrap_err().field, "constants.interference.e3");
    }

    /// `cal` with the constants of [`Calibration::BOUNDS`] set to `v`.
    fn set(cal: &mut Calibration, v: [f64; 14]) {
        [
            cal.gemm_efficiency,
            cal.hidden_half,
            cal.rows_half,
            cal.sm_exponent,
            cal.bw_saturation,
            cal.hbm_efficiency,
            cal.link_efficiency,
            cal.nvlink_hop_us,
            cal.ib_hop_us,
            cal.comm_overlap,
            cal.launch_step_ms,
            cal.launch_us,
            cal.overlap_exponent,
            cal.workspace_gib,
        ] = v;
    }

    #[test]
    fn constants_too_slow_together_are_refused_naming_the_slow_part() {
        let e = slowest().check().unwrap_err();
        assert_eq!(e.field, "constants");
        assert!(e.to_string().contains("gemm_efficiency 0.0100"), "{e}");
        // Slow matmuls alone: 1/40 of the fitted efficiency gives CTVLM's LLM on 4 of an
        // A100's SMs more than 10⁷ ms.
        let cal = Calibration {
            gemm_efficiency: 0.014,
            ..Calibration::default()
        };
        let e = cal.check().unwrap_err();
        assert!(e.to_string().contains("matmuls"), "{e}");
        // The slowest host the bounds allow alone is fine.
        Calibration {
            launch_us: LAUNCH_US.max,
            launch_step_ms: LAUNCH_STEP_MS.max,
            ..Calibration::default()
        }
        .check()
        .unwrap();
    }

    /// Every sample of every built-in model's profile on `c`, under `cal`: (largest time,
    /// largest memory), and whether the file reads back.
    fn profiles(cal: &Calibration, c: &str) -> (f64, f64, bool) {
        let c = cluster(c).unwrap();
        let (mut time, mut mem, mut valid) = (0.0f64, 0.0f64, true);
        for m in models() {
            let p = cal.profile(&m, &c);
            valid &= mosaic_profile::parse(&serde_json::to_string(&p).unwrap(), "p.json").is_ok();
            for s in p.modules.iter().flat_map(|m| &m.samples) {
                time = time.max(s.time_ms);
                mem = mem.max(s.mem_gib);
            }
        }
        (time, mem, valid)
    }

    /// The clusters whose profiles cover every sample a built-in cluster's can have: each
    /// device on one node and on the largest pool.
    const CLUSTERS: [&str; 6] = [
        "h100x8",
        "a100x8",
        "h200x8",
        "a100x65536",
        "h100x65536",
        "h200x65536",
    ];

    #[test]
    fn the_slowest_matmuls_that_pass_give_profiles_that_read_back() {
        // The smallest matmul efficiency the joint check lets through with every other
        // constant at its default, and just below it.
        let mut edge = Calibration::default();
        for k in 0..400 {
            edge.gemm_efficiency = GEMM_EFFICIENCY.min * 1.01f64.powi(k);
            if edge.check().is_ok() {
                break;
            }
        }
        assert!(
            edge.gemm_efficiency > 0.02 && edge.gemm_efficiency < 0.1,
            "{edge:?}"
        );
        for c in CLUSTERS {
            let (time, mem, valid) = profiles(&edge, c);
            assert!(valid, "{c}: {time} ms, {mem} GiB");
        }
        let past = Calibration {
            gemm_efficiency: edge.gemm_efficiency / 1.01,
            ..edge
        };
        assert_eq!(past.check().unwrap_err().field, "constants");
        let (time, _, valid) = CLUSTERS
            .iter()
            .map(|c| profiles(&past, c))
            .fold((0.0, 0.0, true), |a, b| (b.0.max(a.0), 0.0, a.2 && b.2));
        assert!(time > PROFILE_MAX_MS && !valid, "{time}");
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 24,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]
        /// Any constants inside their bounds (drawn log-uniformly where a range spans
        /// decades): if the check passes, every built-in model's profile on every device reads
        /// back; if it refuses them, some profile would not.
        #[test]
        fn constants_that_pass_give_profiles_that_read_back(
            u in proptest::collection::vec(0.0f64..=1.0, 14),
            e in proptest::collection::vec(0.0f64..=100.0, 3),
        ) {
            let mut v = [0.0; 14];
            for (i, b) in Calibration::BOUNDS.iter().enumerate() {
                v[i] = if b.min > 0.0 && b.max / b.min > 10.0 {
                    (b.min.ln() + u[i] * (b.max.ln() - b.min.ln())).exp().clamp(b.min, b.max)
                } else {
                    b.min + u[i] * (b.max - b.min)
                };
            }
            let mut cal = Calibration::default();
            set(&mut cal, v);
            cal.interference = mosaic_profile::Interference { e1: e[0], e2: e[1], e3: e[2] };
            let valid = CLUSTERS.iter().all(|c| profiles(&cal, c).2);
            match cal.check() {
                Ok(()) => prop_assert!(valid, "{cal:?}"),
                Err(err) => {
                    prop_assert_eq!(err.field.as_str(), "constants");
                    prop_assert!(!valid, "{cal:?}: {err}");
                }
            }
        }
    }

    #[test]
    fn the_smallest_quota_holds_the_slowest_sample() {
        // What check_profiles relies on: over a profile, a module's time is largest at the
        // device's smallest quota, at some dp.
        for cal in [Calibration::default(), slowest()] {
            for c in ["a100x8", "h100x65536"] {
                let c = cluster(c).unwrap();
                let smallest = c.device.quota_grid()[0];
                for m in models() {
                    for module in cal.profile(&m, &c).modules {
                        let max = |keep: &dyn Fn(f64) -> bool| {
                            module
                                .samples
                                .iter()
                                .filter(|s| keep(s.sm))
                                .map(|s| s.time_ms)
                                .fold(0.0, f64::max)
                        };
                        assert_eq!(max(&|_| true), max(&|sm| sm == smallest), "{}", module.name);
                    }
                }
            }
        }
    }
}
