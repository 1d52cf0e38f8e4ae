//! Where a transformer block's step goes (`mosaic bench block`): one block of a zoo encoder at
//! its real shape, and each of its pieces alone — the norm, the three projections, attention
//! (fused where the device has the kernels, and composed), the MLP — timed forward and
//! forward + backward on the device, with the products' throughput and what each leaves on the
//! autograd tape. What the engine's step times (`train --json-log`) cannot say: which piece is
//! slow, and against what.
//!
//! A piece's time runs from a synchronised device to a synchronised device; its backward pass
//! starts from an all-ones gradient of its output, made once, as a module's starts from the
//! gradient its consumers hand it. The median of `reps` runs after one warm-up run counts.

use std::time::Instant;

use candle_core::{DType, Device, Result, Tensor, Var};
use mosaic_kit::rng::SplitMix64;
use mosaic_kit::stats::median;

use crate::error::EngineError;
use crate::models::nn::{causal_mask, composed_attention, Block, LayerNorm, Linear, ParamBuilder};
use crate::models::zoo::EncoderBlock;
use crate::models::{flash, grad_op};
use crate::runtime::trainer::Compute;

/// One piece of a block, timed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PieceTime {
    /// What was timed.
    pub piece: &'static str,
    /// Median forward time, ms.
    pub forward_ms: f64,
    /// Median forward + backward time, ms.
    pub step_ms: f64,
    /// Floating-point operations of its products in the forward pass (0 for a piece without
    /// products); forward and backward take three times as many.
    pub flop: f64,
    /// Bytes its forward pass leaves on the autograd tape for the backward pass: the distinct
    /// storages of candle's graph from the output back to its inputs, the inputs included and
    /// the parameters not (`super::bytes::tape_bytes`), as this device runs it.
    pub tape_bytes: u64,
}

impl PieceTime {
    /// Throughput of its products over forward and backward, TFLOP/s (`None` without
    /// products).
    pub fn tflops(&self) -> Option<f64> {
        (self.flop > 0.0).then(|| 3.0 * self.flop / (self.step_ms * 1e9))
    }
}

/// `block` (a zoo encoder's, [`encoder_block`](crate::models::zoo::encoder_block)) on
/// `compute`'s device at per-GPU batch `batch` (products in bf16 on a GPU, f32 on the CPU):
/// every piece, then the whole block.
pub fn time_block(
    block: &EncoderBlock,
    batch: usize,
    compute: Compute,
    reps: usize,
) -> std::result::Result<Vec<PieceTime>, EngineError> {
    let tensor = EngineError::tensor("bench block");
    match compute {
        Compute::Cpu => {
            fits_in_memory(block, batch)?;
            time_pieces(&Device::Cpu, DType::F32, block, batch, reps).map_err(tensor)
        }
        Compute::Cuda(ordinal) => on_gpu(ordinal, |dev| {
            time_pieces(dev, DType::BF16, block, batch, reps).map_err(tensor)
        }),
    }
}

/// Refuses a block whose pieces would not fit this machine's memory in f32, before anything is
/// allocated (a host allocation that fails aborts the process; a GPU's reports an error). The
/// estimate is the whole block's, the largest piece: the composed attention's scores,
/// probabilities and their gradients (4 · b·h·t² floats), the MLP's hidden activations and
/// gradients (12 · b·t·mlp), and the rest with the pieces' inputs (24 · b·t·dim).
fn fits_in_memory(block: &EncoderBlock, batch: usize) -> std::result::Result<(), EngineError> {
    let (b, t) = (batch as f64, block.tokens as f64);
    let d = block.dims;
    let floats = 4.0 * b * d.heads as f64 * t * t
        + 12.0 * b * t * d.mlp as f64
        + 24.0 * b * t * d.dim as f64;
    let need_gib = 4.0 * floats / (1u64 << 30) as f64;
    let have_gib = super::machine::read_mem_total_gib()?;
    if need_gib > have_gib {
        return Err(EngineError::BadSetting {
            setting: "--batch".into(),
            message: format!(
                "this block at batch {batch} needs about {need_gib:.0} GiB on the CPU, and this \
                 machine has {have_gib:.0} GiB: lower --batch or --size"
            ),
        });
    }
    Ok(())
}

