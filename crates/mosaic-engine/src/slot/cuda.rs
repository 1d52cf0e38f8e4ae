//! CUDA green-context slots (Mosaic §3.2): a slot is a green context holding a module's SM
//! quota, with a non-blocking stream in it; a plan's slots are created before training and
//! leased at every stage transition ([`GpuSlotPool`]), since creating one costs tens of
//! milliseconds ([`bench_gpu_slots`] measures it).
//!
//! Built on the CUDA driver API through `cudarc::driver::sys` (cudarc has no safe
//! green-context wrapper). cudarc loads `libcuda` when the first driver function is called and
//! panics if it is missing, so every entry point here first checks [`driver_unavailable`].
//!
//! # Partitions
//! A module's SMs are [`sms_for`] its quota: `quota × device SMs` rounded to the nearest size
//! the architecture allows (multiples of 8, at least 8, on compute capability 9.x; at least 4,
//! multiples of 2, on 8.x; see [`SmGranularity::for_compute_capability`]), at most the whole
//! device. The modules of a stage run at the same time, so [`GpuDevice::create_stage`] gives
//! them disjoint SMs: [`partition_sms`] first takes SMs back from the modules rounded up the
//! most until the stage fits the device, then the stage's SMs are split off one module at a
//! time with `cuDevSmResourceSplitByCount`. The driver neither splits a split's output again
//! nor (CUDA 12.4) merges several into one descriptor, so what is left after each module
//! becomes a green context of its own, whose SM resource is split for the next module; these
//! scaffolding contexts (one fewer than the stage's modules, never given work) live as long as
//! the stage's slots. Slots of different stages may share SMs: stages do not overlap in time.
//! [`GpuSlot::sms`] reports what the driver granted, read back from the slot's context.
//!
//! # Threads
//! A green context may be current on one thread at a time and the driver does not serialise
//! calls on it; [`GpuSlot::enter`] makes the slot's context current on the calling thread
//! (pushing it, so the previous context comes back on exit) and blocks other threads that try
//! to enter the same slot until it is left. Entering again on the same thread nests.

use std::ffi::{c_char, c_void, CStr};
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::ThreadId;
use std::time::Instant;

use cudarc::driver::sys::{
    self, CUcontext, CUdevResource, CUdevResourceDesc, CUdevResourceType, CUdevice,
    CUdevice_attribute, CUdeviceptr, CUgreenCtx, CUgreenCtxCreate_flags, CUresult, CUstream,
    CUstream_flags,
};
use serde::Serialize;

use super::{Slot, SlotMode};
use crate::error::EngineError;

/// Driver functions this module calls; all must be present before any is called (cudarc
/// panics on a missing symbol). The green-context ones need a driver of CUDA 12.4 or later.
const REQUIRED: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
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

/// The first driver version with green contexts (12.4).
const MIN_DRIVER: i32 = 12040;

/// The smallest SM partition of a device and the step between partition sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SmGranularity {
    /// Fewest SMs a partition may have.
    pub min: u32,
    /// A partition's SM count is a multiple of this.
    pub step: u32,
}

impl SmGranularity {
    /// The CUDA driver documentation's guideline for compute capability `major`.x: 6.x one SM;
    /// 7.x at least 2, multiples of 2; 8.x at least 4, multiples of 2; 9.0 and later at least
    /// 8, multiples of 8. (CUDA 13 reports the device's own values as `minSmPartitionSize` and
    /// `smCoscheduledAlignment`; the driver rounds a request up to them in any case.)
    pub fn for_compute_capability(major: i32) -> SmGranularity {
        let (min, step) = match major {
            i32::MIN..=6 => (1, 1),
            7 => (2, 2),
            8 => (4, 2),
            _ => (8, 8),
        };
        SmGranularity { min, step }
    }

    /// Whether a partition of `sms` SMs is allowed.
    pub fn allows(&self, sms: u32) -> bool {
        sms >= self.min && sms.is_multiple_of(self.step.max(1))
    }

    /// The most SMs an allowed partition of at most `capacity` SMs can have, if any.
    pub fn largest_within(&self, capacity: u32) -> Option<u32> {
        let step = self.step.max(1);
        let top = capacity - capacity % step;
        (top >= self.min).then_some(top)
    }
}

/// SMs for a slot of `quota` on a device of `total` SMs: `quota × total` rounded to the nearest
/// multiple of `g.step`, at least `g.min`, at most the largest allowed count within `total`.
/// `None` if the quota is not positive (or not a number) or `total` cannot hold a partition.
pub fn sms_for(quota: f64, total: u32, g: SmGranularity) -> Option<u32> {
    let cap = g.largest_within(total)?;
    if quota.is_nan() || quota <= 0.0 {
        return None;
    }
    let step = g.step.max(1);
    let want = (quota * total as f64 / step as f64).round();
    let rounded = (want.min(u32::MAX as f64) as u32).saturating_mul(step);
    Some(rounded.max(g.min).min(cap))
}

