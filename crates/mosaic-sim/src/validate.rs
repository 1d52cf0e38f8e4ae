//! Checking a plan against what the simulator runs it on: the plan file's own rules are
//! `mosaic_plan`'s ([`Plan::resolve`]); here, the cluster's device, size and memory.

use std::path::Path;

use mosaic_plan::{Assignment, ModuleGraph, Plan};
use mosaic_zoo::{Calibration, ClusterSpec, ModelSpec};

use crate::error::SimError;

/// The graph of a zoo model's modules, as plan errors name it (`model ofasys`).
fn graph(model: &ModelSpec) -> ModuleGraph {
    let index = |name: &String| model.modules.iter().position(|m| &m.name == name);
    ModuleGraph {
        model: format!("model {}", model.name),
        names: model.modules.iter().map(|m| m.name.clone()).collect(),
        producers: model
            .modules
            .iter()
            .map(|m| m.after.iter().filter_map(index).collect())
            .collect(),
    }
}

/// Resolves `plan` against `model` (the plan file's rules), then checks it against `cluster`:
/// its device, its size, its modules' nodes (where listed) under the cluster's node size and
/// every GPU's memory. The first violation found is returned.
pub(crate) fn resolve(
    plan: &Plan,
    file: &Path,
    model: &ModelSpec,
    cluster: &ClusterSpec,
    cal: &Calibration,
) -> Result<Vec<Vec<Assignment>>, SimError> {
    let f = || file.to_path_buf();
    check_cluster(cluster)?;
    let stages = plan.resolve(file, &graph(model))?;
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
    // A plan listing its modules' nodes was made for nodes of this size.
    plan.check_nodes(file, Some(cluster.gpus_per_node))?;
    for (si, stage) in stages.iter().enumerate() {
        check_memory(file, si, stage, plan.gpus, model, cluster, cal)?;
    }
    Ok(stages)
}

/// The modules of stage `si` fit in every GPU's memory, by the device model's ground truth
/// (not the plan's `mem_gib`).
fn check_memory(
    file: &Path,
    si: usize,
    stage: &[Assignment],
    pool: u32,
    model: &ModelSpec,
    cluster: &ClusterSpec,
    cal: &Calibration,
) -> Result<(), SimError> {
    let mut memory = vec![0.0; pool as usize];
    let mut names: Vec<Vec<&str>> = vec![Vec::new(); pool as usize];
    for a in stage {
        let mem = cal.estimate(model, a.module, cluster, a.dp, a.sm).mem_gib;
        for &gpu in &a.gpus {
            memory[gpu as usize] += mem;
            names[gpu as usize].push(&model.modules[a.module].name);
        }
    }
    let capacity = cluster.device.memory_gib;
    match (0..pool as usize).find(|&x| memory[x] > capacity + 1e-3) {
        Some(gpu) => Err(SimError::OutOfMemory {
            file: file.to_path_buf(),
            field: format!("stages[{si}]"),
            gpu: gpu as u32,
            need_gib: memory[gpu],
            capacity_gib: capacity,
            modules: names[gpu].join(", "),
        }),
        None => Ok(()),
    }
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
