//! `mosaic check gpu`: every GPU path of the engine, run on the GPU present, each ending in
//! pass or fail with the figure it rests on — what a session lent a GPU runs first, since the
//! GPU code is written without one. A path this build lacks is skipped, saying why.
//!
//! In order: the driver; green-context slots (SMs granted as asked, work on each stream); NVML
//! (the device found, its memory, bandwidth and busy fractions read);
//! then, in the GPU build only (`--cfg mosaic_gpu`, `scripts/cuda-cargo`), by risk, since a
//! kernel that faults ends the context and every check after it, what has run on a GPU first:
//! candle's ops on a slot against the CPU through either [`Binding`](crate::runtime::slot::cuda)
//! (a transformer block's forward and backward in f32, a matmul in bf16); SM confinement by
//! timing (the same bf16 matmuls on 16 SMs and on 128); co-location (two 64-SM slots launched
//! from two threads at once against each alone); the bf16 ops around a block's products (a norm
//! writing bf16, a bias into the residual stream, a bias under GELU) against candle ops
//! composing them; one training step of every engine model on the GPU against the CPU (loss
//! and every gradient), modules one after another and the encoders co-located, and ten steps,
//! launched op by op, whose loss must fall; the fused AdamW kernel against the composed update
//! and its time on CLIP ViT-L's vision tower; a block's forward pass replayed from a CUDA graph
//! against launched op by op (`measure::launch_cost`); a gradient bucket summed by a one-rank
//! NCCL communicator; ImageBind's six-way stage carved each way (`Carving`), its six slots
//! running products at once. Then what was written since without a GPU: the fused attention
//! kernels against composed attention, both timed (`models::flash::check`); SM confinement of
//! products replayed from a CUDA graph; a block's forward and backward passes replayed from a
//! graph (the fused attention's backward inside it); the training steps again with
//! launch-bound modules replayed from graphs, against their losses op by op; and a small GPU
//! profile sweep and colocations (`mosaic measure profile|colocations --device cuda`), whose
//! launch-bound points replay graphs. The block and the training steps run through the
//! engine's LayerNorm, GELU and bias kernels (`kernels/elementwise.cu`).

use serde::Serialize;

use crate::runtime::slot::cuda::driver_unavailable;

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// It ran and met its bound.
    Pass,
    /// It ran and missed its bound, or failed.
    Fail,
    /// It could not run here (the figure says why).
    Skip,
}

/// One check: what was checked, how it ended and the figure behind it.
#[derive(Debug, Clone, Serialize)]
pub struct GpuCheck {
    /// What was checked.
    pub name: String,
    /// How it ended.
    pub outcome: Outcome,
    /// The measured figure, the error, or why it was skipped.
    pub figure: String,
}

impl GpuCheck {
    fn new(name: &str, outcome: Outcome, figure: impl Into<String>) -> GpuCheck {
        GpuCheck {
            name: name.to_string(),
            outcome,
            figure: figure.into(),
        }
    }

    /// Pass when `pass`, else fail.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn judged(name: &str, pass: bool, figure: impl Into<String>) -> GpuCheck {
        let outcome = if pass { Outcome::Pass } else { Outcome::Fail };
        GpuCheck::new(name, outcome, figure)
    }
}

/// The checks so far, each handed to a callback as it ends (so that a check that hangs still
/// leaves the rows before it on screen).
struct Checks<'a> {
    done: Vec<GpuCheck>,
    each: &'a mut dyn FnMut(&GpuCheck),
}

impl Checks<'_> {
    fn push(&mut self, check: GpuCheck) {
        (self.each)(&check);
        self.done.push(check);
    }
}

/// Every check on CUDA device `ordinal`, in order; `each` sees every check as it ends.
pub fn check_gpu(ordinal: usize, each: &mut dyn FnMut(&GpuCheck)) -> Vec<GpuCheck> {
    let mut out = Checks {
        done: Vec::new(),
        each,
    };
    if let Some(why) = driver_unavailable() {
        out.push(GpuCheck::new("driver", Outcome::Skip, why));
        return out.done;
    }
    #[cfg(feature = "cuda")]
    driver::run(ordinal, &mut out);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        out.push(GpuCheck::new(
            "driver",
            Outcome::Skip,
            "built without the `cuda` feature",
        ));
    }
    out.done
}

#[cfg(all(feature = "cuda", mosaic_gpu))]
mod compute;
#[cfg(feature = "cuda")]
mod driver;
