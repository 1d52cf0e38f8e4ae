//! The launches of `kernels/attention.cu`: the forward kernel, then in the backward pass the
//! row dots `Σ dO·O` and the backward kernel, each on the stream of the tensors' device.

use candle_core::cuda_backend::cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, DType, Result, Tensor};

use crate::kernels::{address, cuda_device, kernel, kernel_output, ATTENTION};
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

/// Whether the kernels run attention of this `[batch, tokens, 3, heads, d]` tensor: bf16 on a
/// CUDA device, with a head dimension they were compiled for and at most [`MAX_HEADS`]
/// batch × heads.
pub(crate) fn runs(qkv: &Tensor) -> bool {
    let dims = qkv.dims();
    qkv.device().is_cuda()
        && qkv.dtype() == DType::BF16
        && dims.len() == 5
        && dims[2] == 3
        && dims[0] * dims[3] <= MAX_HEADS
        && HEAD_DIMS.contains(&dims[4])
}

/// The fused attention (see [`super::attention`]).
pub(crate) fn attention(qkv: &Tensor, causal: bool) -> Result<Tensor> {
    let qkv = packed(qkv)?; // a projection's output already is
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

/// The device addresses of head 0 of token 0 of sample 0 in q, k and v, the thirds of each row
/// of a packed `[batch, tokens, 3, heads, d]` bf16 tensor (the kernels' pointers).
fn thirds(qkv: &Tensor, stream: &CudaStream) -> Result<[u64; 3]> {
    let base = address(qkv, stream)?;
    let (_, _, _, h, d) = qkv.dims5()?;
    let third = (h * d * 2) as u64; // bytes of a row's q (or k, or v): heads × d bf16
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

/// The shape of a `[batch, tokens, 3, heads, head dim]` tensor, checked against the grid.
struct Shape {
    batch: usize,
    tokens: usize,
    heads: usize,
    d: usize,
}

impl Shape {
    fn of(qkv: &Tensor) -> Result<Shape> {
        let (batch, tokens, _, heads, d) = qkv.dims5()?;
        if batch * heads > MAX_HEADS {
            bail!("fused attention: {batch} × {heads} heads exceed a grid's {MAX_HEADS} blocks")
        }
        Ok(Shape {
            batch,
            tokens,
            heads,
            d,
        })
    }

    /// The (sample, head) pairs: a launch's block rows.
    fn pairs(&self) -> usize {
        self.batch * self.heads
    }

    /// Elements between consecutive tokens of q, k, v: a row of the projection's output.
    fn ld_qkv(&self) -> i32 {
        (3 * self.heads * self.d) as i32
    }

    /// Elements between consecutive tokens of o, its gradient and dq's accumulator.
    fn ld_o(&self) -> i32 {
        (self.heads * self.d) as i32
    }

    /// The grid: tiles of 64 tokens along x, (sample, head) along y.
    fn launch(&self, smem: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.tokens.div_ceil(TILE) as u32, self.pairs() as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem,
        }
    }
}

/// The output (bf16 `[batch, tokens, heads, d]`, the layout the output projection reads) and
/// each query row's log-sum-exp (f32 `[batch, tokens, heads]`) of a packed `qkv`.
fn forward(qkv: &Tensor, causal: bool) -> Result<(Tensor, Tensor)> {
    let dev = cuda_device(qkv, "fused attention")?;
    let shape = Shape::of(qkv)?;
    let Shape {
        batch,
        tokens: t,
        heads,
        d,
    } = shape;
    let qkv = packed(qkv)?;
    // SAFETY: the kernel below writes every row of o and every log-sum-exp.
    let o = unsafe { kernel_output(dev, (batch, t, heads, d), DType::BF16, true) }?;
    let lse = unsafe { kernel_output(dev, (batch, t, heads), DType::F32, true) }?;
    if o.elem_count() == 0 {
        return Ok((o, lse));
    }
    let smem = forward_smem(d);
    let func = kernel(dev, &ATTENTION, &format!("mosaic_flash_forward_{d}"), smem)?;
    let stream = dev.cuda_stream();
    let [q_at, k_at, v_at] = thirds(&qkv, &stream)?;
    let (o_at, lse_at) = (address(&o, &stream)?, address(&lse, &stream)?);
    let (ld_qkv, ld_o) = (shape.ld_qkv(), shape.ld_o());
    let (tokens, heads, causal, scale) = (t as i32, heads as i32, causal as i32, scale(d));
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&q_at)
        .arg(&k_at)
        .arg(&v_at)
        .arg(&ld_qkv)
        .arg(&o_at)
        .arg(&ld_o)
        .arg(&lse_at)
        .arg(&tokens)
        .arg(&heads)
        .arg(&causal)
        .arg(&scale);
    // SAFETY: the arguments match `mosaic_flash_forward_<d>`'s parameters in number, order
    // and size (three device addresses, an i32, an address, an i32, an address, four i32, an
    // f32 — `int` is 32 bits); q, k and v are the thirds of the rows of qkv (`batch·t` rows of
    // `ld_qkv` bf16), o holds `batch·t` rows of `ld_o` bf16 and lse `batch·t·heads` f32, live
    // allocations of this device that outlive the launch in stream order.
    unsafe { launch.launch(shape.launch(smem)) }.w()?;
    Ok((o, lse))
}

