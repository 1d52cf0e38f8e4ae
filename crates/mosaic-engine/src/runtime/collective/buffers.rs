//! Tensors as the flat `f32` buffers collectives move: several tensors packed one after the
//! other (a module's gradient bucket), and one tensor with its shape (a row shard).

use candle_core::Tensor;

use crate::error::EngineError;
use crate::models::nn::to_f32s;

/// The tensors' values, one after the other.
pub(crate) fn flatten(tensors: &[Tensor]) -> candle_core::Result<Vec<f32>> {
    let mut out = Vec::with_capacity(tensors.iter().map(|t| t.elem_count()).sum());
    for t in tensors {
        out.extend(to_f32s(t)?);
    }
    Ok(out)
}

/// [`flatten`] undone: tensors shaped like `like`, from `values`.
pub(crate) fn unflatten(values: &[f32], like: &[Tensor]) -> candle_core::Result<Vec<Tensor>> {
    let mut at = 0;
    like.iter()
        .map(|t| {
            let n = t.elem_count();
            at += n;
            Tensor::from_slice(&values[at - n..at], t.shape(), t.device())
        })
        .collect()
}

/// A tensor as `[rank, dims…, values…]` (f32 holds dimensions exactly below 2²⁴), or nothing.
pub(crate) fn encode(t: Option<&Tensor>, module: &str) -> Result<Vec<f32>, EngineError> {
    let Some(t) = t else {
        return Ok(Vec::new());
    };
    let mut out = vec![t.rank() as f32];
    out.extend(t.dims().iter().map(|&d| d as f32));
    out.extend(to_f32s(t).map_err(EngineError::tensor(module))?);
    Ok(out)
}

/// [`encode`] undone: the dimensions and the values, `None` for nothing.
pub(crate) fn decode(chunk: &[f32]) -> Option<(Vec<usize>, &[f32])> {
    let (&rank, rest) = chunk.split_first()?;
    let rank = rank as usize;
    let dims = rest[..rank].iter().map(|&d| d as usize).collect();
    Some((dims, &rest[rank..]))
}