/// SMs for every module of a stage that runs them at the same time: [`sms_for`] each quota of
/// `total`, then, while the stage asks for more than `capacity` SMs (the SMs its partitions can
/// be cut from), the module furthest above its exact share `quota × total` gives back
/// `g.step` SMs (the first such module on a tie); a module never goes below `g.min`. Fails
/// when the stage cannot fit (too many modules for their minimum partitions) or a quota is not
/// positive.
pub fn partition_sms(
    quotas: &[f64],
    total: u32,
    capacity: u32,
    g: SmGranularity,
) -> Result<Vec<u32>, String> {
    let cap = g.largest_within(capacity).ok_or_else(|| {
        format!(
            "{capacity} SMs hold no partition (of at least {} SMs)",
            g.min
        )
    })?;
    let mut sms = Vec::with_capacity(quotas.len());
    for (i, &q) in quotas.iter().enumerate() {
        let n = sms_for(q, total, g).ok_or_else(|| {
            format!("module {i}: quota {q} gives no partition of a {total}-SM device")
        })?;
        sms.push(n.min(cap));
    }
    let step = g.step.max(1);
    while sms.iter().map(|&n| n as u64).sum::<u64>() > capacity as u64 {
        let over = |i: usize| sms[i] as f64 - quotas[i] * total as f64;
        let give = (0..sms.len()).filter(|&i| sms[i] >= g.min + step).fold(
            None,
            |best: Option<usize>, i| match best {
                Some(b) if over(b) >= over(i) => Some(b),
                _ => Some(i),
            },
        );
        match give {
            Some(i) => sms[i] -= step,
            None => {
                return Err(format!(
                    "{} modules at once need at least {} SMs ({} each); {capacity} can be \
                     partitioned",
                    sms.len(),
                    sms.len() as u64 * g.min as u64,
                    g.min
                ))
            }
        }
    }
    Ok(sms)
}

/// Why green-context slots cannot be used here, or `None` if they can: no CUDA driver library,
/// a driver older than 12.4 (no green contexts), `cuInit` failing, or no device. Loads and
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

/// Loads the driver library, checks every function this module calls is in it, and calls
/// `cuInit` — once per process.
fn driver() -> &'static Result<(), String> {
    static DRIVER: OnceLock<Result<(), String>> = OnceLock::new();
    DRIVER.get_or_init(|| {
        // SAFETY: only tries to open the library (dlopen) and drops it.
        if !unsafe { sys::is_culib_present() } {
            return Err("no CUDA driver library (libcuda.so) found".into());
        }
        // SAFETY: `culib` cannot panic now that a candidate library opened; `get` only looks
        // a symbol up, the pointer is not called.
        let lib = unsafe { sys::culib() };
        for name in REQUIRED {
            if unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err() {
                return Err(format!(
                    "the CUDA driver lacks {name} (green contexts need a driver for CUDA 12.4 \
                     or later)"
                ));
            }
        }
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
                "the CUDA driver is version {}.{}; green contexts need 12.4 or later",
                version / 1000,
                version % 1000 / 10
            ));
        }
        Ok(())
    })
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
fn check(r: CUresult, what: impl FnOnce() -> String) -> Result<(), EngineError> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(EngineError::Cuda {
            what: what(),
            message: describe(r),
        })
    }
}

/// A GPU ready for green-context slots: its SMs, compute capability and primary context
/// (retained while the device or any of its slots lives: green contexts are created from it,
/// and keeping it alive spares every creation its initialisation). Cheap to clone.
#[derive(Debug, Clone)]
pub struct GpuDevice {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    ordinal: usize,
    dev: CUdevice,
    name: String,
    sms: u32,
    compute_capability: (i32, i32),
    primary: CUcontext,
    whole: CUdevResource,
}

// SAFETY: the handles are process-wide driver objects, usable from any thread; the device is
// read-only after `open` (its SM resource is copied before the driver sees it).
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

/// The SM count of an SM resource.
fn sm_count(r: &CUdevResource) -> u32 {
    // SAFETY: only called on resources of type SM, whose union member is `sm`.
    unsafe { r.__bindgen_anon_1.sm.smCount }
}

/// An owned green context, destroyed when dropped.
struct GreenCtx(CUgreenCtx);

// SAFETY: a driver handle; see `GpuSlot` for how calls on it are serialised.
unsafe impl Send for GreenCtx {}
unsafe impl Sync for GreenCtx {}

impl GreenCtx {
    /// A green context (with a default stream) of `resource` on `device`.
    fn create(
        device: &DeviceInner,
        resource: &CUdevResource,
        at: &dyn Fn(&str) -> String,
    ) -> Result<GreenCtx, EngineError> {
        let mut resources = [*resource];
        let mut desc: CUdevResourceDesc = std::ptr::null_mut();
        // SAFETY: `resource` is an SM resource of this device (a split result); out pointers
        // point at live locals.
        check(
            unsafe { sys::cuDevResourceGenerateDesc(&mut desc, resources.as_mut_ptr(), 1) },
            || at("cuDevResourceGenerateDesc"),
        )?;
        let mut green: CUgreenCtx = std::ptr::null_mut();
        check(
            unsafe {
                sys::cuGreenCtxCreate(
                    &mut green,
                    desc,
                    device.dev,
                    CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
                )
            },
            || at("cuGreenCtxCreate"),
        )?;
        Ok(GreenCtx(green))
    }

