//! NCCL on the slot's device: a gradient bucket summed by a one-rank communicator.

use std::time::Instant;

use candle_core::Tensor;

use super::{slot, tensor, Res};
use crate::runtime::slot::cuda::{Binding, GpuDevice};
use crate::EngineError;

/// A gradient bucket summed by NCCL where it lies, on a half-GPU slot
/// ([`crate::runtime::collective::device_sum`], what `--collective nccl` does on GPUs):
/// with one rank the sum is the bucket, and the slot's next op must see it. NCCL across
/// GPUs needs two.
pub(super) fn nccl_bucket(device: &GpuDevice) -> Res<(bool, String)> {
    use crate::runtime::collective::device_sum::sum_on_device;
    use cudarc::driver::CudaContext;
    use cudarc::nccl::{Comm, Id};
    let nccl = |message: String| EngineError::Collective {
        collective: "nccl",
        message,
    };
    let ctx = CudaContext::new(device.ordinal())
        .map_err(|e| nccl(format!("opening the primary context: {e}")))?;
    let stream = (ctx.new_stream()).map_err(|e| nccl(format!("creating a stream: {e}")))?;
    let id = Id::new().map_err(|e| nccl(format!("ncclGetUniqueId: {:?}", e.0)))?;
    let comm = (Comm::from_rank(stream, 0, 1, id))
        .map_err(|e| nccl(format!("ncclCommInitRank (one rank): {:?}", e.0)))?;
    let slot = slot(device, "nccl", 0.5)?;
    // SAFETY: the device and its tensors are dropped at the end of this function, before
    // the slot, all on this thread.
    let dev = unsafe { slot.candle_device(Binding::Primary)? };
    // Whole numbers below 2²⁴: exact in f32, doubled too.
    let n = 1usize << 22;
    let bucket = Tensor::arange(0f32, n as f32, &dev).map_err(tensor)?;
    dev.synchronize().map_err(tensor)?;
    let start = Instant::now();
    let doubled = (sum_on_device(&comm, &bucket).map_err(tensor)? * 2.0).map_err(tensor)?;
    dev.synchronize().map_err(tensor)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let got = doubled.to_vec1::<f32>().map_err(tensor)?;
    let wrong = (got.iter().enumerate())
        .filter(|&(i, &v)| v != 2.0 * i as f32)
        .count();
    Ok((
        wrong == 0,
        format!(
            "{n} floats on {} SMs: summed and doubled in {ms:.2} ms, {wrong} wrong; across \
             GPUs needs two",
            slot.sms()
        ),
    ))
}
