//! The CUDA driver as green-context slots use it: loading `libcuda` (once, checking every
//! function called is there), errors named by the driver, and owned green contexts.
//!
//! Built on the CUDA driver API through `cudarc::driver::sys` (cudarc has no safe
//! green-context wrapper). cudarc loads `libcuda` when the first driver function is called and
//! panics if it is missing, so every entry point first checks [`driver_unavailable`].

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

use cudarc::driver::sys::{
    self, CUcontext, CUdevResource, CUdevResourceDesc, CUdevResourceType, CUdevice, CUgreenCtx,
    CUgreenCtxCreate_flags, CUresult,
};

use crate::error::EngineError;
use mosaic_profile::SmGranularity;

/// Driver functions the slots call; all must be present before any is called (cudarc
/// panics on a missing symbol). The green-context ones need a driver of CUDA 12.5 or later
/// (`cuGreenCtxStreamCreate`).
/// (The GPU build links the driver, so a started process has them all: it reads none.)
#[cfg_attr(mosaic_gpu, allow(dead_code))]
const REQUIRED: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetPCIBusId",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDeviceGetDevResource",
    "cuDevSmResourceSplitByCount",
    "cuDevResourceGenerateDesc",
    "cuGreenCtxCreate",
    "cuGreenCtxDestroy",
    "cuGreenCtxGetDevResource",
    "cuGreenCtxStreamCreate",
    "cuCtxFromGreenCtx",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD32Async",
    "cuMemcpyDtoHAsync_v2",
    "cuStreamSynchronize",
    "cuStreamDestroy_v2",
    "cuGetErrorString",
];

/// The first driver version with everything the slots call (12.5: `cuGreenCtxStreamCreate`;
/// green contexts themselves came in 12.4).
const MIN_DRIVER: i32 = 12050;

/// Why green-context slots cannot be used here, or `None` if they can: no CUDA driver library,
/// a driver older than 12.5 (no green-context streams), `cuInit` failing, or no device. Loads and
/// initialises the driver on first call; never panics.
pub fn driver_unavailable() -> Option<String> {
    if let Err(why) = driver() {
        return Some(why.clone());
    }
    let mut count = 0;
    // SAFETY: the driver is loaded and initialised (checked above); `count` is a valid out
    // pointer.
    let r = unsafe { sys::cuDeviceGetCount(&mut count) };
    if r != CUresult::CUDA_SUCCESS {
        return Some(format!("cuDeviceGetCount: {}", describe(r)));
    }
    (count == 0).then(|| "the CUDA driver reports no device".to_string())
}

/// The CUDA devices this process sees (after `CUDA_VISIBLE_DEVICES`), or why none can be
/// counted.
pub fn device_count() -> Result<usize, String> {
    driver().clone()?;
    let mut count = 0;
    // SAFETY: the driver is loaded and initialised (checked above); `count` is a valid out
    // pointer.
    let r = unsafe { sys::cuDeviceGetCount(&mut count) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(format!("cuDeviceGetCount: {}", describe(r)));
    }
    Ok(usize::try_from(count).unwrap_or(0))
}

/// Loads the driver library, checks every function the slots call is in it, and calls
/// `cuInit` — once per process.
pub(super) fn driver() -> &'static Result<(), String> {
    static DRIVER: OnceLock<Result<(), String>> = OnceLock::new();
    DRIVER.get_or_init(|| {
        library()?;
        // SAFETY: every function called from here on is present (checked above).
        let r = unsafe { sys::cuInit(0) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(format!("cuInit: {}", describe(r)));
        }
        let mut version = 0;
        let r = unsafe { sys::cuDriverGetVersion(&mut version) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(format!("cuDriverGetVersion: {}", describe(r)));
        }
        if version < MIN_DRIVER {
            return Err(format!(
                "the CUDA driver is version {}.{}; green-context slots need 12.5 or later",
                version / 1000,
                version % 1000 / 10
            ));
        }
        Ok(())
    })
}

/// Whether the driver library is there with every function the slots call: cudarc opens
/// `libcuda` when first called (dynamic loading) and panics on a missing symbol.
#[cfg(not(mosaic_gpu))]
fn library() -> Result<(), String> {
    // SAFETY: only tries to open the library (dlopen) and drops it.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so) found".into());
    }
    // SAFETY: `culib` cannot panic now that a candidate library opened; `get` only looks a
    // symbol up, the pointer is not called.
    let lib = unsafe { sys::culib() };
    match REQUIRED
        .iter()
        .find(|name| unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err())
    {
        Some(name) => Err(format!(
            "the CUDA driver lacks {name} (green contexts need a driver for CUDA 12.5 or later)"
        )),
        None => Ok(()),
    }
}

/// The GPU build links `libcuda` (candle turns on cudarc's dynamic linking): a process that
/// started has the library and every function the slots call, `REQUIRED` included.
#[cfg(mosaic_gpu)]
fn library() -> Result<(), String> {
    Ok(())
}

/// `CUDA_ERROR_…: text` for a driver result.
fn describe(r: CUresult) -> String {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: only called once the driver is loaded; the driver returns a static string.
    let ok = unsafe { sys::cuGetErrorString(r, &mut text) } == CUresult::CUDA_SUCCESS;
    if ok && !text.is_null() {
        let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
        format!("{r:?}: {text}")
    } else {
        format!("{r:?}")
    }
}

/// `Ok` on success, else [`EngineError::Cuda`] naming the call and what it was doing.
pub(super) fn check(r: CUresult, what: impl FnOnce() -> String) -> Result<(), EngineError> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(EngineError::Cuda {
            what: what(),
            message: describe(r),
        })
    }
}

