//! A value computed off candle's autograd tape, given a backward pass of our own: the pattern
//! behind the fused softmax ([`super::nn::softmax`]) and block recomputation
//! ([`super::recompute`]). candle's fast kernels that have no backward pass
//! (`softmax_last_dim`) and computations whose tape must not be kept become one node of the
//! tape with a gradient we write.
//!
//! [`with_backward`] takes `x`, the value `y` computed from it without a tape, and the
//! backward pass; the result has `y`'s values and, as a custom op of `x` ([`CustomOp1`]), calls
//! the backward pass with `x`, itself and its gradient. The op hands `y`'s storage over once
//! (a copy: candle's custom ops return new storage), so it keeps no second copy of `y`.

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, CustomOp1, Layout, Result, Shape, Storage, Tensor};

/// A backward pass: `(x, y, ∂loss/∂y) ↦ ∂loss/∂x`.
pub type Backward = Box<dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Option<Tensor>> + Send + Sync>;

/// `y` (computed from `x` off the tape) as a node of `x`'s tape whose gradient is `backward`'s.
pub fn with_backward(
    x: &Tensor,
    y: Tensor,
    name: &'static str,
    backward: Backward,
) -> Result<Tensor> {
    x.apply_op1(GradOp {
        name,
        output: Mutex::new(Some(y.detach())),
        backward,
    })
}

struct GradOp {
    name: &'static str,
    output: Mutex<Option<Tensor>>,
    backward: Backward,
}

impl GradOp {
    /// The precomputed output's storage (taken: the op keeps no copy) and shape.
    fn output(&self) -> Result<(Storage, Shape)> {
        let y = (self.output.lock().expect("output lock").take())
            .ok_or_else(|| candle_core::Error::Msg(format!("{} ran forward twice", self.name)))?;
        let y = if y.is_contiguous() && y.layout().start_offset() == 0 {
            y
        } else {
            y.copy()?
        };
        let (storage, layout) = y.storage_and_layout();
        let storage = match &*storage {
            Storage::Cpu(s) => Storage::Cpu(s.try_clone(layout)?),
            Storage::Cuda(s) => Storage::Cuda(s.try_clone(layout)?),
            Storage::Metal(_) => candle_core::bail!("{} runs on the CPU and CUDA", self.name),
        };
        Ok((storage, y.shape().clone()))
    }
}

impl CustomOp1 for GradOp {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(&self, _x: &CpuStorage, _layout: &Layout) -> Result<(CpuStorage, Shape)> {
        match self.output()? {
            (Storage::Cpu(s), shape) => Ok((s, shape)),
            _ => candle_core::bail!("{}: the output is not on the input's device", self.name),
        }
    }

    fn cuda_fwd(&self, _x: &CudaStorage, _layout: &Layout) -> Result<(CudaStorage, Shape)> {
        match self.output()? {
            (Storage::Cuda(s), shape) => Ok((s, shape)),
            _ => candle_core::bail!("{}: the output is not on the input's device", self.name),
        }
    }

    fn bwd(&self, x: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        (self.backward)(x, y, grad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn the_result_has_the_values_and_the_gradient_given() {
        let x = Var::new(&[1f32, 2.0, 3.0], &Device::Cpu).unwrap();
        // y = x² off the tape, with its true gradient 2x·g.
        let y = x.as_tensor().detach().sqr().unwrap();
        let backward: Backward = Box::new(|x, _y, g| Ok(Some((x * 2.0)?.mul(g)?)));
        let z = with_backward(x.as_tensor(), y, "square", backward).unwrap();
        assert_eq!(z.to_vec1::<f32>().unwrap(), [1.0, 4.0, 9.0]);
        let grads = z.sum_all().unwrap().backward().unwrap();
        let g = grads.get(x.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(g, [2.0, 4.0, 6.0]);
    }
}
