//! The planner's error type.

/// Why no plan could be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The pool has no GPU.
    #[error("--gpus: expected at least one GPU")]
    NoGpus,
    /// A module has no profiled candidate that fits the pool.
    #[error(
        "module \"{module}\" cannot be placed on {gpus} GPU(s): no profiled dp ≤ {gpus} fits in \
         {memory_gib} GiB per GPU"
    )]
    Unplaceable {
        /// Module name.
        module: String,
        /// Pool size.
        gpus: u32,
        /// Device memory.
        memory_gib: f64,
    },
    /// The exact search was asked for but did not finish in its budget.
    #[error(
        "the exact search did not finish within {budget_ms} ms ({modules} modules); use \
         --search gahc or --search auto, or a larger --time-budget"
    )]
    ExactTimeout {
        /// The budget in ms.
        budget_ms: u64,
        /// Module count.
        modules: usize,
    },
}
