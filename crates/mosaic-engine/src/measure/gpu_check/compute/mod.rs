//! The checks of the GPU build (`--cfg mosaic_gpu`): candle's ops, the engine's kernels, training
//! steps, timings and the measuring commands, on slots of the device, in order of risk.

mod adamw;
mod fused;
mod nccl;
mod ops;
mod sweeps;
mod timing;
mod training;

use super::{Checks, GpuCheck, Outcome};
use crate::measure::Pass;
use crate::runtime::slot::cuda::{Binding, Carving, GpuDevice, GpuSlot};
use crate::EngineError;
use adamw::adamw;
use fused::fused;
use nccl::nccl_bucket;
use ops::{attention, ops};
use sweeps::{colocations, sweep};
use timing::{blas_target, colocation, confinement, launch, six_slots, SIX};
use training::{resume, train, train_graphed, Bounds, BF16_BOUNDS, F32_BOUNDS};

type Res<T> = Result<T, EngineError>;

/// A candle error as a check's error.
fn tensor(e: candle_core::Error) -> EngineError {
    EngineError::tensor("check")(e)
}

/// The models trained, each one module after another and with its encoders co-located: tiny
/// ones in f32 on both devices; zoo-built ones at a small size, bf16 products on the GPU
/// against f32 on the CPU, so within bf16's tolerance.
const MODELS: [(&str, f64, Bounds); 4] = [
    ("clip-tiny", 1.0, F32_BOUNDS),
    ("omni-tiny", 1.0, F32_BOUNDS),
    ("clip", 0.05, BF16_BOUNDS),
    ("imagebind", 0.05, BF16_BOUNDS),
];

/// Every check of the GPU build, in order of risk: a kernel that faults ends the CUDA context,
/// and with it every check after it, so what has run on a GPU comes first, in the order it
/// ran there, and what was written since without one last (the attention kernels as they are
/// now, CUDA graphs of a block's step and of training, and the sweep and colocations that
/// replay them).
pub(super) fn run(device: &GpuDevice, out: &mut Checks) {
    for binding in Binding::ALL {
        let name = format!("candle ops ({})", binding.name());
        out.push(outcome(&name, || ops(device, binding)));
    }
    out.push(outcome("SM confinement", || confinement(device, false)));
    out.push(outcome("co-location", || colocation(device, false)));
    // The bf16 ops around a block's products, each against its composed form, before the
    // models that run them: a failure there names its kernel.
    out.push(outcome("fused bf16 ops", || fused(device)));
    // Every module launched op by op; the losses are kept for the same steps with graphs.
    let mut op_by_op = Vec::new();
    for (model, size, bounds) in MODELS {
        for colocated in [false, true] {
            let mut losses = None;
            let run = || {
                train(
                    device.ordinal(),
                    (model, size, colocated),
                    bounds,
                    &mut losses,
                )
            };
            out.push(outcome(&training_row(model, size, colocated, ""), run));
            op_by_op.push(losses);
        }
    }
    out.push(outcome("fused AdamW", || adamw(device)));
    out.push(outcome("CUDA graph (a block's forward)", || {
        launch(device, Pass::Forward)
    }));
    // NCCL's start-up opens a bootstrap socket, the one step here that could wait on
    // something other than the GPU.
    out.push(outcome("NCCL bucket (one rank)", || nccl_bucket(device)));
    for how in [Carving::OneSplit, Carving::InTurn] {
        let name = format!("six slots at once ({how:?})");
        out.push(match caught(|| device.create_stage_by(&SIX, how)) {
            Ok(Ok(slots)) => outcome(&name, || six_slots(device, &slots)),
            // A stage the driver will not carve in one split is split in turn.
            Ok(Err(e)) if how == Carving::OneSplit => GpuCheck::new(
                &name,
                Outcome::Skip,
                format!("the driver refused it ({e}); stages are split in turn"),
            ),
            Ok(Err(e)) => GpuCheck::new(&name, Outcome::Fail, e.to_string()),
            Err(why) => GpuCheck::new(&name, Outcome::Fail, why),
        });
    }
    // Written since the last GPU ran: cuBLAS told a slot's SMs (as every row above was), a
    // checkpoint and its resumption on the GPU (no kernel of its own), the attention kernels
    // against composed attention, then CUDA graphs, from a loop of products to training (a
    // failed capture ends with the capture: it is not sticky).
    out.push(outcome("cuBLAS told a slot's SMs", || blas_target(device)));
    out.push(outcome("checkpoint and resume", || {
        resume(device.ordinal(), "clip-tiny", F32_BOUNDS.2)
    }));
    out.push(outcome("fused attention", || attention(device)));
    out.push(outcome("SM confinement (CUDA graph)", || {
        confinement(device, true)
    }));
    out.push(outcome("co-location (CUDA graphs)", || {
        colocation(device, true)
    }));
    out.push(outcome("CUDA graph (a block's step)", || {
        launch(device, Pass::Step)
    }));
    let mut losses = op_by_op.into_iter();
    for (model, size, bounds) in MODELS {
        for colocated in [false, true] {
            let name = training_row(model, size, colocated, ", CUDA graphs");
            let op_by_op = losses.next().flatten();
            let run = || {
                train_graphed(
                    device.ordinal(),
                    (model, size, colocated),
                    bounds,
                    op_by_op.as_deref(),
                )
            };
            out.push(match caught(run) {
                Ok(Ok(None)) => GpuCheck::new(&name, Outcome::Skip, "MOSAIC_GRAPHS=off"),
                Ok(Ok(Some((pass, figure)))) => GpuCheck::judged(&name, pass, figure),
                Ok(Err(e)) => GpuCheck::new(&name, Outcome::Fail, e.to_string()),
                Err(why) => GpuCheck::new(&name, Outcome::Fail, why),
            });
        }
    }
    let mut profile = None;
    out.push(outcome("profile sweep", || sweep(device, &mut profile)));
    out.push(outcome("measured colocations", || {
        colocations(device, profile.as_ref())
    }));
}

/// A training row's name: `train clip ×0.05 (encoders co-located{more})`.
fn training_row(model: &str, size: f64, colocated: bool, more: &str) -> String {
    format!(
        "train {model}{} ({}{more})",
        if size < 1.0 {
            format!(" ×{size}")
        } else {
            String::new()
        },
        if colocated {
            "encoders co-located"
        } else {
            "one after another"
        }
    )
}

/// Runs one check; a panic inside it (candle and cudarc panic on some CUDA failures) fails
/// that check only, so the checks after it still run.
fn outcome(name: &str, check: impl FnOnce() -> Res<(bool, String)>) -> GpuCheck {
    match caught(check) {
        Ok(Ok((pass, figure))) => GpuCheck::judged(name, pass, figure),
        Ok(Err(e)) => GpuCheck::new(name, Outcome::Fail, e.to_string()),
        Err(why) => GpuCheck::new(name, Outcome::Fail, why),
    }
}

/// `f`'s result, or what it panicked with.
fn caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        let why = crate::error::panic_text(&*panic).unwrap_or_else(|| "a panic".into());
        format!("panicked: {why}")
    })
}

/// One slot of `quota` for `module`, alone in its stage.
fn slot(device: &GpuDevice, module: &str, quota: f64) -> Res<GpuSlot> {
    device.create_slot(module, quota)
}
