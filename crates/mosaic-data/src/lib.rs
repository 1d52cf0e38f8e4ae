//! The data side of multimodal training: how variable-length samples become balanced
//! microbatches, and how those microbatches are spread over data-parallel (DP) ranks.
//!
//! This is issue 14 (the peers' data side), planner-weight only:
//!
//! - [`packing`]: FlowTrain's dynamic packing scheduler (FlowTrain §3.4, Algorithm 1):
//!   segment-tree best-fit packing of sequences into fixed-capacity microbatches, the
//!   `α·Σl² + β·Σl` cost model, cost buckets and (bucketed) zig-zag dispatch of microbatches
//!   over DP ranks.
//! - [`partition`]: DistTrain's intra-microbatch reordering (DistTrain §6.1, Algorithm 2):
//!   greedy number partitioning of samples over DP groups, with its lower bound.
//! - [`pipeline`]: a microbatch-level simulator of the 1F1B pipeline schedule and of
//!   Megatron-LM's interleaved 1F1B (virtual pipeline stages), giving iteration time and
//!   bubble fraction from per-stage times.
//! - [`policy`]: three ways to form and place one global batch's microbatches (random,
//!   DistTrain §6.1 + §6.2 with Algorithm 3's inter-microbatch reordering and its VPP
//!   retrofit, FlowTrain §3.4), evaluated over DP × PP (× VPP) on the simulator (iteration
//!   time, bubble, DP imbalance), with stages splitting each microbatch's cost equally or by
//!   weights (heterogeneous encoder/backbone stages).
//! - [`samples`]: users' per-sample sizes from JSONL (text tokens, images in pixels, audio
//!   seconds), turned into token counts by a documented tokenizer (ViT patches, audio
//!   tokens per second).
//! - [`sizes`]: a seeded generator of skewed per-sample token counts, after the skew that
//!   DistTrain §2.3 (Fig. 5) measures on LAION-400M.
//!
//! The CLI runs these policies as `mosaic data` and `mosaic compare --samples`; the engine
//! packs its variable-length batches with [`pack`] and shards them across ranks with
//! [`greedy_partition_sized`]. Not here: communication and
//! gradient synchronisation in the simulator (stages and ranks exchange activations and
//! gradients for free), and memory limits beyond what the 1F1B orders imply.

#![warn(missing_docs)]

pub mod packing;
pub mod partition;
pub mod pipeline;
pub mod policy;
pub mod samples;
pub mod sizes;

pub use packing::{buckets, cost, pack, zigzag, zigzag_buckets, PackError};
pub use partition::{greedy_partition, greedy_partition_sized, loads, lower_bound};
pub use pipeline::{interleaved, one_f_one_b, PipelineError, Schedule};
pub use policy::{assign, assign_weighted, evaluate, evaluate_weighted, inter_reorder};
pub use policy::{inter_reorder_vpp, DataError, Layout, Params, Policy, Report, MAX_OPERATIONS};
pub use samples::{parse_jsonl, read_jsonl, token_counts, Sample, SamplesError, Tokenizer};
pub use sizes::{generate, Distribution};
