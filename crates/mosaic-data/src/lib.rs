//! The data side of multimodal training: how variable-length samples become balanced
//! microbatches, and how those microbatches are spread over data-parallel (DP) ranks.
//!
//! This is issue 14 (the peers' data side), planner-weight only:
//!
//! - [`packing`]: FlowTrain's dynamic packing scheduler (FlowTrain §3.4, Algorithm 1):
//!   segment-tree best-fit packing of sequences into fixed-capacity microbatches, the
//!   `α·Σl² + β·Σl` cost model, and zig-zag dispatch of microbatches over DP ranks.
//! - [`partition`]: DistTrain's intra-microbatch reordering (DistTrain §6.1, Algorithm 2):
//!   greedy number partitioning of samples over DP groups, with its lower bound.
//! - [`pipeline`]: a microbatch-level simulator of the non-interleaved 1F1B pipeline
//!   schedule, giving iteration time and bubble fraction from per-stage times.
//! - [`policy`]: three ways to form and place one global batch's microbatches (random,
//!   DistTrain §6.1 + §6.2 with Algorithm 3's inter-microbatch reordering, FlowTrain §3.4),
//!   evaluated over DP × PP on the simulator (iteration time, bubble, DP imbalance).
//! - [`sizes`]: a seeded generator of skewed per-sample token counts, after the skew that
//!   DistTrain §2.3 (Fig. 5) measures on LAION-400M.
//!
//! Not here yet (future work of issue 14): interleaved 1F1B / virtual pipeline stages (VPP)
//! in the simulator and DistTrain's VPP variant of Algorithm 3; FlowTrain's cost buckets
//! (Algorithm 1, lines 12–14; [`packing::zigzag`] dispatches one bucket); communication,
//! gradient synchronisation and heterogeneous (encoder/backbone/generator) stages in the
//! simulator, whose stages split each microbatch's cost equally; the CLI `mosaic data`
//! command; and the engine side that feeds real batches.

pub mod packing;
pub mod partition;
pub mod pipeline;
pub mod policy;
pub mod sizes;

pub use packing::{cost, pack, zigzag, PackError};
pub use partition::{greedy_partition, loads, lower_bound};
pub use pipeline::{one_f_one_b, Schedule};
pub use policy::{assign, evaluate, inter_reorder, Layout, Params, Policy, Report};
pub use sizes::{generate, Distribution};