/// `f` with a candle device on every SM of CUDA device `ordinal`.
#[cfg(all(feature = "cuda", mosaic_gpu))]
pub(super) fn on_gpu<T>(
    ordinal: usize,
    f: impl FnOnce(&Device) -> std::result::Result<T, EngineError>,
) -> std::result::Result<T, EngineError> {
    use crate::runtime::slot::cuda::{Binding, GpuDevice};
    crate::kernels::KERNELS.check()?;
    let gpu = GpuDevice::open(ordinal)?;
    let slot = gpu.create_slot("block", 1.0)?;
    // SAFETY: the device and every tensor on it are dropped inside `f`, before the slot, on
    // this thread.
    let dev = unsafe { slot.candle_device(Binding::Primary)? };
    f(&dev)
}

/// The error of a build without GPU compute.
#[cfg(not(all(feature = "cuda", mosaic_gpu)))]
pub(super) fn on_gpu<T>(
    ordinal: usize,
    _f: impl FnOnce(&Device) -> std::result::Result<T, EngineError>,
) -> std::result::Result<T, EngineError> {
    Err(crate::runtime::on_gpu::needs_gpu_build(&format!(
        "timing a block on CUDA device {ordinal}"
    )))
}

/// A piece: its name, the flop of its forward products, and its forward pass.
type Piece<'a> = (&'static str, f64, Box<dyn Fn() -> Result<Tensor> + 'a>);

fn time_pieces(
    dev: &Device,
    dtype: DType,
    block: &EncoderBlock,
    batch: usize,
    reps: usize,
) -> Result<Vec<PieceTime>> {
    let EncoderBlock {
        dims,
        tokens,
        causal,
    } = *block;
    let (dim, heads, mlp) = (dims.dim, dims.heads, dims.mlp);
    let hd = dim / heads;
    let mut pb = ParamBuilder::new(SplitMix64::new(1), dev).computing_in(dtype);
    let ln = LayerNorm::new(&mut pb, "ln", dim)?;
    let qkv = Linear::new(&mut pb, "qkv", dim, 3 * dim)?;
    let out = Linear::new(&mut pb, "out", dim, dim)?;
    let fc1 = Linear::new(&mut pb, "fc1", dim, mlp)?;
    let fc2 = Linear::new(&mut pb, "fc2", mlp, dim)?;
    let whole = Block::new(&mut pb, "block", dims, causal)?;
    let params = pb.finish();

    let mut seed = 10;
    let mut var = |shape: &[usize], std: f64, dtype: DType| -> Result<Var> {
        seed += 1;
        let n = shape.iter().product();
        let x = Tensor::from_vec(SplitMix64::new(seed).normals(n, std), shape, dev)?;
        Var::from_tensor(&x.to_dtype(dtype)?)
    };
    let x = var(&[batch, tokens, dim], 1.0, DType::F32)?;
    let normed = var(&[batch, tokens, dim], 1.0, dtype)?; // a norm's output, as products read it
    let y = var(&[batch, tokens, dim], 1.0, dtype)?;
    let heads_shape = [batch, heads, tokens, hd];
    let q = var(&heads_shape, (hd as f64).powf(-0.5), dtype)?;
    let (k, v) = (
        var(&heads_shape, 1.0, dtype)?,
        var(&heads_shape, 1.0, dtype)?,
    );
    let stacked = var(&[batch, tokens, 3, heads, hd], 1.0, dtype)?; // q, k, v as the kernels take them
    let qkv_bias = var(&[3 * dim], 1.0, DType::F32)?;
    let mask = causal
        .then(|| causal_mask(tokens, dtype, dev))
        .transpose()?;

    let rows = (batch * tokens) as f64;
    let (dim_f, mlp_f) = (dim as f64, mlp as f64);
    let attention_flop = 4.0 * (batch * heads * tokens * tokens * hd) as f64;
    let projections_flop = 2.0 * rows * dim_f * 4.0 * dim_f;
    let mlp_flop = 4.0 * rows * dim_f * mlp_f;
    // Fused attention adds the projection's bias itself: the projection is then its product.
    let fused = flash::attention(&stacked, &qkv_bias, causal)?.is_some();
    let mut pieces: Vec<Piece> = vec![
        ("layer norm", 0.0, Box::new(|| ln.forward_in(&x, dtype))),
        (
            "qkv projection",
            2.0 * rows * dim_f * 3.0 * dim_f,
            Box::new(|| match fused {
                true => qkv.product(&normed).map(|(product, _)| product),
                false => qkv.forward_in_compute(&normed),
            }),
        ),
    ];
    if fused {
        pieces.push((
            "attention, fused",
            // Causal, the kernels skip the tiles above the diagonal: about half the products.
            if causal {
                attention_flop / 2.0
            } else {
                attention_flop
            },
            Box::new(|| {
                flash::attention(&stacked, &qkv_bias, causal)?
                    .ok_or_else(|| candle_core::Error::Msg("the fused kernels did not run".into()))
            }),
        ));
    }
    pieces.extend([
        (
            "attention, composed",
            attention_flop,
            Box::new(|| composed_attention(&q, &k, &v, &[mask.as_ref()])) as Box<dyn Fn() -> _>,
        ),
        (
            "output projection",
            2.0 * rows * dim_f * dim_f,
            Box::new(|| out.forward_residual(&y, &x)),
        ),
        (
            "MLP",
            mlp_flop,
            Box::new(|| fc2.forward_residual(&fc1.forward_gelu(&normed)?, &x)),
        ),
        (
            "block",
            projections_flop + attention_flop + mlp_flop,
            Box::new(|| whole.forward(&x)),
        ),
    ]);
    pieces
        .into_iter()
        .map(|(piece, flop, forward)| {
            let (forward_ms, step_ms) = time(dev, &forward, reps)?;
            let tape_bytes = super::bytes::tape_bytes(&forward()?, &params);
            Ok(PieceTime {
                piece,
                forward_ms,
                step_ms,
                flop,
                tape_bytes,
            })
        })
        .collect()
}

