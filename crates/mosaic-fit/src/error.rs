//! The one error type of this crate: colocation measurements that do not fit the profiles.

use std::path::PathBuf;

/// Colocation measurements that cannot be matched to the profiles they are fitted against.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    /// A field of the colocations file names something the profiles do not have: an unknown
    /// module, a (dp, quota) that is not a candidate of the module, another device.
    #[error("{file}: field `{field}`: {message}", file = file.display())]
    Invalid {
        /// The colocations file.
        file: PathBuf,
        /// Path of the offending field, e.g. `samples[3].modules[1]`.
        field: String,
        /// What is wrong and what was expected.
        message: String,
    },
}

impl FitError {
    pub(crate) fn invalid(
        file: impl Into<PathBuf>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        FitError::Invalid {
            file: file.into(),
            field: field.into(),
            message: message.into(),
        }
    }

    /// The field of the colocations file the error is about.
    pub fn field(&self) -> &str {
        match self {
            FitError::Invalid { field, .. } => field,
        }
    }
}
