//! LayerNorm and GELU on a GPU as custom ops of candle's whose backward passes are one kernel
//! each (`kernels/elementwise.cu`): LayerNorm forward and backward one warp a row (∂γ and ∂β as
//! per-block partial rows, summed on the device by a candle op), GELU's forward candle's kernel
//! and its backward one pass. Each op's output is its own storage (no copy), every launch on
//! the stream of the tensors' device. [`crate::models::nn`] uses them on a CUDA device; its
//! composed forms stay the CPU's and the reference.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{
    bail, CpuStorage, CudaStorage, CustomOp1, CustomOp3, DType, Layout, Result, Shape, Tensor,
};

use super::{
    address, cuda_device, kernel, kernel_output, storage_address, uninit_storage, ELEMENTWISE,
};

/// Threads a block.
const THREADS: u32 = 256;
/// At most this many blocks: LayerNorm's partial rows, or a grid-stride loop's grid.
const MAX_BLOCKS: usize = 1024;
/// Shared memory a block may use without asking (∂γ and ∂β of a row, 2·dim floats).
const SMEM_LIMIT: usize = 48 * 1024;

/// Whether [`layer_norm`] runs rows of `dim` features.
pub fn layer_norm_fits(dim: usize) -> bool {
    dim > 0 && 2 * dim * 4 <= SMEM_LIMIT
}

/// `y = LayerNorm(x)·γ + β` over the last dimension of `x` (f32; variance guard `eps`), `y` in
/// `out` (f32, or bf16 for a norm whose output feeds a bf16 product: rounded once, as a cast
/// after it would, without the cast's pass over the tensor), as one node of the tapes of x, γ
/// and β whose backward pass is [`layer_norm_backward`].
pub fn layer_norm(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f64,
    out: DType,
) -> Result<Tensor> {
    x.contiguous()?
        .apply_op3(gamma, beta, LayerNormOp { eps, out })
}

struct LayerNormOp {
    eps: f64,
    out: DType,
}

impl CustomOp3 for LayerNormOp {
    fn name(&self) -> &'static str {
        "layer_norm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("the LayerNorm kernel runs on CUDA devices only")
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        x_layout: &Layout,
        gamma: &CudaStorage,
        gamma_layout: &Layout,
        beta: &CudaStorage,
        beta_layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let shape = x_layout.shape();
        let dim = shape.dims().last().copied().unwrap_or(0);
        let rows = shape.elem_count() / dim.max(1);
        let vectors = [gamma_layout, beta_layout];
        if [x.dtype(), gamma.dtype(), beta.dtype()] != [DType::F32; 3]
            || !x_layout.is_contiguous()
            || vectors
                .iter()
                .any(|l| l.shape().dims() != [dim] || !l.is_contiguous())
            || !layer_norm_fits(dim)
        {
            bail!("the LayerNorm kernel takes contiguous f32 rows of at most {} features and γ, β of their width", SMEM_LIMIT / 8)
        }
        let dev = x.device().clone();
        let stream = dev.cuda_stream();
        let name = match self.out {
            DType::F32 => "mosaic_layer_norm_f32",
            DType::BF16 => "mosaic_layer_norm_f32_to_bf16",
            other => bail!("the LayerNorm kernel writes f32 or bf16, not {other:?}"),
        };
        // SAFETY: the kernel writes every element before anything reads it.
        let y = unsafe { uninit_storage(&dev, rows * dim, self.out) }?;
        if rows > 0 {
            let func = kernel(&dev, &ELEMENTWISE, name, 0)?;
            let (x_at, gamma_at, beta_at, y_at) = (
                storage_address(x, x_layout, &stream)?,
                storage_address(gamma, gamma_layout, &stream)?,
                storage_address(beta, beta_layout, &stream)?,
                storage_address(&y, &Layout::contiguous(shape), &stream)?,
            );
            let (rows_i, dim_i, eps) = (rows as i32, dim as i32, self.eps as f32);
            let mut launch = stream.launch_builder(&func);
            launch
                .arg(&x_at)
                .arg(&gamma_at)
                .arg(&beta_at)
                .arg(&y_at)
                .arg(&rows_i)
                .arg(&dim_i)
                .arg(&eps);
            let config = LaunchConfig {
                grid_dim: (
                    rows.div_ceil((THREADS / 32) as usize).min(MAX_BLOCKS * 4) as u32,
                    1,
                    1,
                ),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the arguments match `mosaic_layer_norm_f32`'s and
            // `mosaic_layer_norm_f32_to_bf16`'s (four device addresses, two i32, an f32); x
            // holds rows·dim f32, y rows·dim of the kernel's output type and γ, β dim f32 each,
            // contiguous, alive past the launch in stream order.
            unsafe { launch.launch(config) }.w()?;
        }
        Ok((y, shape.clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        _beta: &Tensor,
        _y: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dgamma, dbeta) = layer_norm_backward(x, gamma, g, self.eps)?;
        Ok((Some(dx), Some(dgamma), Some(dbeta)))
    }
}

/// candle's GELU (tanh form) as one node of `x`'s tape whose backward pass is
/// [`gelu_backward`]'s one pass.
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    x.apply_op1(GeluOp)
}

