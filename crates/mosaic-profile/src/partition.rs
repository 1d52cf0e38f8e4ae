//! SM partitions: the one mapping between SM quotas and SM counts that the planner, the
//! simulator, the fit and the engine's green-context slots share. Pure arithmetic.
//!
//! A CUDA green context holds a partition of the device's SMs whose size the architecture
//! constrains (`docs/reference.md`, "Green contexts": at least 8 and multiples of 8 on compute
//! capability 9.x; at least 4, multiples of 2, on 8.x): an [`SmGranularity`], which a profile's
//! `device.partition` carries. The planner's quota grid on such a device is
//! [`SmGranularity::quota_sms`]: every partition a split can hand out, and the whole device for
//! a module alone on its GPU. The engine's slot of a quota gets [`sms_for`] it, and the
//! modules of a stage, which run at the same time, get disjoint SMs by [`partition_sms`].

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::ProfileError;

/// How far (as a fraction of the GPU) a quota may lie from a whole number of SMs and still be
/// read as that SM count: files write quotas such as 16/132 as `0.1212`.
pub const SM_QUOTA_TOLERANCE: f64 = 1e-3;

/// The smallest SM partition of a device and the step between partition sizes: a profile's
/// `device.partition`, `{"min_sms": 8, "step_sms": 8}` on Hopper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmGranularity {
    /// Fewest SMs a partition may have.
    pub min_sms: u32,
    /// A partition's SM count is a multiple of this.
    pub step_sms: u32,
}

/// The rule in words: `at least 8 SMs, multiples of 8`.
impl fmt::Display for SmGranularity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "at least {} SMs, multiples of {}",
            self.min_sms, self.step_sms
        )
    }
}

impl SmGranularity {
    /// The CUDA driver documentation's guideline for compute capability `major`.x (CUDA 13.0's
    /// `cuda.h`): 6.x and 7.x at least 2, multiples of 2; 8.x at least 4, multiples of 2; 9.0 and later at least
    /// 8, multiples of 8. (CUDA 13 reports the device's own values as `minSmPartitionSize` and
    /// `smCoscheduledAlignment`; the driver rounds a request up to them in any case.)
    pub fn for_compute_capability(major: i32) -> SmGranularity {
        let (min, step) = match major {
            i32::MIN..=7 => (2, 2),
            8 => (4, 2),
            _ => (8, 8),
        };
        SmGranularity {
            min_sms: min,
            step_sms: step,
        }
    }

    /// Whether a partition of `sms` SMs is allowed.
    pub fn allows(&self, sms: u32) -> bool {
        sms >= self.min_sms && sms.is_multiple_of(self.step_sms.max(1))
    }

    /// The most SMs an allowed partition of at most `capacity` SMs can have, if any: what a
    /// split of `capacity` SMs hands out at most (128 of an H100's 132).
    pub fn largest_within(&self, capacity: u32) -> Option<u32> {
        let step = self.step_sms.max(1);
        let top = capacity - capacity % step;
        (top >= self.min_sms.max(1)).then_some(top)
    }

    /// The SM counts a module may hold on a device of `total` SMs, ascending: every allowed
    /// partition up to [`largest_within`](Self::largest_within)`(total)` — what the modules
    /// sharing a GPU get — and `total` itself, the whole GPU of a module alone on it (no split).
    /// On an H100 (132 SMs, 8/8): 8, 16, …, 128, 132; on an A100 (108, 4/2): 4, 6, …, 108.
    pub fn quota_sms(&self, total: u32) -> Vec<u32> {
        let step = self.step_sms.max(1);
        let first = self.min_sms.max(1).div_ceil(step) * step;
        let mut out: Vec<u32> = match self.largest_within(total) {
            Some(top) => (first..=top).step_by(step as usize).collect(),
            None => Vec::new(),
        };
        if total > 0 && out.last() != Some(&total) {
            out.push(total);
        }
        out
    }
}

