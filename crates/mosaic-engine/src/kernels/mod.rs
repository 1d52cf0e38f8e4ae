//! The engine's own CUDA kernels (`kernels/*.cu`, compiled to PTX by the build script in the
//! GPU build only): their PTX, the device addresses their launches take, and the launches of
//! the one-pass backward passes of LayerNorm and GELU ([`elementwise`]) and of a Linear
//! layer's bias ([`bias`]). `kernels/emulated/`
//! runs their source on a CPU for the tests (`tests/kernels.rs`).

pub mod bias;
pub mod elementwise;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaStream, DevicePtr};
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{bail, CudaStorage, Layout, Result, Storage, Tensor};

/// `kernels/adamw.cu`: AdamW on one parameter tensor in one pass.
pub const ADAMW_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/adamw.ptx"));

/// `kernels/elementwise.cu`: LayerNorm's and GELU's backward passes, one pass each.
pub const ELEMENTWISE_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/elementwise.ptx"));

/// `kernels/attention.cu`: FlashAttention-2's forward and backward passes.
pub const ATTENTION_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/attention.ptx"));

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
