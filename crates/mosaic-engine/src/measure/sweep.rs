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

use candle_core::Tensor;
use serde::Serialize;

use super::bytes::{bytes_moved, Memory};
use super::gpu_info::GpuInfo;
use super::machine::{busy_share, Machine};
use super::profiler::{stand_in_grads, GraphedPasses, ProfileConfig, Profiler, Timing};
use crate::error::EngineError;
use crate::models::model::{shards, Shard};
use crate::runtime::graphed::{launch_bound, GRAPHS};
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
    /// The slot's cores: threads on the CPU, SMs on a GPU.
    pub cores: usize,
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
    /// The profile's `bw_util`, in [0, 1]: on the CPU `achieved_gbps` over the machine's peak;
    /// on a GPU NVML's memory-controller busy fraction over the point's iterations.
    pub bw_util: f64,
    /// The profile's `sm_util`, in [0, 1]: on the CPU the busy fraction of the slot's
    /// core-time; on a GPU NVML's kernel-busy fraction over the point's iterations.
    pub sm_util: f64,
    /// Whether the module recomputed its activations because the point did not fit the GPU
    /// otherwise ([`super::sweep_gpu`]).
    pub recomputed: bool,
    /// How the timed iterations' forward and backward passes were launched.
    pub launched: Launched,
}

/// How a grid point's forward and backward passes were launched: as the trainer would launch
/// the module at that point ([`crate::runtime::graphed`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Launched {
    /// Op by op: on the CPU, a GPU-bound point, or graphs turned off.
    OpByOp,
    /// Replayed from CUDA graphs: the point was launch-bound.
    Graphed,
    /// Op by op although launch-bound, and why (the passes could not be captured, or their
    /// replay differed).
    Refused(String),
}

/// How a grid point's iterations run: op by op, or replaying its passes' CUDA graphs.
pub(super) struct Launch {
    graphs: Option<GraphedPasses>,
    /// What the point says of it.
    #[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))] // the GPU sweep's
    pub(super) launched: Launched,
}

impl Launch {
    /// Every op launched by the host.
    pub(super) fn op_by_op() -> Launch {
        Launch {
            graphs: None,
            launched: Launched::OpByOp,
        }
    }
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
    /// The machine (the host, when a GPU was profiled).
    pub machine: Machine,
    /// The GPU the modules ran on ([`super::sweep_gpu`]), or `None` for this machine's CPU.
    pub gpu: Option<GpuInfo>,
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
        if let Some(gpu) = &self.gpu {
            return gpu.sweep_source(&self.model, &self.config);
        }
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
        Ok(self.profile(None, points))
    }

    /// The profile of `points`, measured on `gpu` or on this machine's CPU.
    pub(super) fn profile(&self, gpu: Option<GpuInfo>, points: Vec<Point>) -> EngineProfile {
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
        EngineProfile {
            model: self.model.name.to_string(),
            config: self.config.clone(),
            machine: self.machine.clone(),
            gpu,
            modules,
            points,
        }
    }

    /// Module `m` at data-parallel degree `dp` in `slot`.
    fn measure_point(&self, m: usize, dp: usize, slot: &Slot) -> Result<Point, EngineError> {
        let run = Run::new(self, m, dp)?;
        let (memory, (runs, sm_util)) = slot.run(|| -> Result<_, EngineError> {
            let memory = run.warm_up()?;
            Ok((memory, busy_share(|| run.timed(self.config.reps))?))
        })?;
        let mut point = run.point(slot.quota(), slot.threads(), memory, runs);
        point.bw_util = (point.achieved_gbps / self.machine.peak_gbps).clamp(0.0, 1.0);
        point.sm_util = sm_util;
        Ok(point)
    }
}

/// One grid point's iterations of one module: the replica's shard and the other replicas'
/// stand-in gradients.
pub(super) struct Run<'a> {
    profiler: &'a Profiler,
    m: usize,
    dp: usize,
    shard: Shard,
    others: Vec<Vec<Tensor>>,
}

impl<'a> Run<'a> {
    /// Module `m` of `profiler` at data-parallel degree `dp`.
    pub(super) fn new(profiler: &'a Profiler, m: usize, dp: usize) -> Result<Run<'a>, EngineError> {
        let module = &profiler.model.modules[m];
        let others =
            stand_in_grads(&module.params, dp).map_err(EngineError::tensor(module.name))?;
        Ok(Run {
            profiler,
            m,
            dp,
            shard: shards(profiler.config.batch, dp).swap_remove(0),
            others,
        })
    }

    fn error(&self) -> impl FnOnce(candle_core::Error) -> EngineError + '_ {
        EngineError::tensor(self.profiler.model.modules[self.m].name)
    }

    /// One untimed iteration.
    pub(super) fn once(&self) -> Result<Timing, EngineError> {
        let (timing, _) = self
            .profiler
            .iterate(self.m, &self.shard, &self.others, false)
            .map_err(self.error())?;
        Ok(timing)
    }

    /// The warm-up iterations (at least one); what the replica holds, counted on the first.
    pub(super) fn warm_up(&self) -> Result<Memory, EngineError> {
        let mut memory = Memory::default();
        for w in 0..self.profiler.config.warmup.max(1) {
            let (_, counted) = self
                .profiler
                .iterate(self.m, &self.shard, &self.others, w == 0)
                .map_err(self.error())?;
            if let Some(c) = counted {
                memory = c;
            }
        }
        Ok(memory)
    }

