//! Fused attention on a GPU: FlashAttention-2 (Dao, ICLR 2024) in kernels of ours
//! (`kernels/attention.cu`, bf16 tensor cores), forward and backward, so that attention's
//! `tokens²` scores never reach device memory nor the autograd tape. [`attention`] is what
//! [`super::nn::Attention`] calls; where it answers `None` (a CPU, f32 products, a head
//! dimension the kernels lack, the GPU-less build) the layer composes attention of candle ops,
//! the reference the kernels are checked against (on a CPU under `kernels/emulated/`, on a GPU by
//! `mosaic check gpu`).

use candle_core::{Result, Tensor};

/// `softmax(q kᵀ + causal mask) · v` of `q`, `k`, `v` (`[batch, heads, tokens, head dim]`, q
/// already scaled by 1/√(head dim)) as one node of their tape, computed by the fused kernels:
/// `None` where they cannot run it (see the module's doc), and then the caller composes it.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> Result<Option<Tensor>> {
    #[cfg(mosaic_gpu)]
    if cuda::runs(q) {
        return cuda::attention(q, k, v, causal).map(Some);
    }
    let _ = (q, k, v, causal);
    Ok(None)
}

#[cfg(mosaic_gpu)]
pub(crate) mod check;
#[cfg(mosaic_gpu)]
pub(crate) mod cuda;
