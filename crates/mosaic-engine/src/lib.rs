//! The multiplexing engine (Mosaic §3.2, §4): really trains a multimodal model by a
//! `mosaic-plan/1` plan — stages one after another, the modules of a stage at the same time,
//! each module in its own pre-created execution slot with its own data-parallel replicas,
//! parameters and AdamW optimizer — and checkpoints it atomically.
//!
//! ```
//! use mosaic_engine::{models, Schedule, TrainConfig, Trainer};
//! use candle_core::Device;
//!
//! let model = models::build("clip-tiny", 0, &Device::Cpu)?;
//! // Every module its own stage, dp 1, the whole machine (what `mosaic train` runs without
//! // --plan); Schedule::from_plan reads a planner's plan instead.
//! let schedule = Schedule::sequential(&model, 2);
//! let mut trainer = Trainer::new(model, schedule, TrainConfig::default())?;
//! let first = trainer.step()?;
//! assert_eq!(first.stages.len(), 3); // vision, text, align
//! for _ in 0..9 {
//!     trainer.step()?;
//! }
//! let later = trainer.step()?;
//! assert!(later.loss < first.loss);
//! # Ok::<(), mosaic_engine::EngineError>(())
//! ```
//!
//! Three rooms: [`models`] is what is trained, [`runtime`] what runs a plan, [`measure`] what
//! measures this machine.
//!
//! # Pieces, in the order a step uses them
//! - [`models`]: the built-in models (`clip-tiny`, `omni-tiny`) with their synthetic data, built
//!   from [`models::nn`] layers that pass gradients (candle's fused norms and softmax do not)
//!   into a DAG of modules ([`models::model`]); [`models::data`] holds what a batch is, and
//!   reads the user's own tensors instead.
//! - [`runtime::feed`]: preprocessing off the training path (DistTrain §4): encoded images
//!   decoded, resized and captions tokenised in producer processes that send each batch,
//!   reordered for the data-parallel ranks, over a Unix socket (or on the trainer's thread).
//! - [`runtime::schedule`]: a plan checked against a model becomes a [`Schedule`]: stages of
//!   placements (the plan's resolved assignment, and the module's slot threads).
//! - [`runtime::slot`]: execution slots — on CPU a thread pool of `round(quota × cores)` threads
//!   — and the pool that creates them all before training ([`SlotMode::Pooled`]) or per stage
//!   ([`SlotMode::OnDemand`], the baseline [`measure::bench_slots`] measures against);
//!   [`runtime::slot::cuda`]: CUDA green-context slots and their pool (which create and hold SM
//!   partitions and streams, on which the GPU build's modules compute, see [`runtime::slot`]),
//!   with the `cuda` feature; without it, a stand-in that says so.
//! - [`runtime::collective`]: what crosses processes: gradients summed over a module's ranks,
//!   and activations and their gradients redistributed at module boundaries ([`InProcess`] for
//!   one process, `Mpi` with the `mpi` feature for `mpirun`, `Nccl` with `mpi` and `cuda` for
//!   gradients summed on GPUs).
//! - [`runtime::trainer`]: the iteration — forward by stages, backward by stages in reverse,
//!   activations and gradients handed across module boundaries detached.
//! - [`runtime::optim`]: AdamW with its state exposed; [`runtime::checkpoint`]: atomic
//!   `mosaic-checkpoint/1` files holding parameters, optimizer state and the data position.
//! - [`measure`]: this machine as a device — measured profiles (every module's iteration at
//!   every (dp, quota) grid point), co-located runs, both as `mosaic-profiles/1` and
//!   `mosaic-colocations/1` values, and the slot pool's benchmark (`mosaic measure`).
//!
//! Random draws (initialisation, synthetic data, colocations) come from
//! [`mosaic_kit::rng::SplitMix64`] streams, so a seed repeats a run bit for bit.

#![warn(missing_docs)]

#[cfg(test)]
mod emulated;
mod error;
#[cfg(mosaic_gpu)]
mod kernels;
pub mod measure;
pub mod models;
pub mod runtime;
mod switch;

pub use candle_core::Device;
pub use error::EngineError;
pub use models::{Model, Module};
#[cfg(feature = "mpi")]
pub use runtime::collective::Mpi;
#[cfg(all(feature = "mpi", feature = "cuda"))]
pub use runtime::collective::Nccl;
pub use runtime::collective::{Collective, InProcess};
pub use runtime::on_gpu::rank_gpu;
pub use runtime::optim::{AdamW, AdamWConfig};
pub use runtime::schedule::{sequential_plan, Placement, Schedule};
pub use runtime::slot::{Slot, SlotMode, SlotPool};
pub use runtime::trainer::{Compute, ModuleLaunch, ParamGrad, StepReport, TrainConfig, Trainer};