/// The gradient of the packed `qkv` (bf16, its shape) given the output `o`, its gradient `g`
/// and the forward's log-sum-exp: dq, dk and dv written into the thirds of its rows.
fn backward(qkv: &Tensor, o: &Tensor, g: &Tensor, lse: &Tensor, causal: bool) -> Result<Tensor> {
    let dev = cuda_device(qkv, "fused attention")?;
    let shape = Shape::of(qkv)?;
    let (t, d) = (shape.tokens, shape.d);
    let (qkv, o) = (packed(&qkv.detach())?, packed(o)?);
    let g = packed(&g.to_dtype(DType::BF16)?)?;
    let device = qkv.device();
    // SAFETY: the kernels below write every element of dqkv (dk and dv the backward kernel, dq
    // the cast) and of dd (the row dots); dq32 is summed into, so it starts at zero.
    let dqkv = unsafe { kernel_output(dev, qkv.shape(), DType::BF16, true) }?;
    let dq32 = Tensor::zeros(o.shape(), DType::F32, device)?;
    let dd = unsafe { kernel_output(dev, lse.shape(), DType::F32, true) }?;
    if o.elem_count() == 0 {
        return Ok(dqkv);
    }
    let stream = dev.cuda_stream();
    let at = |x: &Tensor| address(x, &stream);
    // The row dots: one a (sample, token, head), the rows of the contiguous o and g.
    let rows = lse.elem_count() as i32;
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
        grid_dim: ((rows as usize).div_ceil(4) as u32, 1, 1),
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
    let (ld_qkv, ld_o) = (shape.ld_qkv(), shape.ld_o());
    let (tokens, heads) = (t as i32, shape.heads as i32);
    let (causal, scale) = (causal as i32, scale(d));
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&q_at)
        .arg(&k_at)
        .arg(&v_at)
        .arg(&ld_qkv)
        .arg(&g_at)
        .arg(&ld_o)
        .arg(&lse_at)
        .arg(&dd_at)
        .arg(&dq32_at)
        .arg(&dk_at)
        .arg(&dv_at)
        .arg(&tokens)
        .arg(&heads)
        .arg(&causal)
        .arg(&scale);
    // SAFETY: the arguments match `mosaic_flash_backward_<d>`'s parameters in number, order
    // and size (three device addresses, an i32, an address, an i32, five addresses, four i32,
    // an f32); q, k, v, dq, dk, dv are the thirds of the rows of qkv and dqkv (`batch·t` rows
    // of `ld_qkv` bf16), g and dq32 hold `batch·t` rows of `ld_o` elements, lse and dd
    // `batch·t·heads` f32, live allocations of this device, alive past the launch in stream
    // order.
    unsafe { launch.launch(shape.launch(smem)) }.w()?;

    let cast = kernel(dev, &ATTENTION, "mosaic_f32_to_bf16_rows", 0)?;
    let n = dq32.elem_count() as u64;
    let (width, ld) = (ld_o as u64, ld_qkv as u64);
    let mut launch = stream.launch_builder(&cast);
    launch
        .arg(&dq32_at)
        .arg(&dq_at)
        .arg(&n)
        .arg(&width)
        .arg(&ld);
    let config = LaunchConfig {
        grid_dim: (
            (n as usize).div_ceil(THREADS as usize).min(1 << 16) as u32,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `mosaic_f32_to_bf16_rows`'s (two device addresses, three
    // u64): dq32 holds n f32 in rows of `width`, and the first third of each of dqkv's rows
    // (`ld` bf16 apart) takes one, alive past the launch in stream order.
    unsafe { launch.launch(config) }.w()?;
    Ok(dqkv)
}
