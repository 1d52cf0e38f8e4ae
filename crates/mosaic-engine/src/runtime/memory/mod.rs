//! What a run needs of a GPU's memory (`device`), checked before step 1: the weights,
//! gradients and AdamW moments against the device's free memory (`weights_fit`), then a trial
//! step, after which activation recomputation is turned on where it can help
//! (`fit_or_recompute`). A plan that still does not fit is refused with
//! [`crate::EngineError::DeviceMemory`] (exit code 2).
//!
//! On the CPU (`host`), [`HostNeed`] estimates what a step holds in host memory at any batch from
//! forward passes at a few samples, so that `mosaic train` refuses a `--batch` that cannot fit
//! before it draws the batch, instead of the allocator aborting the process minutes in; the
//! ranks an `mpirun` starts on one machine are checked against its memory together.

mod device;
mod host;

#[cfg(all(feature = "cuda", mosaic_gpu))]
pub(crate) use device::weights_fit;
pub(crate) use device::{fit_or_recompute, in_step, release_pool};
pub(crate) use host::check_sweep_memory;
pub use host::{available_host_bytes, check_host_memory, HostBytes, HostNeed, Neighbours};