struct GeluOp;

impl CustomOp1 for GeluOp {
    fn name(&self) -> &'static str {
        "gelu"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("the GELU kernel runs on CUDA devices only")
    }

    fn cuda_fwd(&self, x: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        Ok((
            x.unary_impl::<candle_core::op::Gelu>(layout)?,
            layout.shape().clone(),
        ))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        gelu_backward(x, g).map(Some)
    }
}

/// The gradients `(∂x, ∂γ, ∂β)` of `y = LayerNorm(x)·γ + β` over the last dimension (f32, rows
/// that [`layer_norm_fits`], variance guard `eps`) given `g = ∂loss/∂y` (read as it comes in
/// bf16, else in f32), as `nn::layer_norm_backward` composes them; ∂x in `x`'s shape.
fn layer_norm_backward(
    x: &Tensor,
    gamma: &Tensor,
    g: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let dev = cuda_device(x, "the engine's elementwise kernels")?;
    let dim = x.dim(candle_core::D::Minus1)?;
    let rows = x.elem_count() / dim.max(1);
    // The op's forward pass checked the dtypes and the width.
    let x = x.detach().contiguous()?;
    let (g, name) = match g.dtype() {
        DType::BF16 => (g.contiguous()?, "mosaic_layer_norm_backward_bf16_grad"),
        _ => (
            g.to_dtype(DType::F32)?.contiguous()?,
            "mosaic_layer_norm_backward_f32",
        ),
    };
    let gamma = gamma.detach().to_dtype(DType::F32)?.contiguous()?;
    let blocks = rows.div_ceil((THREADS / 32) as usize).clamp(1, MAX_BLOCKS);
    // SAFETY: the kernel below writes every row of dx, and when it runs every block writes its
    // partial rows.
    let dx = unsafe { kernel_output(dev, x.shape(), DType::F32, true) }?;
    let part = unsafe { kernel_output(dev, (blocks, 2, dim), DType::F32, rows > 0) }?;
    if rows > 0 {
        let func = kernel(dev, &ELEMENTWISE, name, 0)?;
        let stream = dev.cuda_stream();
        let at = |t: &Tensor| address(t, &stream);
        let (x_at, gamma_at, g_at, dx_at, part_at) =
            (at(&x)?, at(&gamma)?, at(&g)?, at(&dx)?, at(&part)?);
        let (rows_i, dim_i, eps) = (rows as i32, dim as i32, eps as f32);
        let mut launch = stream.launch_builder(&func);
        launch
            .arg(&x_at)
            .arg(&gamma_at)
            .arg(&g_at)
            .arg(&dx_at)
            .arg(&part_at)
            .arg(&rows_i)
            .arg(&dim_i)
            .arg(&eps);
        let config = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: (2 * dim * 4) as u32,
        };
        // SAFETY: the arguments match `mosaic_layer_norm_backward_f32`'s and
        // `mosaic_layer_norm_backward_bf16_grad`'s (five device addresses, two i32, an f32); x
        // and dx hold rows·dim f32, g rows·dim of the kernel's gradient type, γ dim and the
        // partials blocks·2·dim f32, all contiguous, alive past the launch in stream order.
        unsafe { launch.launch(config) }.w()?;
    }
    let sums = part.sum(0)?; // [2, dim]
    Ok((dx.reshape(x.shape())?, sums.get(0)?, sums.get(1)?))
}

/// `∂loss/∂x` of `gelu(x)` (candle's tanh form) given `g = ∂loss/∂gelu(x)`, in `x`'s dtype
/// (f32 or bf16).
fn gelu_backward(x: &Tensor, g: &Tensor) -> Result<Tensor> {
    let dev = cuda_device(x, "the engine's elementwise kernels")?;
    let dtype = x.dtype();
    let name = match dtype {
        DType::F32 => "mosaic_gelu_backward_f32",
        DType::BF16 => "mosaic_gelu_backward_bf16",
        other => bail!("the GELU kernel takes f32 or bf16, not {other:?}"),
    };
    let x = x.detach().contiguous()?;
    let g = g.to_dtype(dtype)?.contiguous()?;
    // SAFETY: the kernel below writes every element.
    let dx = unsafe { kernel_output(dev, x.shape(), dtype, true) }?;
    let n = x.elem_count();
    if n > 0 {
        let func = kernel(dev, &ELEMENTWISE, name, 0)?;
        let stream = dev.cuda_stream();
        let at = |t: &Tensor| address(t, &stream);
        let (x_at, g_at, dx_at, count) = (at(&x)?, at(&g)?, at(&dx)?, n as u64);
        let mut launch = stream.launch_builder(&func);
        launch.arg(&x_at).arg(&g_at).arg(&dx_at).arg(&count);
        let config = LaunchConfig {
            grid_dim: (
                n.div_ceil(THREADS as usize).min(MAX_BLOCKS * 64) as u32,
                1,
                1,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's (three device addresses, a u64 count); x, g
        // and dx hold `count` contiguous elements of `dtype`, alive past the launch in stream
        // order.
        unsafe { launch.launch(config) }.w()?;
    }
    Ok(dx)
}
