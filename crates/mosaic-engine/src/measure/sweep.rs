//! The profile sweep: every module of a built-in engine model at every grid point (dp, quota)
//! of this machine ([`Profiler::sweep`]), what a `mosaic-profiles/1` file holds, and more.
//!
//! The planner reads, per module and per grid point, an iteration time, a memory footprint, an
//! achieved SM utilisation and a memory-bandwidth utilisation `B(m, a)`. Each point is one
//! replica's iteration (see [`super::profiler`]) in a slot of the quota's threads: it runs
//! [`ProfileConfig::warmup`] untimed iterations, then [`ProfileConfig::reps`] timed ones, and
//! keeps the median iteration (the upper middle one for an even count). Memory is counted on
//! the first iteration ([`super::bytes`]); `sm_util` is the slot's busy share
//! ([`super::machine`]); `bw_util` the estimated traffic over the time over the machine's
//! peak.

use serde::Serialize;

use super::bytes::{bytes_moved, Memory};
use super::machine::{busy_share, Machine};
use super::profiler::{stand_in_grads, ProfileConfig, Profiler, Timing};
use crate::error::EngineError;
use crate::models::model::shards;
use crate::runtime::slot::{threads_for, Slot};

/// One grid point of one module.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    /// The module.
    pub module: String,
    /// Data-parallel degree.
    pub dp: usize,
    /// Quota.
    pub sm: f64,
    /// Threads of the slot.
    pub threads: usize,
    /// Samples of the replica (shard 0 of the batch).
    pub rows: usize,
    /// The median iteration, in ms: the profile's `time_ms`.
    pub time_ms: f64,
    /// The fastest timed iteration, in ms.
    pub min_ms: f64,
    /// The slowest timed iteration, in ms.
    pub max_ms: f64,
    /// The median iteration's phases (they add up to `time_ms`).
    pub parts: Timing,
    /// What the replica holds.
    pub memory: Memory,
    /// Estimated bytes the iteration moves ([`bytes_moved`]).
    pub bytes_moved: u64,
    /// `bytes_moved` over `time_ms`, in GB/s.
    pub achieved_gbps: f64,
    /// `achieved_gbps` over the machine's peak, in [0, 1]: the profile's `bw_util`.
    pub bw_util: f64,
    /// Busy fraction of the slot's core-time, in [0, 1]: the profile's `sm_util`.
    pub sm_util: f64,
}

/// A module as the profile file lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModuleInfo {
    /// Its name.
    pub name: String,
    /// The modules it reads from (the profile's `after`).
    pub after: Vec<String>,
    /// Scalar parameters.
    pub params: usize,
}

/// The result of a sweep: everything a `mosaic-profiles/1` file holds, and more.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineProfile {
    /// The engine model.
    pub model: String,
    /// The sweep's settings.
    pub config: ProfileConfig,
    /// The machine.
    pub machine: Machine,
    /// The modules in model order.
    pub modules: Vec<ModuleInfo>,
    /// Every grid point, by module, then dp, then quota.
    pub points: Vec<Point>,
}

impl EngineProfile {
    /// The grid points of `module`.
    pub fn points_of<'a>(&'a self, module: &'a str) -> impl Iterator<Item = &'a Point> + 'a {
        self.points.iter().filter(move |p| p.module == module)
    }

    /// One paragraph on what the numbers are, for the profile file's `source` field.
    pub fn source(&self) -> String {
        let m = &self.machine;
        let c = &self.config;
        format!(
            "mosaic-engine: {} (seed {}, batch {}) measured on {} ({:.1} GiB RAM, STREAM-triad \
             peak {:.1} GB/s with {} MiB arrays). A sample is one data-parallel replica's \
             iteration on batch/dp samples in a slot of round(sm x cores) threads: forward, \
             backward, in-process gradient all-reduce of dp replicas, AdamW step; median of {} \
             after {} warm-up. mem_gib: parameters, gradients, AdamW moments and the \
             activations on the autograd tape. sm_util: on-CPU time of the slot's threads / \
             (threads x wall time). bw_util: estimated bytes (5 x activations + 10 x parameters \
             + 3(dp-1) x parameters) / time / peak. Interference not fitted (mosaic fit --out).",
            self.model,
            c.seed,
            c.batch,
            m.name,
            m.memory_gib,
            m.peak_gbps,
            m.stream_array_mib,
            c.reps,
            c.warmup.max(1)
        )
    }
}

