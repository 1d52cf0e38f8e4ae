//! The performance model of Mosaic §3.3: the scaling surface f_m(d, a) interpolated from the
//! sparse profiling grid, and the interference rectification of Eq. 8.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::ProfileError;
use crate::format::{Device, Interference, Nodes, ProfileFile};
use crate::partition::whole_sms;

/// Most modules a model may have: module sets are 64-bit masks.
pub const MAX_MODULES: usize = 64;

/// A set of modules as a bitmask over module indices (the result-cache key of §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ModuleSet(pub u64);

impl ModuleSet {
    /// The empty set.
    pub const EMPTY: ModuleSet = ModuleSet(0);

    /// The set holding only module `i`.
    pub fn single(i: usize) -> Self {
        ModuleSet(1 << i)
    }
    /// The set of modules `0..n`.
    pub fn all(n: usize) -> Self {
        ModuleSet(if n >= 64 { u64::MAX } else { (1u64 << n) - 1 })
    }
    /// Whether module `i` is in the set.
    pub fn contains(self, i: usize) -> bool {
        self.0 >> i & 1 == 1
    }
    /// Number of modules in the set.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }
    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// Union.
    pub fn union(self, other: ModuleSet) -> ModuleSet {
        ModuleSet(self.0 | other.0)
    }
    /// Intersection.
    pub fn intersect(self, other: ModuleSet) -> ModuleSet {
        ModuleSet(self.0 & other.0)
    }
    /// Modules of `self` not in `other`.
    pub fn minus(self, other: ModuleSet) -> ModuleSet {
        ModuleSet(self.0 & !other.0)
    }
    /// Whether every module of `self` is in `other`.
    pub fn is_subset(self, other: ModuleSet) -> bool {
        self.0 & !other.0 == 0
    }
    /// The module indices, ascending.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        let mut bits = self.0;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let i = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                i
            })
        })
    }
}

/// One deployment candidate of a module: `dp` replicas, each with `units` quota units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuotaOption {
    /// Data-parallel degree (a profiled one).
    pub dp: u32,
    /// Quota per replica in quota units (1..=units per GPU): multiples of the granularity, or
    /// SMs on a device with a partition rule.
    pub units: u32,
    /// Quota per replica as a fraction of the GPU.
    pub sm: f64,
    /// Predicted iteration time without interference, f_m(dp, sm), in ms.
    pub time_ms: f64,
    /// Predicted memory per GPU in GiB.
    pub mem_gib: f64,
    /// Predicted bandwidth utilisation B(m, sm).
    pub bw_util: f64,
    /// Predicted achieved SM utilisation of the quota, in [0, 1] (the profiled `sm_util`,
    /// interpolated like the other fields): the fraction of the replica's SM-time that does
    /// work, used to report GPU utilisation.
    pub sm_util: f64,
}

/// A module as the planner sees it.
#[derive(Debug, Clone)]
pub struct ModuleModel {
    /// Module name.
    pub name: String,
    /// Direct producers (the `after` list).
    pub parents: ModuleSet,
    /// All transitive producers.
    pub ancestors: ModuleSet,
    /// Candidate deployments that fit in a GPU's memory, ordered by (dp, units).
    pub options: Vec<QuotaOption>,
    /// Gradient bytes each replica all-reduces per step, GiB: the profile's `grad_gib`, 0
    /// where it has none (nothing is then charged for spanning nodes).
    pub grad_gib: f64,
}

/// The largest pool of GPUs anything here plans, profiles or simulates: a profile's `dp` and a
/// plan's `gpus` are at most this. With at most [`MAX_QUOTA_UNITS`] units per GPU, every count
/// of units over a pool (at most 65,536 × 10,000 < 2³²) fits the solvers' `u32` arithmetic.
pub const MAX_GPUS: u32 = 1 << 16;

/// The most quota units a GPU is divided into: a `--granularity` of at least 1/10,000, or a
/// device of at most 10,000 SMs. Finer grids add candidates without changing any plan, and the
/// bound keeps the planner's unit counts within `u32`.
pub const MAX_QUOTA_UNITS: u32 = 10_000;

/// The performance model of one model on one device kind at one quota granularity.
#[derive(Debug, Clone)]
pub struct PerfModel {
    /// The device the profiles were taken on.
    pub device: Device,
    /// The pool's nodes and the placement the samples assume (the profile's `nodes`); `None`:
    /// the pool is one node.
    pub nodes: Option<Nodes>,
    /// Interference coefficients of Eq. 8.
    pub interference: Interference,
    /// Quota units per GPU: 1 / granularity, or the device's `sm_count` when it has a
    /// partition rule (one unit is one SM).
    pub units_per_gpu: u32,
    /// The modules, in file order.
    pub modules: Vec<ModuleModel>,
    /// Module indices in a topological order (producers first, ties by file order).
    pub topo_order: Vec<usize>,
}