    /// The SMs it holds, as a resource that can be split.
    fn sm_resource(&self, at: &dyn Fn(&str) -> String) -> Result<CUdevResource, EngineError> {
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

impl GpuDevice {
    /// Opens CUDA device `ordinal`: checks the driver ([`driver_unavailable`]), reads the
    /// device's name, SMs and compute capability, and retains its primary context.
    pub fn open(ordinal: usize) -> Result<GpuDevice, EngineError> {
        let at = |what: &str| format!("{what} (device {ordinal})");
        driver().as_ref().map_err(|why| EngineError::Cuda {
            what: at("loading the driver"),
            message: why.clone(),
        })?;
        let mut dev: CUdevice = 0;
        // SAFETY (all calls below): the driver is loaded and initialised, every out pointer
        // points at a live local.
        check(
            unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) },
            || at("cuDeviceGet"),
        )?;
        let attribute = |a: CUdevice_attribute, what: &str| -> Result<i32, EngineError> {
            let mut v = 0;
            check(unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) }, || {
                at(&format!("cuDeviceGetAttribute({what})"))
            })?;
            Ok(v)
        };
        let major = attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            "compute capability major",
        )?;
        let minor = attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            "compute capability minor",
        )?;
        let mut name = [0 as c_char; 256];
        check(
            unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev) },
            || at("cuDeviceGetName"),
        )?;
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        if major < 6 {
            return Err(EngineError::Cuda {
                what: at("green contexts"),
                message: format!(
                    "{name} has compute capability {major}.{minor}; green contexts need 6.0 \
                     or later"
                ),
            });
        }
        let mut whole: CUdevResource = unsafe { std::mem::zeroed() };
        check(
            unsafe {
                sys::cuDeviceGetDevResource(
                    dev,
                    &mut whole,
                    CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
                )
            },
            || at("cuDeviceGetDevResource(SM)"),
        )?;
        let mut primary: CUcontext = std::ptr::null_mut();
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut primary, dev) },
            || at("cuDevicePrimaryCtxRetain"),
        )?;
        Ok(GpuDevice {
            inner: Arc::new(DeviceInner {
                ordinal,
                dev,
                name,
                sms: sm_count(&whole),
                compute_capability: (major, minor),
                primary,
                whole,
            }),
        })
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The device's name (e.g. `NVIDIA H100 80GB HBM3`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The device's SMs (as its SM resource reports them).
    pub fn sms(&self) -> u32 {
        self.inner.sms
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.inner.compute_capability
    }

    /// The partition sizes this device allows, by its compute capability.
    pub fn granularity(&self) -> SmGranularity {
        SmGranularity::for_compute_capability(self.inner.compute_capability.0)
    }

    /// SMs each module of a stage would ask for, by [`partition_sms`] on this device.
    pub fn stage_sms(&self, quotas: &[f64]) -> Result<Vec<u32>, EngineError> {
        partition_sms(quotas, self.sms(), self.sms(), self.granularity()).map_err(|message| {
            EngineError::Cuda {
                what: format!(
                    "partitioning device {} ({}) for quotas {quotas:?}",
                    self.ordinal(),
                    self.name()
                ),
                message,
            }
        })
    }

    /// The slots of one stage, `(module, quota)` each, on disjoint SMs: a green context and a
    /// stream per module (see the [module docs](self) for how the SMs are split).
    pub fn create_stage(&self, modules: &[(&str, f64)]) -> Result<Vec<GpuSlot>, EngineError> {
        let quotas: Vec<f64> = modules.iter().map(|m| m.1).collect();
        let sms = self.stage_sms(&quotas)?;
        let device = &self.inner;
        let mut input = device.whole;
        let mut scaffold = Vec::new();
        let mut parts = Vec::with_capacity(sms.len());
        for (i, (&(module, _), &n)) in modules.iter().zip(&sms).enumerate() {
            let left = sm_count(&input);
            let at = |what: &str| {
                format!(
                    "{what} taking {n} of {left} SMs for module \"{module}\" (device {})",
                    device.ordinal
                )
            };
            let mut part: CUdevResource = unsafe { std::mem::zeroed() };
            let mut rest: CUdevResource = unsafe { std::mem::zeroed() };
            let mut count = 1;
            // SAFETY: `input` is the device's SM resource or a green context's; out pointers
            // point at live locals; room for one group.
            check(
                unsafe {
                    sys::cuDevSmResourceSplitByCount(&mut part, &mut count, &input, &mut rest, 0, n)
                },
                || at("cuDevSmResourceSplitByCount"),
            )?;
            if count != 1 {
                return Err(EngineError::Cuda {
                    what: at("cuDevSmResourceSplitByCount"),
                    message: "the driver made no group of that size".into(),
                });
            }
            parts.push(part);
            if i + 1 < modules.len() {
                // The rest cannot be split again as it is; as a green context's resource it can.
                let rest = GreenCtx::create(device, &rest, &at)?;
                input = rest.sm_resource(&at)?;
                scaffold.push(rest);
            }
        }
        let scaffold = Arc::new(scaffold);
        modules
            .iter()
            .zip(&parts)
            .map(|(&(module, quota), part)| {
                GpuSlot::create(&self.inner, module, quota, part, scaffold.clone())
            })
            .collect()
    }

    /// One slot of `quota` for `module` (a stage of one module).
    pub fn create_slot(&self, module: &str, quota: f64) -> Result<GpuSlot, EngineError> {
        Ok(self
            .create_stage(&[(module, quota)])?
            .pop()
            .expect("one module, one slot"))
    }

    /// Runs `f` with the primary context current on this thread.
    fn in_primary<T>(&self, f: impl FnOnce() -> Result<T, EngineError>) -> Result<T, EngineError> {
        // SAFETY: the primary context is retained for the device's life.
        check(
            unsafe { sys::cuCtxPushCurrent_v2(self.inner.primary) },
            || "cuCtxPushCurrent(primary context)".into(),
        )?;
        let out = f();
        let mut prev: CUcontext = std::ptr::null_mut();
        unsafe { sys::cuCtxPopCurrent_v2(&mut prev) };
        out
    }
}

