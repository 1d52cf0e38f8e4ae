//! The engine's own CUDA kernels (`kernels/*.cu`, compiled by the build script in the GPU
//! build only): their fatbins, what every launch takes (the loaded kernel, the device, device
//! addresses), and the ops built on them: LayerNorm and GELU ([`elementwise`]) and a Linear
//! layer's bias ([`bias`]); fused attention's are in `models::flash`, AdamW's in
//! `runtime::optim`. `kernels/emulated/` runs their source on a CPU for the tests
//! (`src/emulated.rs`).

pub mod bias;
pub mod elementwise;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::{self, CUfunction_attribute_enum};
use candle_core::cuda_backend::cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DevicePtr,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{bail, CudaDevice, CudaStorage, Device, Layout, Result, Storage, Tensor};

use crate::switch::EnvSwitch;

/// One `.cu` file compiled by the build script: a fatbin with the machine code for the build's
/// compute capability and the PTX the driver compiles for a newer one.
pub struct Image {
    name: &'static str,
    fatbin: &'static [u8],
}

/// `kernels/adamw.cu`: AdamW on one parameter tensor in one pass.
pub const ADAMW: Image = Image {
    name: "adamw",
    fatbin: include_bytes!(concat!(env!("OUT_DIR"), "/adamw.fatbin")),
};

/// `kernels/elementwise.cu`: LayerNorm forward and backward, GELU's backward pass, a bias and
/// its gradient, one pass each.
pub const ELEMENTWISE: Image = Image {
    name: "elementwise",
    fatbin: include_bytes!(concat!(env!("OUT_DIR"), "/elementwise.fatbin")),
};

/// `kernels/attention.cu`: FlashAttention-2's forward and backward passes.
pub const ATTENTION: Image = Image {
    name: "attention",
    fatbin: include_bytes!(concat!(env!("OUT_DIR"), "/attention.fatbin")),
};

/// `MOSAIC_KERNELS`, which chooses the engine's ops on a GPU: unset or `fused`, its own kernels
/// (LayerNorm, GELU's backward, bias, attention, AdamW); `composed`, candle's composed ops
/// instead.
pub static KERNELS: EnvSwitch = EnvSwitch::new("MOSAIC_KERNELS", "fused", "composed");

/// Whether the engine's own kernels run ([`KERNELS`]).
pub fn fused() -> bool {
    KERNELS.is_on()
}

/// The CUDA device `t` is on; else an error saying that `what` runs on CUDA devices only.
pub fn cuda_device<'a>(t: &'a Tensor, what: &str) -> Result<&'a CudaDevice> {
    match t.device() {
        Device::Cuda(dev) => Ok(dev),
        _ => bail!("{what} runs on CUDA devices only"),
    }
}

/// Each context's loaded modules and their kernels (by name, with the dynamic shared memory
/// they were allowed), by context and image, for one thread.
#[derive(Default)]
struct Loaded {
    modules: HashMap<ModuleKey, Arc<CudaModule>>,
    kernels: HashMap<ModuleKey, HashMap<String, (CudaFunction, u32)>>,
}

