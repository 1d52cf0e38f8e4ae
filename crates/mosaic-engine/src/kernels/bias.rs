//! A Linear layer's bias on a GPU (`kernels/elementwise.cu`): added to the bf16 product in one
//! pass by a custom op of candle's (the output is the op's own storage, no copy), its gradient
//! the rows' sums in f32, read along the rows. candle's broadcast add and the row sum behind its
//! backward pass index every element through 64-bit divisions, and that sum reads a column at a
//! time and accumulates in bf16. Where a residual connection follows the layer, the bias and
//! the add into the f32 residual stream are one op ([`residual_bias_add`]); where GELU does (a
//! block's MLP), the bias and GELU are one op forward and one backward ([`bias_gelu`]).

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{
    bail, CpuStorage, CudaDevice, CudaStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape,
    Tensor,
};

use super::{
    address, cuda_device, kernel, kernel_output, storage_address, uninit_storage, ELEMENTWISE,
};

/// Threads a block, along the columns.
const THREADS: u32 = 256;
/// Blocks down the rows, at most: the bias add's grid, and the gradient's partial rows.
const ROW_BLOCKS: usize = 256;

/// `y + bias` over the rows of `y` (bf16 `[rows, cols]`, contiguous) with `bias` (f32
/// `[cols]`), as a node of both tapes: the gradient passes to `y` as it is and to `bias` as
/// its column sums (f32).
pub fn bias_add(y: &Tensor, bias: &Tensor) -> Result<Tensor> {
    y.apply_op2(bias, Biased::Add)
}

/// `gelu(y + bias)` over the rows of `y` (bf16 `[rows, cols]`, contiguous) with `bias` (f32
/// `[cols]`): `y + bias` rounded to bf16 as [`bias_add`] stores it, GELU (tanh form) in f32 and
/// rounded once, in one pass where the two took two and kept the pre-activation on the tape
/// (its backward pass recomputes it from `y`). A node of both tapes: `y`'s gradient is
/// `g·gelu'(y + bias)` in bf16 and the bias's its column sums, in one more pass.
pub fn bias_gelu(y: &Tensor, bias: &Tensor) -> Result<Tensor> {
    y.apply_op2(bias, Biased::Gelu)
}

/// What follows a bf16 product's bias, in one op.
enum Biased {
    /// Nothing: [`bias_add`].
    Add,
    /// GELU: [`bias_gelu`].
    Gelu,
}

/// `(rows, cols)` of a bf16 product and an f32 bias that match, for the op `op`.
fn dims(
    op: &str,
    y: &Layout,
    y_dtype: DType,
    bias: &Layout,
    bias_dtype: DType,
) -> Result<(usize, usize)> {
    let (rows, cols) = y.shape().dims2()?;
    if y_dtype != DType::BF16 || bias_dtype != DType::F32 {
        bail!("{op} adds an f32 bias to a bf16 product, not {bias_dtype:?} to {y_dtype:?}")
    }
    if bias.shape().dims() != [cols] || !y.is_contiguous() || !bias.is_contiguous() {
        bail!(
            "{op}: a contiguous [{cols}] bias for a contiguous [{rows}, {cols}] product, not \
             {:?} for {:?}",
            bias.shape(),
            y.shape()
        )
    }
    Ok((rows, cols))
}

impl CustomOp2 for Biased {
    fn name(&self) -> &'static str {
        match self {
            Biased::Add => "bias_add",
            Biased::Gelu => "bias_gelu",
        }
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("{} runs on CUDA devices only", self.name())
    }

    fn cuda_fwd(
        &self,
        y: &CudaStorage,
        y_layout: &Layout,
        bias: &CudaStorage,
        bias_layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        let (rows, cols) = dims(self.name(), y_layout, y.dtype(), bias_layout, bias.dtype())?;
        let kernel = match self {
            Biased::Add => "mosaic_bias_add_bf16",
            Biased::Gelu => "mosaic_bias_gelu_bf16",
        };
        let inputs = [(y, y_layout), (bias, bias_layout)];
        // SAFETY: both kernels take y, bias and a bf16 output: y holds rows·cols bf16 and the
        // bias cols f32 (checked above).
        let out = unsafe { run_biased(kernel, &inputs, DType::BF16, rows, cols) }?;
        Ok((out, y_layout.shape().clone()))
    }

    fn bwd(
        &self,
        y: &Tensor,
        bias: &Tensor,
        _out: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dy, d_bias) = match self {
            // In y's dtype whatever reached the output (no copy when it is already).
            Biased::Add => (g.to_dtype(y.dtype())?, column_sums(g)?),
            Biased::Gelu => bias_gelu_backward(y, bias, g)?,
        };
        Ok((Some(dy), Some(d_bias)))
    }
}

