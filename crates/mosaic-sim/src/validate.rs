//! Reading a plan file and checking it against the model and the cluster it is simulated on.

use std::collections::HashMap;
use std::path::Path;

use mosaic_plan::{Plan, PLAN_FORMAT};
use mosaic_zoo::{Calibration, ClusterSpec, ModelSpec};

use crate::engine::{Placement, StageSpec};
use crate::error::SimError;

/// Reads and parses a `mosaic-plan/1` file; errors name the file and the field.
pub fn load_plan(path: impl AsRef<Path>) -> Result<Plan, SimError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| SimError::Io {
        file: path.to_path_buf(),
        source,
    })?;
    parse_plan(&text, path)
}

/// Parses a `mosaic-plan/1` file's text; `file` names it in errors. The `format` field is
/// checked first, so that a file of another kind gets that error rather than a complaint
/// about its fields.
pub fn parse_plan(text: &str, file: impl AsRef<Path>) -> Result<Plan, SimError> {
    let file = file.as_ref();
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) {
        match map.get("format") {
            Some(serde_json::Value::String(f)) if f == PLAN_FORMAT => {}
            Some(other) => {
                return Err(SimError::Format {
                    file: file.to_path_buf(),
                    found: other.to_string(),
                })
            }
            None => {
                return Err(SimError::Format {
                    file: file.to_path_buf(),
                    found: "no format field".into(),
                })
            }
        }
    }
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        SimError::Syntax {
            file: file.to_path_buf(),
            field: if field == "." { "(file)".into() } else { field },
            message: e.into_inner().to_string(),
        }
    })
}

