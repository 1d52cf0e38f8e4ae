//! The one error type of this crate: a name the zoo does not know.

/// A model or cluster name that the zoo cannot resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZooError {
    /// No built-in model has this name.
    #[error("unknown model \"{name}\"; known models: {known}")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The built-in model names, comma-separated.
        known: String,
    },
    /// The name is neither a built-in cluster nor `<device>x<N>`.
    #[error(
        "unknown cluster \"{name}\"; known clusters: {known}, or <device>x<N> with a device \
         among {devices} (e.g. h100x24)"
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
    #[error("cluster \"{name}\": {reason}")]
    BadCluster {
        /// The name asked for.
        name: String,
        /// What is wrong with the GPU count.
        reason: String,
    },
}
