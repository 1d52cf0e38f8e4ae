//! The simulator's output: iteration and stage times next to the plan's predictions, per-GPU
//! utilisation, the pool's utilisation over time and every slice of the timeline.

use serde::{Deserialize, Serialize};

/// The value of the `format` field of a [`SimReport`].
pub const REPORT_FORMAT: &str = "mosaic-sim/1";

/// What happened when a plan ran in the simulator.
///
/// Two utilisation measures, both as fractions of the SM-time the pool offers (GPUs × time):
/// - **utilisation**: SM-time spent computing at full rate. A replica with quota `a` that does
///   `F` FLOPs at its quota's matmul rate `R(a)` uses `a × F / R(a)`, however long it actually
///   takes: bandwidth stalls, host-launch waits and all-reduces add time, not use. A GPU whose
///   quotas are all filled by compute-bound modules for the whole iteration scores 1.
/// - **occupancy**: SM-time with a kernel resident, `a ×` the time a replica is running a
///   segment (stalled on bandwidth or not); host-launch waits, all-reduces and idle quota do
///   not count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    /// Always [`REPORT_FORMAT`].
    pub format: String,
    /// The plan file simulated.
    pub plan: String,
    /// The model.
    pub model: String,
    /// The cluster.
    pub cluster: String,
    /// The cluster's GPU.
    pub device: String,
    /// GPUs of the plan's pool (the first `gpus` GPUs of the cluster).
    pub gpus: u32,
    /// GPUs per node of the cluster.
    pub gpus_per_node: u32,
    /// SMs of the cluster's GPU: a slice's `quota` holds `quota × sm_count` of them (0 in
    /// reports written before it was recorded).
    #[serde(default)]
    pub sm_count: u32,
    /// Simulated iteration time, ms.
    pub iteration_ms: f64,
    /// The plan's predicted iteration time, ms.
    pub predicted_ms: f64,
    /// `(simulated − predicted) / predicted`: positive when the plan was optimistic.
    pub prediction_error: f64,
    /// Stages in execution order.
    pub stages: Vec<StageReport>,
    /// Per GPU of the pool.
    pub gpu_utilisation: Vec<GpuReport>,
    /// Mean utilisation over the pool's GPUs.
    pub mean_utilisation: f64,
    /// Lowest GPU utilisation.
    pub min_utilisation: f64,
    /// Mean occupancy over the pool's GPUs.
    pub mean_occupancy: f64,
    /// The pool's mean utilisation and occupancy over time, in equal bins.
    pub timeline: Vec<TimelinePoint>,
    /// Every compute and all-reduce slice, per GPU.
    pub slices: Vec<Slice>,
}

/// One stage of the simulated iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageReport {
    /// 0-based, as in the plan's `stages[i]`.
    pub index: usize,
    /// When it started, ms.
    pub start_ms: f64,
    /// Its simulated time (its slowest module, all-reduce included), ms.
    pub time_ms: f64,
    /// The plan's predicted stage time, ms.
    pub predicted_ms: f64,
    /// `(simulated − predicted) / predicted`.
    pub error: f64,
    /// Its modules, in plan order.
    pub modules: Vec<ModuleReport>,
}

/// One module of a stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModuleReport {
    /// Module name.
    pub name: String,
    /// Data-parallel degree.
    pub dp: u32,
    /// SM quota per GPU.
    pub sm: f64,
    /// Its GPUs.
    pub gpus: Vec<u32>,
    /// The plan's predicted time with interference, ms.
    pub predicted_ms: f64,
    /// The plan's predicted time alone (`f_m(dp, sm)`), ms.
    pub base_ms: f64,
    /// The device model's closed-form time at (dp, sm) (what the profile samples hold), ms.
    pub estimate_ms: f64,
    /// The simulator's time for the module alone on its GPUs and links, ms.
    pub alone_ms: f64,
    /// From the stage's start to its slowest replica's end of computing, ms.
    pub compute_ms: f64,
    /// Its gradient all-reduce (0 for frozen modules and one replica), ms.
    pub allreduce_ms: f64,
    /// From the stage's start to the end of its all-reduce, ms.
    pub time_ms: f64,
    /// Simulated slowdown by sharing: `time / alone − 1` (cf. the plan's `time / base − 1`).
    pub slowdown: f64,
}

/// Utilisation of one GPU over the iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuReport {
    /// GPU index.
    pub gpu: u32,
    /// Its node.
    pub node: u32,
    /// SM-time computing at full rate / SM-time (see [`SimReport`]).
    pub utilisation: f64,
    /// SM-time with a kernel resident / SM-time.
    pub occupancy: f64,
}

/// The pool's mean activity over one time bin.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimelinePoint {
    /// Bin start, ms.
    pub start_ms: f64,
    /// Bin end, ms.
    pub end_ms: f64,
    /// Mean utilisation over the pool in the bin.
    pub utilisation: f64,
    /// Mean occupancy over the pool in the bin.
    pub occupancy: f64,
}

/// What a slice of a GPU's time is spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The training step on the module's quota (host-launch waits included).
    Compute,
    /// The gradient ring all-reduce, from the slowest replica's end to the reduction's end.
    Allreduce,
}

impl Phase {
    /// `compute` or `allreduce`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Compute => "compute",
            Phase::Allreduce => "allreduce",
        }
    }
}

/// One module replica's phase on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slice {
    /// GPU index.
    pub gpu: u32,
    /// Its node.
    pub node: u32,
    /// Module name.
    pub module: String,
    /// Stage index (0-based).
    pub stage: usize,
    /// Start, ms.
    pub start_ms: f64,
    /// End, ms.
    pub end_ms: f64,
    /// SM quota.
    pub quota: f64,
    /// Position among the stage's modules on this GPU (0 = first in plan order): slices with
    /// one lane never overlap.
    pub lane: usize,
    /// Sum of the quotas of the modules before it on this GPU in this stage (where its band
    /// starts when the GPU is drawn as a stack of quotas).
    pub offset: f64,
    /// Compute or all-reduce.
    pub phase: Phase,
}

/// Relative error `(got − want) / want` (0 when `want` is 0).
pub(crate) fn relative(got: f64, want: f64) -> f64 {
    if want == 0.0 {
        0.0
    } else {
        (got - want) / want
    }
}
