//! `mosaic check gpu`'s row for the fused attention: the kernels against attention composed of
//! candle ops, then both timed at a real module's shape.

use std::time::Instant;

use candle_core::{DType, Device, Result, Tensor, Var};
use mosaic_kit::rng::SplitMix64;
use mosaic_kit::stats::{self, median, relative_error as rel_err};

use crate::models::grad_op::backward_from;
use crate::models::nn::{add_bias, causal_mask, composed_attention, to_f32s};

/// `(batch, heads, tokens, head dim)` and causality of the accuracy cases: head dimensions of
/// the zoo's encoders (48: ImageBind depth, 64, 80: ImageBind vision), tokens past a tile.
const CASES: [((usize, usize, usize, usize), bool); 3] = [
    ((2, 4, 200, 64), true),
    ((1, 2, 130, 80), false),
    ((2, 2, 77, 48), true),
];

/// The timed shape: CLIP ViT-L/14's vision tower in the zoo (batch 16, 16 heads, 1297
/// tokens, 64 a head).
const TIMED: (usize, usize, usize, usize) = (16, 16, 1297, 64);

/// Bound on the largest error over the largest value, output and gradients: bf16 products.
const BOUND: f32 = 3e-2;

/// The kernels on `dev` (a CUDA device) against attention composed in f32 from the same bf16
/// inputs, output and the gradients of q, k, v and their bias; then forward and backward timed
/// both ways in bf16 at [`TIMED`] ([`timed`]). Passes when every error is within [`BOUND`] and
/// the kernels are the faster.
pub(crate) fn check(dev: &Device) -> Result<(bool, String)> {
    let mut worst = 0f32;
    for (shape, causal) in CASES {
        let fused = run(dev, shape, causal, true)?;
        let composed = run(dev, shape, causal, false)?;
        for (f, c) in fused.iter().zip(&composed) {
            worst = stats::worst([worst, rel_err(&to_f32s(f)?, &to_f32s(c)?)]);
        }
    }
    let (fused_ms, composed_ms) = timed(dev)?;
    let (b, h, t, d) = TIMED;
    Ok((
        worst < BOUND && fused_ms < composed_ms,
        format!(
            "largest error {worst:.1e} over {} cases (bound {BOUND:.0e}); forward and backward \
             at {b}×{h} heads × {t} tokens × {d}: {fused_ms:.1} ms fused, {composed_ms:.1} ms \
             composed ({:.1}×)",
            CASES.len(),
            composed_ms / fused_ms
        ),
    ))
}

