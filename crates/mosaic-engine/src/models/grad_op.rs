//! A value computed off candle's autograd tape, given a backward pass of our own: the pattern
//! behind the fused softmax and LayerNorm ([`super::nn`]) and block recomputation
//! ([`super::recompute`]). candle's fast kernels that have no backward pass
//! (`softmax_last_dim`, `layer_norm`) and computations whose tape must not be kept become one
//! node of the tape with a gradient we write.
//!
//! [`with_backward`] takes `x`, the value `y` computed from it without a tape, and the
//! backward pass; the result has `y`'s values and, as a custom op of `x` ([`CustomOp1`]), calls
//! the backward pass with `x`, itself and its gradient. [`with_backward3`] does the same for a
//! value of three tensors ([`CustomOp3`]). The op hands `y`'s storage over once (a copy:
//! candle's custom ops return new storage), so it keeps no second copy of `y`.

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::backprop::GradStore;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Storage, Tensor,
};

/// A backward pass: `(x, y, ∂loss/∂y) ↦ ∂loss/∂x`.
pub type Backward = Box<dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Option<Tensor>> + Send + Sync>;

/// The gradients of a value of three tensors, in their order.
pub type Grads3 = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

/// A backward pass of three inputs: `([a, b, c], y, ∂loss/∂y) ↦ (∂loss/∂a, ∂loss/∂b, ∂loss/∂c)`.
pub type Backward3 = Box<dyn Fn([&Tensor; 3], &Tensor, &Tensor) -> Result<Grads3> + Send + Sync>;

/// `y` (computed from `x` off the tape) as a node of `x`'s tape whose gradient is `backward`'s.
pub fn with_backward(
    x: &Tensor,
    y: Tensor,
    name: &'static str,
    backward: Backward,
) -> Result<Tensor> {
    x.apply_op1(GradOp {
        output: Output::new(name, y),
        backward,
    })
}

/// `y` (computed from `a`, `b` and `c` off the tape) as a node of their tapes whose gradients
/// are `backward`'s.
pub fn with_backward3(
    [a, b, c]: [&Tensor; 3],
    y: Tensor,
    name: &'static str,
    backward: Backward3,
) -> Result<Tensor> {
    a.apply_op3(
        b,
        c,
        GradOp3 {
            output: Output::new(name, y),
            backward,
        },
    )
}

/// The backward pass of everything `y` was computed from, seeded with `grad` (`y`'s gradient,
/// of its shape and dtype) as `y`'s own gradient, where `(y · grad).sum()`'s backward pass
/// would first multiply, sum, fill a tensor of ones and multiply twice more, over the whole
/// of `y`: a module's backward pass from its output's gradient, a block's when recomputed.
pub fn backward_from(y: &Tensor, grad: &Tensor) -> Result<GradStore> {
    if y.shape() != grad.shape() || y.dtype() != grad.dtype() {
        candle_core::bail!(
            "a gradient of shape {:?} ({:?}) for a tensor of shape {:?} ({:?})",
            grad.dims(),
            grad.dtype(),
            y.dims(),
            y.dtype()
        )
    }
    let seed = grad.detach();
    let root = Tensor::zeros((), y.dtype(), y.device())?;
    let backward: Backward = Box::new(move |_, _, _| Ok(Some(seed.clone())));
    with_backward(y, root, "seed", backward)?.backward()
}

/// An op's name and its precomputed output, handed over once: the op keeps no copy.
struct Output {
    name: &'static str,
    y: Mutex<Option<Tensor>>,
}

impl Output {
    fn new(name: &'static str, y: Tensor) -> Output {
        Output {
            name,
            y: Mutex::new(Some(y.detach())),
        }
    }

    /// The output's storage (taken out) and shape.
    fn take(&self) -> Result<(Storage, Shape)> {
        let name = self.name;
        let y = (self.y.lock().expect("output lock").take())
            .ok_or_else(|| candle_core::Error::Msg(format!("{name} ran forward twice")))?;
        let y = if y.is_contiguous() && y.layout().start_offset() == 0 {
            y
        } else {
            y.copy()?
        };
        let (storage, layout) = y.storage_and_layout();
        let storage = match &*storage {
            Storage::Cpu(s) => Storage::Cpu(s.try_clone(layout)?),
            Storage::Cuda(s) => Storage::Cuda(s.try_clone(layout)?),
            Storage::Metal(_) => candle_core::bail!("{name} runs on the CPU and CUDA"),
        };
        Ok((storage, y.shape().clone()))
    }

    fn cpu(&self) -> Result<(CpuStorage, Shape)> {
        match self.take()? {
            (Storage::Cpu(s), shape) => Ok((s, shape)),
            _ => candle_core::bail!("{}: the output is not on the input's device", self.name),
        }
    }

    fn cuda(&self) -> Result<(CudaStorage, Shape)> {
        match self.take()? {
            (Storage::Cuda(s), shape) => Ok((s, shape)),
            _ => candle_core::bail!("{}: the output is not on the input's device", self.name),
        }
    }
}

struct GradOp {
    output: Output,
    backward: Backward,
}

impl CustomOp1 for GradOp {
    fn name(&self) -> &'static str {
        self.output.name
    }

    fn cpu_fwd(&self, _x: &CpuStorage, _layout: &Layout) -> Result<(CpuStorage, Shape)> {
        self.output.cpu()
    }

    fn cuda_fwd(&self, _x: &CudaStorage, _layout: &Layout) -> Result<(CudaStorage, Shape)> {
        self.output.cuda()
    }

    fn bwd(&self, x: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        (self.backward)(x, y, grad)
    }
}

struct GradOp3 {
    output: Output,
    backward: Backward3,
}

impl CustomOp3 for GradOp3 {
    fn name(&self) -> &'static str {
        self.output.name
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.output.cpu()
    }

    fn cuda_fwd(
        &self,
        _: &CudaStorage,
        _: &Layout,
        _: &CudaStorage,
        _: &Layout,
        _: &CudaStorage,
        _: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.output.cuda()
    }

    fn bwd(&self, a: &Tensor, b: &Tensor, c: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Grads3> {
        (self.backward)([a, b, c], y, grad)
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

    #[test]
    fn a_seeded_backward_pass_gives_the_weighted_sums_gradients() {
        let dev = Device::Cpu;
        let x = Var::new(&[[1f32, -2.0, 3.0], [0.5, 4.0, -1.0]], &dev).unwrap();
        let y = (x.as_tensor().sqr().unwrap() * 3.0).unwrap().exp().unwrap();
        let y = (y.log().unwrap() + x.as_tensor()).unwrap();
        let g = Tensor::new(&[[0.1f32, 2.0, -1.5], [3.0, -0.25, 7.0]], &dev).unwrap();
        let seeded = backward_from(&y, &g).unwrap();
        let summed = y.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
        let grad = |s: &GradStore| s.get(x.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(grad(&seeded), grad(&summed));
    }

    #[test]
    fn a_seed_of_another_shape_or_dtype_is_refused() {
        let x = Var::new(&[1f32, 2.0, 3.0], &Device::Cpu).unwrap();
        let y = x.as_tensor().sqr().unwrap();
        let short = Tensor::new(&[1f32, 2.0], &Device::Cpu).unwrap();
        let err = backward_from(&y, &short).unwrap_err().to_string();
        assert!(
            err.contains("shape [2]") && err.contains("shape [3]"),
            "{err}"
        );
        let f64s = Tensor::new(&[1f64, 2.0, 3.0], &Device::Cpu).unwrap();
        assert!(backward_from(&y, &f64s).is_err());
    }
}
