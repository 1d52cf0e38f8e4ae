//! Tensors as collectives move them: several tensors packed one after the other into one flat
//! f32 tensor on their device (a module's gradient bucket), and one tensor with its shape as a
//! flat host buffer (a row shard).

use candle_core::{DType, Tensor};

use crate::error::EngineError;
use crate::models::nn::to_f32s;

/// The tensors' values, one after the other, as one flat f32 tensor on their device (on a
/// GPU it stays there: one all-reduce of it sums them all).
pub(crate) fn bucket(tensors: &[Tensor]) -> candle_core::Result<Tensor> {
    let flat = tensors
        .iter()
        .map(|t| t.to_dtype(DType::F32)?.flatten_all())
        .collect::<candle_core::Result<Vec<_>>>()?;
    Tensor::cat(&flat, 0)
}

/// [`bucket`] undone: tensors shaped like `like`, cut from `bucket` (views of it).
pub(crate) fn unbucket(bucket: &Tensor, like: &[Tensor]) -> candle_core::Result<Vec<Tensor>> {
    let mut at = 0;
    like.iter()
        .map(|t| {
            let n = t.elem_count();
            at += n;
            bucket.narrow(0, at - n, n)?.reshape(t.shape())
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn a_bucket_holds_its_tensors_in_order_and_gives_them_back() {
        let dev = Device::Cpu;
        let a = Tensor::arange(0f32, 6.0, &dev)
            .unwrap()
            .reshape((2, 3))
            .unwrap();
        let b = Tensor::new(&[7f32], &dev).unwrap();
        let c = Tensor::arange(10f32, 14.0, &dev)
            .unwrap()
            .reshape((2, 1, 2))
            .unwrap();
        let tensors = [a, b, c];
        let flat = bucket(&tensors).unwrap();
        assert_eq!(
            flat.to_vec1::<f32>().unwrap(),
            [0., 1., 2., 3., 4., 5., 7., 10., 11., 12., 13.]
        );
        let back = unbucket(&flat, &tensors).unwrap();
        for (x, y) in back.iter().zip(&tensors) {
            assert_eq!(x.dims(), y.dims());
            assert_eq!(to_f32s(x).unwrap(), to_f32s(y).unwrap());
        }
    }

    #[test]
    fn a_shape_survives_encoding() {
        let t = Tensor::arange(0f32, 6.0, &Device::Cpu)
            .unwrap()
            .reshape((3, 2))
            .unwrap();
        let chunk = encode(Some(&t), "m").unwrap();
        let (dims, values) = decode(&chunk).unwrap();
        assert_eq!((dims, values), (vec![3, 2], &[0., 1., 2., 3., 4., 5.][..]));
        assert!(encode(None, "m").unwrap().is_empty() && decode(&[]).is_none());
    }
}
