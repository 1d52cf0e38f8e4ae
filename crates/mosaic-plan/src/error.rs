//! The planner's errors: why no plan could be made ([`PlanError`]), and why a plan file is
//! refused ([`PlanFileError`]).

use std::path::{Path, PathBuf};

use crate::plan::PLAN_FORMAT;

/// The most characters of a parser's message, or of a list of names, that an error quotes:
/// the user's text they echo is clipped ([`mosaic_kit::text`]).
const MAX_MESSAGE_CHARS: usize = 1000;

/// Why no plan could be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The pool has no GPU.
    #[error("--gpus: expected at least one GPU")]
    NoGpus,
    /// A pool larger than the planner takes.
    #[error("--gpus: {gpus} GPUs is more than the {max} the planner takes", max = crate::MAX_GPUS)]
    TooManyGpus {
        /// The pool asked for.
        gpus: u32,
    },
    /// A module has no profiled candidate that fits the pool.
    #[error(
        "module \"{module}\" cannot be placed on {gpus} GPU(s): no profiled dp ≤ {gpus} fits in \
         {memory_gib} GiB per GPU",
        module = mosaic_kit::text::name(module)
    )]
    Unplaceable {
        /// Module name.
        module: String,
        /// Pool size.
        gpus: u32,
        /// Device memory.
        memory_gib: f64,
    },
}

/// A `mosaic-plan/1` file that cannot be read, or that does not fit the model it is run for.
/// Every variant but [`PlanFileError::Io`] names the file and the field (e.g.
/// `stages[1].modules[2].gpus[0]`); the simulator and the engine add only their own checks.
#[derive(Debug, thiserror::Error)]
pub enum PlanFileError {
    /// The plan file could not be read at all.
    #[error("{file}: cannot read: {error}", file = file.display())]
    Io {
        /// The plan file.
        file: PathBuf,
        /// The OS error (in the message, not a separate cause, so it is printed once).
        error: std::io::Error,
    },
    /// The JSON is malformed, or a field is missing or has the wrong type.
    #[error(
        "{file}: field `{field}`: {message}",
        file = file.display(),
        message = mosaic_kit::text::clip_middle(message, MAX_MESSAGE_CHARS)
    )]
    Syntax {
        /// The plan file.
        file: PathBuf,
        /// Path of the offending field.
        field: String,
        /// What the parser expected.
        message: String,
    },
    /// The `format` field is missing or is not [`PLAN_FORMAT`].
    #[error(
        "{file}: field `format`: expected \"{PLAN_FORMAT}\", found {found}",
        file = file.display(),
        found = mosaic_kit::text::name(found)
    )]
    Format {
        /// The plan file.
        file: PathBuf,
        /// What the file has instead.
        found: String,
    },
    /// A module the model does not have.
    #[error(
        "{file}: field `{field}`: unknown module \"{name}\"; {model} has {known}",
        file = file.display(),
        name = mosaic_kit::text::name(name),
        known = mosaic_kit::text::clip(known, MAX_MESSAGE_CHARS)
    )]
    UnknownModule {
        /// The plan file.
        file: PathBuf,
        /// e.g. `stages[0].modules[3].name`.
        field: String,
        /// The unknown name.
        name: String,
        /// The model, as its consumer names it (`model ofasys`, `engine model clip-tiny`).
        model: String,
        /// The model's module names, comma-separated.
        known: String,
    },
    /// A module placed in two places.
    #[error(
        "{file}: field `{field}`: module \"{name}\" is placed twice (first at `{first}`)",
        file = file.display(),
        name = mosaic_kit::text::name(name)
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
        "{file}: field `stages`: module \"{name}\" of {model} is not placed in any stage",
        file = file.display(),
        name = mosaic_kit::text::name(name)
    )]
    MissingModule {
        /// The plan file.
        file: PathBuf,
        /// The module.
        name: String,
        /// The model, as its consumer names it.
        model: String,
    },
    /// A module that runs no later than a module it consumes.
    #[error(
        "{file}: field `{field}`: module \"{name}\" runs in stage {stage} but its producer \
         \"{producer}\" runs in stage {producer_stage}; producers must run in earlier stages",
        file = file.display(),
        name = mosaic_kit::text::name(name),
        producer = mosaic_kit::text::name(producer)
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
    /// A quota outside (0, 1], or below [`crate::MIN_QUOTA`].
    #[error(
        "{file}: field `{field}`: SM quota {sm:?} outside (0, 1] or below {min}, less than one SM \
         of any GPU",
        file = file.display(),
        min = crate::MIN_QUOTA
    )]
    BadQuota {
        /// The plan file.
        file: PathBuf,
        /// e.g. `stages[0].modules[1].sm`.
        field: String,
        /// The quota.
        sm: f64,
    },
    /// A time, memory or quota figure that is not a finite number in its range.
    #[error("{file}: field `{field}`: {value:?} is not a number from 0 to {max:e}", file = file.display())]
    BadNumber {
        /// The plan file.
        file: PathBuf,
        /// e.g. `stages[0].modules[1].time_ms`.
        field: String,
        /// The value found.
        value: f64,
        /// The largest value accepted.
        max: f64,
    },
    /// A pool of no GPU, or of more than [`crate::MAX_GPUS`].
    #[error(
        "{file}: field `gpus`: a plan's pool is 1 to {max} GPUs, found {gpus}",
        file = file.display(),
        max = crate::MAX_GPUS
    )]
    PoolSize {
        /// The plan file.
        file: PathBuf,
        /// The pool size found.
        gpus: u32,
    },
    /// A GPU index outside the plan's pool.
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
        /// GPUs in the plan's pool.
        pool: u32,
    },
    /// A GPU listed twice by one module.
    #[error(
        "{file}: field `{field}`: GPU {gpu} is listed twice; each replica needs its own GPU",
        file = file.display()
    )]
    RepeatedGpu {
        /// The plan file.
        file: PathBuf,
        /// The second occurrence, e.g. `stages[1].modules[2].gpus[3]`.
        field: String,
        /// The GPU index.
        gpu: u32,
    },
    /// A module's `nodes` that are not the nodes its GPUs lie on.
    #[error(
        "{file}: field `{field}`: {message}",
        file = file.display(),
        message = mosaic_kit::text::clip_middle(message, MAX_MESSAGE_CHARS)
    )]
    BadNodes {
        /// The plan file.
        file: PathBuf,
        /// e.g. `stages[0].modules[1].nodes`.
        field: String,
        /// What is wrong and what was expected.
        message: String,
    },
    /// An `sm_count` no GPU has, or, with one, a quota that is not a whole number of SMs.
    #[error("{file}: field `{field}`: {message}", file = file.display())]
    BadSms {
        /// The plan file.
        file: PathBuf,
        /// `sm_count`, or e.g. `stages[0].modules[1].sm`.
        field: String,
        /// What is wrong and what was expected.
        message: String,
    },
    /// A field whose value is out of its range or not one of the values the tools write
    /// (`granularity`, `lower_bound_ms`, `search`).
    #[error("{file}: field `{field}`: {message}", file = file.display())]
    BadField {
        /// The plan file.
        file: PathBuf,
        /// The field, e.g. `granularity`.
        field: String,
        /// What was found and what was expected.
        message: String,
    },
    /// The quotas of a stage's modules on one GPU add up to more than the whole GPU.
    #[error(
        "{file}: field `{field}`: the quotas on GPU {gpu} add up to {quota:.3} > 1",
        file = file.display()
    )]
    Oversubscribed {
        /// The plan file.
        file: PathBuf,
        /// The placement that tips it over, e.g. `stages[0].modules[8].gpus[0]`.
        field: String,
        /// The GPU index.
        gpu: u32,
        /// The summed quota.
        quota: f64,
    },
}

