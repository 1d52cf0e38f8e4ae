//! From a `mosaic-plan/1` plan to what the engine executes: stages of placements, each a
//! module with its data-parallel degree and its slot.
//!
//! How a GPU plan maps onto this machine: a module's `dp` becomes `dp` in-process replicas
//! that split the batch (see [`crate::collective`]); its `sm` quota becomes its slot's thread
//! count, `max(1, round(sm × cores))`; its `gpus` list and the plan's pool size, device and
//! predicted times are not used on a CPU (every replica runs on this machine's cores). The
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

/// The plan [`Schedule::sequential`] runs, as a `mosaic-plan/1` file a user can edit: every
/// module its own stage on GPU 0 at quota 1.0. Its times are 0: nothing was predicted.
pub fn sequential_plan(model: &Model) -> Plan {
    Plan {
        format: PLAN_FORMAT.to_string(),
        iteration_ms: 0.0,
        search: "sequential".into(),
        solve_ms: 0.0,
        gpus: 1,
        device: "cpu".into(),
        granularity: 0.1,
        model: Some(model.name.to_string()),
        cluster: None,
        stages: model
            .modules
            .iter()
            .map(|m| PlanStage {
                time_ms: 0.0,
                gpu_quota: vec![1.0],
                modules: vec![PlanModule {
                    name: m.name.to_string(),
                    dp: 1,
                    sm: 1.0,
                    gpus: vec![0],
                    time_ms: 0.0,
                    base_ms: 0.0,
                    mem_gib: 0.0,
                }],
            })
            .collect(),
    }
}
