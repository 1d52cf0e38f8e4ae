//! The errors of this crate: a name the zoo does not know, and calibration constants it
//! refuses.

/// A model or cluster name that the zoo cannot resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZooError {
    /// No built-in model has this name.
    #[error(
        "unknown model \"{name}\"; known models: {known}",
        name = mosaic_kit::text::name(name)
    )]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The built-in model names, comma-separated.
        known: String,
    },
    /// The name is neither a built-in cluster nor `<device>x<N>`.
    #[error(
        "unknown cluster \"{name}\"; known clusters: {known}, or <device>x<N> with a device \
         among {devices} (e.g. h100x24)",
        name = mosaic_kit::text::name(name)
    )]
    UnknownCluster {
        /// The name asked for.
        name: String,
        /// The built-in cluster names, comma-separated.
        known: String,
        /// The device short names, comma-separated.
        devices: String,
    },
    /// A `<device>x<N>` name with a GPU count that cannot form a cluster.
    #[error("cluster \"{name}\": {reason}", name = mosaic_kit::text::name(name))]
    BadCluster {
        /// The name asked for.
        name: String,
        /// What is wrong with the GPU count.
        reason: String,
    },
}

/// Calibration constants outside what [`crate::Calibration::check`] allows.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("field `{field}`: {message}")]
pub struct CalibrationError {
    /// The field of a calibration file, e.g. `constants.gemm_efficiency`, or `constants` for
    /// constants that are each within range but together too slow.
    pub field: String,
    /// What is wrong and what was expected.
    pub message: String,
}

impl CalibrationError {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        CalibrationError {
            field: field.into(),
            message: message.into(),
        }
    }
}
