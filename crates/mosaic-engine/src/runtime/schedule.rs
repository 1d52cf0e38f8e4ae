//! From a `mosaic-plan/1` plan to what the engine executes: stages of placements, each the
//! plan's resolved assignment of a module (its data-parallel degree, quota and GPUs) and the
//! slot the engine gives it.
//!
//! How a GPU plan maps onto CPU processes: a module's `dp` becomes `dp` replicas that split
//! the batch (see [`crate::runtime::collective`]); replica `k` runs on the rank holding the
//! plan GPU `gpus[k]`, the plan's GPUs being spread over the run's ranks in contiguous blocks
//! as GPUs are over nodes ([`Schedule::ranks`]); its `sm` quota becomes its slot's thread count,
//! `max(1, round(sm × cores))`. The plan's device and predicted times are not used. The
//! plan's stage order and stage membership are followed exactly.

use std::path::Path;

use mosaic_plan::{Assignment, ModuleGraph, Plan, PlanModule, PlanStage, PLAN_FORMAT};
use serde::ser::SerializeStruct;
use serde::Serialize;

use super::slot::{threads_for, SlotSpec};
use crate::error::EngineError;
use crate::models::Model;

/// One module's place in a stage: the plan's assignment, resolved against the model, and what
/// the engine adds to it. The module's name is kept beside the index so that a schedule
/// describes and logs itself without the model. Serialises as `{"name", "dp", "sm", "gpus",
/// "threads"}` (what `mosaic train` logs).
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// The module (index in [`Model::modules`]), its data-parallel degree, its SM quota and
    /// the plan GPU of each replica.
    pub assignment: Assignment,
    /// The module's name.
    pub name: String,
    /// Threads of its slot: `max(1, round(sm × cores))`.
    pub threads: usize,
}

impl Placement {
    /// The module's index in [`Model::modules`].
    pub fn module(&self) -> usize {
        self.assignment.module
    }

    /// Data-parallel replicas.
    pub fn dp(&self) -> usize {
        self.assignment.dp as usize
    }
}

impl Serialize for Placement {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let a = &self.assignment;
        let mut out = s.serialize_struct("Placement", 5)?;
        out.serialize_field("name", &self.name)?;
        out.serialize_field("dp", &a.dp)?;
        out.serialize_field("sm", &a.sm)?;
        out.serialize_field("gpus", &a.gpus)?;
        out.serialize_field("threads", &self.threads)?;
        out.end()
    }
}

/// What the trainer executes: stages in order, the modules of a stage at the same time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Schedule {
    /// Where it came from (a plan file, or `sequential`).
    pub source: String,
    /// Cores the quotas were turned into threads with.
    pub cores: usize,
    /// GPUs of the plan's pool.
    pub pool: usize,
    /// Stages in order.
    pub stages: Vec<Vec<Placement>>,
}