/// The SM count of an SM resource.
pub(super) fn sm_count(r: &CUdevResource) -> u32 {
    // SAFETY: only called on resources of type SM, whose union member is `sm`.
    unsafe { r.__bindgen_anon_1.sm.smCount }
}

/// The partition rule a CUDA 13 driver reports for an SM resource (`minSmPartitionSize`,
/// `smCoscheduledAlignment`: the two words after `smCount` in CUDA 13.0's `CUdevSmResource`,
/// which the bindings this crate builds with, CUDA 12.8's, do not name); `None` where they
/// read zero, as from an older driver, which leaves the zeroed struct's words as they were.
pub(super) fn reported_granularity(r: &CUdevResource) -> Option<SmGranularity> {
    // SAFETY: only called on resources of type SM; the union is 48 plain bytes.
    let bytes = unsafe { r.__bindgen_anon_1._oversize };
    let word = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let (min_sms, step_sms) = (word(4), word(8));
    (min_sms > 0 && step_sms > 0).then_some(SmGranularity { min_sms, step_sms })
}

/// An owned green context, destroyed when dropped.
pub(super) struct GreenCtx(pub(super) CUgreenCtx);

// SAFETY: a driver handle; see `GpuSlot` for how calls on it are serialised.
unsafe impl Send for GreenCtx {}
unsafe impl Sync for GreenCtx {}

impl GreenCtx {
    /// A green context (with a default stream) of `resources` on device `dev`: one SM
    /// resource, or several outputs of one split (the driver refuses others).
    pub(super) fn create(
        dev: CUdevice,
        resources: &[CUdevResource],
        at: &dyn Fn(&str) -> String,
    ) -> Result<GreenCtx, EngineError> {
        let mut resources = resources.to_vec();
        let mut desc: CUdevResourceDesc = std::ptr::null_mut();
        // SAFETY: `resources` are SM resources of this device (split outputs); out pointers
        // point at live locals.
        check(
            unsafe {
                sys::cuDevResourceGenerateDesc(
                    &mut desc,
                    resources.as_mut_ptr(),
                    resources.len() as u32,
                )
            },
            || at("cuDevResourceGenerateDesc"),
        )?;
        let mut green: CUgreenCtx = std::ptr::null_mut();
        check(
            unsafe {
                sys::cuGreenCtxCreate(
                    &mut green,
                    desc,
                    dev,
                    CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
                )
            },
            || at("cuGreenCtxCreate"),
        )?;
        Ok(GreenCtx(green))
    }

    /// The SMs it holds, as a resource that can be split.
    pub(super) fn sm_resource(
        &self,
        at: &dyn Fn(&str) -> String,
    ) -> Result<CUdevResource, EngineError> {
        // SAFETY: a live green context; `r` is a live local.
        let mut r: CUdevResource = unsafe { std::mem::zeroed() };
        check(
            unsafe {
                sys::cuGreenCtxGetDevResource(
                    self.0,
                    &mut r,
                    CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
                )
            },
            || at("cuGreenCtxGetDevResource(SM)"),
        )?;
        Ok(r)
    }
}

impl Drop for GreenCtx {
    fn drop(&mut self) {
        // SAFETY: created by `create`; its streams were destroyed first (see `GpuSlot`).
        unsafe { sys::cuGreenCtxDestroy(self.0) };
    }
}

/// An opened device, shared by its [`GpuDevice`](super::GpuDevice) handle and every slot
/// carved from it (each holds an `Arc`), so the primary context outlives them all.
pub(super) struct DeviceInner {
    pub(super) ordinal: usize,
    pub(super) dev: CUdevice,
    pub(super) name: String,
    pub(super) pci_bus_id: String,
    pub(super) sms: u32,
    pub(super) compute_capability: (i32, i32),
    pub(super) primary: CUcontext,
    pub(super) whole: CUdevResource,
    /// The stages (their SMs per module) the driver would not carve in one split: later ones
    /// of the same SMs go straight to a split in turn.
    pub(super) refused_one_split: std::sync::Mutex<std::collections::HashSet<Vec<u32>>>,
}

// SAFETY: the handles are process-wide driver objects, usable from any thread; the device is
// read-only after `open` (its SM resource is copied before the driver sees it), but for the
// refusals it remembers, behind their lock.
unsafe impl Send for DeviceInner {}
unsafe impl Sync for DeviceInner {}

impl std::fmt::Debug for DeviceInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDevice")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("sms", &self.sms)
            .field("compute_capability", &self.compute_capability)
            .finish()
    }
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // SAFETY: retained in `open`; every slot holds an `Arc` to this, so none is left.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

#[cfg(test)]
mod tests {
    use super::{reported_granularity, sm_count, CUdevResource};
    use mosaic_profile::SmGranularity;

    /// An SM resource laid out as a CUDA 13 driver fills one: smCount, minSmPartitionSize,
    /// smCoscheduledAlignment.
    fn resource(words: [u32; 3]) -> CUdevResource {
        // SAFETY: a plain C struct; zero is how the slots hand one to the driver.
        let mut r: CUdevResource = unsafe { std::mem::zeroed() };
        // SAFETY: writing plain bytes of the union.
        let bytes = unsafe { &mut r.__bindgen_anon_1._oversize };
        for (i, w) in words.iter().enumerate() {
            bytes[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
        }
        r
    }

    #[test]
    fn the_partition_rule_is_read_where_the_driver_wrote_it() {
        let h100 = resource([132, 8, 8]);
        assert_eq!(sm_count(&h100), 132);
        assert_eq!(
            reported_granularity(&h100),
            Some(SmGranularity {
                min_sms: 8,
                step_sms: 8
            })
        );
        // A CUDA 12 driver writes smCount alone.
        assert_eq!(reported_granularity(&resource([132, 0, 0])), None);
    }
}
