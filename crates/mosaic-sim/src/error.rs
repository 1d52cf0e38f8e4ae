//! The one error type of this crate: a plan that cannot be read, or that does not fit the model
//! or the cluster it is simulated on. Every variant names the plan file and the field.

use std::path::{Path, PathBuf};

use mosaic_plan::PLAN_FORMAT;

/// A plan the simulator refuses, with the file and the field (e.g. `stages[1].modules[2].gpus[0]`).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The plan file could not be read at all.
    #[error("{file}: cannot read: {source}", file = file.display())]
    Io {
        /// The plan file.
        file: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The JSON is malformed, or a field is missing or has the wrong type.
    #[error("{file}: field `{field}`: {message}", file = file.display())]
    Syntax {
        /// The plan file.
        file: PathBuf,
        /// Path of the offending field.
        field: String,
        /// What the parser expected.
        message: String,
    },
    /// The `format` field is missing or is not [`PLAN_FORMAT`].
    #[error("{file}: field `format`: expected \"{PLAN_FORMAT}\", found {found}", file = file.display())]
    Format {
        /// The plan file.
        file: PathBuf,
        /// What the file has instead (`missing` when absent).
        found: String,
    },
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
    /// A module the model does not have.
    #[error(
        "{file}: field `{field}`: unknown module \"{name}\"; model {model} has {known}",
        file = file.display()
    )]
    UnknownModule {
        /// The plan file.
        file: PathBuf,
        /// e.g. `stages[0].modules[3].name`.
        field: String,
        /// The unknown name.
        name: String,
        /// The model's name.
        model: String,
        /// The model's module names, comma-separated.
        known: String,
    },
    /// A module placed in two places.
    #[error(
        "{file}: field `{field}`: module \"{name}\" is placed twice (first at `{first}`)",
        file = file.display()
    )]
    DuplicateModule {
        /// The plan file.
        file: PathBuf,
        /// The second placement, e.g. `stages[2].modules[0].name`.
        field: String,
        /// The module.
        name: String,
        /// The first placement.
        first: String,
    },
    /// A module of the model that no stage runs.
    #[error(
        "{file}: field `stages`: module \"{name}\" of model {model} is not placed in any stage",
        file = file.display()
    )]
    MissingModule {
        /// The plan file.
        file: PathBuf,
        /// The module.
        name: String,
        /// The model's name.
        model: String,
    },
    /// A module that runs no later than a module it consumes.
    #[error(
        "{file}: field `{field}`: module \"{name}\" runs in stage {stage} but its producer \
         \"{producer}\" runs in stage {producer_stage}; producers must run in earlier stages",
        file = file.display()
    )]
    Order {
        /// The plan file.
        file: PathBuf,
        /// The consumer's placement, e.g. `stages[0].modules[1].name`.
        field: String,
        /// The consumer.
        name: String,
        /// Its stage (0-based, as in the field path).
        stage: usize,
        /// The producer.
        producer: String,
        /// The producer's stage (0-based).
        producer_stage: usize,
    },
    /// `dp` is 0 or differs from the number of GPUs listed.
    #[error(
        "{file}: field `{field}`: dp {dp} but {gpus} GPU(s) listed; dp must be at least 1 and \
         equal the number of GPUs",
        file = file.display()
    )]
    DpMismatch {
        /// The plan file.
        file: PathBuf,
        /// e.g. `stages[0].modules[1].dp`.
        field: String,
        /// The module's dp.
        dp: u32,
        /// GPUs listed.
        gpus: usize,
    },
    /// A quota outside (0, 1].
    #[error("{file}: field `{field}`: SM quota {sm} outside (0, 1]", file = file.display())]
    BadQuota {
        /// The plan file.
        file: PathBuf,
        /// e.g. `stages[0].modules[1].sm`.
        field: String,
        /// The quota.
        sm: f64,
    },
    /// A GPU index outside the plan's pool or the cluster.
    #[error(
        "{file}: field `{field}`: GPU {gpu} is outside the pool of {pool} GPU(s) (GPUs are \
         numbered from 0)",
        file = file.display()
    )]
    GpuOutOfRange {
        /// The plan file.
        file: PathBuf,
        /// e.g. `stages[1].modules[2].gpus[0]`.
        field: String,
        /// The GPU index.
        gpu: u32,
        /// GPUs in the pool (the smaller of the plan's and the cluster's).
        pool: u32,
    },
    /// A GPU listed twice by one module.
    #[error("{file}: field `{field}`: GPU {gpu} is listed twice", file = file.display())]
    RepeatedGpu {
        /// The plan file.
        file: PathBuf,
        /// The second occurrence, e.g. `stages[1].modules[2].gpus[3]`.
        field: String,
        /// The GPU index.
        gpu: u32,
    },
    /// The quotas of a stage's modules on one GPU add up to more than the whole GPU.
    #[error(
        "{file}: field `{field}`: the quotas on GPU {gpu} add up to {quota:.3} > 1",
        file = file.display()
    )]
    Oversubscribed {
        /// The plan file.
        file: PathBuf,
        /// The stage, e.g. `stages[0]`.
        field: String,
        /// The GPU index.
        gpu: u32,
        /// The summed quota.
        quota: f64,
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
            SimError::Io { .. } | SimError::BadCluster { .. } => None,
            SimError::Format { .. } => Some("format"),
            SimError::DeviceMismatch { .. } => Some("device"),
            SimError::TooManyGpus { .. } => Some("gpus"),
            SimError::MissingModule { .. } => Some("stages"),
            SimError::Syntax { field, .. }
            | SimError::UnknownModule { field, .. }
            | SimError::DuplicateModule { field, .. }
            | SimError::Order { field, .. }
            | SimError::DpMismatch { field, .. }
            | SimError::BadQuota { field, .. }
            | SimError::GpuOutOfRange { field, .. }
            | SimError::RepeatedGpu { field, .. }
            | SimError::Oversubscribed { field, .. }
            | SimError::OutOfMemory { field, .. } => Some(field),
        }
    }

    /// The plan file the error is about, if any.
    pub fn file(&self) -> Option<&Path> {
        match self {
            SimError::BadCluster { .. } => None,
            SimError::Io { file, .. }
            | SimError::Syntax { file, .. }
            | SimError::Format { file, .. }
            | SimError::DeviceMismatch { file, .. }
            | SimError::TooManyGpus { file, .. }
            | SimError::UnknownModule { file, .. }
            | SimError::DuplicateModule { file, .. }
            | SimError::MissingModule { file, .. }
            | SimError::Order { file, .. }
            | SimError::DpMismatch { file, .. }
            | SimError::BadQuota { file, .. }
            | SimError::GpuOutOfRange { file, .. }
            | SimError::RepeatedGpu { file, .. }
            | SimError::Oversubscribed { file, .. }
            | SimError::OutOfMemory { file, .. } => Some(file),
        }
    }
}
