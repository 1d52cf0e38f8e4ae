//! A green-context slot: the green context holding a module's SMs and a non-blocking stream
//! in it, and the guard that makes it current on a thread.
//!
//! A green context may be current on one thread at a time and the driver does not serialise
//! calls on it; [`GpuSlot::enter`] makes the slot's context current on the calling thread
//! (pushing it, so the previous context comes back on exit) and blocks other threads that try
//! to enter the same slot until it is left. Entering again on the same thread nests.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;

use cudarc::driver::sys::{self, CUcontext, CUdevResource, CUdeviceptr, CUstream, CUstream_flags};

use super::driver::{check, reported_granularity, sm_count, DeviceInner, GreenCtx};
use super::Carving;
use crate::error::EngineError;
use mosaic_profile::SmGranularity;

/// A green-context slot: the green context holding a module's SMs and a non-blocking stream
/// in it. Destroyed (stream, then context) when dropped, after the stream's work finishes.
pub struct GpuSlot {
    module: String,
    quota: f64,
    sms: u32,
    reported: Option<SmGranularity>,
    carving: Carving,
    context: CUcontext,
    stream: CUstream,
    owner: Owner,
    /// The candle devices bound to the stream through the primary context
    /// ([`GpuSlot::candle_device`]), a clone each: the last, dropped with the slot before its
    /// stream, unless a fault lost the context (see `Drop`).
    bound: Mutex<Vec<candle_core::Device>>,
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
            .field("carving", &self.carving)
            .field("device", &self.device.ordinal)
            .finish()
    }
}

impl GpuSlot {
    /// A green context of `parts` (outputs of one split) and a non-blocking stream in it.
    pub(super) fn create(
        device: &Arc<DeviceInner>,
        module: &str,
        quota: f64,
        parts: &[CUdevResource],
        scaffold: Arc<Vec<GreenCtx>>,
        carving: Carving,
    ) -> Result<GpuSlot, EngineError> {
        let at = |what: &str| {
            format!(
                "{what} for a {}-SM slot of module \"{module}\" (device {})",
                parts.iter().map(sm_count).sum::<u32>(),
                device.ordinal
            )
        };
        let green = GreenCtx::create(device.dev, parts, &at)?;
        let granted = green.sm_resource(&at)?;
        let mut slot = GpuSlot {
            module: module.to_string(),
            quota,
            sms: sm_count(&granted),
            reported: reported_granularity(&granted),
            carving,
            context: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            owner: Owner::default(),
            bound: Mutex::default(),
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

    /// Keeps a clone of `device`, bound to this slot's stream, until the slot is dropped.
    // Called by the GPU build alone (`candle_device`).
    #[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))]
    pub(super) fn keep(&self, device: &candle_core::Device) {
        let mut bound = self.bound.lock().unwrap_or_else(|p| p.into_inner());
        bound.push(device.clone());
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

    /// The partition rule the driver reports for the slot's SMs (CUDA 13 drivers): what a
    /// further split of them would need, and how many of them are co-scheduled on one GPU
    /// processing cluster (`smCoscheduledAlignment`), which a slot cut from a split's
    /// remainder may lack.
    pub fn reported_granularity(&self) -> Option<SmGranularity> {
        self.reported
    }

    /// How its SMs were carved from the device.
    pub fn carving(&self) -> Carving {
        self.carving
    }

    /// The ordinal of its device.
    pub fn device_ordinal(&self) -> usize {
        self.device.ordinal
    }

    /// The slot's green context as a `CUcontext` and its stream (both owned by the slot).
    #[cfg(mosaic_gpu)]
    pub(super) fn handles(&self) -> (CUcontext, CUstream) {
        (self.context, self.stream)
    }

    /// Its device's driver handle.
    #[cfg(mosaic_gpu)]
    pub(super) fn cu_device(&self) -> cudarc::driver::sys::CUdevice {
        self.device.dev
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
                let done = sys::cuStreamSynchronize(self.stream);
                let bound = std::mem::take(self.bound.get_mut().unwrap_or_else(|p| p.into_inner()));
                // cudarc unwraps `cublasDestroy` and `curandDestroyGenerator` when a candle
                // device's handles drop, which can fail once a fault has lost their context (an
                // illegal address in a kernel, say: every later call in it fails); that panic
                // would end the process before the failed run's error is reported. So the
                // handles are kept where this stream reports a fault, or while the thread
                // unwinds (a second panic would abort it), and a panic from a fault seen
                // elsewhere first (a sibling slot's, the primary context's) is caught. Their
                // drop makes the primary context current on this thread, as cudarc's drops do:
                // no slot may be entered on it here.
                if done != sys::CUresult::CUDA_SUCCESS || std::thread::panicking() {
                    std::mem::forget(bound);
                } else {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(bound)));
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::slot::cuda::{driver_unavailable, Carving, GpuDevice};
    use crate::runtime::slot::Slot;

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
        // Each carving grants what was asked, ImageBind's six-way stage too.
        let six: Vec<(&str, f64)> = [48.0, 24.0, 32.0, 8.0, 8.0, 8.0]
            .iter()
            .map(|&n| ("m", n / device.sms() as f64))
            .collect();
        for stage in [&modules, &six] {
            let quotas: Vec<f64> = stage.iter().map(|m| m.1).collect();
            let asked = device.stage_sms(&quotas).unwrap();
            for how in [Carving::OneSplit, Carving::InTurn] {
                match device.create_stage_by(stage, how) {
                    Ok(slots) => {
                        let got: Vec<u32> = slots.iter().map(GpuSlot::sms).collect();
                        eprintln!("{how:?}: asked {asked:?}, got {got:?}");
                        assert_eq!(got, asked, "{how:?}");
                        assert!(slots.iter().all(|s| s.carving() == how));
                    }
                    // The driver may refuse one descriptor over several groups; then
                    // create_stage falls back to splitting in turn, which must work.
                    Err(e) => {
                        eprintln!("{how:?} refused: {e}");
                        assert_eq!(how, Carving::OneSplit, "{e}");
                    }
                }
            }
        }
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
        // A module alone at quota 1 holds every SM, not the largest split's.
        let whole = device
            .create_slot("alone", 1.0)
            .expect("a whole-device slot");
        assert_eq!(whole.sms(), device.sms());
        assert_eq!(whole.fill(16, 9).unwrap(), [9; 16]);
    }
}
