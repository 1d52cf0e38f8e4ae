//! What launching costs a block (issue 11, item 2): a zoo encoder block's forward pass, or
//! its whole step (forward, and backward from Σ y), on a whole GPU, launched op by op as the
//! trainer does, against the same pass captured once as a CUDA graph and replayed, so that the
//! host launches nothing but the graph. The gap is the launch cost that capturing a module's
//! step would take off its critical path.
//!
//! candle uploads the shape of every non-contiguous operand from the host, which stream
//! capture refuses; under `CudaDevice::enable_cuda_graph_htod_cache` (candle 0.11.1) a
//! warm-up pass leaves those uploads on the device and the captured pass reads them there.
//! The passes launched op by op are timed without it, as the trainer runs.
//! Allocations made while capturing become the graph's own memory nodes
//! ([`crate::runtime::graphed`]), so the captured result keeps its address and holds each
//! replay's values.

use serde::Serialize;

use crate::error::EngineError;
use crate::models::zoo::EncoderBlock;

/// Which pass of a block is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    /// The forward pass; its output is checked.
    Forward,
    /// The forward pass and the backward pass from Σ y; the first parameter's gradient is
    /// checked.
    Step,
}

impl Pass {
    /// What the pass is, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Pass::Forward => "forward",
            Pass::Step => "forward + backward",
        }
    }
}

/// A block's pass launched op by op and replayed from a CUDA graph.
#[derive(Debug, Clone, Serialize)]
pub struct LaunchCost {
    /// The pass.
    pub pass: Pass,
    /// Median pass launched op by op, from a synchronised device to a synchronised device, ms.
    pub eager_ms: f64,
    /// Of it, the host's time until the last op was launched, ms.
    pub eager_host_ms: f64,
    /// Median replay of the captured pass, from a synchronised device to a synchronised
    /// device, ms.
    pub graph_ms: f64,
    /// Nodes of the graph (kernels, copies, memory allocations and frees): the launches one
    /// replay stands for.
    pub nodes: usize,
    /// Largest difference between the last replay's result and the same pass launched op by
    /// op, relative to the result's largest magnitude.
    pub replay_error: f32,
}

impl LaunchCost {
    /// The time launching op by op adds to the pass, ms.
    pub fn launch_ms(&self) -> f64 {
        self.eager_ms - self.graph_ms
    }
}

/// [`LaunchCost`] of `block`'s `pass` at per-GPU batch `batch` in bf16 on every SM of CUDA
/// device `ordinal`, medians of `reps` runs after one.
pub fn launch_cost(
    block: &EncoderBlock,
    batch: usize,
    pass: Pass,
    ordinal: usize,
    reps: usize,
) -> Result<LaunchCost, EngineError> {
    super::block::on_gpu(ordinal, |dev| {
        on_device::measure(dev, block, batch, pass, reps)
            .map_err(EngineError::tensor("bench block"))
    })
}

#[cfg(all(feature = "cuda", mosaic_gpu))]
mod on_device {
    use std::time::Instant;

    use candle_core::backend::BackendDevice;
    use candle_core::{bail, CudaDevice, DType, Device, Error, Result, Tensor};
    use mosaic_kit::rng::SplitMix64;
    use mosaic_kit::stats::{median, relative_error};

    use super::{LaunchCost, Pass};
    use crate::models::nn::{to_f32s, Block, ParamBuilder};
    use crate::models::zoo::EncoderBlock;
    use crate::runtime::graphed::record;

