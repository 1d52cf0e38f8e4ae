//! A gradient bucket summed by NCCL where it lies, in a slot's GPU memory (the GPU build).

use candle_core::Tensor;
use cudarc::nccl::{Comm, ReduceOp};

/// `bucket` (f32, contiguous, on a slot's CUDA device) summed over `comm`'s ranks in GPU
/// memory: NCCL's all-reduce on the communicator's stream, after the work queued on the
/// bucket's stream (the backward pass that wrote the gradients), and before the work queued
/// there next (the optimizer that reads the sum; the bucket's free). A new tensor on the
/// bucket's device. NCCL's kernels run on the communicator's stream of the primary context,
/// so on any SM, not only the slot's.
pub(crate) fn sum_on_device(comm: &Comm, bucket: &Tensor) -> candle_core::Result<Tensor> {
    bucket.apply_op1_no_bwd(&DeviceSum(comm))
}

/// [`sum_on_device`] as a candle op, whose output is its own storage.
struct DeviceSum<'a>(&'a Comm);

impl candle_core::CustomOp1 for DeviceSum<'_> {
    fn name(&self) -> &'static str {
        "nccl_all_reduce"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        candle_core::bail!("the NCCL all-reduce sums buckets on a GPU only")
    }

    fn cuda_fwd(
        &self,
        bucket: &candle_core::CudaStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
        use candle_core::backend::BackendStorage;
        use candle_core::cuda_backend::WrapErr;
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("a gradient bucket is contiguous, this one is not")
        };
        let dev = bucket.device().clone();
        let (slot, comm) = (dev.cuda_stream(), self.0.stream());
        let (here, there) = (slot.context().ordinal(), comm.context().ordinal());
        if here != there {
            candle_core::bail!(
                "the gradients are on CUDA device {here} and this rank's NCCL communicator on \
                 device {there}, where both are the rank's index on its machine"
            )
        }
        let send = bucket.as_cuda_slice::<f32>()?.slice(start..end);
        // SAFETY: the all-reduce writes every element before anything reads it.
        let mut sum = unsafe { dev.alloc::<f32>(end - start) }?;
        // Slots track no events, so the streams are ordered here. Before NCCL: the slot's
        // queued work (the backward pass, the bucket, the allocation) finished, waited for on
        // the host, since an event of the primary context may not be recordable on a green
        // context's stream. After: the slot's stream waits for the communicator's (an event
        // may be waited for across contexts), and the optimizer and both frees follow it.
        slot.synchronize().w()?;
        let summed = (self.0.all_reduce(&send, &mut sum, &ReduceOp::Sum))
            .map_err(|e| format!("ncclAllReduce: {:?}", e.0))
            .and_then(|_| {
                slot.join(&comm)
                    .map_err(|e| format!("ordering the slot after NCCL: {e}"))
            });
        if let Err(why) = summed {
            // Nothing may be freed while NCCL could still use it.
            comm.synchronize().w()?;
            candle_core::bail!("{why}")
        }
        let sum = candle_core::CudaStorage::wrap_cuda_slice(sum, dev);
        Ok((sum, layout.shape().clone()))
    }
}
