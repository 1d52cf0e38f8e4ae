//! candle's CUDA device on a green-context slot: what makes a module's kernels, cuBLAS calls
//! and allocations go to its slot's stream, and so run on the slot's SMs only. The GPU build
//! alone has it (`--cfg mosaic_gpu`, made by `scripts/cuda-cargo`), since candle's CUDA
//! backend needs nvcc at build time and a constructor that candle 0.11.1 keeps private
//! (`CudaDevice::from_context_and_stream`, public in upstream PR #3777; the script builds
//! against a copy of candle with that one line changed).

use candle_core::{CudaDevice, Device};
use cudarc::driver::CudaContext;

use super::green::GpuSlot;
use crate::error::EngineError;

/// How a candle device is bound to a slot. Both give candle the slot's stream; they differ in
/// the context candle loads its kernels into and makes current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// The GPU's primary context, with the slot's green-context stream: kernels launched on a
    /// green context's stream run on its SMs (PyTorch's did on an H100, launched the same way
    /// through the primary context: `measurements/h100/README.md`). Memory and loaded kernels
    /// are the primary context's, shared by every slot, and any thread may use the device.
    /// What training uses.
    Primary,
    /// The slot's green context itself (`cuCtxFromGreenCtx`): candle loads its kernels into it
    /// and makes it current. A green context may be current on one thread at a time, so the
    /// device and all its tensors must stay on one thread; `mosaic check gpu` tries it beside
    /// [`Binding::Primary`], as the way out should the driver refuse the other.
    Green,
}

impl Binding {
    /// Both, in the order `mosaic check gpu` tries them.
    pub const ALL: [Binding; 2] = [Binding::Primary, Binding::Green];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Binding::Primary => "primary context + green stream",
            Binding::Green => "green context + green stream",
        }
    }
}

impl GpuSlot {
    /// A candle CUDA device whose every kernel launch, cuBLAS call and stream-ordered
    /// allocation goes to this slot's stream. With [`Binding::Primary`] the slot keeps a clone,
    /// dropped with it.
    ///
    /// # Safety
    /// The device borrows the slot's stream: the device, its clones and every tensor on it
    /// must be dropped before the slot. With [`Binding::Green`] they must also be used and
    /// dropped on one thread at a time.
    pub(crate) unsafe fn candle_device(&self, binding: Binding) -> Result<Device, EngineError> {
        let at = |message: String| EngineError::Cuda {
            what: format!(
                "binding candle to the slot of module \"{}\" ({})",
                self.module(),
                binding.name()
            ),
            message,
        };
        let (context, stream) = self.handles();
        let ordinal = self.device_ordinal();
        let ctx = match binding {
            Binding::Primary => CudaContext::new(ordinal).map_err(|e| at(e.to_string()))?,
            Binding::Green => {
                // Entered, so that cudarc finds the context current and leaves the thread's
                // context stack as it was.
                let ctx = self.run(|| {
                    // SAFETY: a live context of this device, which the slot owns.
                    unsafe { CudaContext::from_raw_context(ordinal, self.cu_device(), context) }
                })?;
                let ctx = ctx.map_err(|e| at(e.to_string()))?;
                // cudarc destroys a non-primary context when its last handle drops; this one
                // belongs to the green context, which the slot destroys: keep a handle forever.
                std::mem::forget(ctx.clone());
                ctx
            }
        };
        // SAFETY: the stream lives as long as the slot, which the caller keeps alive longer
        // than the device.
        let stream = unsafe { ctx.wrap_borrowed_stream(stream) };
        let device =
            CudaDevice::from_context_and_stream(ctx, stream).map_err(|e| at(e.to_string()))?;
        // A hint: where cuBLAS refuses it, its defaults stay (`check gpu` says which it was).
        target_sms(&device, self.sms());
        // cudarc gives every allocation two events, which order its uses across the streams of
        // a context in multi-stream mode. This context never is: it only wraps the slot's
        // stream (streams it creates itself would count), so the events were never recorded
        // or waited on, and not making them saves four driver calls per tensor (two creations
        // and, when it is freed, two destructions). The engine orders work across slots
        // itself, by synchronising each module's stream at the stage barrier.
        // SAFETY: called before any tensor exists on this device; see above.
        unsafe { device.disable_event_tracking() };
        let device = Device::Cuda(device);
        if binding == Binding::Primary {
            // Its cuBLAS and cuRAND handles go with the slot, or stay where a fault lost the
            // context (`GpuSlot`'s drop). A green context's device must be dropped on the
            // thread that uses it, so the slot keeps none.
            self.keep(&device);
        }
        Ok(device)
    }
}

/// Has `device`'s cuBLAS handle choose its kernels (tile shapes, splitting a product along k)
/// for `sms` SMs, or 0 for every SM of the GPU, cuBLAS's default: `cublasSetSmCountTarget`,
/// which cuBLAS documents for its routines sharing a GPU with other work. A slot's products run
/// on its SMs whatever cuBLAS expects; expecting the whole GPU, it cuts a small product into
/// blocks for 132 SMs, which a slot of 8 runs in waves (two of ImageBind's three 8-SM slots ran
/// 1.6× slower than their share of the SMs, `bench engine` on an H200, README: one possible
/// cause, which `check gpu`'s row "cuBLAS told a slot's SMs" measures). Whether cuBLAS took
/// it, as read back.
pub(crate) fn target_sms(device: &CudaDevice, sms: u32) -> bool {
    use candle_core::cuda_backend::cudarc::cublas::sys::{
        cublasGetSmCountTarget, cublasSetSmCountTarget, cublasStatus_t::CUBLAS_STATUS_SUCCESS,
    };
    let blas = device.cublas_handle();
    let sms = i32::try_from(sms).unwrap_or(0);
    let mut now = -1;
    // SAFETY: the live cuBLAS handle of a device of this process, configured before its use;
    // `now` outlives the call that writes it.
    unsafe {
        cublasSetSmCountTarget(*blas.handle(), sms) == CUBLAS_STATUS_SUCCESS
            && cublasGetSmCountTarget(*blas.handle(), &mut now) == CUBLAS_STATUS_SUCCESS
            && now == sms
    }
}