    pub(super) fn measure(
        dev: &Device,
        block: &EncoderBlock,
        batch: usize,
        pass: Pass,
        reps: usize,
    ) -> Result<LaunchCost> {
        let Device::Cuda(cuda) = dev else {
            bail!("a CUDA graph needs a CUDA device")
        };
        let mut pb = ParamBuilder::new(SplitMix64::new(1), dev).computing_in(DType::BF16);
        let whole = Block::new(&mut pb, "block", block.dims, block.causal)?;
        let params = pb.finish();
        let first = match params.iter().next() {
            Some((_, v)) => v.as_tensor().clone(),
            None => bail!("a block without parameters"),
        };
        let shape = (batch, block.tokens, block.dims.dim);
        let n = batch * block.tokens * block.dims.dim;
        let x = Tensor::from_vec(SplitMix64::new(11).normals(n, 1.0), shape, dev)?;
        let forward = || whole.forward(&x);
        // The step keeps the first parameter's gradient; the rest are freed inside the pass.
        let step = || {
            let grads = whole.forward(&x)?.sum_all()?.backward()?;
            (grads.get(&first).cloned()).ok_or_else(|| Error::Msg("no gradient".into()))
        };
        match pass {
            Pass::Forward => graphed(cuda, pass, &forward, reps),
            Pass::Step => graphed(cuda, pass, &step, reps),
        }
    }

    /// `run` launched op by op, then captured and replayed: [`LaunchCost`] of it.
    fn graphed(
        cuda: &CudaDevice,
        pass: Pass,
        run: &dyn Fn() -> Result<Tensor>,
        reps: usize,
    ) -> Result<LaunchCost> {
        // Op by op, as the trainer launches (each non-contiguous op uploading its shape); the
        // first run warms up (kernels loaded, the causal mask built and kept).
        let (eager_ms, eager_host_ms) = timed(cuda, reps, run)?;

        // One more run with the upload cache on leaves every shape on the device for the
        // capture to read; then the capture, launched once.
        let _cached = cuda.enable_cuda_graph_htod_cache();
        drop(run()?);
        let captured = record(cuda, run)?;
        let (graph_ms, _) = timed(cuda, reps, &|| captured.replay().map(drop))?;
        let nodes = captured.nodes()?;
        // The last replay's result against the pass launched op by op.
        let replayed = to_f32s(captured.last())?;
        let direct = to_f32s(&run()?)?;
        cuda.synchronize()?;
        drop(captured);
        Ok(LaunchCost {
            pass,
            eager_ms,
            eager_host_ms,
            graph_ms,
            nodes,
            replay_error: relative_error(&replayed, &direct),
        })
    }

    /// Median times of `run` over `reps` runs after one, ms: from a synchronised device to a
    /// synchronised device, and to `run`'s return (the host's part).
    fn timed<T>(cuda: &CudaDevice, reps: usize, run: &dyn Fn() -> Result<T>) -> Result<(f64, f64)> {
        let (mut whole, mut host) = (Vec::new(), Vec::new());
        for i in 0..=reps {
            cuda.synchronize()?;
            let start = Instant::now();
            let result = run()?;
            let returned = start.elapsed().as_secs_f64() * 1e3;
            cuda.synchronize()?;
            if i > 0 {
                whole.push(start.elapsed().as_secs_f64() * 1e3);
                host.push(returned);
            }
            drop(result);
        }
        let mid = |xs: &[f64]| median(xs).unwrap_or(f64::NAN);
        Ok((mid(&whole), mid(&host)))
    }
}

#[cfg(not(all(feature = "cuda", mosaic_gpu)))]
mod on_device {
    use candle_core::{Device, Result};

    use super::{LaunchCost, Pass};
    use crate::models::zoo::EncoderBlock;

    /// Never called: [`super::launch_cost`] refuses first, in a build without GPU compute.
    pub(super) fn measure(
        _: &Device,
        _: &EncoderBlock,
        _: usize,
        _: Pass,
        _: usize,
    ) -> Result<LaunchCost> {
        candle_core::bail!("CUDA graphs need the GPU build")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_build_the_launch_cost_says_how_to_make_one() {
        if cfg!(all(feature = "cuda", mosaic_gpu)) {
            return; // the GPU build opens the device instead
        }
        let block = crate::models::zoo::encoder_block("clip", "text", 0.05).unwrap();
        let e = launch_cost(&block, 2, Pass::Step, 0, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("scripts/cuda-cargo"), "{e}");
    }
}
