//! The fused AdamW kernel against the composed update, and both timed.

use std::time::Instant;

use candle_core::Tensor;
use mosaic_kit::rng::SplitMix64;
use mosaic_kit::stats::{relative_error as rel_err, worst};

use super::{slot, tensor, Res};
use crate::models::nn::{to_f32s, ParamBuilder};
use crate::runtime::slot::cuda::{Binding, GpuDevice};

/// Parameter shapes of one CLIP ViT-L/14 vision block (width 1024, MLP 4096): the
/// attention's qkv and output projections, the MLP's two layers and two LayerNorms.
const VISION_BLOCK: [&[usize]; 12] = [
    &[3072, 1024],
    &[3072],
    &[1024, 1024],
    &[1024],
    &[4096, 1024],
    &[4096],
    &[1024, 4096],
    &[1024],
    &[1024],
    &[1024],
    &[1024],
    &[1024],
];

/// The fused AdamW kernel against the composed update on a 64-SM slot: three steps on
/// small tensors (one gradient a transposed view) must leave the same parameters and
/// moments within 1e-5; then one step of each over 24 vision blocks' parameters (302 M),
/// timed, host launch time beside the stream's.
pub(super) fn adamw(device: &GpuDevice) -> Res<(bool, String)> {
    use crate::runtime::optim::{AdamW, AdamWConfig};
    let slot = slot(device, "adamw", 0.5)?;
    // SAFETY: the device and its tensors are dropped at the end of this function, before
    // the slot, all on this thread.
    let dev = unsafe { slot.candle_device(Binding::Primary)? };
    let shapes: [&[usize]; 3] = [&[1000], &[37, 129], &[129, 37]];
    let build = |seed: u64| -> Res<_> {
        let mut pb = ParamBuilder::new(SplitMix64::new(seed), &dev);
        for (i, shape) in shapes.iter().enumerate() {
            pb.normal(&format!("p{i}"), shape, 1.0).map_err(tensor)?;
        }
        Ok(pb.finish())
    };
    let (fused_params, composed_params) = (build(11)?, build(11)?);
    let config = AdamWConfig::default();
    let mut fused = AdamW::new(&fused_params, config).map_err(tensor)?;
    let mut composed = AdamW::new(&composed_params, config).map_err(tensor)?;
    let mut rng = SplitMix64::new(12);
    for _ in 0..3 {
        let grads = shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| {
                let n = shape.iter().product();
                let g = Tensor::from_vec(rng.normals(n, 1.0), shape.to_vec(), &dev)?;
                // The last gradient as a transposed view, as a Linear weight's arrives.
                if i == 2 {
                    let t: Vec<usize> = shape.iter().rev().copied().collect();
                    Tensor::from_vec(rng.normals(n, 1.0), t, &dev)?.t()
                } else {
                    Ok(g)
                }
            })
            .collect::<candle_core::Result<Vec<_>>>()
            .map_err(tensor)?;
        fused.step_fused(&fused_params, &grads).map_err(tensor)?;
        composed
            .step_composed(&composed_params, &grads)
            .map_err(tensor)?;
    }
    let mut err = 0f32;
    for (i, ((_, a), (_, b))) in fused_params.iter().zip(composed_params.iter()).enumerate() {
        let pairs = [
            (a.as_tensor(), b.as_tensor()),
            (&fused.m[i], &composed.m[i]),
            (&fused.v[i], &composed.v[i]),
        ];
        for (x, y) in pairs {
            let e = rel_err(&to_f32s(x).map_err(tensor)?, &to_f32s(y).map_err(tensor)?);
            err = worst([err, e]);
        }
    }
    // One step over a vision tower's parameters, each way, timed after a warm-up step.
    let mut pb = ParamBuilder::new(SplitMix64::new(13), &dev);
    // Constants, not draws: 302 M normals would take the host seconds.
    for layer in 0..24 {
        for (i, shape) in VISION_BLOCK.iter().enumerate() {
            pb.constant(&format!("b{layer}.p{i}"), shape, 0.0)
                .map_err(tensor)?;
        }
    }
    let tower = pb.finish();
    let grads = tower
        .iter()
        .map(|(_, v)| v.as_tensor().ones_like())
        .collect::<candle_core::Result<Vec<_>>>()
        .map_err(tensor)?;
    let mut opt = AdamW::new(&tower, config).map_err(tensor)?;
    let mut time = |fused: bool| -> Res<(f64, f64)> {
        let step = |opt: &mut AdamW| {
            if fused {
                opt.step_fused(&tower, &grads)
            } else {
                opt.step_composed(&tower, &grads)
            }
        };
        step(&mut opt).map_err(tensor)?;
        dev.synchronize().map_err(tensor)?;
        let began = Instant::now();
        step(&mut opt).map_err(tensor)?;
        let host = began.elapsed().as_secs_f64() * 1e3;
        dev.synchronize().map_err(tensor)?;
        Ok((host, began.elapsed().as_secs_f64() * 1e3))
    };
    let (fused_host, fused_ms) = time(true)?;
    let (composed_host, composed_ms) = time(false)?;
    Ok((
        err < 1e-5,
        format!(
            "{} SMs: 3 steps max rel err {err:.1e} (bound 1e-5); {} tensors, {:.0} M \
             parameters: fused {fused_ms:.2} ms ({fused_host:.2} ms host), composed \
             {composed_ms:.2} ms ({composed_host:.2} ms host): {:.1}×",
            slot.sms(),
            tower.len(),
            tower.count() as f64 / 1e6,
            composed_ms / fused_ms
        ),
    ))
}
