//! The `mosaic-profiles/1` file: the paper's structured profiling JSON (Mosaic §4).

use serde::{Deserialize, Serialize};

use crate::partition::SmGranularity;

/// The value of the `format` field this crate reads and writes.
pub const FORMAT: &str = "mosaic-profiles/1";

/// A whole profile file: one device kind, the modules of one model and the interference
/// coefficients of Eq. 8.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    /// Always [`FORMAT`].
    pub format: String,
    /// The GPU every sample was taken on.
    pub device: Device,
    /// How the pool's GPUs are grouped into nodes, and the all-reduce bandwidth inside and
    /// across them; absent: the pool is one node (nothing is charged for spanning nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Nodes>,
    /// The model's modules; `after` edges make them a DAG.
    pub modules: Vec<ModuleProfile>,
    /// The interference coefficients `e1, e2, e3` (relative slowdown).
    pub interference: Interference,
    /// Where the file came from (free text: profiler, model, cluster); optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// The GPU kind the profiles were taken on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// Marketing name, e.g. `H100-SXM5-80GB`.
    pub name: String,
    /// Streaming multiprocessors per GPU.
    pub sm_count: u32,
    /// Memory per GPU in GiB: the capacity every GPU's placed modules must fit in.
    pub memory_gib: f64,
    /// The SM partitions the device's execution slots can hold (CUDA green contexts: Hopper
    /// `{"min_sms": 8, "step_sms": 8}`), when it has such a rule. With one, sample quotas are
    /// whole SM counts over `sm_count` and the planner's quotas are the partitions a split
    /// hands out (or the whole GPU for a module alone); without one, multiples of the
    /// planner's `--granularity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<SmGranularity>,
}

impl Device {
    /// Its SM count when it has a partition rule, so that every quota is a whole number of
    /// SMs; `None` without one.
    pub fn partitioned_sms(&self) -> Option<u32> {
        self.partition.map(|_| self.sm_count)
    }
}

/// The nodes of the pool the profile plans for, and the placement its samples assume.
///
/// GPUs are numbered node by node: node `k` holds GPUs `k·gpus_per_node ..
/// (k+1)·gpus_per_node` (the last node may be partial). The samples at `dp` = d were measured
/// (or modelled) with the d replicas *packed*: on ⌈d / gpus_per_node⌉ nodes, spread as evenly
/// as those nodes allow (full nodes when d is a multiple of `gpus_per_node`). A placement that
/// spans more nodes, or leaves fewer replicas on one of its nodes, all-reduces its gradients
/// more slowly than the samples say; the planner charges the difference
/// (`mosaic_plan::nodes::cross_node_ms`) from these bandwidths and the modules' `grad_gib`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nodes {
    /// GPUs per node (one NVLink domain), 1 to [`crate::MAX_GPUS`].
    pub gpus_per_node: u32,
    /// Bus bandwidth of a ring all-reduce inside a node, GB/s (10⁹ bytes) per GPU and direction:
    /// what NCCL reports as `busbw` over NVLink.
    pub intra_gbps: f64,
    /// Bus bandwidth a ring all-reduce reaches across nodes through one GPU's InfiniBand NIC,
    /// GB/s per direction. A ring spanning nodes is bounded by `inter_gbps` × the fewest of
    /// its GPUs on one node (NCCL runs one ring per NIC), and by `intra_gbps`.
    pub inter_gbps: f64,
}

/// One module of the model and its sampled scaling surface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleProfile {
    /// Unique module name.
    pub name: String,
    /// Modules whose output this module consumes (the DAG's incoming edges).
    pub after: Vec<String>,
    /// Measurements at (dp, sm) grid points.
    pub samples: Vec<Sample>,
    /// Gradient bytes each replica all-reduces per step, in GiB (0 for a frozen module);
    /// absent: unknown, and then nothing is charged for a placement spanning nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_gib: Option<f64>,
}

/// One measurement of a module's training iteration at a data-parallel degree and SM quota.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    /// Data-parallel degree: the number of GPUs holding a replica.
    pub dp: u32,
    /// SM quota on each of those GPUs, in (0, 1].
    pub sm: f64,
    /// One iteration (forward + backward + gradient sync) in milliseconds.
    pub time_ms: f64,
    /// Memory per GPU in GiB.
    pub mem_gib: f64,
    /// Achieved SM utilisation in [0, 1].
    pub sm_util: f64,
    /// Memory-bandwidth utilisation B(m, a) in [0, 1], the interference proxy of §3.3.
    pub bw_util: f64,
}

/// Coefficients of the interference rectification Δ = e1 + e2·ΣB + e3·ΠB (Eq. 8, relative form).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interference {
    /// Constant slowdown of any colocation.
    pub e1: f64,
    /// Additive term: slowdown per unit of summed bandwidth utilisation.
    pub e2: f64,
    /// Multiplicative term: slowdown per unit of the product of bandwidth utilisations.
    pub e3: f64,
}

impl Interference {
    /// Relative slowdown Δ_g of every module on a GPU hosting modules with these bandwidth
    /// utilisations: zero for a GPU with one module, else e1 + e2·ΣB + e3·ΠB.
    pub fn delta(&self, bw: impl IntoIterator<Item = f64>) -> f64 {
        let (mut n, mut sum, mut prod) = (0usize, 0.0, 1.0);
        for b in bw {
            n += 1;
            sum += b;
            prod *= b;
        }
        if n < 2 {
            0.0
        } else {
            self.e1 + self.e2 * sum + self.e3 * prod
        }
    }
}