impl PerfModel {
    /// Builds the model of a validated profile file.
    ///
    /// The quota grid is the device's when its profile has a partition rule
    /// (`device.partition`): one quota unit is one SM (`units_per_gpu` = `sm_count`), and the
    /// candidate quotas are [`quota_sms`](crate::SmGranularity::quota_sms) — the partitions a split hands out
    /// (multiples of `step_sms` from `min_sms` up to ⌊sm_count/step⌋·step: 128 of an H100's
    /// 132) and the whole GPU. Since every GPU holds `sm_count` units, a module at the whole
    /// GPU is alone on it, and modules sharing one get at most what a split can hand out; the
    /// `granularity` argument is then ignored. Without a rule, quotas are the multiples of
    /// `granularity`. Quotas are interpolated linearly between profiled quotas at the same
    /// `dp` (sample quotas of a partitioned device read as whole SM counts, so that 16/132
    /// written `0.1212` is exactly the grid's 16 SMs) and never extrapolated; `dp` values that
    /// were not profiled are not candidates. Fails, naming `file` and the field, when the
    /// granularity does not divide 1 (without a rule), a sample quota is no whole SM count
    /// (with one), or a module fits on no GPU.
    pub fn new(
        p: &ProfileFile,
        granularity: f64,
        file: impl AsRef<Path>,
    ) -> Result<Self, ProfileError> {
        let file = file.as_ref();
        let (units, grid) = match p.device.partition {
            Some(rule) => (p.device.sm_count, rule.quota_sms(p.device.sm_count)),
            None => {
                let units = (1.0 / granularity).round();
                if !(granularity > 0.0 && granularity <= 1.0)
                    || (units * granularity - 1.0).abs() > 1e-9
                    || units > MAX_QUOTA_UNITS as f64
                {
                    return Err(ProfileError::invalid(
                        file,
                        "granularity",
                        format!("expected a quota step in [1/{MAX_QUOTA_UNITS}, 1] that divides 1 (e.g. 0.1, 0.05), found {granularity}"),
                    ));
                }
                (units as u32, (1..=units as u32).collect())
            }
        };
        let index: BTreeMap<&str, usize> = p
            .modules
            .iter()
            .enumerate()
            .map(|(i, m)| (m.name.as_str(), i))
            .collect();
        let parents: Vec<ModuleSet> = p
            .modules
            .iter()
            .map(|m| {
                ModuleSet(
                    m.after
                        .iter()
                        .fold(0, |acc, a| acc | 1 << index[a.as_str()]),
                )
            })
            .collect();
        let topo_order = topological_order(&parents);
        let mut ancestors = vec![ModuleSet::EMPTY; parents.len()];
        for &i in &topo_order {
            ancestors[i] = parents[i]
                .iter()
                .fold(parents[i], |acc, j| acc.union(ancestors[j]));
        }
        let mut modules = Vec::with_capacity(p.modules.len());
        for (i, m) in p.modules.iter().enumerate() {
            let mut samples = m.samples.clone();
            if p.device.partition.is_some() {
                for (k, s) in samples.iter_mut().enumerate() {
                    let sms = whole_sms(s.sm, p.device.sm_count, file, || {
                        format!("modules[{i}].samples[{k}].sm")
                    })?;
                    s.sm = sms as f64 / units as f64;
                }
            }
            let options: Vec<QuotaOption> = surface(&samples, &grid, units)
                .into_iter()
                .filter(|o| o.mem_gib <= p.device.memory_gib)
                .collect();
            if options.is_empty() {
                return Err(ProfileError::invalid(
                    file,
                    format!("modules[{i}].samples"),
                    format!(
                        "module \"{}\" fits on no GPU: every sample needs more than the device's {} GiB \
                         or lies below the smallest quota {}",
                        m.name,
                        p.device.memory_gib,
                        grid[0] as f64 / units as f64
                    ),
                ));
            }
            modules.push(ModuleModel {
                name: m.name.clone(),
                parents: parents[i],
                ancestors: ancestors[i],
                options,
                grad_gib: m.grad_gib.unwrap_or(0.0),
            });
        }
        Ok(PerfModel {
            device: p.device.clone(),
            nodes: p.nodes,
            interference: p.interference,
            units_per_gpu: units,
            modules,
            topo_order,
        })
    }

    /// The quota step as a fraction of a GPU: the granularity the model was built with, or on
    /// a device with a partition rule `step_sms / sm_count` (its quotas are multiples of it,
    /// or the whole GPU).
    pub fn granularity(&self) -> f64 {
        match self.device.partition {
            Some(rule) => rule.step_sms as f64 / self.device.sm_count as f64,
            None => 1.0 / self.units_per_gpu as f64,
        }
    }

    /// The quota, as a fraction of a GPU, of `units` quota units.
    pub fn quota(&self, units: u32) -> f64 {
        units as f64 / self.units_per_gpu as f64
    }

