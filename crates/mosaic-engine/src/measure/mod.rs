//! What measures this machine (Mosaic §3.3 and §4, "Performance Model"; `mosaic measure`).
//!
//! The planner reads, per module and per grid point (data-parallel degree `dp`, SM quota `sm`),
//! an iteration time, a memory footprint, an achieved SM utilisation and a memory-bandwidth
//! utilisation `B(m, a)`. Mosaic's profiler runs each module's training iteration at every grid
//! point on a GPU and reads them off the device. Here the *device* is this machine: its cores
//! play the SMs (a quota `a` is a slot of `round(a × cores)` threads, see
//! [`crate::runtime::slot`]) and its RAM the device memory.
//!
//! - `machine`: the machine itself ([`measure_machine`]: CPU, cores, memory, STREAM-triad peak
//!   bandwidth) and how busy a slot's threads are (`sm_util`).
//! - `bytes`: what a replica holds and moves, counted from its tensors ([`Memory`],
//!   [`bytes_moved`]): `mem_gib` and the traffic behind `bw_util`.
//! - `profiler`: a built-in model's modules ready to be measured one replica at a time
//!   ([`Profiler`]) and the grid ([`quota_grid`], [`dp_grid`]).
//! - `sweep`: every module at every grid point ([`Profiler::sweep`] → [`EngineProfile`]).
//! - `gpu_info`: the GPU a profile is measured on and its partition grid ([`GpuInfo`]);
//!   `gpu_sweep`: the sweep on a GPU, each SM partition a green-context slot ([`sweep_gpu`]),
//!   with NVML's busy fractions (`nvml`); `gpu_colocate`: colocations there, each module in
//!   its stage's green context, driven from its own thread ([`colocations_gpu`]).
//! - `colocate`: modules run side by side in their own slots ([`Profiler::colocations`]), the
//!   data the interference coefficients of Eq. 8 are fitted to (`mosaic fit`).
//! - `files`: both as the typed `mosaic-profiles/1` and `mosaic-colocations/1` values
//!   ([`profile_file`], [`colocation_file`]).
//! - `preprocess`: preprocessing in the training process against in producer processes
//!   ([`measure_preprocess`], DistTrain's Fig. 21; see [`crate::runtime::feed`]).
//! - `slots`: the slot pool's benchmark, pooled against on-demand slots ([`bench_slots`],
//!   [`matmul_in_slots`]; on a GPU, [`bench_gpu_slots`], whose CUDA part is `gpu_slots`).
//! - `block`: one transformer block of a zoo encoder, piece by piece, forward and backward
//!   ([`time_block`], `mosaic bench block`).
//! - `launch`: a block's pass launched op by op against replayed from a CUDA graph
//!   ([`launch_cost`], `mosaic bench block` on a GPU).
//! - `gpu_check`: every GPU path of the engine, pass or fail with its figure ([`check_gpu`],
//!   `mosaic check gpu`).

mod block;
mod bytes;
mod colocate;
mod files;
mod gpu_check;
mod gpu_colocate;
mod gpu_info;
#[cfg(feature = "cuda")]
mod gpu_slots;
mod gpu_sweep;
mod launch;
mod machine;
#[cfg(feature = "cuda")]
pub(crate) mod nvml;
mod preprocess;
mod profiler;
mod slots;
mod sweep;

pub use block::{time_block, PieceTime};
pub use bytes::{bytes_moved, Memory};
pub(crate) use bytes::{tape_bytes, tensor_bytes};
pub use colocate::{ColocatedRun, ColocationConfig, MeasuredColocation, MAX_COLOCATED};
pub use files::{colocation_file, profile_file};
pub use gpu_check::{check_gpu, GpuCheck, Outcome};
pub use gpu_colocate::{colocations_gpu, gpu_colocation_source};
pub use gpu_info::{gpu_sm_grid, GpuInfo, BUSY_WINDOW};
pub use gpu_sweep::sweep_gpu;
pub use launch::{launch_cost, LaunchCost, Pass};
pub use machine::{
    available_cores, measure_machine, quota_grid, Machine, StreamPoint, MAX_ATTEMPTS,
    MAX_QUOTA_STEPS, UNDISTURBED,
};
pub use preprocess::{measure_preprocess, PreprocessConfig, PreprocessRow, PreprocessRun};
pub use profiler::{dp_grid, ProfileConfig, Profiler, Timing};
pub use slots::{
    bench_gpu_slots, bench_slots, matmul_in_slots, GpuSlotBench, MatmulInSlot, ModeFigures,
    SlotBench,
};
pub use sweep::{EngineProfile, Launched, ModuleInfo, Point};