/// A green-context slot: the green context holding a module's SMs and a non-blocking stream
/// in it. Destroyed (stream, then context) when dropped, after the stream's work finishes.
pub struct GpuSlot {
    module: String,
    quota: f64,
    sms: u32,
    context: CUcontext,
    stream: CUstream,
    owner: Owner,
    // Dropped in this order after `Drop::drop` has destroyed the stream.
    green: GreenCtx,
    _scaffold: Arc<Vec<GreenCtx>>,
    device: Arc<DeviceInner>,
}

// SAFETY: the handles are driver objects usable from any thread; what the driver does not
// serialise (a green context current on several threads, calls on it from several threads)
// only happens inside `enter`, which admits one thread at a time.
unsafe impl Send for GpuSlot {}
unsafe impl Sync for GpuSlot {}

impl std::fmt::Debug for GpuSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSlot")
            .field("module", &self.module)
            .field("quota", &self.quota)
            .field("sms", &self.sms)
            .field("device", &self.device.ordinal)
            .finish()
    }
}

impl GpuSlot {
    /// A green context of `part` (a split result) and a non-blocking stream in it.
    fn create(
        device: &Arc<DeviceInner>,
        module: &str,
        quota: f64,
        part: &CUdevResource,
        scaffold: Arc<Vec<GreenCtx>>,
    ) -> Result<GpuSlot, EngineError> {
        let at = |what: &str| {
            format!(
                "{what} for a {}-SM slot of module \"{module}\" (device {})",
                sm_count(part),
                device.ordinal
            )
        };
        let green = GreenCtx::create(device, part, &at)?;
        let granted = green.sm_resource(&at)?;
        let mut slot = GpuSlot {
            module: module.to_string(),
            quota,
            sms: sm_count(&granted),
            context: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            owner: Owner::default(),
            green,
            _scaffold: scaffold,
            device: device.clone(),
        };
        // SAFETY: a live green context; out pointers point at the slot's fields. On an early
        // return, `Drop` destroys what was created.
        check(
            unsafe { sys::cuCtxFromGreenCtx(&mut slot.context, slot.green.0) },
            || at("cuCtxFromGreenCtx"),
        )?;
        check(
            unsafe {
                sys::cuGreenCtxStreamCreate(
                    &mut slot.stream,
                    slot.green.0,
                    CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                    0,
                )
            },
            || at("cuGreenCtxStreamCreate"),
        )?;
        Ok(slot)
    }

    /// The module the slot is for.
    pub fn module(&self) -> &str {
        &self.module
    }

    /// The quota it was created for.
    pub fn quota(&self) -> f64 {
        self.quota
    }

    /// SMs the driver granted its green context.
    pub fn sms(&self) -> u32 {
        self.sms
    }

    /// The ordinal of its device.
    pub fn device_ordinal(&self) -> usize {
        self.device.ordinal
    }

    /// Makes the slot's green context current on this thread until the returned guard drops
    /// (which restores the previous context). Blocks while another thread is inside the slot;
    /// nests on the same thread.
    pub fn enter(&self) -> Result<Current<'_>, EngineError> {
        self.owner.acquire();
        // SAFETY: `context` is the live green context's CUcontext; only this thread has it.
        let r = unsafe { sys::cuCtxPushCurrent_v2(self.context) };
        if let Err(e) = check(r, || {
            format!("cuCtxPushCurrent(slot of module \"{}\")", self.module)
        }) {
            self.owner.release();
            return Err(e);
        }
        Ok(Current {
            slot: self,
            _thread_bound: PhantomData,
        })
    }

    /// Runs `f` on this thread with the slot's green context current (see [`GpuSlot::enter`]).
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T, EngineError> {
        let _current = self.enter()?;
        Ok(f())
    }

    /// Real work on the slot's stream: allocates `words` 32-bit words in the slot's context,
    /// fills them with `value` (`cuMemsetD32Async`) and copies them back on the stream, waits
    /// for the stream and returns what the device holds.
    pub fn fill(&self, words: usize, value: u32) -> Result<Vec<u32>, EngineError> {
        if words == 0 {
            return Ok(Vec::new());
        }
        let current = self.enter()?;
        let at = |what: &str| format!("{what} ({words} words, slot of module \"{}\")", self.module);
        let mut dptr: CUdeviceptr = 0;
        // SAFETY: the slot's context is current; `dptr` is freed below on every path.
        check(unsafe { sys::cuMemAlloc_v2(&mut dptr, words * 4) }, || {
            at("cuMemAlloc")
        })?;
        let mut host = vec![0u32; words];
        let work = (|| {
            // SAFETY: `dptr` holds `words` words; `host` outlives the synchronisation below.
            check(
                unsafe { sys::cuMemsetD32Async(dptr, value, words, current.stream()) },
                || at("cuMemsetD32Async"),
            )?;
            check(
                unsafe {
                    sys::cuMemcpyDtoHAsync_v2(
                        host.as_mut_ptr() as *mut c_void,
                        dptr,
                        words * 4,
                        current.stream(),
                    )
                },
                || at("cuMemcpyDtoHAsync"),
            )?;
            current.synchronize()
        })();
        // SAFETY: the stream is idle (synchronised), or failed before using `dptr`.
        unsafe {
            if work.is_err() {
                sys::cuStreamSynchronize(current.stream());
            }
            sys::cuMemFree_v2(dptr);
        }
        work.map(|()| host)
    }
}