/// `x + (y + bias)` with `x` the f32 residual stream `[rows, cols]`, `y` a bf16 product of the
/// same shape and `bias` f32 `[cols]`, all contiguous; `y + bias` rounded to bf16 as
/// [`bias_add`] stores it, so the values are `x + bias_add(y, bias)` cast to f32, in one pass
/// where that took three. A node of the three tapes: the gradient passes to `x` as it is, to
/// `y` in bf16 and to `bias` as the column sums of that.
pub fn residual_bias_add(x: &Tensor, y: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.apply_op3(y, bias, ResidualBiasAdd)
}

struct ResidualBiasAdd;

impl CustomOp3 for ResidualBiasAdd {
    fn name(&self) -> &'static str {
        "residual_bias_add"
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
        bail!("residual_bias_add runs on CUDA devices only")
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        x_layout: &Layout,
        y: &CudaStorage,
        y_layout: &Layout,
        bias: &CudaStorage,
        bias_layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        let (rows, cols) = dims(
            "residual_bias_add",
            y_layout,
            y.dtype(),
            bias_layout,
            bias.dtype(),
        )?;
        if x.dtype() != DType::F32
            || x_layout.shape() != y_layout.shape()
            || !x_layout.is_contiguous()
        {
            bail!(
                "residual_bias_add: a contiguous f32 residual of the product's shape {:?}, not \
                 {:?} {:?}",
                y_layout.shape(),
                x.dtype(),
                x_layout.shape()
            )
        }
        let inputs = [(x, x_layout), (y, y_layout), (bias, bias_layout)];
        // SAFETY: `mosaic_residual_bias_add_bf16` takes x, y, bias and an f32 output: x holds
        // rows·cols f32, y rows·cols bf16 and the bias cols f32 (checked above).
        let name = "mosaic_residual_bias_add_bf16";
        let out = unsafe { run_biased(name, &inputs, DType::F32, rows, cols) }?;
        Ok((out, y_layout.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _y: &Tensor,
        _bias: &Tensor,
        _out: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let g_product = g.to_dtype(DType::BF16)?;
        let d_bias = column_sums(&g_product)?;
        Ok((Some(g.clone()), Some(g_product), Some(d_bias)))
    }
}

/// The gradients of `y` (bf16) and of the bias (f32, its column sums) of [`bias_gelu`] given
/// `g`, the gradient of its output: one pass, and the partial rows summed by a candle op.
fn bias_gelu_backward(y: &Tensor, bias: &Tensor, g: &Tensor) -> Result<(Tensor, Tensor)> {
    let dev = cuda_device(y, "the MLP's bias and GELU")?;
    let (rows, cols) = y.dims2()?;
    // The op's forward pass checked the dtypes, shapes and contiguity of y and the bias.
    let g = g.to_dtype(DType::BF16)?.contiguous()?;
    let launched = rows * cols > 0;
    // SAFETY: the kernel below writes every element of dy and, when it runs, of part.
    let dy = unsafe { kernel_output(dev, (rows, cols), DType::BF16, true) }?;
    let part_shape = (rows.clamp(1, ROW_BLOCKS), cols);
    let part = unsafe { kernel_output(dev, part_shape, DType::F32, launched) }?;
    let stream = dev.cuda_stream();
    let at = [y, bias, &g, &dy, &part]
        .map(|t| address(t, &stream))
        .into_iter()
        .collect::<Result<Vec<u64>>>()?;
    // SAFETY: the addresses are `mosaic_bias_gelu_backward_bf16`'s (y, bias, g, dy, part): y,
    // g and dy hold rows·cols bf16, the bias cols f32 and part min(rows, ROW_BLOCKS)·cols f32
    // (the grid's rows), contiguous, alive past the launch in stream order.
    unsafe { launch_biased(dev, "mosaic_bias_gelu_backward_bf16", &at, rows, cols) }?;
    Ok((dy, part.sum(0)?))
}

/// Runs the bias kernel `name` over a `[rows, cols]` product on the inputs' device and stream,
/// into a fresh contiguous `[rows, cols]` output of `out`: the kernel's arguments are the
/// inputs' device addresses, the output's, then rows and cols (i32); threads along the columns,
/// blocks down the rows. The kernel writes every element of the output.
///
/// # Safety
///
/// `inputs` must be the kernel's input parameters, in order, each holding what the kernel
/// reads there, and `out` its output's element type.
unsafe fn run_biased(
    name: &str,
    inputs: &[(&CudaStorage, &Layout)],
    out: DType,
    rows: usize,
    cols: usize,
) -> Result<CudaStorage> {
    use candle_core::backend::BackendStorage;
    let dev = inputs[0].0.device().clone();
    // SAFETY: every element is written by the kernel below before anything reads it.
    let out = unsafe { uninit_storage(&dev, rows * cols, out) }?;
    let stream = dev.cuda_stream();
    let mut at = (inputs.iter())
        .map(|(storage, layout)| storage_address(storage, layout, &stream))
        .collect::<Result<Vec<u64>>>()?;
    at.push(storage_address(
        &out,
        &Layout::contiguous((rows, cols)),
        &stream,
    )?);
    // SAFETY: the caller vouches for the inputs and the output's type; the output holds
    // rows·cols of it, and every allocation outlives the launch in stream order.
    unsafe { launch_biased(&dev, name, &at, rows, cols) }?;
    Ok(out)
}

/// Launches the bias kernel `name` over a `[rows, cols]` product on `dev`'s stream: its device
/// addresses `at`, then rows and cols (i32); threads along the columns, blocks down the rows
/// (at most [`ROW_BLOCKS`]). Nothing to launch for an empty product.
///
/// # Safety
///
/// `at` must be the kernel's address parameters, in order, each of a live allocation of `dev`
/// that holds what the kernel reads or writes there and outlives the launch in stream order.
unsafe fn launch_biased(
    dev: &CudaDevice,
    name: &str,
    at: &[u64],
    rows: usize,
    cols: usize,
) -> Result<()> {
    if rows * cols == 0 {
        return Ok(());
    }
    let func = kernel(dev, &ELEMENTWISE, name, 0)?;
    let stream = dev.cuda_stream();
    let (rows_i, cols_i) = (rows as i32, cols as i32);
    let mut launch = stream.launch_builder(&func);
    for address in at {
        launch.arg(address);
    }
    launch.arg(&rows_i).arg(&cols_i);
    let config = LaunchConfig {
        grid_dim: (
            cols.div_ceil(THREADS as usize) as u32,
            rows.min(ROW_BLOCKS) as u32,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the caller vouches for the addresses; rows and cols are the kernels' two i32.
    unsafe { launch.launch(config) }.w()?;
    Ok(())
}

/// The sums over the rows of `g` (bf16 `[rows, cols]`), f32 `[cols]`.
pub(crate) fn column_sums(g: &Tensor) -> Result<Tensor> {
    let dev = cuda_device(g, "the bias gradient")?;
    let g = g.to_dtype(DType::BF16)?.contiguous()?;
    let (rows, cols) = g.dims2()?;
    let part_shape = (rows.clamp(1, ROW_BLOCKS), cols);
    // SAFETY: the kernel below writes every element of part when it runs.
    let part = unsafe { kernel_output(dev, part_shape, DType::F32, rows * cols > 0) }?;
    let stream = dev.cuda_stream();
    let at = [address(&g, &stream)?, address(&part, &stream)?];
    // SAFETY: the addresses are `mosaic_column_sums_bf16`'s (g, part): g holds rows·cols bf16
    // and part min(rows, ROW_BLOCKS)·cols f32 (the grid's rows), contiguous, alive past the
    // launch in stream order.
    unsafe { launch_biased(dev, "mosaic_column_sums_bf16", &at, rows, cols) }?;
    part.sum(0)
}
