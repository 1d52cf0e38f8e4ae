//! The data side of multimodal training: how variable-length samples become balanced
//! microbatches, and how those microbatches are spread over data-parallel (DP) ranks.
//!
//! This is the first piece of issue 14 (the peers' data side), planner-weight only:
//!
//! - [`packing`]: FlowTrain's dynamic packing scheduler (FlowTrain §3.4, Algorithm 1):
//!   segment-tree best-fit packing of sequences into fixed-capacity microbatches, the
//!   `α·Σl² + β·Σl` cost model, and zig-zag dispatch of microbatches over DP ranks.
//! - [`partition`]: DistTrain's intra-microbatch reordering (DistTrain §6.1, Algorithm 2):
//!   greedy number partitioning of samples over DP groups, with its lower bound.
//! - [`sizes`]: a seeded generator of skewed per-sample token counts, after the skew that
//!   DistTrain §2.3 (Fig. 5) measures on LAION-400M.
//!
//! Not here yet (future work of issue 14): FlowTrain's cost buckets (Algorithm 1, lines
//! 12–14; [`packing::zigzag`] dispatches one bucket), a microbatch simulator that turns
//! these assignments into step times, DistTrain's inter-microbatch reordering (§6.2,
//! Algorithm 3) for 1F1B pipeline bubbles, and the engine side that feeds real batches.

pub mod packing;
pub mod partition;
pub mod sizes;

pub use packing::{cost, pack, zigzag, PackError};
pub use partition::{greedy_partition, loads, lower_bound};
pub use sizes::{generate, Distribution};