impl Drop for GpuSlot {
    fn drop(&mut self) {
        // SAFETY: the stream was created in `create` (null if creation stopped earlier); no
        // `Current` guard can be alive (it borrows the slot). Errors cannot be reported here.
        // The green context is destroyed next, by its field's drop.
        unsafe {
            if !self.stream.is_null() {
                sys::cuStreamSynchronize(self.stream);
                sys::cuStreamDestroy_v2(self.stream);
            }
        }
    }
}

/// A slot's green context, current on this thread while this guard lives (not `Send`: the
/// context must be popped on the thread that pushed it).
pub struct Current<'a> {
    slot: &'a GpuSlot,
    _thread_bound: PhantomData<*const ()>,
}

impl Current<'_> {
    /// The slot.
    pub fn slot(&self) -> &GpuSlot {
        self.slot
    }

    /// The slot's stream (non-blocking, in its green context), for driver calls made while
    /// the guard lives.
    pub fn stream(&self) -> CUstream {
        self.slot.stream
    }

    /// The slot's green context as a `CUcontext` (owned by the slot: never destroy it).
    pub fn context(&self) -> CUcontext {
        self.slot.context
    }

    /// Waits until the slot's stream has finished its work.
    pub fn synchronize(&self) -> Result<(), EngineError> {
        // SAFETY: the stream lives as long as the slot.
        check(
            unsafe { sys::cuStreamSynchronize(self.slot.stream) },
            || {
                format!(
                    "cuStreamSynchronize(slot of module \"{}\")",
                    self.slot.module
                )
            },
        )
    }
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        let mut prev: CUcontext = std::ptr::null_mut();
        // SAFETY: pushed in `enter` on this thread (the guard is not `Send`).
        unsafe { sys::cuCtxPopCurrent_v2(&mut prev) };
        self.slot.owner.release();
    }
}

/// Which thread is inside a slot, and how deeply: a lock that the same thread may take again.
#[derive(Debug, Default)]
struct Owner {
    state: Mutex<Option<(ThreadId, usize)>>,
    freed: Condvar,
}

impl Owner {
    fn acquire(&self) {
        let me = std::thread::current().id();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match state.as_mut() {
                None => {
                    *state = Some((me, 1));
                    return;
                }
                Some((owner, depth)) if *owner == me => {
                    *depth += 1;
                    return;
                }
                Some(_) => state = self.freed.wait(state).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    fn release(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, depth)) = state.as_mut() {
            *depth -= 1;
            if *depth == 0 {
                *state = None;
                self.freed.notify_one();
            }
        }
    }
}

/// The green-context slots of a plan's stages: created before training
/// ([`SlotMode::Pooled`]) or by every stage that starts ([`SlotMode::OnDemand`]). Each stage
/// is partitioned with [`GpuDevice::create_stage`].
#[derive(Debug)]
pub struct GpuSlotPool {
    device: GpuDevice,
    mode: SlotMode,
    stages: Vec<Vec<(String, f64)>>,
    slots: Vec<Vec<Slot>>,
}

/// A stage's slots: the pool's, or created for the stage and destroyed when dropped.
#[derive(Debug)]
pub enum StageSlots<'a> {
    /// Borrowed from the pool.
    Pooled(&'a [Slot]),
    /// Created on demand.
    Fresh(Vec<Slot>),
}

impl Deref for StageSlots<'_> {
    type Target = [Slot];
    fn deref(&self) -> &[Slot] {
        match self {
            StageSlots::Pooled(s) => s,
            StageSlots::Fresh(s) => s,
        }
    }
}

fn create_stage_slots(
    device: &GpuDevice,
    stage: &[(String, f64)],
) -> Result<Vec<Slot>, EngineError> {
    let modules: Vec<(&str, f64)> = stage.iter().map(|(m, q)| (m.as_str(), *q)).collect();
    Ok(device
        .create_stage(&modules)?
        .into_iter()
        .map(Slot::Gpu)
        .collect())
}

impl GpuSlotPool {
    /// The pool for `stages` (each a list of `(module, quota)` that run at the same time) on
    /// `device`; in [`SlotMode::Pooled`] every slot is created now.
    pub fn new(
        device: &GpuDevice,
        stages: Vec<Vec<(String, f64)>>,
        mode: SlotMode,
    ) -> Result<GpuSlotPool, EngineError> {
        let slots = match mode {
            SlotMode::Pooled => stages
                .iter()
                .map(|s| create_stage_slots(device, s))
                .collect::<Result<_, _>>()?,
            SlotMode::OnDemand => Vec::new(),
        };
        Ok(GpuSlotPool {
            device: device.clone(),
            mode,
            stages,
            slots,
        })
    }

    /// The mode.
    pub fn mode(&self) -> SlotMode {
        self.mode
    }

    /// Slots created ahead of training (0 on demand).
    pub fn created(&self) -> usize {
        self.slots.iter().map(Vec::len).sum()
    }

