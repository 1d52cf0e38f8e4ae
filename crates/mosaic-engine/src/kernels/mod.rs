//! The engine's own CUDA kernels (`kernels/*.cu`, compiled to PTX by the build script in the
//! GPU build only): their PTX, what every launch takes (the device, the loaded kernel, device
//! addresses), and the ops built on them: LayerNorm and GELU ([`elementwise`]) and a Linear
//! layer's bias ([`bias`]); fused attention's are in `models::flash`, AdamW's in
//! `runtime::optim`. `kernels/emulated/` runs their source on a CPU for the tests
//! (`tests/kernels.rs`).

pub mod bias;
pub mod elementwise;

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaStream, DevicePtr};
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{bail, CudaDevice, CudaStorage, Device, Layout, Result, Storage, Tensor};

/// One `.cu` file's PTX, loaded once per device as a module of this name.
pub struct Ptx {
    module: &'static str,
    source: &'static str,
}

/// `kernels/adamw.cu`: AdamW on one parameter tensor in one pass.
pub const ADAMW: Ptx = Ptx {
    module: "mosaic_adamw",
    source: include_str!(concat!(env!("OUT_DIR"), "/adamw.ptx")),
};

/// `kernels/elementwise.cu`: LayerNorm forward and backward, GELU's backward pass, a bias and
/// its gradient, one pass each.
pub const ELEMENTWISE: Ptx = Ptx {
    module: "mosaic_elementwise",
    source: include_str!(concat!(env!("OUT_DIR"), "/elementwise.ptx")),
};

/// `kernels/attention.cu`: FlashAttention-2's forward and backward passes.
pub const ATTENTION: Ptx = Ptx {
    module: "mosaic_attention",
    source: include_str!(concat!(env!("OUT_DIR"), "/attention.ptx")),
};

/// The environment variable that chooses the engine's ops on a GPU: unset or `fused`, its own
/// kernels (LayerNorm, GELU's backward, bias, attention, AdamW); `composed`, candle's composed
/// ops instead. For measuring what the kernels gain (the same binary, A against B) and for
/// getting past a kernel that fails on some GPU.
pub const KERNELS_VAR: &str = "MOSAIC_KERNELS";

/// Whether the engine's own kernels run ([`KERNELS_VAR`], read once; a value other than
/// `fused` or `composed` counts as `fused` here and is refused by [`check_env`]).
pub fn fused() -> bool {
    kernels_setting().unwrap_or(true)
}

/// [`KERNELS_VAR`]'s setting: `Ok(true)` for fused kernels, `Ok(false)` for composed ops, or
/// the value it does not understand.
fn kernels_setting() -> std::result::Result<bool, String> {
    static SETTING: OnceLock<std::result::Result<bool, String>> = OnceLock::new();
    SETTING
        .get_or_init(|| match std::env::var_os(KERNELS_VAR) {
            None => Ok(true),
            Some(v) if v == "fused" => Ok(true),
            Some(v) if v == "composed" => Ok(false),
            Some(v) => Err(v.to_string_lossy().into_owned()),
        })
        .clone()
}

/// Err, naming [`KERNELS_VAR`] and the values it takes, where it holds another.
pub fn check_env() -> std::result::Result<(), crate::EngineError> {
    kernels_setting()
        .map(|_| ())
        .map_err(|v| crate::EngineError::BadSetting {
            setting: KERNELS_VAR.into(),
            message: format!("expected `fused` (the default) or `composed`, got `{v}`"),
        })
}

/// The CUDA device `t` is on; else an error saying that `what` runs on CUDA devices only.
pub fn cuda_device<'a>(t: &'a Tensor, what: &str) -> Result<&'a CudaDevice> {
    match t.device() {
        Device::Cuda(dev) => Ok(dev),
        _ => bail!("{what} runs on CUDA devices only"),
    }
}

/// The kernel `name` of `ptx` on `dev`, allowed `smem` bytes of dynamic shared memory (above
/// 48 KiB a kernel must ask for it). Launch it with the device's stream's `launch_builder`.
pub fn kernel(dev: &CudaDevice, ptx: &Ptx, name: &str, smem: u32) -> Result<CudaFunction> {
    let func = dev
        .get_or_load_custom_func(name, ptx.module, ptx.source)?
        .into_cuda_function();
    if smem > 0 {
        func.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .w()?;
    }
    Ok(func)
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
