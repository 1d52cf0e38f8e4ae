//! The launches of `kernels/attention.cu`: the forward kernel, then in the backward pass the
//! row dots `Σ dO·O` and the backward kernel, each on the stream of the tensors' device; and
//! the op that puts them on the tape.

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchArgs, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, CpuStorage, CudaStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

use super::geometry::{backward_smem, forward_smem, HEAD_DIMS, THREADS, TILE};
use crate::kernels::bias::column_sums;
use crate::kernels::{
    address, cuda_device, kernel, kernel_output, storage_address, uninit_storage, ATTENTION,
};

/// Most batch × heads a launch takes: a grid's y dimension, a (sample, head) per block row.
const MAX_HEADS: usize = 65_535;

/// Whether the kernels run attention of this `[batch, tokens, 3, heads, d]` product with this
/// bias: bf16 on a CUDA device, with a head dimension they were compiled for and at most
/// [`MAX_HEADS`] batch × heads, and an f32 bias of `3·heads·d`.
pub(crate) fn runs(qkv: &Tensor, bias: &Tensor) -> bool {
    let dims = qkv.dims();
    qkv.device().is_cuda()
        && qkv.dtype() == DType::BF16
        && dims.len() == 5
        && dims[2] == 3
        && dims[0] * dims[3] <= MAX_HEADS
        && HEAD_DIMS.contains(&dims[4])
        && bias.dtype() == DType::F32
        && bias.dims() == [3 * dims[3] * dims[4]]
}

/// The fused attention (see [`super::attention`]).
pub(crate) fn attention(qkv: &Tensor, bias: &Tensor, causal: bool) -> Result<Tensor> {
    // A projection's output is packed already; so is a bias variable.
    let (qkv, bias) = (packed(qkv)?, packed(bias)?);
    qkv.apply_op2(
        &bias,
        Flash {
            causal,
            lse: Mutex::new(None),
        },
    )
}

/// The op: attention of a `[batch, tokens, 3, heads, d]` product plus its bias, as one node of
/// both tapes. Its forward pass writes the output into the op's own storage (no copy) and
/// keeps each query row's log-sum-exp here for the backward pass.
struct Flash {
    causal: bool,
    lse: Mutex<Option<Tensor>>,
}

impl CustomOp2 for Flash {
    fn name(&self) -> &'static str {
        "flash_attention"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("the fused attention kernels run on CUDA devices only")
    }

    fn cuda_fwd(
        &self,
        qkv: &CudaStorage,
        qkv_layout: &Layout,
        bias: &CudaStorage,
        bias_layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let shape = Dims::of(qkv_layout.dims())?;
        if qkv.dtype() != DType::BF16
            || bias.dtype() != DType::F32
            || !qkv_layout.is_contiguous()
            || !bias_layout.is_contiguous()
            || bias_layout.dims() != [3 * shape.heads * shape.d]
        {
            bail!(
                "fused attention: a contiguous bf16 [batch, tokens, 3, heads, d] product and an \
                 f32 bias of 3·heads·d, not {:?} {:?} and {:?} {:?}",
                qkv.dtype(),
                qkv_layout.dims(),
                bias.dtype(),
                bias_layout.dims()
            )
        }
        // The kernels load q, k and v 16 bytes (8 elements) at a time.
        if !qkv_layout.start_offset().is_multiple_of(8) {
            bail!(
                "fused attention: the product starts {} elements into its storage, not a \
                 multiple of 8 (16-byte loads)",
                qkv_layout.start_offset()
            )
        }
        let dev = qkv.device().clone();
        let Dims {
            batch,
            tokens: t,
            heads,
            d,
        } = shape;
        let out_shape = Shape::from((batch, t, heads, d));
        // SAFETY: the kernel below writes every row of o and every log-sum-exp.
        let o = unsafe { uninit_storage(&dev, out_shape.elem_count(), DType::BF16) }?;
        let lse = unsafe { kernel_output(&dev, (batch, t, heads), DType::F32, true) }?;
        if out_shape.elem_count() > 0 {
            let smem = forward_smem(d);
            let func = kernel(&dev, &ATTENTION, &format!("mosaic_flash_forward_{d}"), smem)?;
            let stream = dev.cuda_stream();
            let operands = Operands::of(
                &shape,
                storage_address(qkv, qkv_layout, &stream)?,
                storage_address(bias, bias_layout, &stream)?,
            )?;
            let o_at = storage_address(&o, &Layout::contiguous(&out_shape), &stream)?;
            let lse_at = address(&lse, &stream)?;
            let ld_o = shape.ld_o();
            let (tokens, heads, causal, scale) =
                (t as i32, heads as i32, self.causal as i32, scale(d));
            let mut launch = stream.launch_builder(&func);
            operands.push(&mut launch);
            launch
                .arg(&o_at)
                .arg(&ld_o)
                .arg(&lse_at)
                .arg(&tokens)
                .arg(&heads)
                .arg(&causal)
                .arg(&scale);
            // SAFETY: the arguments match `mosaic_flash_forward_<d>`'s parameters in number,
            // order and size (six device addresses, an i32, an address, an i32, an address,
            // three i32, an f32 — `int` is 32 bits); q, k and v are the thirds of the rows of
            // qkv (`batch·t` rows of `ld_qkv` bf16) and bq, bk, bv those of the bias (3·heads·d
            // f32), o holds `batch·t` rows of `ld_o` bf16 and lse `batch·t·heads` f32, live
            // allocations of this device that outlive the launch in stream order.
            unsafe { launch.launch(shape.launch(smem)) }.w()?;
        }
        *self.lse.lock().expect("the log-sum-exp's lock") = Some(lse);
        Ok((o, out_shape))
    }

    fn bwd(
        &self,
        qkv: &Tensor,
        bias: &Tensor,
        o: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let lse = (self.lse.lock().expect("the log-sum-exp's lock").clone()).ok_or_else(|| {
            candle_core::Error::Msg("fused attention: a backward pass before its forward".into())
        })?;
        let dqkv = backward(qkv, bias, o, g, &lse, self.causal)?;
        // The bias adds to every token's q, k and v: its gradient is their gradient's sums.
        let (batch, t, _, heads, d) = dqkv.dims5()?;
        let d_bias = column_sums(&dqkv.reshape((batch * t, 3 * heads * d))?)?;
        Ok((Some(dqkv), Some(d_bias)))
    }
}