/// A context's id and an image's name.
type ModuleKey = (usize, &'static str);

thread_local! {
    /// Per thread, so that slots launching from their own threads share no lock. Keyed by the
    /// context's id, which the driver never gives another context of the process (a context's
    /// address may be reused once it is destroyed, as a slot's green context is).
    static LOADED: RefCell<Loaded> = RefCell::default();
}

/// The driver's id of `context`: "unique for the life of the program" (`cuCtxGetId`).
fn context_id(context: &CudaContext) -> Result<usize> {
    let mut id: std::ffi::c_ulonglong = 0;
    // SAFETY: a context handle of a live `CudaContext`; the out pointer is a live local.
    unsafe { sys::cuCtxGetId(context.cu_ctx(), &mut id) }
        .result()
        .w()?;
    Ok(id as usize)
}

/// The kernel `name` of `image` on `dev`'s context, allowed `smem` bytes of dynamic shared
/// memory (above 48 KiB a kernel must ask for it). The image is loaded into a context once per
/// launching thread (machine code: no compilation at run time on the build's GPU), the kernel
/// looked up once. Launch it with the device's stream's `launch_builder`.
///
/// Refused on a context where cudarc orders streams by events: kernels take their operands'
/// addresses without keeping cudarc's guards (see [`storage_address`]).
pub fn kernel(dev: &CudaDevice, image: &Image, name: &str, smem: u32) -> Result<CudaFunction> {
    let stream = dev.cuda_stream();
    let context = stream.context();
    if context.is_managing_stream_synchronization() {
        bail!(
            "{name}: the engine's kernels run on a device whose work stream order alone orders \
             (one stream, or event tracking off), not one where cudarc records events across \
             streams"
        )
    }
    let key = (context_id(context)?, image.name);
    LOADED.with_borrow_mut(|loaded| {
        let known = loaded.kernels.get_mut(&key).and_then(|k| k.get_mut(name));
        if let Some((func, allowed)) = known {
            if smem > *allowed {
                allow_smem(func, smem)?;
                *allowed = smem;
            }
            return Ok(func.clone());
        }
        let module = match loaded.modules.get(&key) {
            Some(module) => module.clone(),
            None => {
                // A heap copy: `include_bytes!` promises no alignment, a fatbin's header has
                // 8-byte fields (nvcc aligns its fatbins to 8), and the system allocator
                // returns blocks this large 16-byte aligned.
                let module = context
                    .load_module(Ptx::from_binary(image.fatbin.to_vec()))
                    .w()?;
                loaded.modules.insert(key, module.clone());
                module
            }
        };
        let func = module.load_function(name).w()?;
        if smem > 0 {
            allow_smem(&func, smem)?;
        }
        let kernels = loaded.kernels.entry(key).or_default();
        kernels.insert(name.to_string(), (func.clone(), smem));
        Ok(func)
    })
}

/// Lets `func` use `smem` bytes of dynamic shared memory.
fn allow_smem(func: &CudaFunction, smem: u32) -> Result<()> {
    func.set_attribute(
        CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )
    .w()
}

/// The device address of the first element of `t`, an f32 or bf16 tensor on a CUDA device,
/// for a kernel launched on `stream`. The caller keeps `t` alive until that kernel has run (a
/// tensor freed after the launch is freed in stream order, after it).
pub fn address(t: &Tensor, stream: &CudaStream) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(storage) = &*storage else {
        bail!("a kernel's tensor is not on a CUDA device")
    };
    storage_address(storage, layout, stream)
}

/// The device address of the first element of `layout` in `storage` (f32 or bf16).
///
/// cudarc's guard that would record an event for another stream is dropped at once: the
/// engine's devices each launch on one stream (slots turn event tracking off), so stream order
/// alone orders every kernel after its inputs' writers. A device with a second stream on its
/// context would have to keep the guards alive until after the launch.
pub fn storage_address(storage: &CudaStorage, layout: &Layout, stream: &CudaStream) -> Result<u64> {
    let (base, size) = match &storage.slice {
        CudaStorageSlice::F32(s) => (s.device_ptr(stream).0, 4),
        CudaStorageSlice::BF16(s) => (s.device_ptr(stream).0, 2),
        _ => bail!(
            "a kernel's tensor is {:?}, not f32 or bf16",
            storage.dtype()
        ),
    };
    Ok(base + (layout.start_offset() * size) as u64)
}

/// A contiguous tensor of `shape` and `dtype` (f32 or bf16) on `dev` for a kernel's output:
/// uninitialised where a kernel writes every element (`written`), so that no memset is launched
/// to write it once more, as `Tensor::zeros` would; zeros where none runs (an empty input's
/// partial sums must still sum to zero).
///
/// # Safety
///
/// Where `written`, a kernel must write every element before anything reads it.
pub unsafe fn kernel_output(
    dev: &CudaDevice,
    shape: impl Into<candle_core::Shape>,
    dtype: candle_core::DType,
    written: bool,
) -> Result<Tensor> {
    let shape = shape.into();
    if !written {
        return Tensor::zeros(shape, dtype, &Device::Cuda(dev.clone()));
    }
    // SAFETY: the caller's kernel writes every element before it is read.
    let storage = unsafe { uninit_storage(dev, shape.elem_count(), dtype) }?;
    Ok(Tensor::from_storage(
        Storage::Cuda(storage),
        shape,
        candle_core::op::BackpropOp::none(),
        false,
    ))
}

/// Device memory on `dev` for `n` elements of `dtype` (f32 or bf16; one element at least, no
/// allocation of nothing), not initialised: a kernel's output, or a custom op's.
///
/// # Safety
///
/// Every element must be written before anything reads it.
pub unsafe fn uninit_storage(
    dev: &CudaDevice,
    n: usize,
    dtype: candle_core::DType,
) -> Result<CudaStorage> {
    use candle_core::DType;
    let n = n.max(1);
    // SAFETY: the caller writes every element before it is read.
    Ok(match dtype {
        DType::F32 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<f32>(n) }?, dev.clone()),
        DType::BF16 => {
            CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(n) }?, dev.clone())
        }
        other => bail!("a kernel's output is f32 or bf16, not {other:?}"),
    })
}
