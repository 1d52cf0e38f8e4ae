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
//! # Pieces, in the order a step uses them
//! - [`models`]: the built-in models (`clip-tiny`, `omni-tiny`), built from [`nn`] layers that
//!   pass gradients (candle's fused norms and softmax do not), with their synthetic data;
//!   [`data`] reads the user's own tensors instead.
//! - [`schedule`]: a plan checked against a model becomes a [`Schedule`]: stages of
//!   placements (module, dp, threads).
//! - [`slot`]: execution slots — on CPU a thread pool of `round(quota × cores)` threads — and the
//!   pool that creates them all before training ([`SlotMode::Pooled`]) or per stage
//!   ([`SlotMode::OnDemand`], the baseline [`bench::bench_slots`] measures against); with the
//!   `cuda` feature, `slot::cuda`: CUDA green-context slots and their pool (which create and
//!   hold SM partitions and streams; module compute stays on CPU slots, see [`slot`]).
//! - [`collective`]: what crosses processes: gradients summed over a module's ranks, and
//!   activations and their gradients redistributed at module boundaries ([`InProcess`] for
//!   one process, `Mpi` with the `mpi` feature for `mpirun`, `Nccl` with `mpi` and `cuda` for
//!   gradients summed on GPUs).
//! - [`trainer`]: the iteration — forward by stages, backward by stages in reverse, activations
//!   and gradients handed across module boundaries detached.
//! - [`optim`]: AdamW with its state exposed; [`checkpoint`]: atomic `mosaic-checkpoint/1`
//!   files holding parameters, optimizer state and the data position.
//! - [`profile`]: measured profiles — every module's iteration at every (dp, quota) grid point
//!   of this machine, and co-located runs (`mosaic profile --engine`).
//!

#![warn(missing_docs)]

pub mod bench;
pub mod checkpoint;
pub mod collective;
pub mod data;
mod error;
pub mod model;
pub mod models;
pub mod nn;
pub mod optim;
pub mod profile;
pub mod rng;
pub mod schedule;
pub mod slot;
pub mod trainer;

pub use candle_core::Device;
#[cfg(feature = "mpi")]
pub use collective::Mpi;
#[cfg(all(feature = "mpi", feature = "cuda"))]
pub use collective::Nccl;
pub use collective::{Collective, InProcess};
pub use error::EngineError;
pub use model::{Model, Module};
pub use optim::{AdamW, AdamWConfig};
pub use schedule::{sequential_plan, Placement, Schedule};
pub use slot::{Slot, SlotMode, SlotPool};
pub use trainer::{ParamGrad, StepReport, TrainConfig, Trainer};
