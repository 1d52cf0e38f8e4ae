//! Fused attention on a GPU: FlashAttention-2 (Dao, ICLR 2024) in kernels of ours
//! (`kernels/attention.cu`, bf16 tensor cores), forward and backward, so that attention's
//! `tokens²` scores never reach device memory nor the autograd tape. [`attention`] is what
//! [`super::nn::Attention`] calls; where it answers `None` (a CPU, f32 products, a head
//! dimension the kernels lack, the GPU-less build) the layer composes attention of candle ops,
//! the reference the kernels are checked against (on a CPU under `kernels/emulated/`, on a GPU by
//! `mosaic check gpu`).

use candle_core::{Result, Tensor};

/// `softmax(q kᵀ/√d + causal mask) · v` of `qkv + bias` (the qkv projection's product as it
/// is, `[batch, tokens, 3, heads, d]`: each token's q, k and v, head after head; and its f32
/// bias of `3·heads·d`) as one node of both tapes, `[batch, tokens, heads, d]` (what the output
/// projection reads as it is), computed by the fused kernels: `None` where they cannot run it
/// (see the module's doc) or `MOSAIC_KERNELS=composed` turns them off, and then the caller
/// composes it. The kernels read and write these layouts in place and add the bias as they
/// load q, k and v, so no copy rearranges heads around them and no pass adds the bias, forward
/// or backward; and taking q, k and v as one tensor, the backward pass writes their gradient as
/// one (split q, k, v would each be padded back to the whole).
pub fn attention(qkv: &Tensor, bias: &Tensor, causal: bool) -> Result<Option<Tensor>> {
    #[cfg(mosaic_gpu)]
    if cuda::runs(qkv, bias) && crate::kernels::fused() {
        return cuda::attention(qkv, bias, causal).map(Some);
    }
    let _ = (qkv, bias, causal);
    Ok(None)
}

#[cfg(mosaic_gpu)]
pub(crate) mod check;
#[cfg(mosaic_gpu)]
pub(crate) mod cuda;
mod geometry;