/// The softmax scale 1/√d.
fn scale(d: usize) -> f32 {
    (d as f64).powf(-0.5) as f32
}

/// The kernels' first parameters: q, k and v (the thirds of the product's first row), their
/// biases (the thirds of the bias) and the product's row stride.
struct Operands {
    qkv: [u64; 3],
    bias: [u64; 3],
    ld_qkv: i32,
}

impl Operands {
    /// From the product's and the bias's device addresses; an error where the product is not
    /// 16-byte aligned, as the kernels' 16-byte loads of it need (every row and head then is:
    /// `d` is a multiple of 16).
    fn of(shape: &Dims, qkv_at: u64, bias_at: u64) -> Result<Operands> {
        if !qkv_at.is_multiple_of(16) {
            bail!("fused attention: the product lies at {qkv_at:#x}, not 16-byte aligned")
        }
        let head_row = shape.heads * shape.d; // a third of a row: q, k or v of every head
        Ok(Operands {
            qkv: thirds(qkv_at, head_row * 2),
            bias: thirds(bias_at, head_row * 4),
            ld_qkv: shape.ld_qkv(),
        })
    }

    /// Pushes them, in the kernels' order (three bf16 addresses, three f32 addresses, an i32).
    fn push<'a>(&'a self, launch: &mut LaunchArgs<'a>) {
        for at in self.qkv.iter().chain(&self.bias) {
            launch.arg(at);
        }
        launch.arg(&self.ld_qkv);
    }
}

/// The addresses of a row's three thirds (q, k, v; or their biases) from the first's, a third
/// being `bytes` long.
fn thirds(base: u64, bytes: usize) -> [u64; 3] {
    let third = bytes as u64;
    [base, base + third, base + 2 * third]
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

/// The dimensions of a `[batch, tokens, 3, heads, head dim]` product, checked against the grid.
#[derive(Clone, Copy)]
struct Dims {
    batch: usize,
    tokens: usize,
    heads: usize,
    d: usize,
}

impl Dims {
    fn of(dims: &[usize]) -> Result<Dims> {
        let &[batch, tokens, 3, heads, d] = dims else {
            bail!("fused attention: a [batch, tokens, 3, heads, d] product, not {dims:?}")
        };
        if batch * heads > MAX_HEADS {
            bail!("fused attention: {batch} × {heads} heads exceed a grid's {MAX_HEADS} blocks")
        }
        Ok(Dims {
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

/// The gradient of the packed `qkv` product (bf16, its shape) given its `bias`, the output
/// `o`, its gradient `g` and the forward's log-sum-exp: dq, dk and dv written into the thirds of
/// its rows.
fn backward(
    qkv: &Tensor,
    bias: &Tensor,
    o: &Tensor,
    g: &Tensor,
    lse: &Tensor,
    causal: bool,
) -> Result<Tensor> {
    let dev = cuda_device(qkv, "fused attention")?;
    let shape = Dims::of(qkv.dims())?;
    let (t, heads, d) = (shape.tokens, shape.heads, shape.d);
    let (qkv, bias, o) = (packed(&qkv.detach())?, packed(&bias.detach())?, packed(o)?);
    let g = packed(&g.to_dtype(DType::BF16)?)?;
    // SAFETY: the kernels below write every element of dqkv (dk and dv the backward kernel, dq
    // the cast) and of dd (the row dots); dq32 is summed into, so it starts at zero.
    let dqkv = unsafe { kernel_output(dev, qkv.shape(), DType::BF16, true) }?;
    let dq32 = Tensor::zeros(o.shape(), DType::F32, qkv.device())?;
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
    let operands = Operands::of(&shape, at(&qkv)?, at(&bias)?)?;
    let [dq_at, dk_at, dv_at] = thirds(at(&dqkv)?, heads * d * 2);
    let (lse_at, dq32_at) = (at(lse)?, at(&dq32)?);
    let (ld_qkv, ld_o) = (shape.ld_qkv(), shape.ld_o());
    let (tokens, heads) = (t as i32, heads as i32);
    let (causal, scale) = (causal as i32, scale(d));
    let mut launch = stream.launch_builder(&func);
    operands.push(&mut launch);
    launch
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
    // and size (six device addresses, an i32, an address, an i32, five addresses, three i32, an
    // f32); q, k, v, dq, dk, dv are the thirds of the rows of qkv and dqkv (`batch·t` rows of
    // `ld_qkv` bf16), bq, bk, bv those of the bias (3·heads·d f32), g and dq32 hold `batch·t`
    // rows of `ld_o` elements, lse and dd `batch·t·heads` f32, live allocations of this device,
    // alive past the launch in stream order.
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