impl Profiler {
    /// Measures every module at every grid point (module by module, then dp, then quota),
    /// calling `on_point` after each, and returns them all.
    pub fn sweep(&self, mut on_point: impl FnMut(&Point)) -> Result<EngineProfile, EngineError> {
        let cores = self.machine.cores;
        let slots = self
            .quotas()
            .into_iter()
            .map(|q| Slot::cpu("profile", q, threads_for(q, cores)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut points = Vec::with_capacity(self.grid_points());
        for m in 0..self.model.modules.len() {
            for dp in self.dps() {
                for slot in &slots {
                    let point = self.measure_point(m, dp, slot)?;
                    on_point(&point);
                    points.push(point);
                }
            }
        }
        let modules = (0..self.model.modules.len())
            .map(|i| ModuleInfo {
                name: self.model.modules[i].name.to_string(),
                after: self
                    .model
                    .producers(i)
                    .map(|p| self.model.modules[p].name.to_string())
                    .collect(),
                params: self.model.modules[i].params.count(),
            })
            .collect();
        Ok(EngineProfile {
            model: self.model.name.to_string(),
            config: self.config.clone(),
            machine: self.machine.clone(),
            modules,
            points,
        })
    }

    /// Module `m` at data-parallel degree `dp` in `slot`.
    fn measure_point(&self, m: usize, dp: usize, slot: &Slot) -> Result<Point, EngineError> {
        let module = &self.model.modules[m];
        let shard = shards(self.config.batch, dp).swap_remove(0);
        let others =
            stand_in_grads(&module.params, dp).map_err(EngineError::tensor(module.name))?;
        let threads = slot.threads();
        let (memory, (mut runs, sm_util)) = slot.run(|| -> Result<_, EngineError> {
            let err = || EngineError::tensor(module.name);
            let mut memory = Memory::default();
            for w in 0..self.config.warmup.max(1) {
                let (_, counted) = self.iterate(m, &shard, &others, w == 0).map_err(err())?;
                if let Some(c) = counted {
                    memory = c;
                }
            }
            let timed = busy_share(|| {
                (0..self.config.reps)
                    .map(|_| Ok(self.iterate(m, &shard, &others, false)?.0))
                    .collect::<candle_core::Result<Vec<Timing>>>()
                    .map_err(err())
            })?;
            Ok((memory, timed))
        })?;
        runs.sort_by(|a, b| a.total_ms().total_cmp(&b.total_ms()));
        let parts = runs[runs.len() / 2];
        let time_ms = parts.total_ms();
        let bytes = bytes_moved(&memory, dp);
        let achieved_gbps = bytes as f64 / (time_ms * 1e6);
        Ok(Point {
            module: module.name.to_string(),
            dp,
            sm: slot.quota(),
            threads,
            rows: shard.rows.len(),
            time_ms,
            min_ms: runs[0].total_ms(),
            max_ms: runs[runs.len() - 1].total_ms(),
            parts,
            memory,
            bytes_moved: bytes,
            achieved_gbps,
            bw_util: (achieved_gbps / self.machine.peak_gbps).clamp(0.0, 1.0),
            sm_util,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::machine::tests::machine;
    use crate::measure::profiler::tests::quick;

    #[test]
    fn sweep_measures_every_grid_point() {
        let p = Profiler::new("clip-tiny", quick(8, 4), machine(2)).unwrap();
        assert_eq!(p.grid_points(), 3 * 3 * 2);
        let mut seen = 0;
        let profile = p.sweep(|_| seen += 1).unwrap();
        assert_eq!(seen, 18);
        assert_eq!(profile.points.len(), 18);
        let names: Vec<&str> = profile.modules.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["vision", "text", "align"]);
        assert_eq!(profile.modules[2].after, ["vision", "text"]);
        assert!(profile.modules[0].after.is_empty());
        for pt in &profile.points {
            assert!(pt.time_ms > 0.0 && pt.time_ms.is_finite(), "{pt:?}");
            assert!(pt.min_ms <= pt.time_ms && pt.time_ms <= pt.max_ms, "{pt:?}");
            assert!((pt.parts.total_ms() - pt.time_ms).abs() < 1e-9);
            assert_eq!(pt.parts.allreduce_ms == 0.0, pt.dp == 1, "{pt:?}");
            assert!((0.0..=1.0).contains(&pt.sm_util) && (0.0..=1.0).contains(&pt.bw_util));
            assert_eq!(pt.threads, threads_for(pt.sm, 2));
            assert_eq!(pt.rows, 8 / pt.dp);
            assert!(pt.memory.params > 0 && pt.memory.activations > 0);
            assert_eq!(pt.memory.grads, pt.memory.params);
            assert_eq!(pt.memory.optimizer, 2 * pt.memory.params);
            assert_eq!(pt.bytes_moved, bytes_moved(&pt.memory, pt.dp));
            assert!((pt.achieved_gbps - pt.bytes_moved as f64 / (pt.time_ms * 1e6)).abs() < 1e-9);
            let params = profile
                .modules
                .iter()
                .find(|m| m.name == pt.module)
                .unwrap();
            assert_eq!(pt.memory.params, 4 * params.params as u64);
        }
        // A sharded module holds fewer activations per replica as dp grows; the gathered
        // align sees the whole batch at every dp.
        let act = |module: &str, dp: usize| {
            profile
                .points_of(module)
                .find(|p| p.dp == dp)
                .unwrap()
                .memory
                .activations
        };
        for module in ["vision", "text"] {
            assert!(act(module, 1) > act(module, 2) && act(module, 2) > act(module, 4));
        }
        assert!(act("align", 1) >= act("align", 4));
        // Memory does not depend on the quota.
        for pair in profile.points.chunks(2) {
            assert_eq!(pair[0].memory, pair[1].memory);
        }
        assert!(profile.source().contains("clip-tiny"));
    }
}
