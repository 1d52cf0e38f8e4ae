//! CUDA green-context slots (Mosaic §3.2): a slot is a green context holding a module's SM
//! quota, with a non-blocking stream in it; a plan's slots are created before training and
//! leased at every stage transition (`GpuSlotPool`), since creating one costs tens of
//! milliseconds ([`crate::measure::bench_gpu_slots`] measures it).
//!
//! - how many SMs a slot gets and how a stage's slots share a device ([`sms_for`],
//!   [`partition_sms`]): pure arithmetic in `mosaic_profile::partition`, re-exported here, the
//!   one quota ↔ SM mapping the planner shares.
//! - `driver`: loading `libcuda` and checking it ([`driver_unavailable`]), driver errors, owned
//!   green contexts.
//! - `carving`: [`Carving`], the ways a stage's SMs are split into slots.
//! - `device`: `GpuDevice`, a GPU opened for slots, which cuts a stage's slots from its SMs.
//! - `green`: [`GpuSlot`], a green context and its stream, made current on a thread by
//!   `GpuSlot::enter`.
//! - `pool`: `GpuSlotPool`, the slots of a plan's stages, pooled or on demand.
//! - `compute` (the GPU build only, `--cfg mosaic_gpu`): candle's CUDA device on a slot's
//!   stream, `Binding` saying through which context.
//!
//! Everything but the partition arithmetic needs the `cuda` feature (cudarc, which loads
//! `libcuda` at run time, so it builds without CUDA). Without it, `dummy` stands in: [`GpuSlot`] has no values
//! and [`driver_unavailable`] says the build has no CUDA, so callers need no `cfg`.

pub use carving::Carving;
pub use mosaic_profile::{partition_sms, sms_for, SmGranularity};

mod carving;

#[cfg(all(feature = "cuda", mosaic_gpu))]
mod compute;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
mod green;
#[cfg(feature = "cuda")]
mod pool;
#[cfg(all(feature = "cuda", mosaic_gpu))]
pub(crate) use compute::target_sms;
#[cfg(all(feature = "cuda", mosaic_gpu))]
pub use compute::Binding;
#[cfg(feature = "cuda")]
pub(crate) use device::Scratch;
#[cfg(feature = "cuda")]
pub use {
    device::GpuDevice,
    driver::{device_count, driver_unavailable},
    green::{Current, GpuSlot},
    pool::{GpuSlotPool, StageSlots},
};

#[cfg(not(feature = "cuda"))]
mod dummy;
#[cfg(not(feature = "cuda"))]
pub use dummy::{device_count, driver_unavailable, GpuSlot};