    /// The slots of stage `stage`, in its module order.
    ///
    /// # Panics
    /// If there is no stage `stage`.
    pub fn stage(&self, stage: usize) -> Result<StageSlots<'_>, EngineError> {
        match self.mode {
            SlotMode::Pooled => Ok(StageSlots::Pooled(&self.slots[stage])),
            SlotMode::OnDemand => Ok(StageSlots::Fresh(create_stage_slots(
                &self.device,
                &self.stages[stage],
            )?)),
        }
    }
}

/// Pooled against on-demand green-context slots over the same stage transitions.
#[derive(Debug, Clone, Serialize)]
pub struct GpuSlotBench {
    /// The device's name.
    pub device: String,
    /// Its compute capability, e.g. `9.0`.
    pub compute_capability: String,
    /// Its SMs.
    pub sms: u32,
    /// Partition sizes the device allows.
    pub granularity: SmGranularity,
    /// The stages' quotas, as asked.
    pub quotas: Vec<Vec<f64>>,
    /// SMs granted to each slot of each stage (pooled slots, read back from the driver).
    pub granted_sms: Vec<Vec<u32>>,
    /// Stage transitions measured per mode (after one warm-up pass over the stages).
    pub transitions: usize,
    /// Time to create the pool's slots before training, ms.
    pub pool_setup_ms: f64,
    /// Median pooled transition: lease the stage's slots and enqueue work on each stream, ms.
    pub pooled_transition_ms: f64,
    /// Median on-demand transition: create the stage's slots and enqueue work on each, ms.
    pub on_demand_transition_ms: f64,
    /// Median creation part of an on-demand transition, ms.
    pub on_demand_create_ms: f64,
    /// Median time to destroy a stage's on-demand slots at its end, ms (not in the transition).
    pub on_demand_destroy_ms: f64,
}

/// A device buffer in the primary context (green contexts share its memory).
struct Scratch<'a> {
    device: &'a GpuDevice,
    ptr: CUdeviceptr,
}