impl Schedule {
    /// Every module its own stage in model order, dp 1, quota 1.0: the plan
    /// [`sequential_plan`] writes.
    pub fn sequential(model: &Model, cores: usize) -> Schedule {
        Schedule {
            source: "sequential".into(),
            cores,
            pool: 1,
            stages: model
                .modules
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    vec![Placement {
                        assignment: Assignment {
                            module: i,
                            dp: 1,
                            sm: 1.0,
                            gpus: vec![0],
                        },
                        name: m.name.to_string(),
                        threads: threads_for(1.0, cores),
                    }]
                })
                .collect(),
        }
    }

    /// Resolves `plan` (read from `file`) against `model` by the plan file's rules
    /// ([`Plan::resolve`]), then checks what is the engine's: a module's `dp` is at most the
    /// `batch` it splits. The first violation is returned, naming the file and the field.
    pub fn from_plan(
        plan: &Plan,
        file: &Path,
        model: &Model,
        batch: usize,
        cores: usize,
    ) -> Result<Schedule, EngineError> {
        crate::models::data::check_batch(batch)?;
        let resolved = plan.resolve(file, &graph(model))?;
        let mut stages = Vec::with_capacity(resolved.len());
        for (si, stage) in resolved.into_iter().enumerate() {
            let mut placements = Vec::with_capacity(stage.len());
            for (mi, a) in stage.into_iter().enumerate() {
                if a.dp as usize > batch {
                    return Err(EngineError::BadDp {
                        file: file.to_path_buf(),
                        field: format!("stages[{si}].modules[{mi}].dp"),
                        message: format!(
                            "dp {} is more replicas than the {batch} samples of a batch (--batch)",
                            a.dp
                        ),
                    });
                }
                placements.push(Placement {
                    name: model.modules[a.module].name.to_string(),
                    threads: threads_for(a.sm, cores),
                    assignment: a,
                });
            }
            if !placements.is_empty() {
                stages.push(placements);
            }
        }
        Ok(Schedule {
            source: file.display().to_string(),
            cores,
            pool: plan.gpus as usize,
            stages,
        })
    }

    /// The slot every module needs, indexed by module.
    pub fn slot_specs(&self, modules: usize) -> Vec<SlotSpec> {
        let mut specs = vec![None; modules];
        for p in self.stages.iter().flatten() {
            specs[p.module()] = Some(SlotSpec {
                module: p.name.clone(),
                quota: p.assignment.sm,
                threads: p.threads,
            });
        }
        specs
            .into_iter()
            .map(|s| s.expect("a schedule places every module"))
            .collect()
    }

    /// The placement of module `module`.
    pub fn placement(&self, module: usize) -> &Placement {
        self.stages
            .iter()
            .flatten()
            .find(|p| p.module() == module)
            .expect("a schedule places every module")
    }

    /// The rank of every replica of every module (indexed by module, then replica) when the
    /// plan's GPUs are spread over `world` ranks in contiguous blocks, GPU `g` on rank
    /// `⌊g · world / pool⌋`: on one rank everything is local; on as many ranks as GPUs, GPU
    /// `g` is rank `g`. Every rank needs at least one GPU of the plan.
    pub fn ranks(&self, modules: usize, world: usize) -> Result<Vec<Vec<usize>>, EngineError> {
        if world == 0 || world > self.pool {
            return Err(EngineError::Ranks {
                plan: self.source.clone(),
                message: format!(
                    "the plan has {} GPU(s) but the run has {world} rank(s); write a plan for \
                     at least {world} GPUs (e.g. `mosaic plan ... --gpus {world}`)",
                    self.pool
                ),
            });
        }
        let mut ranks = vec![Vec::new(); modules];
        for p in self.stages.iter().flatten() {
            ranks[p.module()] = (p.assignment.gpus.iter())
                .map(|&g| g as usize * world / self.pool)
                .collect();
        }
        Ok(ranks)
    }

    /// A one-line picture with each slot's threads: `[vision×2@1t text@1t] → [align@2t]`.
    pub fn describe(&self) -> String {
        self.describe_with(|p| format!("{}t", p.threads))
    }

    /// The stages as `[vision×2@X text@X] → [align@X]`, X being `at(placement)`.
    pub fn describe_with(&self, at: impl Fn(&Placement) -> String) -> String {
        self.stages
            .iter()
            .map(|s| {
                let mods: Vec<String> = s
                    .iter()
                    .map(|p| {
                        let dp = if p.dp() > 1 {
                            format!("×{}", p.dp())
                        } else {
                            String::new()
                        };
                        format!("{}{dp}@{}", p.name, at(p))
                    })
                    .collect();
                format!("[{}]", mods.join(" "))
            })
            .collect::<Vec<_>>()
            .join(" → ")
    }
}

/// The graph of an engine model's modules, as plan errors name it (`engine model clip-tiny`).
fn graph(model: &Model) -> ModuleGraph {
    ModuleGraph {
        model: format!("engine model {}", model.name),
        names: model.modules.iter().map(|m| m.name.to_string()).collect(),
        producers: (0..model.modules.len())
            .map(|m| model.producers(m).collect())
            .collect(),
    }
}

/// Plain data parallelism on `gpus` GPUs as a `mosaic-plan/1` file a user can edit: every
/// module its own stage in model order, replicated on GPUs `0..gpus` at quota 1.0 (with one
/// GPU, the plan [`Schedule::sequential`] runs). Its times are 0: nothing was predicted.
pub fn sequential_plan(model: &Model, gpus: usize) -> Plan {
    let gpus = gpus.max(1);
    Plan {
        format: PLAN_FORMAT.to_string(),
        iteration_ms: 0.0,
        search: "sequential".into(),
        optimal: false,
        lower_bound_ms: None,
        solve_ms: 0.0,
        gpus: gpus as u32,
        device: "cpu".into(),
        granularity: 0.1,
        sm_count: None,
        model: Some(model.name.to_string()),
        cluster: None,
        stages: model
            .modules
            .iter()
            .map(|m| PlanStage {
                time_ms: 0.0,
                gpu_quota: vec![1.0; gpus],
                modules: vec![PlanModule {
                    name: m.name.to_string(),
                    dp: gpus as u32,
                    sm: 1.0,
                    gpus: (0..gpus as u32).collect(),
                    nodes: Vec::new(),
                    time_ms: 0.0,
                    base_ms: 0.0,
                    mem_gib: 0.0,
                }],
            })
            .collect(),
    }
}
