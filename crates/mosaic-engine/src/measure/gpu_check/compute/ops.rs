//! candle's ops on a slot against the CPU, and the fused attention kernels against composed
//! attention.

use candle_core::{DType, Device, Tensor};
use mosaic_kit::rng::SplitMix64;
use mosaic_kit::stats::{relative_error as rel_err, worst};

use super::{slot, tensor, Res};
use crate::models::nn::{to_f32s, Block, BlockDims, ParamBuilder};
use crate::runtime::slot::cuda::{Binding, GpuDevice};
use crate::EngineError;

/// The fused attention kernels against composed attention, and both timed
/// ([`crate::models::flash::check`]), on the whole GPU.
pub(super) fn attention(device: &GpuDevice) -> Res<(bool, String)> {
    let slot = slot(device, "attention", 1.0)?;
    // SAFETY: the device and its tensors are dropped at the end of this function, before
    // the slot, all on this thread.
    let dev = unsafe { slot.candle_device(Binding::Primary)? };
    crate::models::flash::check::check(&dev).map_err(tensor)
}

/// A transformer block's output and every gradient of Σy², on `dev`, from seed 7.
fn block(dev: &Device, x: &[f32], shape: (usize, usize, usize)) -> Res<Vec<Vec<f32>>> {
    let dims = BlockDims {
        dim: shape.2,
        heads: 4,
        mlp: 4 * shape.2,
        layers: 1,
    };
    let mut pb = ParamBuilder::new(SplitMix64::new(7), dev);
    let b = Block::new(&mut pb, "b", dims, true).map_err(tensor)?;
    let params = pb.finish();
    let x = Tensor::from_slice(x, shape, dev).map_err(tensor)?;
    let y = b.forward(&x).map_err(tensor)?;
    let grads = y
        .sqr()
        .and_then(|s| s.sum_all())
        .and_then(|l| l.backward())
        .map_err(tensor)?;
    let mut out = vec![to_f32s(&y).map_err(tensor)?];
    for (_, v) in params.iter() {
        let g = grads
            .get(v.as_tensor())
            .ok_or_else(|| EngineError::BadSetting {
                setting: "check".into(),
                message: "a block parameter got no gradient".into(),
            })?;
        out.push(to_f32s(g).map_err(tensor)?);
    }
    Ok(out)
}

/// candle's ops on a 64-SM slot bound by `binding` against the CPU: a causal transformer
/// block (LayerNorm, attention with softmax, GELU MLP) forward and backward in f32, and a
/// 512³ matmul in bf16 against f32.
pub(super) fn ops(device: &GpuDevice, binding: Binding) -> Res<(bool, String)> {
    let slot = slot(device, "ops", 0.5)?;
    let shape = (4, 32, 64);
    let x = SplitMix64::new(3).normals(shape.0 * shape.1 * shape.2, 1.0);
    let cpu = block(&Device::Cpu, &x, shape)?;
    let (gpu, bf16) = {
        // SAFETY: the device and its tensors are dropped at the end of this block, before
        // the slot, all on this thread.
        let dev = unsafe { slot.candle_device(binding)? };
        let gpu = block(&dev, &x, shape)?;
        let a = SplitMix64::new(5).normals(512 * 512, 1.0);
        let b = SplitMix64::new(6).normals(512 * 512, 1.0);
        let exact = {
            let a = Tensor::from_slice(&a, (512, 512), &Device::Cpu).map_err(tensor)?;
            let b = Tensor::from_slice(&b, (512, 512), &Device::Cpu).map_err(tensor)?;
            to_f32s(&a.matmul(&b).map_err(tensor)?).map_err(tensor)?
        };
        let on_gpu = (|| {
            let a = Tensor::from_slice(&a, (512, 512), &dev)?.to_dtype(DType::BF16)?;
            let b = Tensor::from_slice(&b, (512, 512), &dev)?.to_dtype(DType::BF16)?;
            to_f32s(&a.matmul(&b)?)
        })()
        .map_err(tensor)?;
        dev.synchronize().map_err(tensor)?;
        (gpu, rel_err(&on_gpu, &exact))
    };
    let f32_err = worst(cpu.iter().zip(&gpu).map(|(c, g)| rel_err(g, c)));
    Ok((
        f32_err < 1e-3 && bf16 < 2e-2,
        format!(
            "{} SMs: block fwd+bwd f32 max rel err {f32_err:.1e} (bound 1e-3), matmul bf16 \
             {bf16:.1e} (bound 2e-2)",
            slot.sms()
        ),
    ))
}
