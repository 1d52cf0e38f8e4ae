//! The launches of `kernels/attention.cu`: the forward kernel, then in the backward pass the
//! row dots `Σ dO·O` and the backward kernel, each on the stream of the tensors' device.

use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDevice;
use candle_core::{bail, DType, Device, Result, Tensor};

use crate::kernels::{address, ATTENTION_PTX};
use crate::models::grad_op::{with_backward3, Grads3};

/// Rows of queries (forward) or keys (backward) a block takes: the kernels' `TILE`.
const TILE: usize = 64;
/// Threads a block: the kernels' `THREADS` (four warps).
const THREADS: u32 = 128;
/// The head dimensions compiled (`FLASH_KERNELS` in the kernel source).
const HEAD_DIMS: [usize; 8] = [16, 32, 48, 64, 80, 96, 112, 128];

/// Dynamic shared memory of the forward kernel for head dimension `d`: `FWD_SMEM`.
fn forward_smem(d: usize) -> u32 {
    (3 * TILE * d * 2 + TILE * TILE * 4 + TILE * TILE * 2 + TILE * d * 4) as u32
}

/// Dynamic shared memory of the backward kernel for head dimension `d`: `BWD_SMEM`.
fn backward_smem(d: usize) -> u32 {
    (4 * TILE * d * 2
        + 2 * TILE * d * 4
        + TILE * TILE * 4
        + 2 * TILE * TILE * 2
        + 4 * 256 * 4
        + 2 * TILE * 4) as u32
}

/// Whether the kernels run attention of these queries: bf16 on a CUDA device, with a head
/// dimension they were compiled for.
pub(crate) fn runs(q: &Tensor) -> bool {
    q.device().is_cuda()
        && q.dtype() == DType::BF16
        && q.rank() == 4
        && HEAD_DIMS.contains(&q.dims()[3])
}

/// The fused attention (see [`super::attention`]); `q`, `k`, `v` of one shape.
pub(crate) fn attention(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> Result<Tensor> {
    for (what, t) in [("keys", k), ("values", v)] {
        if t.shape() != q.shape() || t.dtype() != q.dtype() {
            bail!(
                "fused attention: the {what} are {:?} {:?}, the queries {:?} {:?}",
                t.dtype(),
                t.shape(),
                q.dtype(),
                q.shape()
            )
        }
    }
    let (o, lse) = forward(&q.detach(), &k.detach(), &v.detach(), causal)?;
    with_backward3(
        [q, k, v],
        o,
        "flash_attention",
        Box::new(move |[q, k, v], o, g| backward(q, k, v, o, g, &lse, causal)),
    )
}

/// The kernel `name` of `kernels/attention.cu` on `dev`, allowed `smem` bytes of dynamic shared
/// memory (above 48 KiB a kernel must ask for it).
fn kernel(dev: &CudaDevice, name: &str, smem: u32) -> Result<CudaFunction> {
    let func = dev.get_or_load_custom_func(name, "mosaic_attention", ATTENTION_PTX)?;
    if smem > 0 {
        func.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    }
    Ok(func.into_cuda_function())
}

/// `t` with its elements in order from the start of its own allocation, 16-byte aligned as
/// the kernels' vector loads need (a copy only when it is not already).
fn packed(t: &Tensor) -> Result<Tensor> {
    if t.is_contiguous() && t.layout().start_offset() == 0 {
        Ok(t.clone())
    } else {
        t.force_contiguous()
    }
}

fn cuda_device(t: &Tensor) -> Result<&CudaDevice> {
    match t.device() {
        Device::Cuda(dev) => Ok(dev),
        _ => bail!("fused attention runs on CUDA devices only"),
    }
}

/// `[batch·heads, tokens, head dim]` of a `[batch, heads, tokens, head dim]` shape.
fn dims(q: &Tensor) -> Result<(usize, usize, usize)> {
    let (b, h, t, d) = q.dims4()?;
    if b * h > 65_535 {
        bail!("fused attention: {b} × {h} heads exceed a grid's 65535 blocks")
    }
    Ok((b * h, t, d))
}

/// The output (bf16, `q`'s shape) and each query row's log-sum-exp (f32 `[batch·heads,
/// tokens]`).
pub(crate) fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
) -> Result<(Tensor, Tensor)> {
    let dev = cuda_device(q)?;
    let (bh, t, d) = dims(q)?;
    let (q, k, v) = (packed(q)?, packed(k)?, packed(v)?);
    let o = Tensor::zeros(q.shape(), DType::BF16, q.device())?;
    let lse = Tensor::zeros((bh, t), DType::F32, q.device())?;
    if t == 0 {
        return Ok((o, lse));
    }
    let smem = forward_smem(d);
    let func = kernel(dev, &format!("mosaic_flash_forward_{d}"), smem)?;
    let stream = dev.cuda_stream();
    let at = |x: &Tensor| address(x, &stream);
    let (q_at, k_at, v_at, o_at, lse_at) = (at(&q)?, at(&k)?, at(&v)?, at(&o)?, at(&lse)?);
    let (tokens, causal) = (t as i32, causal as i32);
    let config = LaunchConfig {
        grid_dim: (t.div_ceil(TILE) as u32, bh as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem,
    };
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&q_at)
        .arg(&k_at)
        .arg(&v_at)
        .arg(&o_at)
        .arg(&lse_at)
        .arg(&tokens)
        .arg(&causal);
    // SAFETY: the arguments match `mosaic_flash_forward_<d>`'s parameters in number, order
    // and size (five device addresses, two i32); q, k, v and o hold `bh·t·d` bf16 and lse
    // `bh·t` f32 of live allocations of this device, which outlive the launch in stream
    // order.
    unsafe { launch.launch(config) }.map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    Ok((o, lse))
}