/// Median forward and forward + backward times of `forward`, ms, over `reps` runs after one.
/// The backward pass is seeded with ones ([`grad_op::backward_from`], as the trainer seeds a
/// module's): from `Σ y` it would begin with candle's reduction of the whole output, which runs
/// in one block of threads (its CUDA `fast_sum` launches a block per output element), on one SM.
fn time(dev: &Device, forward: &dyn Fn() -> Result<Tensor>, reps: usize) -> Result<(f64, f64)> {
    let (mut forwards, mut steps) = (Vec::new(), Vec::new());
    let mut ones: Option<Tensor> = None; // made in the warm-up run, which is not counted
    for run in 0..=reps {
        dev.synchronize()?;
        let start = Instant::now();
        let y = forward()?;
        dev.synchronize()?;
        let forward_ms = start.elapsed().as_secs_f64() * 1e3;
        let seed = match &ones {
            Some(g) => g.clone(),
            None => ones.insert(y.ones_like()?).clone(),
        };
        let grads = grad_op::backward_from(&y, &seed)?;
        dev.synchronize()?;
        let step_ms = start.elapsed().as_secs_f64() * 1e3;
        drop((y, grads));
        if run > 0 {
            forwards.push(forward_ms);
            steps.push(step_ms);
        }
    }
    let mid = |xs: &[f64]| median(xs).unwrap_or(f64::NAN);
    Ok((mid(&forwards), mid(&steps)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_piece_of_a_small_block_is_timed_and_the_products_counted() {
        let text = crate::models::zoo::encoder_block("clip", "text", 0.05).unwrap();
        let rows = time_block(&text, 2, Compute::Cpu, 1).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.piece).collect();
        assert_eq!(
            names,
            [
                "layer norm",
                "qkv projection",
                "attention, composed",
                "output projection",
                "MLP",
                "block"
            ],
            "no fused attention on a CPU"
        );
        for r in &rows {
            assert!(r.forward_ms > 0.0 && r.step_ms >= r.forward_ms, "{r:?}");
            assert!(r.tape_bytes > 0, "{r:?}");
        }
        // The block keeps at least what its MLP keeps, and its input.
        let input = (2 * 102 * text.dims.dim * 4) as u64;
        assert!(rows[5].tape_bytes >= rows[4].tape_bytes + input, "{rows:?}");
        assert_eq!(rows[0].tflops(), None);
        assert!(rows[1].tflops().unwrap() > 0.0);
    }
}