/// Checks `plan` against `model` and `cluster` and resolves its placements; the first
/// violation found is returned.
pub(crate) fn resolve(
    plan: &Plan,
    file: &Path,
    model: &ModelSpec,
    cluster: &ClusterSpec,
    cal: &Calibration,
) -> Result<Vec<StageSpec>, SimError> {
    let f = || file.to_path_buf();
    if plan.format != PLAN_FORMAT {
        return Err(SimError::Format {
            file: f(),
            found: format!("\"{}\"", plan.format),
        });
    }
    check_cluster(cluster)?;
    if plan.device != cluster.device.name {
        return Err(SimError::DeviceMismatch {
            file: f(),
            plan: plan.device.clone(),
            cluster: cluster.name.clone(),
            device: cluster.device.name.clone(),
        });
    }
    if plan.gpus > cluster.gpus() {
        return Err(SimError::TooManyGpus {
            file: f(),
            gpus: plan.gpus,
            cluster: cluster.name.clone(),
            available: cluster.gpus(),
        });
    }
    let pool = plan.gpus;
    let known = || {
        model
            .modules
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Module index -> (stage, field of its name).
    let mut placed: HashMap<usize, (usize, String)> = HashMap::new();
    let mut stages = Vec::with_capacity(plan.stages.len());
    for (si, stage) in plan.stages.iter().enumerate() {
        let mut quota = vec![0.0; pool as usize];
        let mut memory = vec![0.0; pool as usize];
        let mut names: Vec<Vec<&str>> = vec![Vec::new(); pool as usize];
        let mut placements = Vec::with_capacity(stage.modules.len());
        for (mi, m) in stage.modules.iter().enumerate() {
            let at = format!("stages[{si}].modules[{mi}]");
            let module = model
                .modules
                .iter()
                .position(|x| x.name == m.name)
                .ok_or_else(|| SimError::UnknownModule {
                    file: f(),
                    field: format!("{at}.name"),
                    name: m.name.clone(),
                    model: model.name.clone(),
                    known: known(),
                })?;
            if let Some((_, first)) = placed.get(&module) {
                return Err(SimError::DuplicateModule {
                    file: f(),
                    field: format!("{at}.name"),
                    name: m.name.clone(),
                    first: first.clone(),
                });
            }
            placed.insert(module, (si, format!("{at}.name")));
            if !(m.sm > 0.0 && m.sm <= 1.0) {
                return Err(SimError::BadQuota {
                    file: f(),
                    field: format!("{at}.sm"),
                    sm: m.sm,
                });
            }
            let mut seen = Vec::with_capacity(m.gpus.len());
            for (k, &gpu) in m.gpus.iter().enumerate() {
                let field = format!("{at}.gpus[{k}]");
                if gpu >= pool {
                    return Err(SimError::GpuOutOfRange {
                        file: f(),
                        field,
                        gpu,
                        pool,
                    });
                }
                if seen.contains(&gpu) {
                    return Err(SimError::RepeatedGpu {
                        file: f(),
                        field,
                        gpu,
                    });
                }
                seen.push(gpu);
                quota[gpu as usize] += m.sm;
                if quota[gpu as usize] > 1.0 + 1e-6 {
                    return Err(SimError::Oversubscribed {
                        file: f(),
                        field,
                        gpu,
                        quota: quota[gpu as usize],
                    });
                }
            }
            if m.dp == 0 || m.dp as usize != m.gpus.len() {
                return Err(SimError::DpMismatch {
                    file: f(),
                    field: format!("{at}.dp"),
                    dp: m.dp,
                    gpus: m.gpus.len(),
                });
            }
            let mem = cal.estimate(model, module, cluster, m.dp, m.sm).mem_gib;
            for &gpu in &m.gpus {
                memory[gpu as usize] += mem;
                names[gpu as usize].push(&m.name);
            }
            placements.push(Placement {
                module,
                dp: m.dp,
                sm: m.sm,
                gpus: m.gpus.clone(),
            });
        }
        let capacity = cluster.device.memory_gib;
        if let Some(gpu) = (0..pool as usize).find(|&x| memory[x] > capacity + 1e-3) {
            return Err(SimError::OutOfMemory {
                file: f(),
                field: format!("stages[{si}]"),
                gpu: gpu as u32,
                need_gib: memory[gpu],
                capacity_gib: capacity,
                modules: names[gpu].join(", "),
            });
        }
        stages.push(StageSpec { placements });
    }
    if let Some(m) = (0..model.modules.len()).find(|i| !placed.contains_key(i)) {
        return Err(SimError::MissingModule {
            file: f(),
            name: model.modules[m].name.clone(),
            model: model.name.clone(),
        });
    }
    for (i, m) in model.modules.iter().enumerate() {
        let (stage, field) = &placed[&i];
        for producer in &m.after {
            let Some(p) = model.modules.iter().position(|x| &x.name == producer) else {
                continue;
            };
            let producer_stage = placed[&p].0;
            if producer_stage >= *stage {
                return Err(SimError::Order {
                    file: f(),
                    field: field.clone(),
                    name: m.name.clone(),
                    stage: *stage,
                    producer: producer.clone(),
                    producer_stage,
                });
            }
        }
    }
    Ok(stages)
}

/// A cluster the fluid model can run on: positive peak, bandwidths and node size.
pub(crate) fn check_cluster(cluster: &ClusterSpec) -> Result<(), SimError> {
    let bad = |message: &str| {
        Err(SimError::BadCluster {
            cluster: cluster.name.clone(),
            message: message.into(),
        })
    };
    let d = &cluster.device;
    // Written so that NaN is not positive either.
    let positive = |x: f64| x > 0.0;
    if cluster.gpus_per_node == 0 || cluster.nodes == 0 {
        return bad("no GPUs");
    }
    if !(positive(d.peak_tflops) && positive(d.hbm_tbps)) {
        return bad("device peak FLOP/s and HBM bandwidth must be positive");
    }
    if !positive(cluster.nvlink_gbps) {
        return bad("NVLink bandwidth must be positive");
    }
    if cluster.nodes > 1 && !positive(cluster.ib_gbps) {
        return bad("InfiniBand bandwidth must be positive across nodes");
    }
    Ok(())
}
