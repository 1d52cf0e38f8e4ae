//! The launches of `kernels/attention.cu`: the forward kernel, then in the backward pass the
//! row dots `Σ dO·O` and the backward kernel, each on the stream of the tensors' device.

use candle_core::cuda_backend::cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, DType, Result, Tensor};

use crate::kernels::{address, cuda_device, kernel, ATTENTION};
use crate::models::grad_op::with_backward;

/// Rows of queries (forward) or keys (backward) a block takes: the kernels' `TILE`.
const TILE: usize = 64;
/// Threads a block: the kernels' `THREADS` (four warps).
const THREADS: u32 = 128;
/// Most batch × heads a launch takes: a grid's y dimension, a (sample, head) per block row.
const MAX_HEADS: usize = 65_535;
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

/// Whether the kernels run attention of this `[3, batch, heads, tokens, d]` tensor: bf16 on a
/// CUDA device, with a head dimension they were compiled for and at most [`MAX_HEADS`]
/// batch × heads.
pub(crate) fn runs(qkv: &Tensor) -> bool {
    let dims = qkv.dims();
    qkv.device().is_cuda()
        && qkv.dtype() == DType::BF16
        && dims.len() == 5
        && dims[0] == 3
        && dims[1] * dims[2] <= MAX_HEADS
        && HEAD_DIMS.contains(&dims[4])
}

/// The fused attention (see [`super::attention`]).
pub(crate) fn attention(qkv: &Tensor, causal: bool) -> Result<Tensor> {
    let qkv = packed(qkv)?; // one copy of a projection's view
    let (o, lse) = forward(&qkv.detach(), causal)?;
    with_backward(
        &qkv,
        o,
        "flash_attention",
        Box::new(move |qkv, o, g| backward(qkv, o, g, &lse, causal).map(Some)),
    )
}

/// The softmax scale 1/√d.
fn scale(d: usize) -> f32 {
    (d as f64).powf(-0.5) as f32
}

