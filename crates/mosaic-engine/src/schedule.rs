//! From a `mosaic-plan/1` plan to what the engine executes: stages of placements, each a
//! module with its data-parallel degree and its slot.
//!
//! How a GPU plan maps onto CPU processes: a module's `dp` becomes `dp` replicas that split
//! the batch (see [`crate::collective`]); replica `k` runs on the rank holding the plan GPU
//! `gpus[k]`, the plan's GPUs being spread over the run's ranks in contiguous blocks as GPUs
//! are over nodes ([`Schedule::ranks`]); its `sm` quota becomes its slot's thread count,
//! `max(1, round(sm × cores))`. The plan's device and predicted times are not used. The
//! plan's stage order and stage membership are followed exactly.

use std::collections::HashMap;
use std::path::Path;

use mosaic_plan::{Plan, PlanModule, PlanStage, PLAN_FORMAT};
use serde::Serialize;

use crate::error::EngineError;
use crate::model::Model;
use crate::slot::{threads_for, SlotSpec};

/// One module's place in a stage.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Placement {
    /// Index in [`Model::modules`].
    #[serde(skip)]
    pub module: usize,
    /// Its name.
    pub name: String,
    /// Data-parallel replicas.
    pub dp: usize,
    /// The plan's SM quota.
    pub sm: f64,
    /// The plan GPU of each replica.
    pub gpus: Vec<usize>,
    /// Threads of its slot.
    pub threads: usize,
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
                        module: i,
                        name: m.name.to_string(),
                        dp: 1,
                        sm: 1.0,
                        gpus: vec![0],
                        threads: threads_for(1.0, cores),
                    }]
                })
                .collect(),
        }
    }

    /// Checks `plan` (read from `file`) against `model` and a batch of `batch` samples:
    /// every module of the model placed exactly once, producers in earlier stages, `dp` at
    /// least 1, at most the batch and equal to the number of GPUs listed, quotas in (0, 1].
    /// The first violation is returned, naming the file and the field.
    pub fn from_plan(
        plan: &Plan,
        file: &Path,
        model: &Model,
        batch: usize,
        cores: usize,
    ) -> Result<Schedule, EngineError> {
        if batch == 0 {
            return Err(EngineError::BadSetting {
                setting: "--batch".into(),
                message: "expected at least 1 sample".into(),
            });
        }
        let f = || file.to_path_buf();
        let mut placed: HashMap<usize, (usize, String)> = HashMap::new();
        let mut stages = Vec::with_capacity(plan.stages.len());
        for (si, stage) in plan.stages.iter().enumerate() {
            let mut placements = Vec::with_capacity(stage.modules.len());
            for (mi, m) in stage.modules.iter().enumerate() {
                let at = format!("stages[{si}].modules[{mi}]");
                let module = model
                    .index_of(&m.name)
                    .ok_or_else(|| EngineError::UnknownModule {
                        file: f(),
                        field: format!("{at}.name"),
                        name: m.name.clone(),
                        model: model.name.to_string(),
                        known: model.module_names(),
                    })?;
                if let Some((_, first)) = placed.get(&module) {
                    return Err(EngineError::DuplicateModule {
                        file: f(),
                        field: format!("{at}.name"),
                        name: m.name.clone(),
                        first: first.clone(),
                    });
                }
                placed.insert(module, (si, format!("{at}.name")));
                check_dp(m, &f(), &format!("{at}.dp"), batch)?;
                check_gpus(m, &f(), &format!("{at}.gpus"), plan.gpus)?;
                if !(m.sm > 0.0 && m.sm <= 1.0) {
                    return Err(EngineError::BadQuota {
                        file: f(),
                        field: format!("{at}.sm"),
                        sm: m.sm,
                    });
                }
                placements.push(Placement {
                    module,
                    name: model.modules[module].name.to_string(),
                    dp: m.dp as usize,
                    sm: m.sm,
                    gpus: m.gpus.iter().map(|&g| g as usize).collect(),
                    threads: threads_for(m.sm, cores),
                });
            }
            if !placements.is_empty() {
                stages.push(placements);
            }
        }
        if let Some(m) = (0..model.modules.len()).find(|i| !placed.contains_key(i)) {
            return Err(EngineError::MissingModule {
                file: f(),
                name: model.modules[m].name.to_string(),
                model: model.name.to_string(),
            });
        }
        for (i, m) in model.modules.iter().enumerate() {
            let (stage, field) = &placed[&i];
            for p in model.producers(i) {
                let producer_stage = placed[&p].0;
                if producer_stage >= *stage {
                    return Err(EngineError::Order {
                        file: f(),
                        field: field.clone(),
                        name: m.name.to_string(),
                        stage: *stage,
                        producer: model.modules[p].name.to_string(),
                        producer_stage,
                    });
                }
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
            specs[p.module] = Some(SlotSpec {
                module: p.name.clone(),
                quota: p.sm,
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
            .find(|p| p.module == module)
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
            ranks[p.module] = p.gpus.iter().map(|&g| g * world / self.pool).collect();
        }
        Ok(ranks)
    }

    /// A one-line picture: `[vision×2@0.5 text@0.5] → [align]`.
    pub fn describe(&self) -> String {
        self.stages
            .iter()
            .map(|s| {
                let mods: Vec<String> = s
                    .iter()
                    .map(|p| {
                        let dp = if p.dp > 1 {
                            format!("×{}", p.dp)
                        } else {
                            String::new()
                        };
                        format!("{}{dp}@{}t", p.name, p.threads)
                    })
                    .collect();
                format!("[{}]", mods.join(" "))
            })
            .collect::<Vec<_>>()
            .join(" → ")
    }
}

fn check_dp(m: &PlanModule, file: &Path, field: &str, batch: usize) -> Result<(), EngineError> {
    let bad = |message: String| {
        Err(EngineError::BadDp {
            file: file.to_path_buf(),
            field: field.to_string(),
            message,
        })
    };
    if m.dp == 0 {
        return bad("dp must be at least 1".into());
    }
    if m.dp as usize != m.gpus.len() {
        return bad(format!(
            "dp {} but {} GPU(s) listed; dp must equal the number of GPUs",
            m.dp,
            m.gpus.len()
        ));
    }
    if m.dp as usize > batch {
        return bad(format!(
            "dp {} is more replicas than the {batch} samples of a batch (--batch)",
            m.dp
        ));
    }
    Ok(())
}

/// Checks that a module's GPUs are distinct GPUs of the plan's pool of `pool`.
fn check_gpus(m: &PlanModule, file: &Path, field: &str, pool: u32) -> Result<(), EngineError> {
    for (i, &g) in m.gpus.iter().enumerate() {
        let message = if g >= pool {
            format!("GPU {g} is outside the plan's pool of {pool} (field `gpus`)")
        } else if m.gpus[..i].contains(&g) {
            format!("GPU {g} is listed twice; each replica needs its own GPU")
        } else {
            continue;
        };
        return Err(EngineError::BadDp {
            file: file.to_path_buf(),
            field: format!("{field}[{i}]"),
            message,
        });
    }
    Ok(())
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
        solve_ms: 0.0,
        gpus: gpus as u32,
        device: "cpu".into(),
        granularity: 0.1,
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
                    time_ms: 0.0,
                    base_ms: 0.0,
                    mem_gib: 0.0,
                }],
            })
            .collect(),
    }
}