/// The gradients of q, k and v given the output `o`, its gradient `g` and the forward's
/// log-sum-exp.
pub(crate) fn backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    g: &Tensor,
    lse: &Tensor,
    causal: bool,
) -> Result<Grads3> {
    let dev = cuda_device(q)?;
    let (bh, t, d) = dims(q)?;
    let (q, k, v, o) = (
        packed(&q.detach())?,
        packed(&k.detach())?,
        packed(&v.detach())?,
        packed(o)?,
    );
    let g = packed(&g.to_dtype(DType::BF16)?)?;
    let device = q.device();
    let dq = Tensor::zeros(q.shape(), DType::F32, device)?;
    let dk = Tensor::zeros(q.shape(), DType::BF16, device)?;
    let dv = Tensor::zeros(q.shape(), DType::BF16, device)?;
    let dd = Tensor::zeros((bh, t), DType::F32, device)?;
    if t > 0 {
        let stream = dev.cuda_stream();
        let at = |x: &Tensor| address(x, &stream);
        let rows = (bh * t) as i32;
        let (o_at, g_at, dd_at) = (at(&o)?, at(&g)?, at(&dd)?);
        let head_dim = d as i32;
        let dot = kernel(dev, "mosaic_flash_row_dot", 0)?;
        let mut launch = stream.launch_builder(&dot);
        launch
            .arg(&o_at)
            .arg(&g_at)
            .arg(&dd_at)
            .arg(&rows)
            .arg(&head_dim);
        let config = LaunchConfig {
            grid_dim: ((bh * t).div_ceil(4) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match `mosaic_flash_row_dot`'s (three device addresses, two
        // i32); o and g hold `rows·d` bf16 and dd `rows` f32, alive past the launch.
        unsafe { launch.launch(config) }.map_err(|e| candle_core::Error::Msg(e.to_string()))?;

        let smem = backward_smem(d);
        let func = kernel(dev, &format!("mosaic_flash_backward_{d}"), smem)?;
        let (q_at, k_at, v_at, lse_at) = (at(&q)?, at(&k)?, at(&v)?, at(lse)?);
        let (dq_at, dk_at, dv_at) = (at(&dq)?, at(&dk)?, at(&dv)?);
        let (tokens, causal) = (t as i32, causal as i32);
        let mut launch = stream.launch_builder(&func);
        launch
            .arg(&q_at)
            .arg(&k_at)
            .arg(&v_at)
            .arg(&g_at)
            .arg(&lse_at)
            .arg(&dd_at)
            .arg(&dq_at)
            .arg(&dk_at)
            .arg(&dv_at)
            .arg(&tokens)
            .arg(&causal);
        let config = LaunchConfig {
            grid_dim: (t.div_ceil(TILE) as u32, bh as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: the arguments match `mosaic_flash_backward_<d>`'s parameters in number,
        // order and size (nine device addresses, two i32); every tensor holds `bh·t·d`
        // elements (lse and dd `bh·t`) of a live allocation of this device, alive past the
        // launch in stream order.
        unsafe { launch.launch(config) }.map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    }
    Ok((Some(dq.to_dtype(DType::BF16)?), Some(dk), Some(dv)))
}