/// The whole number of SMs of a `total`-SM device that `quota` stands for: `quota × total`
/// rounded, if the quota lies within [`SM_QUOTA_TOLERANCE`] of `sms / total` (and is
/// positive); `None` for a quota between SM counts such as 0.1 of 132 SMs (13.2).
pub fn quota_to_sms(quota: f64, total: u32) -> Option<u32> {
    if !(quota.is_finite() && quota > 0.0) || total == 0 {
        return None;
    }
    let sms = (quota * total as f64).round();
    (sms >= 1.0 && (sms / total as f64 - quota).abs() <= SM_QUOTA_TOLERANCE).then_some(sms as u32)
}

/// SMs for a slot of `quota` on a device of `total` SMs: `quota × total` rounded to the nearest
/// multiple of `g.step_sms`, at least `g.min_sms`, at most the largest allowed count within `total`.
/// `None` if the quota is not positive (or not a number) or `total` cannot hold a partition.
pub fn sms_for(quota: f64, total: u32, g: SmGranularity) -> Option<u32> {
    let cap = g.largest_within(total)?;
    if quota.is_nan() || quota <= 0.0 {
        return None;
    }
    let step = g.step_sms.max(1);
    let want = (quota * total as f64 / step as f64).round();
    let rounded = (want.min(u32::MAX as f64) as u32).saturating_mul(step);
    Some(rounded.max(g.min_sms).min(cap))
}

/// SMs for every module of a stage that runs them at the same time: [`sms_for`] each quota of
/// `total`, then, while the stage asks for more than `capacity` SMs (the SMs its partitions can
/// be cut from), the module furthest above its exact share `quota × total` gives back
/// `g.step_sms` SMs (the first such module on a tie); a module never goes below `g.min_sms`. Fails
/// when the stage cannot fit (too many modules for their minimum partitions) or a quota is not
/// positive.
pub fn partition_sms(
    quotas: &[f64],
    total: u32,
    capacity: u32,
    g: SmGranularity,
) -> Result<Vec<u32>, String> {
    let cap = g.largest_within(capacity).ok_or_else(|| {
        format!(
            "{capacity} SMs hold no partition (of at least {} SMs)",
            g.min_sms
        )
    })?;
    let mut sms = Vec::with_capacity(quotas.len());
    for (i, &q) in quotas.iter().enumerate() {
        let n = sms_for(q, total, g).ok_or_else(|| {
            format!("module {i}: quota {q} gives no partition of a {total}-SM device")
        })?;
        sms.push(n.min(cap));
    }
    let step = g.step_sms.max(1);
    while sms.iter().map(|&n| n as u64).sum::<u64>() > capacity as u64 {
        let over = |i: usize| sms[i] as f64 - quotas[i] * total as f64;
        let give = (0..sms.len()).filter(|&i| sms[i] >= g.min_sms + step).fold(
            None,
            |best: Option<usize>, i| match best {
                Some(b) if over(b) >= over(i) => Some(b),
                _ => Some(i),
            },
        );
        match give {
            Some(i) => sms[i] -= step,
            None => {
                return Err(format!(
                    "{} modules at once need at least {} SMs ({} each); {capacity} can be \
                     partitioned",
                    sms.len(),
                    sms.len() as u64 * g.min_sms as u64,
                    g.min_sms
                ))
            }
        }
    }
    Ok(sms)
}