    /// Index of the module called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.modules.iter().position(|m| m.name == name)
    }

    /// Whether no module of `a` is an ancestor of a module of `b` or the other way round.
    pub fn independent(&self, a: ModuleSet, b: ModuleSet) -> bool {
        a.iter()
            .all(|i| self.modules[i].ancestors.intersect(b).is_empty())
            && b.iter()
                .all(|i| self.modules[i].ancestors.intersect(a).is_empty())
    }
}

/// Kahn's algorithm, smallest index first among the ready modules.
fn topological_order(parents: &[ModuleSet]) -> Vec<usize> {
    let n = parents.len();
    let mut done = ModuleSet::EMPTY;
    let mut order = Vec::with_capacity(n);
    while order.len() < n {
        let next = (0..n)
            .find(|&i| !done.contains(i) && parents[i].is_subset(done))
            .expect("validated profiles are acyclic");
        done = done.union(ModuleSet::single(next));
        order.push(next);
    }
    order
}

/// Candidate options of one module on the quota grid: for every profiled dp, every grid point
/// `u / units` inside that dp's profiled quota range, interpolated linearly in the quota.
fn surface(samples: &[crate::format::Sample], grid: &[u32], units: u32) -> Vec<QuotaOption> {
    let mut by_dp: BTreeMap<u32, Vec<&crate::format::Sample>> = BTreeMap::new();
    for s in samples {
        by_dp.entry(s.dp).or_default().push(s);
    }
    let mut out = Vec::new();
    for (dp, mut row) in by_dp {
        row.sort_by(|a, b| a.sm.total_cmp(&b.sm));
        for &u in grid {
            let a = u as f64 / units as f64;
            // The segment [lo, hi] of profiled quotas that contains a (tolerating float noise).
            let eps = 1e-9;
            let Some(k) = row.iter().position(|s| s.sm >= a - eps) else {
                continue;
            };
            let hi = row[k];
            let (time_ms, mem_gib, bw_util, sm_util) = if (hi.sm - a).abs() <= eps {
                (hi.time_ms, hi.mem_gib, hi.bw_util, hi.sm_util)
            } else if k == 0 {
                continue; // below the smallest profiled quota: never extrapolate
            } else {
                let lo = row[k - 1];
                let t = (a - lo.sm) / (hi.sm - lo.sm);
                let lerp = |x: f64, y: f64| x + t * (y - x);
                (
                    lerp(lo.time_ms, hi.time_ms),
                    lerp(lo.mem_gib, hi.mem_gib),
                    lerp(lo.bw_util, hi.bw_util),
                    lerp(lo.sm_util, hi.sm_util),
                )
            };
            out.push(QuotaOption {
                dp,
                units: u,
                sm: a,
                time_ms,
                mem_gib,
                bw_util,
                sm_util,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Sample;

    fn sample(dp: u32, sm: f64, time_ms: f64) -> Sample {
        Sample {
            dp,
            sm,
            time_ms,
            mem_gib: 1.0,
            sm_util: 0.5,
            bw_util: sm / 2.0,
        }
    }

    #[test]
    fn surface_interpolates_between_profiled_quotas_only() {
        let s = [
            sample(1, 0.2, 100.0),
            sample(1, 0.6, 60.0),
            sample(2, 1.0, 10.0),
        ];
        let opts = surface(&s, &(1..=10).collect::<Vec<_>>(), 10);
        let at = |dp, u| opts.iter().find(|o| o.dp == dp && o.units == u).copied();
        assert!(at(1, 1).is_none(), "0.1 is below the profiled 0.2");
        assert_eq!(at(1, 2).unwrap().time_ms, 100.0);
        assert!((at(1, 4).unwrap().time_ms - 80.0).abs() < 1e-9);
        assert!(at(1, 7).is_none(), "0.7 is above the profiled 0.6");
        assert!(at(4, 10).is_none(), "dp 4 was not profiled");
        assert_eq!(at(2, 10).unwrap().time_ms, 10.0);
        assert_eq!(opts.iter().filter(|o| o.dp == 2).count(), 1);
    }

    #[test]
    fn delta_is_zero_alone_and_eq8_otherwise() {
        let e = Interference {
            e1: 0.1,
            e2: 0.2,
            e3: 0.4,
        };
        assert_eq!(e.delta([0.5]), 0.0);
        assert!((e.delta([0.5, 0.5]) - (0.1 + 0.2 * 1.0 + 0.4 * 0.25)).abs() < 1e-12);
    }

    #[test]
    fn module_sets_iterate_in_order() {
        let s = ModuleSet(0b1011_0000_0001);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 8, 9, 11]);
        assert_eq!(s.len(), 4);
        assert!(ModuleSet(0b1).is_subset(s));
        assert_eq!(ModuleSet::all(64).len(), 64);
    }
}
