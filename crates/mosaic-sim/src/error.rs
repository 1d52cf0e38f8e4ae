//! The one error type of this crate: a plan that cannot be read, or that does not fit the model
//! or the cluster it is simulated on. Every variant names the plan file and the field, but for
//! a cluster that makes no sense.

use std::path::{Path, PathBuf};

use mosaic_plan::PlanFileError;

/// A plan the simulator refuses, with the file and the field (e.g. `stages[1].modules[2].gpus[0]`).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The plan file is unreadable, or breaks the rules of the `mosaic-plan/1` format against
    /// the model's modules.
    #[error(transparent)]
    Plan(#[from] PlanFileError),
    /// The plan was made for another GPU than the cluster's.
    #[error(
        "{file}: field `device`: the plan is for {plan} but cluster {cluster} has {device}",
        file = file.display()
    )]
    DeviceMismatch {
        /// The plan file.
        file: PathBuf,
        /// The plan's device.
        plan: String,
        /// The cluster's name.
        cluster: String,
        /// The cluster's device.
        device: String,
    },
    /// The plan's pool is larger than the cluster.
    #[error(
        "{file}: field `gpus`: the plan needs {gpus} GPUs but cluster {cluster} has {available}",
        file = file.display()
    )]
    TooManyGpus {
        /// The plan file.
        file: PathBuf,
        /// The plan's pool size.
        gpus: u32,
        /// The cluster's name.
        cluster: String,
        /// The cluster's GPUs.
        available: u32,
    },
    /// The modules of a stage on one GPU need more memory than it has (ground-truth memory of
    /// the device model, not the plan's `mem_gib`).
    #[error(
        "{file}: field `{field}`: GPU {gpu} needs {need_gib:.2} GiB for {modules}, more than its \
         {capacity_gib} GiB",
        file = file.display()
    )]
    OutOfMemory {
        /// The plan file.
        file: PathBuf,
        /// The stage, e.g. `stages[0]`.
        field: String,
        /// The GPU index.
        gpu: u32,
        /// Memory the modules need.
        need_gib: f64,
        /// The device's memory.
        capacity_gib: f64,
        /// The modules on that GPU, comma-separated.
        modules: String,
    },
    /// A cluster whose bandwidths or peak make no sense (not positive).
    #[error("cluster {cluster}: {message}")]
    BadCluster {
        /// The cluster's name.
        cluster: String,
        /// What is wrong.
        message: String,
    },
}

impl SimError {
    /// The plan field the error is about, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            SimError::Plan(e) => e.field(),
            SimError::BadCluster { .. } => None,
            SimError::DeviceMismatch { .. } => Some("device"),
            SimError::TooManyGpus { .. } => Some("gpus"),
            SimError::OutOfMemory { field, .. } => Some(field),
        }
    }

    /// The plan file the error is about, if any.
    pub fn file(&self) -> Option<&Path> {
        match self {
            SimError::Plan(e) => Some(e.file()),
            SimError::BadCluster { .. } => None,
            SimError::DeviceMismatch { file, .. }
            | SimError::TooManyGpus { file, .. }
            | SimError::OutOfMemory { file, .. } => Some(file),
        }
    }
}