    /// `reps` timed iterations.
    pub(super) fn timed(&self, reps: usize) -> Result<Vec<Timing>, EngineError> {
        (0..reps).map(|_| self.once()).collect()
    }

    /// How the trainer would launch the module here, from `runs` launched op by op: its passes
    /// captured as CUDA graphs where the median run is launch-bound
    /// ([`crate::runtime::graphed::launch_bound`]) and graphs are on (`MOSAIC_GRAPHS`), else op
    /// by op.
    #[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))] // the GPU sweep's
    pub(super) fn launch(&self, runs: &[Timing]) -> Result<Launch, EngineError> {
        let mid = median_run(runs);
        let op_by_op = Launch::op_by_op();
        if !GRAPHS.is_on() || !launch_bound(mid.host_ms, mid.forward_ms + mid.backward_ms) {
            return Ok(op_by_op);
        }
        Ok(
            match self
                .profiler
                .capture(self.m, &self.shard)
                .map_err(self.error())?
            {
                Ok(graphs) => Launch {
                    graphs: Some(graphs),
                    launched: Launched::Graphed,
                },
                Err(why) => Launch {
                    launched: Launched::Refused(why),
                    ..op_by_op
                },
            },
        )
    }

    /// One untimed iteration launched as `launch` says.
    pub(super) fn once_as(&self, launch: &Launch) -> Result<Timing, EngineError> {
        match &launch.graphs {
            Some(g) => (self.profiler)
                .iterate_graphed(self.m, g, &self.others)
                .map_err(self.error()),
            None => self.once(),
        }
    }

    /// `reps` timed iterations launched as `launch` says.
    #[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))] // the GPU sweep's
    pub(super) fn timed_as(
        &self,
        launch: &Launch,
        reps: usize,
    ) -> Result<Vec<Timing>, EngineError> {
        (0..reps).map(|_| self.once_as(launch)).collect()
    }

    /// The grid point of `runs` in a slot of `quota` and `cores`, its utilisations left at 0
    /// for the caller to measure.
    pub(super) fn point(
        &self,
        quota: f64,
        cores: usize,
        memory: Memory,
        runs: Vec<Timing>,
    ) -> Point {
        let parts = median_run(&runs);
        let time_ms = parts.total_ms();
        let total = |t: &Timing| t.total_ms();
        let min_ms = runs.iter().map(total).fold(f64::INFINITY, f64::min);
        let max_ms = runs.iter().map(total).fold(0.0, f64::max);
        let bytes = bytes_moved(&memory, self.dp);
        Point {
            module: self.profiler.model.modules[self.m].name.to_string(),
            dp: self.dp,
            sm: quota,
            cores,
            rows: self.shard.rows.len(),
            time_ms,
            min_ms,
            max_ms,
            parts,
            memory,
            bytes_moved: bytes,
            achieved_gbps: bytes as f64 / (time_ms * 1e6),
            bw_util: 0.0,
            sm_util: 0.0,
            recomputed: false,
            launched: Launched::OpByOp,
        }
    }
}

/// The median of `runs` by iteration time (the upper middle one for an even count).
fn median_run(runs: &[Timing]) -> Timing {
    let mut sorted = runs.to_vec();
    sorted.sort_by(|a, b| a.total_ms().total_cmp(&b.total_ms()));
    sorted[sorted.len() / 2]
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
            let passes = pt.parts.forward_ms + pt.parts.backward_ms;
            assert!(
                0.0 < pt.parts.host_ms && pt.parts.host_ms <= passes,
                "{pt:?}"
            );
            assert_eq!(pt.launched, Launched::OpByOp);
            assert!((0.0..=1.0).contains(&pt.sm_util) && (0.0..=1.0).contains(&pt.bw_util));
            assert_eq!(pt.cores, threads_for(pt.sm, 2));
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

    /// Off a GPU every pass is host time, so a point is launch-bound; its capture is refused
    /// and it stays op by op, saying why. A GPU-bound point never tries.
    #[test]
    fn a_launch_bound_point_that_cannot_be_graphed_stays_op_by_op_and_says_why() {
        let p = Profiler::new("clip-tiny", quick(4, 1), machine(2)).unwrap();
        let run = Run::new(&p, 0, 1).unwrap();
        run.warm_up().unwrap();
        let runs = run.timed(3).unwrap();
        let launch = run.launch(&runs).unwrap();
        match &launch.launched {
            Launched::Refused(why) => assert!(
                why.starts_with("the forward pass: CUDA graphs need"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
        let again = run.timed_as(&launch, 2).unwrap();
        assert!(again.iter().all(|t| t.total_ms() > 0.0 && t.host_ms > 0.0));
        let gpu_bound: Vec<Timing> = (runs.iter())
            .map(|t| Timing {
                host_ms: 0.4 * (t.forward_ms + t.backward_ms),
                ..*t
            })
            .collect();
        assert_eq!(run.launch(&gpu_bound).unwrap().launched, Launched::OpByOp);
    }
}