impl<'a> Scratch<'a> {
    fn new(device: &'a GpuDevice, words: usize) -> Result<Scratch<'a>, EngineError> {
        let mut ptr: CUdeviceptr = 0;
        device.in_primary(|| {
            // SAFETY: the primary context is current; `ptr` is a live out pointer.
            check(
                unsafe { sys::cuMemAlloc_v2(&mut ptr, words.max(1) * 4) },
                || format!("cuMemAlloc({words} words, primary context)"),
            )
        })?;
        Ok(Scratch { device, ptr })
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        let ptr = self.ptr;
        // SAFETY: allocated in `new`; every stream that used it was synchronised.
        let _ = self.device.in_primary(|| {
            unsafe { sys::cuMemFree_v2(ptr) };
            Ok(())
        });
    }
}

/// Enqueues a one-word fill of word `i` of `scratch` on every slot's stream (what starting a
/// stage's modules costs besides getting their slots).
fn launch(slots: &[Slot], scratch: &Scratch<'_>, value: u32) -> Result<(), EngineError> {
    for (i, slot) in slots.iter().enumerate() {
        let gpu = slot.as_gpu().expect("GPU pools hold GPU slots");
        let current = gpu.enter()?;
        // SAFETY: word `i` lies in `scratch` (one word per module of the largest stage).
        check(
            unsafe {
                sys::cuMemsetD32Async(scratch.ptr + 4 * i as u64, value, 1, current.stream())
            },
            || format!("cuMemsetD32Async(slot of module \"{}\")", gpu.module()),
        )?;
    }
    Ok(())
}

/// Waits for every slot's stream.
fn finish(slots: &[Slot]) -> Result<(), EngineError> {
    for slot in slots {
        let gpu = slot.as_gpu().expect("GPU pools hold GPU slots");
        gpu.enter()?.synchronize()?;
    }
    Ok(())
}

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Mosaic's Fig. 11a on a real GPU: `transitions` stage transitions cycling through `stages`
/// (each a list of quotas that run at the same time) on device `ordinal`, once with the slots
/// of every stage created before the first transition and leased from the pool, once with
/// each stage's slots created when it starts and destroyed when it ends. A transition ends
/// when every module of the new stage has work (a one-word fill) enqueued on its slot's stream;
/// the stage's streams are then waited for, outside the measurement. One warm-up pass over
/// the stages precedes each mode's measurements. Returns the medians.
pub fn bench_gpu_slots(
    ordinal: usize,
    stages: &[Vec<f64>],
    transitions: usize,
) -> Result<GpuSlotBench, EngineError> {
    if stages.is_empty() {
        return Err(EngineError::BadSetting {
            setting: "stages".into(),
            message: "no stage to measure transitions between".into(),
        });
    }
    let device = GpuDevice::open(ordinal)?;
    let named: Vec<Vec<(String, f64)>> = stages
        .iter()
        .enumerate()
        .map(|(s, qs)| {
            qs.iter()
                .enumerate()
                .map(|(m, &q)| (format!("stage{s}-module{m}"), q))
                .collect()
        })
        .collect();
    let widest = stages.iter().map(Vec::len).max().unwrap_or(0);
    let scratch = Scratch::new(&device, widest)?;
    let n = stages.len();

    let t = Instant::now();
    let pooled = GpuSlotPool::new(&device, named.clone(), SlotMode::Pooled)?;
    let pool_setup_ms = ms_since(t);
    let granted_sms = (0..stages.len())
        .map(|s| {
            Ok(pooled
                .stage(s)?
                .iter()
                .map(|slot| slot.sms().unwrap_or(0))
                .collect())
        })
        .collect::<Result<Vec<Vec<u32>>, EngineError>>()?;
    let mut pooled_ms = Vec::with_capacity(transitions);
    for i in 0..stages.len() + transitions {
        let t = Instant::now();
        let slots = pooled.stage(i % n)?;
        launch(&slots, &scratch, i as u32)?;
        let ms = ms_since(t);
        finish(&slots)?;
        if i >= stages.len() {
            pooled_ms.push(ms);
        }
    }
    drop(pooled);

    let on_demand = GpuSlotPool::new(&device, named, SlotMode::OnDemand)?;
    let (mut transition_ms, mut create_ms, mut destroy_ms) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..stages.len() + transitions {
        let t = Instant::now();
        let slots = on_demand.stage(i % n)?;
        let created = ms_since(t);
        launch(&slots, &scratch, i as u32)?;
        let ms = ms_since(t);
        finish(&slots)?;
        let t = Instant::now();
        drop(slots);
        let destroyed = ms_since(t);
        if i >= stages.len() {
            transition_ms.push(ms);
            create_ms.push(created);
            destroy_ms.push(destroyed);
        }
    }
    let (major, minor) = device.compute_capability();
    Ok(GpuSlotBench {
        device: device.name().to_string(),
        compute_capability: format!("{major}.{minor}"),
        sms: device.sms(),
        granularity: device.granularity(),
        quotas: stages.to_vec(),
        granted_sms,
        transitions,
        pool_setup_ms,
        pooled_transition_ms: median(pooled_ms),
        on_demand_transition_ms: median(transition_ms),
        on_demand_create_ms: median(create_ms),
        on_demand_destroy_ms: median(destroy_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOPPER: SmGranularity = SmGranularity { min: 8, step: 8 };
    const AMPERE: SmGranularity = SmGranularity { min: 4, step: 2 };

    #[test]
    fn granularity_by_compute_capability() {
        assert_eq!(SmGranularity::for_compute_capability(9), HOPPER);
        assert_eq!(SmGranularity::for_compute_capability(10), HOPPER);
        assert_eq!(SmGranularity::for_compute_capability(8), AMPERE);
        assert_eq!(
            SmGranularity::for_compute_capability(7),
            SmGranularity { min: 2, step: 2 }
        );
        assert_eq!(
            SmGranularity::for_compute_capability(6),
            SmGranularity { min: 1, step: 1 }
        );
        assert!(HOPPER.allows(16) && !HOPPER.allows(12) && !HOPPER.allows(0));
        assert!(AMPERE.allows(6) && !AMPERE.allows(2) && !AMPERE.allows(7));
        assert_eq!(HOPPER.largest_within(132), Some(128));
        assert_eq!(AMPERE.largest_within(7), Some(6));
        assert_eq!(AMPERE.largest_within(3), None);
    }

    #[test]
    fn quota_rounds_to_the_nearest_allowed_count() {
        // H100 SXM, 132 SMs: 0.25 × 132 = 33 → 32; 0.5 × 132 = 66 → 64; 0.3 × 132 = 39.6 → 40.
        assert_eq!(sms_for(0.25, 132, HOPPER), Some(32));
        assert_eq!(sms_for(0.5, 132, HOPPER), Some(64));
        assert_eq!(sms_for(0.3, 132, HOPPER), Some(40));
        // 0.35 × 132 = 46.2 → 48 (rounded up, not down).
        assert_eq!(sms_for(0.35, 132, HOPPER), Some(48));
        // A100, 108 SMs: 0.3 × 108 = 32.4 → 32; 0.33 × 108 = 35.64 → 36; 0.05 × 108 = 5.4 → 6.
        assert_eq!(sms_for(0.3, 108, AMPERE), Some(32));
        assert_eq!(sms_for(0.33, 108, AMPERE), Some(36));
        assert_eq!(sms_for(0.05, 108, AMPERE), Some(6));
    }

    #[test]
    fn quota_is_at_least_the_minimum_and_at_most_the_device() {
        assert_eq!(sms_for(0.01, 132, HOPPER), Some(8));
        assert_eq!(sms_for(0.01, 108, AMPERE), Some(4));
        // The whole device: 132 is not a multiple of 8; the largest partition is 128.
        assert_eq!(sms_for(1.0, 132, HOPPER), Some(128));
        assert_eq!(sms_for(1.0, 108, AMPERE), Some(108));
        assert_eq!(sms_for(1.0, 7, AMPERE), Some(6));
        assert_eq!(sms_for(3.0, 108, AMPERE), Some(108));
    }

    #[test]
    fn no_partition_for_bad_quotas_or_tiny_devices() {
        assert_eq!(sms_for(0.0, 132, HOPPER), None);
        assert_eq!(sms_for(-0.5, 132, HOPPER), None);
        assert_eq!(sms_for(f64::NAN, 132, HOPPER), None);
        assert_eq!(sms_for(0.5, 6, HOPPER), None);
        assert_eq!(sms_for(1.0, 3, AMPERE), None);
    }

    #[test]
    fn a_stage_that_fits_keeps_its_rounding() {
        assert_eq!(
            partition_sms(&[0.25, 0.5, 0.25], 132, 128, HOPPER).unwrap(),
            [32, 64, 32]
        );
        assert_eq!(
            partition_sms(&[0.3, 0.7], 108, 108, AMPERE).unwrap(),
            [32, 76]
        );
    }

    #[test]
    fn a_stage_rounded_past_the_device_gives_back_the_excess() {
        // 46.2 → 48, 46.2 → 48, 39.6 → 40: 136 > 128. The first of the two modules 1.8 SMs
        // above their share gives back a group: 40 + 48 + 40 = 128.
        assert_eq!(
            partition_sms(&[0.35, 0.35, 0.3], 132, 128, HOPPER).unwrap(),
            [40, 48, 40]
        );
        // Two halves of 132 round to 64 each and fit 128 exactly.
        assert_eq!(
            partition_sms(&[0.5, 0.5], 132, 128, HOPPER).unwrap(),
            [64, 64]
        );
        // 1.0 + a small module: 128 (capped) + 8 > 128 → the big one gives back 8.
        assert_eq!(
            partition_sms(&[1.0, 0.01], 132, 128, HOPPER).unwrap(),
            [120, 8]
        );
        // A smaller capacity than the device (SMs already taken): 96.
        assert_eq!(
            partition_sms(&[0.5, 0.5], 132, 96, HOPPER).unwrap(),
            [48, 48]
        );
        let sms = partition_sms(&[0.2; 5], 108, 108, AMPERE).unwrap();
        assert!(sms.iter().sum::<u32>() <= 108 && sms.iter().all(|&n| AMPERE.allows(n)));
    }

    #[test]
    fn a_stage_of_too_many_modules_is_refused() {
        // 17 modules of at least 8 SMs do not fit 128.
        let e = partition_sms(&[0.05; 17], 132, 128, HOPPER).unwrap_err();
        assert!(e.contains("17 modules") && e.contains("136"), "{e}");
        assert!(partition_sms(&[0.05; 16], 132, 128, HOPPER).is_ok());
        assert!(partition_sms(&[0.5, 0.0], 132, 128, HOPPER).is_err());
        assert!(partition_sms(&[0.5], 132, 4, HOPPER).is_err());
    }

    #[test]
    fn a_slot_admits_one_thread_at_a_time_and_nests_on_one() {
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        use std::time::Duration;
        let owner = Arc::new(Owner::default());
        owner.acquire();
        owner.acquire(); // the same thread again: nests, does not deadlock
        let entered = Arc::new(AtomicBool::new(false));
        let other = {
            let (owner, entered) = (owner.clone(), entered.clone());
            std::thread::spawn(move || {
                owner.acquire();
                entered.store(true, SeqCst);
                owner.release();
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!entered.load(SeqCst), "entered while held twice");
        owner.release();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!entered.load(SeqCst), "entered while still held once");
        owner.release();
        other.join().unwrap();
        assert!(entered.load(SeqCst));
    }

    /// The GPU path: skipped (with a line on standard error) where no driver or device is.
    #[test]
    fn green_context_slots_on_a_real_gpu() {
        if let Some(why) = driver_unavailable() {
            eprintln!("skipped: no CUDA driver/GPU ({why})");
            return;
        }
        let device = GpuDevice::open(0).expect("open device 0");
        let g = device.granularity();
        let quotas = [0.25, 0.5, 0.25];
        let names = ["a", "b", "c"];
        let modules: Vec<(&str, f64)> = names.iter().copied().zip(quotas).collect();
        let slots = device
            .create_stage(&modules)
            .expect("create a stage's slots");
        let planned = device.stage_sms(&quotas).unwrap();
        let granted: Vec<u32> = slots.iter().map(GpuSlot::sms).collect();
        eprintln!(
            "{} ({} SMs, {g:?}): quotas {quotas:?} asked {planned:?}, got {granted:?} SMs",
            device.name(),
            device.sms(),
        );
        assert!(granted.iter().all(|&n| g.allows(n)), "{granted:?} vs {g:?}");
        assert!(granted.iter().sum::<u32>() <= device.sms());
        for (i, slot) in slots.iter().enumerate() {
            let value = 0x5107_0000 + i as u32;
            let got = slot.fill(4096, value).expect("fill on the slot's stream");
            assert!(got.iter().all(|&w| w == value), "slot {i}");
        }
        // Nesting on one thread, and a slot in the Slot enum running a closure.
        let slot = Slot::Gpu(slots.into_iter().next().unwrap());
        let gpu = slot.as_gpu().unwrap();
        let outer = gpu.enter().unwrap();
        assert_eq!(gpu.fill(16, 7).unwrap(), [7; 16]);
        drop(outer);
        assert_eq!(slot.run(|| 41 + 1), 42);
        assert_eq!(slot.sms(), Some(granted[0]));

        let b = bench_gpu_slots(0, &[quotas.to_vec(), vec![0.5, 0.5], vec![1.0]], 12)
            .expect("bench green-context slots");
        eprintln!("{b:?}");
        assert_eq!(b.granted_sms.len(), 3);
        assert!(
            b.pooled_transition_ms < b.on_demand_transition_ms,
            "pooled {} ms vs on demand {} ms",
            b.pooled_transition_ms,
            b.on_demand_transition_ms
        );
    }
}
