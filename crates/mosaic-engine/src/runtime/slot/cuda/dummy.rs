//! Green-context slots without the `cuda` feature (candle's `dummy_cuda_backend` pattern):
//! the API the rest of the engine uses, in a build where no GPU slot can exist.

use super::Carving;
use crate::error::EngineError;

/// Why green-context slots cannot be used here: this build has no CUDA support.
pub fn driver_unavailable() -> Option<String> {
    Some("built without CUDA: green-context slots need mosaic-engine's `cuda` feature".to_string())
}

/// The CUDA devices this process sees: none can be counted without the `cuda` feature.
pub fn device_count() -> Result<usize, String> {
    Err(driver_unavailable().unwrap_or_default())
}

/// A green-context slot; without the `cuda` feature there is none (the type has no values).
#[derive(Debug)]
pub enum GpuSlot {}

impl GpuSlot {
    /// The module the slot is for.
    pub fn module(&self) -> &str {
        match *self {}
    }

    /// The quota it was created for.
    pub fn quota(&self) -> f64 {
        match *self {}
    }

    /// SMs the driver granted its green context.
    pub fn sms(&self) -> u32 {
        match *self {}
    }

    /// How its SMs were carved from the device.
    pub fn carving(&self) -> Carving {
        match *self {}
    }

    /// The ordinal of its device.
    pub fn device_ordinal(&self) -> usize {
        match *self {}
    }

    /// Runs `f` with the slot's green context current.
    pub fn run<T>(&self, _f: impl FnOnce() -> T) -> Result<T, EngineError> {
        match *self {}
    }
}