/// Attention of seeded q, k, v of `shape` (drawn, rounded to bf16; scores scaled by 1/√d) plus
/// a seeded bias of each head's q, k and v, and the gradients of Σ y·w: `[y, dq, dk, dv,
/// dbias]`. Fused (q, k, v laid out as the kernels take them, the bias added by the kernels), in
/// bf16; or composed, in f32.
fn run(
    dev: &Device,
    shape: (usize, usize, usize, usize),
    causal: bool,
    fused: bool,
) -> Result<Vec<Tensor>> {
    let (_, _, t, d) = shape;
    let n = shape.0 * shape.1 * t * d;
    let dtype = if fused { DType::BF16 } else { DType::F32 };
    let draw = |seed: u64, std: f64| -> Result<Var> {
        let x = Tensor::from_vec(SplitMix64::new(seed).normals(n, std), shape, dev)?;
        Var::from_tensor(&x.to_dtype(DType::BF16)?.to_dtype(dtype)?)
    };
    let (q, k, v) = (draw(1, 1.0)?, draw(2, 1.0)?, draw(3, 1.0)?);
    let heads = shape.1;
    let bias = Var::from_tensor(&Tensor::from_vec(
        SplitMix64::new(5).normals(3 * heads * d, 0.5),
        3 * heads * d,
        dev,
    )?)?;
    let w = Tensor::from_vec(SplitMix64::new(4).normals(n, 1.0), shape, dev)?;
    let y = if fused {
        // As a projection writes them: [batch, tokens, 3, heads, d]; the output back from
        // [batch, tokens, heads, d] to the composed form's [batch, heads, tokens, d].
        let qkv = Tensor::stack(&[q.as_tensor(), k.as_tensor(), v.as_tensor()], 0)?
            .permute((1, 3, 0, 2, 4))?
            .contiguous()?;
        super::cuda::attention(&qkv, &bias, causal)?.transpose(1, 2)?
    } else {
        // Each of q, k, v plus its third of the bias, [heads, d] broadcast over [b, heads, t, d].
        let biased = |x: &Var, which: usize| -> Result<Tensor> {
            let b = bias.narrow(0, which * heads * d, heads * d)?;
            let b = b.reshape((1, heads, 1, d))?.to_dtype(dtype)?;
            x.as_tensor().broadcast_add(&b)
        };
        let (qb, kb, vb) = (biased(&q, 0)?, biased(&k, 1)?, biased(&v, 2)?);
        let mask = causal.then(|| causal_mask(t, dtype, dev)).transpose()?;
        let scaled = (qb * (d as f64).powf(-0.5))?;
        composed_attention(
            &scaled,
            &kb.contiguous()?,
            &vb.contiguous()?,
            &[mask.as_ref()],
        )?
    };
    let grads = (y.to_dtype(DType::F32)? * w)?.sum_all()?.backward()?;
    let mut out = vec![y];
    for x in [&q, &k, &v, &bias] {
        let g = grads
            .get(x.as_tensor())
            .ok_or_else(|| candle_core::Error::Msg("an input got no gradient".into()))?;
        out.push(g.clone());
    }
    Ok(out)
}

/// Attention's forward and backward passes at [`TIMED`] as the layer runs them, fused and
/// composed, from one qkv product (bf16, `[batch · tokens, 3 · heads · d]`) and bias drawn
/// once: the median ms of each over 3 runs after a warm-up, each from a synchronised device to
/// a synchronised device, so that only the passes are timed (drawing and uploading the inputs
/// took far longer than the kernels).
fn timed(dev: &Device) -> Result<(f64, f64)> {
    let (b, h, t, d) = TIMED;
    let width = 3 * h * d;
    let draw = |seed: u64, n: usize, std: f64| {
        Tensor::from_vec(SplitMix64::new(seed).normals(n, std), n, dev)
    };
    let product = draw(1, b * t * width, 1.0)?.to_dtype(DType::BF16)?;
    let product = Var::from_tensor(&product.reshape((b * t, width))?)?;
    let bias = Var::from_tensor(&draw(5, width, 0.5)?)?;
    let w = draw(4, b * t * h * d, 1.0)?.to_dtype(DType::BF16)?;
    let w = w.reshape((b, t, h * d))?;
    let fused = || -> Result<Tensor> {
        let qkv = product.reshape((b, t, 3, h, d))?;
        super::cuda::attention(&qkv, &bias, false)?.reshape((b, t, h * d))
    };
    // What `Attention` composes where the kernels do not run.
    let composed = || -> Result<Tensor> {
        let qkv = add_bias(&product, &bias)?
            .reshape((b, t, 3, h, d))?
            .permute((2, 0, 3, 1, 4))?;
        let q = (qkv.get(0)? * (d as f64).powf(-0.5))?;
        let (k, v) = (qkv.get(1)?.contiguous()?, qkv.get(2)?.contiguous()?);
        composed_attention(&q, &k, &v, &[])?
            .transpose(1, 2)?
            .reshape((b, t, h * d))
    };
    let time = |pass: &dyn Fn() -> Result<Tensor>| -> Result<f64> {
        let mut ms = Vec::new();
        for _ in 0..4 {
            dev.synchronize()?;
            let start = Instant::now();
            drop(backward_from(&pass()?, &w)?);
            dev.synchronize()?;
            ms.push(start.elapsed().as_secs_f64() * 1e3);
        }
        Ok(median(&ms[1..]).unwrap_or(f64::NAN))
    };
    Ok((time(&fused)?, time(&composed)?))
}