/// The device addresses of q, k and v, the thirds of a packed `[3, …]` bf16 tensor.
fn thirds(qkv: &Tensor, stream: &CudaStream) -> Result<[u64; 3]> {
    let base = address(qkv, stream)?;
    let third = (qkv.elem_count() / 3 * 2) as u64;
    Ok([base, base + third, base + 2 * third])
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

/// `[batch·heads, tokens, head dim]` of a `[3, batch, heads, tokens, head dim]` shape.
fn dims(qkv: &Tensor) -> Result<(usize, usize, usize)> {
    let (_, b, h, t, d) = qkv.dims5()?;
    if b * h > MAX_HEADS {
        bail!("fused attention: {b} × {h} heads exceed a grid's {MAX_HEADS} blocks")
    }
    Ok((b * h, t, d))
}

/// The output (bf16 `[batch, heads, tokens, d]`) and each query row's log-sum-exp (f32
/// `[batch·heads, tokens]`) of a packed `qkv`.
fn forward(qkv: &Tensor, causal: bool) -> Result<(Tensor, Tensor)> {
    let dev = cuda_device(qkv, "fused attention")?;
    let (bh, t, d) = dims(qkv)?;
    let qkv = packed(qkv)?;
    let o = Tensor::zeros(&qkv.dims()[1..], DType::BF16, qkv.device())?;
    let lse = Tensor::zeros((bh, t), DType::F32, qkv.device())?;
    if t == 0 || bh == 0 {
        return Ok((o, lse));
    }
    let smem = forward_smem(d);
    let func = kernel(dev, &ATTENTION, &format!("mosaic_flash_forward_{d}"), smem)?;
    let stream = dev.cuda_stream();
    let [q_at, k_at, v_at] = thirds(&qkv, &stream)?;
    let (o_at, lse_at) = (address(&o, &stream)?, address(&lse, &stream)?);
    let (tokens, causal, scale) = (t as i32, causal as i32, scale(d));
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
        .arg(&causal)
        .arg(&scale);
    // SAFETY: the arguments match `mosaic_flash_forward_<d>`'s parameters in number, order
    // and size (five device addresses, two i32, an f32); q, k, v (the thirds of qkv) and o hold
    // `bh·t·d` bf16 and lse `bh·t` f32 of live allocations of this device, which outlive the
    // launch in stream order.
    unsafe { launch.launch(config) }.w()?;
    Ok((o, lse))
}

/// The gradient of the packed `qkv` (bf16, its shape) given the output `o`, its gradient `g`
/// and the forward's log-sum-exp: dq, dk and dv written into its thirds.
fn backward(qkv: &Tensor, o: &Tensor, g: &Tensor, lse: &Tensor, causal: bool) -> Result<Tensor> {
    let dev = cuda_device(qkv, "fused attention")?;
    let (bh, t, d) = dims(qkv)?;
    let (qkv, o) = (packed(&qkv.detach())?, packed(o)?);
    let g = packed(&g.to_dtype(DType::BF16)?)?;
    let device = qkv.device();
    let dqkv = Tensor::zeros(qkv.shape(), DType::BF16, device)?;
    let dq32 = Tensor::zeros(o.shape(), DType::F32, device)?;
    let dd = Tensor::zeros((bh, t), DType::F32, device)?;
    if t == 0 || bh == 0 {
        return Ok(dqkv);
    }
    let stream = dev.cuda_stream();
    let at = |x: &Tensor| address(x, &stream);
    let rows = (bh * t) as i32;
    let (o_at, g_at, dd_at) = (at(&o)?, at(&g)?, at(&dd)?);
    let head_dim = d as i32;
    let dot = kernel(dev, &ATTENTION, "mosaic_flash_row_dot", 0)?;
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
    // SAFETY: the arguments match `mosaic_flash_row_dot`'s (three device addresses, two i32);
    // o and g hold `rows·d` bf16 and dd `rows` f32, alive past the launch.
    unsafe { launch.launch(config) }.w()?;

    let smem = backward_smem(d);
    let func = kernel(dev, &ATTENTION, &format!("mosaic_flash_backward_{d}"), smem)?;
    let [q_at, k_at, v_at] = thirds(&qkv, &stream)?;
    let [dq_at, dk_at, dv_at] = thirds(&dqkv, &stream)?;
    let (lse_at, dq32_at) = (at(lse)?, at(&dq32)?);
    let (tokens, causal, scale) = (t as i32, causal as i32, scale(d));
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&q_at)
        .arg(&k_at)
        .arg(&v_at)
        .arg(&g_at)
        .arg(&lse_at)
        .arg(&dd_at)
        .arg(&dq32_at)
        .arg(&dk_at)
        .arg(&dv_at)
        .arg(&tokens)
        .arg(&causal)
        .arg(&scale);
    let config = LaunchConfig {
        grid_dim: (t.div_ceil(TILE) as u32, bh as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem,
    };
    // SAFETY: the arguments match `mosaic_flash_backward_<d>`'s parameters in number, order
    // and size (nine device addresses, two i32, an f32); q, k, v, dq, dk, dv (thirds of qkv and
    // of dqkv), g and dq32 hold `bh·t·d` elements and lse and dd `bh·t`, live allocations of
    // this device, alive past the launch in stream order.
    unsafe { launch.launch(config) }.w()?;

    let cast = kernel(dev, &ATTENTION, "mosaic_f32_to_bf16", 0)?;
    let n = (bh * t * d) as u64;
    let mut launch = stream.launch_builder(&cast);
    launch.arg(&dq32_at).arg(&dq_at).arg(&n);
    let config = LaunchConfig {
        grid_dim: (
            (n as usize).div_ceil(THREADS as usize).min(1 << 16) as u32,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `mosaic_f32_to_bf16`'s (two device addresses, a u64): dq32
    // holds n f32 and the first third of dqkv n bf16, alive past the launch in stream order.
    unsafe { launch.launch(config) }.w()?;
    Ok(dqkv)
}
