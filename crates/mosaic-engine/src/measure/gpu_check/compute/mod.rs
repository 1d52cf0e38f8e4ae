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
use crate::runtime::slot::cuda::{Binding, Carving, GpuDevice, GpuSlot};
use crate::EngineError;
use adamw::adamw;
use fused::fused;
use nccl::nccl_bucket;
use ops::{attention, ops};
use sweeps::{colocations, sweep};
use timing::{colocation, confinement, launch, six_slots, SIX};
use training::{train, BF16_BOUNDS, F32_BOUNDS};

type Res<T> = Result<T, EngineError>;

/// A candle error as a check's error.
fn tensor(e: candle_core::Error) -> EngineError {
    EngineError::tensor("check")(e)
}

/// Every check of the GPU build, in order of risk: a kernel that faults ends the CUDA context,
/// and with it every check after it, so the rows that need only candle and cuBLAS come first
/// and the engine's newest kernels and the stages known to fail last.
pub(super) fn run(device: &GpuDevice, out: &mut Checks) {
    for binding in Binding::ALL {
        let name = format!("candle ops ({})", binding.name());
        out.push(outcome(&name, || ops(device, binding)));
    }
    out.push(outcome("SM confinement", || confinement(device, false)));
    out.push(outcome("SM confinement (CUDA graph)", || {
        confinement(device, true)
    }));
    out.push(outcome("co-location", || colocation(device)));
    // The bf16 ops around a block's products and the fused attention, each against its
    // composed form, before the models that run them: a failure there names its kernel (one
    // that faults ends the context, and every row after it fails with the fault).
    out.push(outcome("fused bf16 ops", || fused(device)));
    out.push(outcome("fused attention", || attention(device)));
    // Tiny models in f32 on both devices; zoo-built ones at a small size, bf16 products
    // on the GPU against f32 on the CPU, so within bf16's tolerance.
    let models = [
        ("clip-tiny", 1.0, F32_BOUNDS),
        ("omni-tiny", 1.0, F32_BOUNDS),
        ("clip", 0.05, BF16_BOUNDS),
        ("imagebind", 0.05, BF16_BOUNDS),
    ];
    for (model, size, bounds) in models {
        for colocated in [false, true] {
            let name = format!(
                "train {model}{} ({})",
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
            );
            let run = || train(device.ordinal(), model, size, colocated, bounds);
            out.push(outcome(&name, run));
        }
    }
    out.push(outcome("fused AdamW", || adamw(device)));
    let mut profile = None;
    out.push(outcome("profile sweep", || sweep(device, &mut profile)));
    out.push(outcome("measured colocations", || {
        colocations(device, profile.as_ref())
    }));
    // A failed capture ends with the capture (it is not sticky).
    out.push(outcome("CUDA graph (a block's forward)", || launch(device)));
    // NCCL's start-up opens a bootstrap socket, the one step here that could wait on
    // something other than the GPU: before the six-way stages all the same, since the stage
    // split in turn failed in cuBLAS on the H200, perhaps ending the context.
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
