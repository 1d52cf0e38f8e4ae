//! The engine's bf16 ops around a transformer block's products on the GPU, against candle ops
//! composing the same mathematics there, forward and backward: a norm writing bf16 for a
//! product, a product's bias added into the f32 residual stream, and a product's bias under
//! GELU. The training rows after it run these ops inside whole models; this row says which op
//! is off, if one is.

use candle_core::{DType, Device, Result, Tensor, Var, D};
use mosaic_kit::rng::SplitMix64;
use mosaic_kit::stats::{relative_error as rel_err, worst};

use super::{slot, tensor, Res};
use crate::kernels::{bias, elementwise};
use crate::models::nn::to_f32s;
use crate::runtime::slot::cuda::{Binding, GpuDevice};
use crate::EngineError;

/// Rows of the cases: more than the bias kernels' 256 row blocks, so that a block takes
/// several, and than LayerNorm's backward grid holds (1024 blocks of 8 rows), so that its
/// blocks stride.
const ROWS: usize = 9000;
/// Features of the cases: three of the bias kernels' 256-thread column blocks, the last one
/// part full, and not a multiple of a warp.
const COLS: usize = 520;
/// Bound on the largest error over the largest value, every output and gradient: a bf16
/// rounding or two apart (the two forms round at the same points, in different orders).
const BOUND: f32 = 1e-2;

/// One case: its inputs drawn from fixed seeds on `dev`, run by the engine's op (`fused`) or
/// by composed candle ops; the output and the gradient of each input of Σ out·w.
type Case = fn(&Device, bool) -> Result<Vec<Tensor>>;

/// Each op against its composed form on the whole GPU; passes when every output and gradient
/// is within [`BOUND`].
pub(super) fn fused(device: &GpuDevice) -> Res<(bool, String)> {
    let slot = slot(device, "fused", 1.0)?;
    // SAFETY: the device and its tensors are dropped at the end of this function, before the
    // slot, all on this thread.
    let dev = unsafe { slot.candle_device(Binding::Primary)? };
    let cases: [(&str, Case); 3] = [
        ("layer norm to bf16", layer_norm),
        ("residual bias add", residual_bias_add),
        ("bias and GELU", bias_gelu),
    ];
    let mut figures = Vec::new();
    let mut pass = true;
    for (name, case) in cases {
        let err = largest_error(case(&dev, true), case(&dev, false))
            .map_err(EngineError::tensor(name))?;
        pass &= err < BOUND; // a NaN fails
        figures.push(format!("{name} {err:.1e}"));
    }
    dev.synchronize().map_err(tensor)?;
    Ok((
        pass,
        format!(
            "largest error over the largest value, output and gradients, against composed ops \
             (bound {BOUND:.0e}): {}",
            figures.join(", ")
        ),
    ))
}

/// The largest relative error over the tensors of two runs; NaN if any is.
fn largest_error(fused: Result<Vec<Tensor>>, composed: Result<Vec<Tensor>>) -> Result<f32> {
    let mut err = 0f32;
    for (f, c) in fused?.iter().zip(&composed?) {
        err = worst([err, rel_err(&to_f32s(f)?, &to_f32s(c)?)]);
    }
    Ok(err)
}

/// A variable of `shape` on `dev`: N(mean, std²) from `seed`, rounded to `dtype`.
fn draw(
    dev: &Device,
    seed: u64,
    shape: &[usize],
    mean: f64,
    std: f64,
    dtype: DType,
) -> Result<Var> {
    let n = shape.iter().product();
    let x = Tensor::from_vec(SplitMix64::new(seed).normals(n, std), shape, dev)?;
    Var::from_tensor(&(x + mean)?.to_dtype(dtype)?)
}

/// `out` and the gradients of Σ out·w (w drawn from a fixed seed) at each of `inputs`.
fn with_gradients(out: Tensor, inputs: &[&Var]) -> Result<Vec<Tensor>> {
    let w = Tensor::from_vec(
        SplitMix64::new(99).normals(out.elem_count(), 1.0),
        out.shape(),
        out.device(),
    )?;
    let grads = (out.to_dtype(DType::F32)? * w)?.sum_all()?.backward()?;
    let mut all = vec![out];
    for x in inputs {
        let g = grads
            .get(x.as_tensor())
            .ok_or_else(|| candle_core::Error::Msg("an input got no gradient".into()))?;
        all.push(g.clone());
    }
    Ok(all)
}

/// LayerNorm of f32 rows off zero mean, written in bf16.
fn layer_norm(dev: &Device, fused: bool) -> Result<Vec<Tensor>> {
    let eps = 1e-5;
    let x = draw(dev, 1, &[ROWS, COLS], 3.0, 2.0, DType::F32)?;
    let gamma = draw(dev, 2, &[COLS], 1.0, 0.5, DType::F32)?;
    let beta = draw(dev, 3, &[COLS], 0.0, 1.0, DType::F32)?;
    let out = if fused {
        elementwise::layer_norm(&x, &gamma, &beta, eps, DType::BF16)?
    } else {
        let centred = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
        let sd = (centred.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?;
        (centred
            .broadcast_div(&sd)?
            .broadcast_mul(&gamma)?
            .broadcast_add(&beta)?)
        .to_dtype(DType::BF16)?
    };
    with_gradients(out, &[&x, &gamma, &beta])
}

/// An f32 residual stream plus a bf16 product with its bias (rounded to bf16 after the add).
fn residual_bias_add(dev: &Device, fused: bool) -> Result<Vec<Tensor>> {
    let x = draw(dev, 4, &[ROWS, COLS], 0.0, 3.0, DType::F32)?;
    let y = draw(dev, 5, &[ROWS, COLS], 0.0, 1.0, DType::BF16)?;
    let b = draw(dev, 6, &[COLS], 0.0, 1.0, DType::F32)?;
    let out = if fused {
        bias::residual_bias_add(&x, &y, &b)?
    } else {
        x.add(&biased(&y, &b)?.to_dtype(DType::F32)?)?
    };
    with_gradients(out, &[&x, &y, &b])
}

/// GELU of a bf16 product with its bias, in bf16.
fn bias_gelu(dev: &Device, fused: bool) -> Result<Vec<Tensor>> {
    let y = draw(dev, 7, &[ROWS, COLS], 0.0, 2.0, DType::BF16)?;
    let b = draw(dev, 8, &[COLS], 0.0, 1.0, DType::F32)?;
    let out = if fused {
        bias::bias_gelu(&y, &b)?
    } else {
        (biased(&y, &b)?.to_dtype(DType::F32)?.gelu()?).to_dtype(DType::BF16)?
    };
    with_gradients(out, &[&y, &b])
}

/// `y + b` added in f32 and rounded to bf16, composed.
fn biased(y: &Tensor, b: &Tensor) -> Result<Tensor> {
    y.to_dtype(DType::F32)?
        .broadcast_add(b)?
        .to_dtype(DType::BF16)
}