/// The whole number of SMs quota `sm` stands for on a device of `sm_count` SMs (within
/// [`SM_QUOTA_TOLERANCE`]), or an error on `field` saying what it is instead.
pub(crate) fn whole_sms(
    sm: f64,
    sm_count: u32,
    file: &Path,
    field: impl FnOnce() -> String,
) -> Result<u32, ProfileError> {
    quota_to_sms(sm, sm_count).ok_or_else(|| {
        ProfileError::invalid(
            file,
            field(),
            format!(
                "the device has a partition rule, so quotas are whole SM counts over its {n} SMs \
                 (k/{n}, within {SM_QUOTA_TOLERANCE}); {sm} is {:.3} SMs",
                sm * sm_count as f64,
                n = sm_count
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOPPER: SmGranularity = SmGranularity {
        min_sms: 8,
        step_sms: 8,
    };
    const AMPERE: SmGranularity = SmGranularity {
        min_sms: 4,
        step_sms: 2,
    };

    #[test]
    fn granularity_by_compute_capability() {
        assert_eq!(SmGranularity::for_compute_capability(9), HOPPER);
        assert_eq!(SmGranularity::for_compute_capability(10), HOPPER);
        assert_eq!(SmGranularity::for_compute_capability(8), AMPERE);
        for major in [6, 7] {
            assert_eq!(
                SmGranularity::for_compute_capability(major),
                SmGranularity {
                    min_sms: 2,
                    step_sms: 2
                }
            );
        }
        assert!(HOPPER.allows(16) && !HOPPER.allows(12) && !HOPPER.allows(0));
        assert_eq!(HOPPER.to_string(), "at least 8 SMs, multiples of 8");
        assert!(AMPERE.allows(6) && !AMPERE.allows(2) && !AMPERE.allows(7));
        assert_eq!(HOPPER.largest_within(132), Some(128));
        assert_eq!(AMPERE.largest_within(7), Some(6));
        assert_eq!(AMPERE.largest_within(3), None);
    }

    #[test]
    fn the_quota_grid_is_every_split_partition_and_the_whole_gpu() {
        let h100 = HOPPER.quota_sms(132);
        assert_eq!(h100.len(), 17);
        assert_eq!((h100[0], h100[15], h100[16]), (8, 128, 132));
        assert!(h100[..16].iter().all(|&n| HOPPER.allows(n)));
        let a100 = AMPERE.quota_sms(108);
        assert_eq!((a100[0], a100[1], *a100.last().unwrap()), (4, 6, 108));
        assert_eq!(a100.len(), 53, "4..=108 in steps of 2, 108 once");
        // A minimum that is not a multiple of the step starts at the next multiple.
        let odd = SmGranularity {
            min_sms: 3,
            step_sms: 2,
        };
        assert_eq!(odd.quota_sms(9), vec![4, 6, 8, 9]);
        // A device smaller than a partition: only the whole device.
        assert_eq!(HOPPER.quota_sms(6), vec![6]);
    }

    #[test]
    fn quotas_read_as_whole_sm_counts_within_the_tolerance() {
        // The measured profile writes 16/132 as 0.1212 and 80/132 as 0.6061.
        assert_eq!(quota_to_sms(0.1212, 132), Some(16));
        assert_eq!(quota_to_sms(0.6061, 132), Some(80));
        assert_eq!(quota_to_sms(1.0, 132), Some(132));
        assert_eq!(quota_to_sms(0.1, 132), None, "13.2 SMs");
        assert_eq!(quota_to_sms(0.0, 132), None);
        assert_eq!(quota_to_sms(f64::NAN, 132), None);
        assert_eq!(quota_to_sms(0.001, 132), None, "0.132 SMs is no SM");
    }

    #[test]
    fn quota_rounds_to_the_nearest_allowed_count() {
        // H100 SXM, 132 SMs: 0.25 × 132 = 33 → 32; 0.5 × 132 = 66 → 64; 0.3 × 132 = 39.6 → 40.
        assert_eq!(sms_for(0.25, 132, HOPPER), Some(32));
        assert_eq!(sms_for(0.5, 132, HOPPER), Some(64));
        assert_eq!(sms_for(0.3, 132, HOPPER), Some(40));
        // 0.35 × 132 = 46.2 → 48 (rounded up, not down).
        assert_eq!(sms_for(0.35, 132, HOPPER), Some(48));
        // A100, 108 SMs: 0.3 × 108 = 32.4 → 32; 0.33 × 108 = 35.64 → 36; 0.05 × 108 = 5.4 → 6.
        assert_eq!(sms_for(0.3, 108, AMPERE), Some(32));
        assert_eq!(sms_for(0.33, 108, AMPERE), Some(36));
        assert_eq!(sms_for(0.05, 108, AMPERE), Some(6));
    }

    #[test]
    fn quota_is_at_least_the_minimum_and_at_most_the_device() {
        assert_eq!(sms_for(0.01, 132, HOPPER), Some(8));
        assert_eq!(sms_for(0.01, 108, AMPERE), Some(4));
        // The whole device: 132 is not a multiple of 8; the largest partition is 128.
        assert_eq!(sms_for(1.0, 132, HOPPER), Some(128));
        assert_eq!(sms_for(1.0, 108, AMPERE), Some(108));
        assert_eq!(sms_for(1.0, 7, AMPERE), Some(6));
        assert_eq!(sms_for(3.0, 108, AMPERE), Some(108));
    }

    #[test]
    fn no_partition_for_bad_quotas_or_tiny_devices() {
        assert_eq!(sms_for(0.0, 132, HOPPER), None);
        assert_eq!(sms_for(-0.5, 132, HOPPER), None);
        assert_eq!(sms_for(f64::NAN, 132, HOPPER), None);
        assert_eq!(sms_for(0.5, 6, HOPPER), None);
        assert_eq!(sms_for(1.0, 3, AMPERE), None);
    }

    #[test]
    fn a_stage_that_fits_keeps_its_rounding() {
        assert_eq!(
            partition_sms(&[0.25, 0.5, 0.25], 132, 128, HOPPER).unwrap(),
            [32, 64, 32]
        );
        assert_eq!(
            partition_sms(&[0.3, 0.7], 108, 108, AMPERE).unwrap(),
            [32, 76]
        );
    }

    #[test]
    fn a_stage_rounded_past_the_device_gives_back_the_excess() {
        // 46.2 → 48, 46.2 → 48, 39.6 → 40: 136 > 128. The first of the two modules 1.8 SMs
        // above their share gives back a group: 40 + 48 + 40 = 128.
        assert_eq!(
            partition_sms(&[0.35, 0.35, 0.3], 132, 128, HOPPER).unwrap(),
            [40, 48, 40]
        );
        // Two halves of 132 round to 64 each and fit 128 exactly.
        assert_eq!(
            partition_sms(&[0.5, 0.5], 132, 128, HOPPER).unwrap(),
            [64, 64]
        );
        // 1.0 + a small module: 128 (capped) + 8 > 128 → the big one gives back 8.
        assert_eq!(
            partition_sms(&[1.0, 0.01], 132, 128, HOPPER).unwrap(),
            [120, 8]
        );
        // A smaller capacity than the device (SMs already taken): 96.
        assert_eq!(
            partition_sms(&[0.5, 0.5], 132, 96, HOPPER).unwrap(),
            [48, 48]
        );
        let sms = partition_sms(&[0.2; 5], 108, 108, AMPERE).unwrap();
        assert!(sms.iter().sum::<u32>() <= 108 && sms.iter().all(|&n| AMPERE.allows(n)));
    }

    #[test]
    fn a_stage_of_too_many_modules_is_refused() {
        // 17 modules of at least 8 SMs do not fit 128.
        let e = partition_sms(&[0.05; 17], 132, 128, HOPPER).unwrap_err();
        assert!(e.contains("17 modules") && e.contains("136"), "{e}");
        assert!(partition_sms(&[0.05; 16], 132, 128, HOPPER).is_ok());
        assert!(partition_sms(&[0.5, 0.0], 132, 128, HOPPER).is_err());
        assert!(partition_sms(&[0.5], 132, 4, HOPPER).is_err());
    }
}