impl PlanFileError {
    /// The plan field the error is about, if any.
    pub fn field(&self) -> Option<&str> {
        use PlanFileError as E;
        match self {
            E::Io { .. } => None,
            E::Format { .. } => Some("format"),
            E::MissingModule { .. } => Some("stages"),
            E::PoolSize { .. } => Some("gpus"),
            E::Syntax { field, .. }
            | E::UnknownModule { field, .. }
            | E::DuplicateModule { field, .. }
            | E::Order { field, .. }
            | E::DpMismatch { field, .. }
            | E::BadQuota { field, .. }
            | E::BadNumber { field, .. }
            | E::GpuOutOfRange { field, .. }
            | E::RepeatedGpu { field, .. }
            | E::BadNodes { field, .. }
            | E::BadSms { field, .. }
            | E::BadField { field, .. }
            | E::Oversubscribed { field, .. } => Some(field),
        }
    }

    /// The plan file the error is about.
    pub fn file(&self) -> &Path {
        use PlanFileError as E;
        match self {
            E::Io { file, .. }
            | E::Syntax { file, .. }
            | E::Format { file, .. }
            | E::UnknownModule { file, .. }
            | E::DuplicateModule { file, .. }
            | E::MissingModule { file, .. }
            | E::Order { file, .. }
            | E::DpMismatch { file, .. }
            | E::BadQuota { file, .. }
            | E::BadNumber { file, .. }
            | E::PoolSize { file, .. }
            | E::GpuOutOfRange { file, .. }
            | E::RepeatedGpu { file, .. }
            | E::BadNodes { file, .. }
            | E::BadSms { file, .. }
            | E::BadField { file, .. }
            | E::Oversubscribed { file, .. } => file,
        }
    }
}
