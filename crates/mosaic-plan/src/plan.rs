//! The `mosaic-plan/1` file: stages, and per module its dp, quota, GPUs and predicted time,
//! as written from a solve ([`Plan::new`]); `read.rs` reads it back.

use serde::{Deserialize, Serialize};

use mosaic_profile::PerfModel;

use crate::stage_eval::StageAlloc;

/// The value of the `format` field of a plan file.
pub const PLAN_FORMAT: &str = "mosaic-plan/1";

/// A temporal-spatial plan as written to `--out` / `--json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Always [`PLAN_FORMAT`].
    pub format: String,
    /// Predicted iteration time: the sum of the stage times, in ms.
    pub iteration_ms: f64,
    /// The search that produced the plan: `gahc` (the paper's Alg. 1), `local` (GAHC then
    /// local moves) or `exact` (the exact search found it); other tools' names for baselines.
    pub search: String,
    /// Whether the plan is proven optimal for its profiles and pool.
    #[serde(default)]
    pub optimal: bool,
    /// A proven lower bound on every plan's iteration time, in ms, when the planner computed
    /// one: the plan is within `iteration_ms / lower_bound_ms − 1` of the optimum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower_bound_ms: Option<f64>,
    /// Wall-clock solve time in ms.
    pub solve_ms: f64,
    /// GPUs in the pool.
    pub gpus: u32,
    /// The device the profiles describe.
    pub device: String,
    /// Quota step as a fraction of a GPU: the `--granularity` the plan was solved at, or on a
    /// device with an SM partition rule its step over its SMs (`8/132` = 0.060606 on an H100:
    /// quotas are then whole partitions, k × 8 SMs over 132, or 1.0 for a module alone).
    pub granularity: f64,
    /// SMs per GPU, on a device with an SM partition rule: every quota is then a whole number
    /// of them (`sm × sm_count` SMs), and tables show SMs. Absent on devices without one, and
    /// in plans written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_count: Option<u32>,
    /// The built-in model the profiles describe, when planned from the zoo (`--model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The built-in cluster planned for, when given (`--cluster`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Stages in execution order.
    pub stages: Vec<PlanStage>,
}

/// One stage: modules that run at the same time, spatially sharing the GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanStage {
    /// Stage time (its slowest module), in ms.
    pub time_ms: f64,
    /// The stage's modules.
    pub modules: Vec<PlanModule>,
    /// SM quota used on each GPU of the pool during this stage.
    pub gpu_quota: Vec<f64>,
}

/// A module's deployment within its stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanModule {
    /// Module name.
    pub name: String,
    /// Data-parallel degree.
    pub dp: u32,
    /// SM quota on each of its GPUs.
    pub sm: f64,
    /// The GPUs holding its replicas.
    pub gpus: Vec<u32>,
    /// The nodes holding its replicas, ascending: GPU `g` lies on node `g / gpus_per_node` of
    /// the profile's `nodes` ([`crate::nodes::nodes_of`]). Empty when the profile has no node
    /// information (the pool is then one node), and in plans written before nodes were known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<u32>,
    /// Predicted time including interference, in ms; on a profile with nodes, also what its
    /// gradient all-reduce loses to spanning more nodes than its profile's packed placement
    /// ([`crate::nodes::cross_node_ms`]).
    pub time_ms: f64,
    /// Predicted time without interference, f_m(dp, sm), in ms.
    pub base_ms: f64,
    /// Predicted memory per GPU, in GiB.
    pub mem_gib: f64,
}

/// Rounds for display and files: times to µs, quotas to 1e-6.
pub(crate) fn round(x: f64, digits: i32) -> f64 {
    let k = 10f64.powi(digits);
    (x * k).round() / k
}

impl Plan {
    /// Builds the plan file of solved stages.
    pub fn new(
        model: &PerfModel,
        gpus: u32,
        stages: &[std::rc::Rc<StageAlloc>],
        search: &str,
        solve_ms: f64,
    ) -> Plan {
        let g = model.granularity();
        let granularity = match model.device.partition {
            Some(_) => round(g, 6),
            None => g,
        };
        let stages: Vec<PlanStage> = stages
            .iter()
            .map(|s| {
                let mut quota = vec![0u32; gpus as usize];
                for p in &s.placements {
                    for &x in &p.gpus {
                        quota[x as usize] += p.choice.units;
                    }
                }
                PlanStage {
                    time_ms: round(s.time_ms, 3),
                    modules: s
                        .placements
                        .iter()
                        .map(|p| PlanModule {
                            name: model.modules[p.module].name.clone(),
                            dp: p.choice.dp,
                            sm: round(model.quota(p.choice.units), 6),
                            gpus: p.gpus.clone(),
                            nodes: model.nodes.map_or_else(Vec::new, |n| {
                                crate::nodes::nodes_of(&p.gpus, n.gpus_per_node)
                            }),
                            time_ms: round(p.time_ms, 3),
                            base_ms: round(p.choice.time_ms, 3),
                            mem_gib: round(p.choice.mem_gib, 3),
                        })
                        .collect(),
                    gpu_quota: quota.iter().map(|&u| round(model.quota(u), 6)).collect(),
                }
            })
            .collect();
        Plan {
            format: PLAN_FORMAT.to_string(),
            iteration_ms: round(stages.iter().map(|s| s.time_ms).sum(), 3),
            search: search.to_string(),
            optimal: false,
            lower_bound_ms: None,
            solve_ms: round(solve_ms, 3),
            gpus,
            device: model.device.name.clone(),
            granularity,
            sm_count: model.device.partitioned_sms(),
            model: None,
            cluster: None,
            stages,
        }
    }
}
