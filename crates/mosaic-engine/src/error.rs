//! The one error type of the engine: a plan that does not fit the model, a checkpoint that does
//! not fit the run, or a failure while training. Plan and checkpoint variants name the file and
//! the field.

use std::path::PathBuf;

/// Why the engine cannot (or can no longer) train.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A model name that is not built in.
    #[error("unknown engine model \"{name}\"; built in: {known}")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The built-in names, comma-separated.
        known: String,
    },
    /// A training setting that makes no sense (`batch`, `lr`, …).
    #[error("{setting}: {message}")]
    BadSetting {
        /// The setting, as the command line spells it (e.g. `--batch`).
        setting: String,
        /// What is wrong.
        message: String,
    },
    /// A plan file that is unreadable or breaks the `mosaic-plan/1` rules against the model.
    #[error(transparent)]
    Plan(#[from] mosaic_plan::PlanFileError),
    /// A data-parallel degree the run cannot honour.
    #[error("{file}: field `{field}`: {message}", file = file.display())]
    BadDp {
        /// The plan file.
        file: PathBuf,
        /// e.g. `stages[0].modules[1].dp`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A checkpoint that cannot be read or written.
    #[error("{file}: {message}", file = file.display())]
    CheckpointIo {
        /// The checkpoint file (or its temporary file).
        file: PathBuf,
        /// What failed.
        message: String,
    },
    /// A checkpoint that is not one, or not of this run.
    #[error("{file}: field `{field}`: {message}", file = file.display())]
    Checkpoint {
        /// The checkpoint file.
        file: PathBuf,
        /// The metadata key or tensor name.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// An execution slot could not be created.
    #[error("cannot create a slot of {threads} thread(s) for module \"{module}\": {message}")]
    Slot {
        /// The module the slot is for.
        module: String,
        /// Threads asked for.
        threads: usize,
        /// The thread-pool error.
        message: String,
    },
    /// A data file that is not the model's data.
    #[error("{file}: field `{field}`: {message}", file = file.display())]
    Data {
        /// The safetensors file.
        file: PathBuf,
        /// The tensor, or `(file)`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A collective among ranks failed.
    #[error("{collective} collective: {message}")]
    Collective {
        /// Which implementation (`mpi`).
        collective: &'static str,
        /// What failed.
        message: String,
    },
    /// A plan that cannot be spread over the ranks of the run.
    #[error("{plan}: field `gpus`: {message}")]
    Ranks {
        /// The plan (its file, or `default plan`).
        plan: String,
        /// What does not fit.
        message: String,
    },
    /// This machine could not be measured (`mosaic measure profile` reads Linux's `/proc`).
    #[error("cannot measure this machine: {message}")]
    Machine {
        /// What could not be read, and why.
        message: String,
    },
    /// A CUDA driver call failed, or CUDA cannot be used here (green-context slots, the `cuda`
    /// feature).
    #[error("CUDA: {what}: {message}")]
    Cuda {
        /// What was being done: the driver call and what for (module, SMs, device).
        what: String,
        /// The driver's error name and text, or why CUDA is unavailable.
        message: String,
    },
    /// What a run needs of a GPU's memory is more than it has: found before step 1 (or, past
    /// the trial step, in a step).
    #[error("CUDA device {device}: out of memory: {message}")]
    DeviceMemory {
        /// The CUDA ordinal.
        device: usize,
        /// What did not fit, and what to change.
        message: String,
    },
    /// A tensor operation failed (a bug in a model, or out of memory).
    #[error("module \"{module}\": {source}")]
    Tensor {
        /// The module that was running, or `data` / `optimizer`.
        module: String,
        /// candle's error.
        source: candle_core::Error,
    },
}

/// What a panic said (its payload as text), where it said anything: candle and cudarc panic on
/// some CUDA failures, which the engine turns into errors.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    (payload.downcast_ref::<String>().cloned())
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
}

impl EngineError {
    /// True when the error is the user's input (exit code 2): a plan, a setting, a model name or
    /// a checkpoint of another run; false for failures while training.
    pub fn is_bad_input(&self) -> bool {
        !matches!(
            self,
            EngineError::Slot { .. }
                | EngineError::Cuda { .. }
                | EngineError::Collective { .. }
                | EngineError::Tensor { .. }
                | EngineError::Machine { .. }
                | EngineError::CheckpointIo { .. }
        )
    }

    /// Whether this is a GPU running out of memory (candle's CUDA backend reports the
    /// driver's or cuBLAS's allocation failure).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            EngineError::DeviceMemory { .. } => true,
            EngineError::Tensor { source, .. } => {
                let text = source.to_string();
                ["CUDA_ERROR_OUT_OF_MEMORY", "CUBLAS_STATUS_ALLOC_FAILED"]
                    .iter()
                    .any(|code| text.contains(code))
            }
            _ => false,
        }
    }

    /// Wraps a candle error raised while `module` was running.
    pub(crate) fn tensor(module: &str) -> impl FnOnce(candle_core::Error) -> EngineError + '_ {
        move |source| EngineError::Tensor {
            module: module.to_string(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::EngineError;

    #[test]
    fn a_gpu_allocation_failure_is_out_of_memory() {
        let cuda = |text: &str| EngineError::Tensor {
            module: "vision".into(),
            source: candle_core::Error::Cuda(text.into()),
        };
        assert!(
            cuda("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")").is_out_of_memory()
        );
        assert!(cuda("CublasError(CUBLAS_STATUS_ALLOC_FAILED)").is_out_of_memory());
        assert!(
            !cuda("DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \"an illegal memory access\")")
                .is_out_of_memory()
        );
        let e = EngineError::DeviceMemory {
            device: 0,
            message: "x".into(),
        };
        assert!(e.is_out_of_memory() && e.is_bad_input());
    }
}
