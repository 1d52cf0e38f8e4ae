//! Layers written from composed candle ops, so that every parameter receives a gradient.
//!
//! candle 0.11's fused `ops::layer_norm`, `ops::rms_norm`, `ops::softmax_last_dim`, the rotary
//! kernels and the `LayerNorm`/`RmsNorm` layers have no backward pass and silently pass no
//! gradient (candle issues #2168 and #3011; `docs/reference.md`, "Engine stack facts"). The
//! layers here use only ops with a backward pass: matmul, broadcast arithmetic, reductions,
//! `exp`, `log`, `sqrt`, `gelu`, `index_select`; and two fused kernels given a backward pass
//! of ours ([`super::grad_op`]): [`LayerNorm`]'s `layer_norm`, and attention's [`softmax`],
//! candle's `softmax_last_dim` in the dtype of the products (bf16 on a GPU, as a fused
//! attention keeps its probabilities). `tests/engine.rs` checks that every parameter of every
//! module gets a non-zero gradient.

use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Result, Tensor, Var, D};

use mosaic_kit::rng::SplitMix64;

use super::flash;
use super::grad_op::{with_backward, with_backward3, Grads3};

/// A module's trainable parameters, in creation order (the order of checkpoints and of the
/// optimizer state).
#[derive(Debug, Clone, Default)]
pub struct Params {
    vars: Vec<(String, Var)>,
}

impl Params {
    /// `(name, variable)` pairs in creation order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.vars.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// Number of parameter tensors.
    pub fn len(&self) -> usize {
        self.vars.len()
    }

    /// True when the module has no parameters.
    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// Number of scalar parameters.
    pub fn count(&self) -> usize {
        self.vars.iter().map(|(_, v)| v.elem_count()).sum()
    }
}

/// Creates a module's parameters from its own random stream, recording them in [`Params`]
/// and handing the layers the tensors they compute with (the same storage: an optimizer step
/// on the `Var` is seen by the layer).
pub struct ParamBuilder {
    device: Device,
    compute: DType,
    rng: SplitMix64,
    prefix: Vec<String>,
    params: Params,
}

impl ParamBuilder {
    /// A builder drawing from `rng` and placing parameters on `device`.
    pub fn new(rng: SplitMix64, device: &Device) -> ParamBuilder {
        ParamBuilder {
            device: device.clone(),
            compute: DType::F32,
            rng,
            prefix: Vec::new(),
            params: Params::default(),
        }
    }

    /// The same builder, its layers' matrix products in `dtype` (mixed precision: parameters
    /// stay f32 master weights, each product casts its operands to `dtype` and its result
    /// back to f32, as autocast does; everything else runs in f32). `F32` by default.
    pub fn computing_in(self, dtype: DType) -> ParamBuilder {
        ParamBuilder {
            compute: dtype,
            ..self
        }
    }

    /// The dtype of its layers' matrix products.
    pub fn compute_dtype(&self) -> DType {
        self.compute
    }

    /// Runs `f` with `name` appended to the parameter-name prefix (`blocks.0.attn.qkv.weight`).
    pub fn scope<T>(&mut self, name: &str, f: impl FnOnce(&mut ParamBuilder) -> T) -> T {
        self.prefix.push(name.to_string());
        let out = f(self);
        self.prefix.pop();
        out
    }

    fn add(&mut self, name: &str, values: Vec<f32>, shape: &[usize]) -> Result<Tensor> {
        let full = self
            .prefix
            .iter()
            .map(String::as_str)
            .chain([name])
            .collect::<Vec<_>>()
            .join(".");
        let var = Var::from_tensor(&Tensor::from_vec(values, shape, &self.device)?)?;
        let t = var.as_tensor().clone();
        self.params.vars.push((full, var));
        Ok(t)
    }

    /// A parameter drawn from N(0, std²).
    pub fn normal(&mut self, name: &str, shape: &[usize], std: f64) -> Result<Tensor> {
        let n = shape.iter().product();
        let values = self.rng.normals(n, std);
        self.add(name, values, shape)
    }

    /// A parameter filled with `value`.
    pub fn constant(&mut self, name: &str, shape: &[usize], value: f32) -> Result<Tensor> {
        let n = shape.iter().product();
        self.add(name, vec![value; n], shape)
    }

    /// The parameters created so far.
    pub fn finish(self) -> Params {
        self.params
    }
}

/// `y = x Wᵀ + b` over the last dimension of a tensor of any rank.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Tensor,
    compute: DType,
}

/// `a · b` with both operands cast to `dtype` and the product back to f32 (no-ops in f32).
pub fn matmul_in(a: &Tensor, b: &Tensor, dtype: DType) -> Result<Tensor> {
    a.to_dtype(dtype)?
        .matmul(&b.to_dtype(dtype)?)?
        .to_dtype(DType::F32)
}

impl Linear {
    /// A layer from `inputs` to `outputs` features, weights N(0, 1/inputs), bias zero.
    pub fn new(pb: &mut ParamBuilder, name: &str, inputs: usize, outputs: usize) -> Result<Linear> {
        pb.scope(name, |pb| {
            Ok(Linear {
                weight: pb.normal("weight", &[outputs, inputs], (inputs as f64).powf(-0.5))?,
                bias: pb.constant("bias", &[outputs], 0.0)?,
                compute: pb.compute,
            })
        })
    }

    /// Applies the layer; the result in f32.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_in_compute(x)?.to_dtype(DType::F32)
    }

    /// Applies the layer, the result in the products' dtype (bf16 on a GPU), the bias added
    /// in it, as autocast's `Linear` returns it: the form for layers whose consumer is another
    /// product or an elementwise op that keeps the dtype, which so skip an f32 copy of it
    /// (three passes over an f32 tensor where this takes one over a bf16 one).
    pub fn forward_in_compute(&self, x: &Tensor) -> Result<Tensor> {
        let (product, out_shape) = self.product(x)?;
        add_bias(&product, &self.bias)?.reshape(out_shape)
    }

    /// `residual + layer(x)`, in f32 (`residual` is an f32 stream of the output's shape): on a
    /// CUDA device, for a bf16 product, the bias and the add are one pass
    /// (`crate::kernels::bias::residual_bias_add`); elsewhere the layer's output is cast and
    /// added, the same values.
    pub fn forward_residual(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        let (product, out_shape) = self.product(x)?;
        #[cfg(mosaic_gpu)]
        if product.device().is_cuda()
            && product.dtype() == DType::BF16
            && residual.dtype() == DType::F32
            && crate::kernels::fused()
        {
            let residual = residual.contiguous()?.reshape(product.shape())?;
            return crate::kernels::bias::residual_bias_add(&residual, &product, &self.bias)?
                .reshape(out_shape);
        }
        residual
            + add_bias(&product, &self.bias)?
                .reshape(out_shape)?
                .to_dtype(DType::F32)?
    }

    /// `gelu(layer(x))` in the products' dtype: on a CUDA device, for a bf16 product, the bias
    /// and GELU are one pass forward and one backward (`crate::kernels::bias::bias_gelu`,
    /// GELU in f32 arithmetic); elsewhere [`gelu`] of [`Linear::forward_in_compute`].
    pub fn forward_gelu(&self, x: &Tensor) -> Result<Tensor> {
        let (product, out_shape) = self.product(x)?;
        #[cfg(mosaic_gpu)]
        if product.device().is_cuda() && product.dtype() == DType::BF16 && crate::kernels::fused() {
            return crate::kernels::bias::bias_gelu(&product, &self.bias)?.reshape(out_shape);
        }
        gelu(&add_bias(&product, &self.bias)?.reshape(out_shape)?)
    }

    /// `x · Wᵀ` over the rows of `x` (`[…, inputs]`) in the products' dtype, `[rows,
    /// outputs]`, and the shape of the layer's output (`[…, outputs]`): the layer without its
    /// bias, for an op that adds it itself.
    pub(crate) fn product(&self, x: &Tensor) -> Result<(Tensor, Vec<usize>)> {
        let dims = x.dims();
        let inputs = dims[dims.len() - 1];
        let rows = x.elem_count() / inputs;
        let mut out_shape = dims.to_vec();
        *out_shape.last_mut().unwrap() = self.weight.dim(0)?;
        let x = x.reshape((rows, inputs))?.to_dtype(self.compute)?;
        let product = x.matmul(&self.weight.to_dtype(self.compute)?.t()?)?;
        Ok((product, out_shape))
    }
}

/// `y + bias` over the rows of a product `y` `[rows, features]`, in `y`'s dtype. A bf16 product
/// on a CUDA device takes the engine's kernel ([`crate::kernels::bias`]: one pass, the bias's
/// gradient summed in f32); otherwise candle's broadcast add.
pub(crate) fn add_bias(y: &Tensor, bias: &Tensor) -> Result<Tensor> {
    #[cfg(mosaic_gpu)]
    if y.device().is_cuda()
        && y.dtype() == DType::BF16
        && y.is_contiguous()
        && crate::kernels::fused()
    {
        return crate::kernels::bias::bias_add(y, bias);
    }
    y.broadcast_add(&bias.to_dtype(y.dtype())?)
}

/// Layer normalisation over the last dimension: candle's fused kernel (one pass, where the
/// composed form takes eleven), given a backward pass of ours (`layer_norm_backward`), so the
/// tape keeps the input alone where the composed form kept five tensors of its size.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    gamma: Tensor,
    beta: Tensor,
}

/// The variance guard of every LayerNorm.
const LN_EPS: f64 = 1e-5;

impl LayerNorm {
    /// Normalises `dim` features; γ = 1, β = 0.
    pub fn new(pb: &mut ParamBuilder, name: &str, dim: usize) -> Result<LayerNorm> {
        pb.scope(name, |pb| {
            Ok(LayerNorm {
                gamma: pb.constant("gamma", &[dim], 1.0)?,
                beta: pb.constant("beta", &[dim], 0.0)?,
            })
        })
    }

    /// Applies the normalisation. On a CUDA device, the engine's kernels forward and backward
    /// (`crate::kernels::elementwise::layer_norm`).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_in(x, DType::F32)
    }

    /// Applies the normalisation with the result in `dtype`: the products' dtype for a norm
    /// that feeds a product, which then casts nothing. On a CUDA device the kernel writes it
    /// in bf16 and its backward pass reads the gradient in bf16 (no cast either way); elsewhere
    /// the result is cast, the same values.
    pub fn forward_in(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        #[cfg(mosaic_gpu)]
        if x.device().is_cuda()
            && x.dtype() == DType::F32
            && matches!(dtype, DType::F32 | DType::BF16)
            && crate::kernels::elementwise::layer_norm_fits(x.dim(D::Minus1)?)
            && crate::kernels::fused()
        {
            return crate::kernels::elementwise::layer_norm(
                x,
                &self.gamma,
                &self.beta,
                LN_EPS,
                dtype,
            );
        }
        self.forward_candle(x)?.to_dtype(dtype)
    }

    /// candle-nn's fused forward kernel with [`layer_norm_backward`] as its backward pass.
    fn forward_candle(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        let y = candle_nn::ops::layer_norm(
            &x.detach(),
            &self.gamma.detach(),
            &self.beta.detach(),
            LN_EPS as f32,
        )?;
        with_backward3(
            [&x, &self.gamma, &self.beta],
            y,
            "layer_norm",
            Box::new(|[x, gamma, _], _, grad| layer_norm_backward(x, gamma, grad)),
        )
    }

    /// The normalisation composed of candle ops, which candle differentiates itself: the
    /// reference [`LayerNorm::forward`] is tested against.
    #[cfg(test)]
    fn forward_composed(&self, x: &Tensor) -> Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centred = x.broadcast_sub(&mean)?;
        let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
        centred
            .broadcast_div(&(var + LN_EPS)?.sqrt()?)?
            .broadcast_mul(&self.gamma)?
            .broadcast_add(&self.beta)
    }
}

/// The gradients of `y = x̂·γ + β` (x̂ = (x − μ)·r, r = 1/√(σ² + ε) over the last dimension)
/// given `g = ∂loss/∂y`: `∂x = r·(gγ − mean(gγ) − x̂·mean(gγ·x̂))`, `∂γ = Σ g·x̂` and
/// `∂β = Σ g` over the rows. μ and r are recomputed from `x`, in two passes. (On a CUDA device
/// the engine's kernel does this in one, `kernels/elementwise.cu`.)
fn layer_norm_backward(x: &Tensor, gamma: &Tensor, g: &Tensor) -> Result<Grads3> {
    let dim = x.dim(D::Minus1)?;
    let rows = x.elem_count() / dim;
    let x2 = x.detach().reshape((rows, dim))?;
    let g2 = g.reshape((rows, dim))?;
    let centred = x2.broadcast_sub(&x2.mean_keepdim(1)?)?;
    let r = (centred.sqr()?.mean_keepdim(1)? + LN_EPS)?
        .sqrt()?
        .recip()?;
    let x_hat = centred.broadcast_mul(&r)?;
    let d_beta = g2.sum(0)?;
    let d_gamma = (&g2 * &x_hat)?.sum(0)?;
    let g_gamma = g2.broadcast_mul(&gamma.detach())?;
    let mean_g = g_gamma.mean_keepdim(1)?;
    let mean_gx = (&g_gamma * &x_hat)?.mean_keepdim(1)?;
    let d_x = g_gamma
        .broadcast_sub(&mean_g)?
        .sub(&x_hat.broadcast_mul(&mean_gx)?)?
        .broadcast_mul(&r)?
        .reshape(x.shape())?;
    Ok((Some(d_x), Some(d_gamma), Some(d_beta)))
}

/// GELU (candle's tanh form). On a CUDA device, in f32 or bf16, its backward pass is one
/// kernel of ours (`kernels/elementwise.cu`) where candle's takes sixteen elementwise ops over
/// the MLP's hidden activations; elsewhere candle differentiates it.
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    #[cfg(mosaic_gpu)]
    if x.device().is_cuda()
        && matches!(
            x.dtype(),
            candle_core::DType::F32 | candle_core::DType::BF16
        )
        && crate::kernels::fused()
    {
        return crate::kernels::elementwise::gelu(x);
    }
    x.gelu()
}

/// `log softmax` over the last dimension, composed (the maximum is taken out of the graph:
/// it cancels in the value and its gradient).
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&log_sum)
}

/// Multi-head self-attention with one fused QKV projection.
#[derive(Debug, Clone)]
pub struct Attention {
    qkv: Linear,
    out: Linear,
    heads: usize,
    causal: bool,
    /// The causal mask last used, shared by the layer's clones (a recomputed block is one):
    /// built on the host and copied to the device once, not in every forward pass (a
    /// `tokens²` copy from pageable memory per layer and pass).
    causal_mask: Arc<Mutex<Option<Tensor>>>,
}

impl Attention {
    /// `heads` heads over `dim` features; `causal` masks attention to later positions.
    pub fn new(
        pb: &mut ParamBuilder,
        name: &str,
        dim: usize,
        heads: usize,
        causal: bool,
    ) -> Result<Attention> {
        assert!(
            dim.is_multiple_of(heads),
            "{dim} features do not split into {heads} heads"
        );
        pb.scope(name, |pb| {
            Ok(Attention {
                qkv: Linear::new(pb, "qkv", dim, 3 * dim)?,
                out: Linear::new(pb, "out", dim, dim)?,
                heads,
                causal,
                causal_mask: Arc::default(),
            })
        })
    }

    /// The additive causal mask `[t, t]` in `dtype` on `device` ([`MASKED`] above the
    /// diagonal), from the cache when it has that one.
    fn causal_mask(&self, t: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        let mut cached = self.causal_mask.lock().expect("causal mask lock");
        if let Some(m) = cached.as_ref() {
            if m.dims() == [t, t] && m.dtype() == dtype && m.device().same_device(device) {
                return Ok(m.clone());
            }
        }
        let mask = causal_mask(t, dtype, device)?;
        *cached = Some(mask.clone());
        Ok(mask)
    }

    /// `x`: `[batch, tokens, dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None)
    }

    /// `x`: `[batch, tokens, dim]`; `mask`, when given, is added to the attention scores and
    /// broadcasts to `[batch, heads, tokens, tokens]` (`0` where a query may read a key,
    /// [`MASKED`] where it may not; see [`super::packed`]). A causal layer also masks later
    /// positions. A row masked everywhere gets uniform weights, never NaN.
    pub fn forward_masked(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        self.out
            .forward_in_compute(&self.attend(x, mask)?)?
            .to_dtype(DType::F32)
    }

    /// `residual + attention(x)` (see [`Attention::forward_masked`]), the output projection's
    /// bias and the add one pass on a GPU ([`Linear::forward_residual`]).
    pub fn forward_residual(
        &self,
        x: &Tensor,
        residual: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.out.forward_residual(&self.attend(x, mask)?, residual)
    }

    /// The heads' outputs side by side, `[batch, tokens, dim]` in the products' dtype: what
    /// the output projection reads.
    fn attend(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let (b, t, dim) = x.dims3()?;
        let hd = dim / self.heads;
        // Everything from the projection to the output stays in the products' dtype (bf16 on
        // a GPU): the score matrices, where materialised, are the largest tensors of the step,
        // and a bf16 product's f32 copy would carry no more precision. The scale goes on q.
        let dtype = self.qkv.compute;
        // The product without its bias: the fused kernels add it as they load q, k and v.
        let (product, _) = self.qkv.product(x)?;
        let qkv = product.reshape((b, t, 3, self.heads, hd))?;
        let fused = match mask {
            None => flash::attention(&qkv, &self.qkv.bias, self.causal)?, // [b, t, heads, hd]
            Some(_) => None,
        };
        let y = match fused {
            Some(y) => y,
            None => {
                let qkv = add_bias(&product, &self.qkv.bias)?
                    .reshape((b, t, 3, self.heads, hd))?
                    .permute((2, 0, 3, 1, 4))?; // [3, b, heads, t, hd]
                let q = (qkv.get(0)? * (hd as f64).powf(-0.5))?;
                let (k, v) = (qkv.get(1)?.contiguous()?, qkv.get(2)?.contiguous()?);
                let y = if self.causal {
                    let causal = self.causal_mask(t, dtype, x.device())?;
                    composed_attention(&q, &k, &v, &[Some(&causal), mask])?
                } else {
                    composed_attention(&q, &k, &v, &[mask])?
                };
                y.transpose(1, 2)? // from [b, heads, t, hd]
            }
        };
        y.reshape((b, t, dim))
    }
}

/// The additive causal mask `[t, t]` in `dtype` on `device`: [`MASKED`] above the diagonal.
pub fn causal_mask(t: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let mask: Vec<f32> = (0..t)
        .flat_map(|i| (0..t).map(move |j| if j > i { MASKED } else { 0.0 }))
        .collect();
    Tensor::from_vec(mask, (t, t), device)?.to_dtype(dtype)
}

/// `softmax(q kᵀ + Σ masks) · v` composed of candle ops, `[b, heads, t, hd]` in and out (q
/// already scaled): two batched products around the fused [`softmax`], the `t × t` scores
/// materialised — what [`flash`]'s kernels avoid, and are checked against. Each mask is
/// additive and broadcasts to the scores.
pub fn composed_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    masks: &[Option<&Tensor>],
) -> Result<Tensor> {
    let mut scores = q.contiguous()?.matmul(&k.t()?)?;
    for mask in masks.iter().flatten() {
        scores = scores.broadcast_add(&mask.to_dtype(q.dtype())?)?;
    }
    // It subtracts the row maximum, so masked scores underflow to weights of exactly 0.
    softmax(&scores)?.matmul(v)
}

/// Softmax over the last dimension: candle's fused kernel (one pass; on a GPU it accumulates
/// in f32 whatever the dtype), with the backward pass `∂x = y ⊙ (∂y − Σ ∂y ⊙ y)`, its row sums
/// in f32. Only `x` and `y` stay on the tape, against five full-size intermediates of the
/// composed `candle_nn::ops::softmax`.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let x = x.contiguous()?;
    let y = candle_nn::ops::softmax_last_dim(&x.detach())?;
    let backward = |_x: &Tensor, y: &Tensor, g: &Tensor| {
        let sums = g
            .mul(y)?
            .to_dtype(DType::F32)?
            .sum_keepdim(D::Minus1)?
            .to_dtype(y.dtype())?;
        Ok(Some(y.mul(&g.broadcast_sub(&sums)?)?))
    };
    with_backward(&x, y, "softmax", Box::new(backward))
}

/// The additive attention mask's value where a query may not read a key: large and finite, so
/// that a fully masked row stays finite (uniform weights) while a masked key next to an
/// unmasked one gets a weight of exactly 0 (`exp(-1e9)` underflows in f32).
pub const MASKED: f32 = -1e9;

/// A pre-norm transformer block: `x + attn(ln(x))`, then `x + mlp(ln(x))` with a GELU MLP.
#[derive(Debug, Clone)]
pub struct Block {
    ln1: LayerNorm,
    attn: Attention,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// The shape of a transformer stack.
#[derive(Debug, Clone, Copy)]
pub struct BlockDims {
    /// Model width.
    pub dim: usize,
    /// Attention heads.
    pub heads: usize,
    /// MLP hidden width.
    pub mlp: usize,
    /// Blocks.
    pub layers: usize,
}

impl Block {
    /// One block of `dims`.
    pub fn new(pb: &mut ParamBuilder, name: &str, dims: BlockDims, causal: bool) -> Result<Block> {
        pb.scope(name, |pb| {
            Ok(Block {
                ln1: LayerNorm::new(pb, "ln1", dims.dim)?,
                attn: Attention::new(pb, "attn", dims.dim, dims.heads, causal)?,
                ln2: LayerNorm::new(pb, "ln2", dims.dim)?,
                fc1: Linear::new(pb, "fc1", dims.dim, dims.mlp)?,
                fc2: Linear::new(pb, "fc2", dims.mlp, dims.dim)?,
            })
        })
    }

    /// `dims.layers` blocks named `blocks.0`, `blocks.1`, ….
    pub fn stack(pb: &mut ParamBuilder, dims: BlockDims, causal: bool) -> Result<Vec<Block>> {
        pb.scope("blocks", |pb| {
            (0..dims.layers)
                .map(|i| Block::new(pb, &i.to_string(), dims, causal))
                .collect()
        })
    }

    /// `x`: `[batch, tokens, dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None)
    }

    /// The parameters it reads (their tensors, whose ids are the variables').
    pub fn params(&self) -> [&Tensor; 12] {
        let (ln1, ln2, attn) = (&self.ln1, &self.ln2, &self.attn);
        [
            &ln1.gamma,
            &ln1.beta,
            &attn.qkv.weight,
            &attn.qkv.bias,
            &attn.out.weight,
            &attn.out.bias,
            &ln2.gamma,
            &ln2.beta,
            &self.fc1.weight,
            &self.fc1.bias,
            &self.fc2.weight,
            &self.fc2.bias,
        ]
    }

    /// `x`: `[batch, tokens, dim]` with an additive attention mask (see
    /// [`Attention::forward_masked`]).
    ///
    /// The residual stream and the norms run in f32; the MLP's hidden activations stay in the
    /// products' dtype (bf16 on a GPU, as under autocast), its GELU too.
    pub fn forward_masked(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        // Each norm feeds a product: its output in the products' dtype.
        let compute = self.fc1.compute;
        let normed = self.ln1.forward_in(x, compute)?;
        let x = self.attn.forward_residual(&normed, x, mask)?;
        let normed = self.ln2.forward_in(&x, compute)?;
        let h = self.fc1.forward_gelu(&normed)?;
        // Each product ends in a residual connection: its bias and the add one pass on a GPU.
        self.fc2.forward_residual(&h, &x)
    }
}

/// Runs a stack of blocks.
pub fn run_blocks(blocks: &[Block], x: Tensor) -> Result<Tensor> {
    run_blocks_masked(blocks, x, None)
}

/// Runs a stack of blocks, every attention with the additive `mask`.
pub fn run_blocks_masked(blocks: &[Block], mut x: Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    for b in blocks {
        x = b.forward_masked(&x, mask)?;
    }
    Ok(x)
}

/// Rows of `x` (`[rows, features]`) scaled to unit length.
pub fn l2_normalise(x: &Tensor) -> Result<Tensor> {
    let norm = (x.sqr()?.sum_keepdim(1)? + 1e-12)?.sqrt()?;
    x.broadcast_div(&norm)
}

/// A one-hot `[rows, classes]` f32 matrix of `labels`.
pub fn one_hot(labels: &[u32], classes: usize, device: &Device) -> Result<Tensor> {
    let mut v = vec![0f32; labels.len() * classes];
    for (i, &l) in labels.iter().enumerate() {
        v[i * classes + l as usize] = 1.0;
    }
    Tensor::from_vec(v, (labels.len(), classes), device)
}

/// Scalars of a rank-0 or rank-1 f32 tensor (for tests and logs).
pub fn to_f32s(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fused_softmax_has_the_composed_ones_values_and_gradients() {
        let mut values = SplitMix64::new(8).normals(3 * 5 * 7, 2.0);
        // A row masked everywhere, and a masked key beside unmasked ones.
        values[..7].fill(MASKED);
        values[7] = MASKED;
        let x =
            Var::from_tensor(&Tensor::from_vec(values, (3, 5, 7), &Device::Cpu).unwrap()).unwrap();
        let w = Tensor::from_vec(
            SplitMix64::new(9).normals(3 * 5 * 7, 1.0),
            (3, 5, 7),
            &Device::Cpu,
        )
        .unwrap();
        let run = |fused: bool| {
            let y = if fused {
                softmax(x.as_tensor()).unwrap()
            } else {
                candle_nn::ops::softmax(x.as_tensor(), D::Minus1).unwrap()
            };
            let grads = y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
            let g = grads.get(x.as_tensor()).unwrap();
            (to_f32s(&y).unwrap(), to_f32s(g).unwrap())
        };
        let ((y, g), (y0, g0)) = (run(true), run(false));
        for (a, b) in y.iter().zip(&y0).chain(g.iter().zip(&g0)) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
        assert!(
            y[..7].iter().all(|&p| (p - 1.0 / 7.0).abs() < 1e-6),
            "uniform, not NaN"
        );
        assert_eq!(y[7], 0.0, "a masked key gets nothing");
    }

    #[test]
    fn the_fused_layer_norm_has_the_composed_ones_values_and_gradients() {
        let var = |seed, n, std, shape: &[usize]| {
            let t = Tensor::from_vec(SplitMix64::new(seed).normals(n, std), shape, &Device::Cpu);
            Var::from_tensor(&t.unwrap()).unwrap()
        };
        let (gamma, beta) = (var(1, 7, 1.0, &[7]), var(2, 7, 1.0, &[7]));
        let ln = LayerNorm {
            gamma: gamma.as_tensor().clone(),
            beta: beta.as_tensor().clone(),
        };
        // Rows offset from zero, read through a transposed view (not contiguous).
        let x = var(3, 3 * 7 * 5, 2.0, &[3, 7, 5]);
        let w = Tensor::from_vec(
            SplitMix64::new(4).normals(3 * 5 * 7, 1.0),
            (3, 5, 7),
            &Device::Cpu,
        )
        .unwrap();
        let run = |fused: bool| {
            let input = (x.as_tensor() + 3.0).unwrap().transpose(1, 2).unwrap();
            let y = if fused {
                ln.forward(&input).unwrap()
            } else {
                ln.forward_composed(&input).unwrap()
            };
            let grads = y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
            let mut out = vec![to_f32s(&y).unwrap()];
            for v in [&x, &gamma, &beta] {
                out.push(to_f32s(grads.get(v.as_tensor()).unwrap()).unwrap());
            }
            out
        };
        let (fused, composed) = (run(true), run(false));
        for (f, c) in fused.iter().zip(&composed) {
            assert_eq!(f.len(), c.len());
            for (a, b) in f.iter().zip(c) {
                assert!((a - b).abs() < 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
            }
        }
    }

    fn attention(causal: bool) -> Attention {
        let mut pb = ParamBuilder::new(SplitMix64::new(3), &Device::Cpu);
        Attention::new(&mut pb, "attn", 8, 2, causal).unwrap()
    }

    fn x(seed: u64) -> Tensor {
        let v = SplitMix64::new(seed).normals(2 * 5 * 8, 1.0);
        Tensor::from_vec(v, (2, 5, 8), &Device::Cpu).unwrap()
    }

    fn values(t: &Tensor) -> Vec<f32> {
        to_f32s(&t.flatten_all().unwrap()).unwrap()
    }

    #[test]
    fn a_zero_mask_changes_nothing_and_a_full_one_gives_no_nan() {
        for causal in [false, true] {
            let a = attention(causal);
            let x = x(1);
            let zero = Tensor::zeros((1, 1, 5, 5), DType::F32, &Device::Cpu).unwrap();
            let plain = values(&a.forward(&x).unwrap());
            assert_eq!(plain, values(&a.forward_masked(&x, Some(&zero)).unwrap()));
            let full = (zero + f64::from(MASKED)).unwrap();
            let out = values(&a.forward_masked(&x, Some(&full)).unwrap());
            assert!(out.iter().all(|v| v.is_finite()));
        }
    }

    #[test]
    fn a_block_with_bf16_products_keeps_f32_out_and_stays_near_the_f32_block() {
        let dims = BlockDims {
            dim: 32,
            heads: 2,
            mlp: 64,
            layers: 1,
        };
        let v = SplitMix64::new(6).normals(2 * 5 * 32, 1.0);
        let x = Tensor::from_vec(v, (2, 5, 32), &Device::Cpu).unwrap();
        let run = |dtype| {
            let mut pb = ParamBuilder::new(SplitMix64::new(5), &Device::Cpu).computing_in(dtype);
            let block = Block::new(&mut pb, "b", dims, true).unwrap();
            let params = pb.finish();
            let y = block.forward(&x).unwrap();
            assert_eq!(y.dtype(), DType::F32, "the residual stream stays f32");
            let grads = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
            for (name, var) in params.iter() {
                let g = to_f32s(grads.get(var.as_tensor()).unwrap()).unwrap();
                assert!(g.iter().all(|v| v.is_finite()), "{name}");
                assert!(g.iter().any(|&v| v != 0.0), "{name} got no gradient");
            }
            values(&y)
        };
        let (bf16, f32) = (run(DType::BF16), run(DType::F32));
        let err = mosaic_kit::stats::relative_error(&bf16, &f32);
        assert!(err < 3e-2, "bf16 products off by {err}");
    }

    #[test]
    fn masked_keys_are_never_read() {
        // Keys 3 and 4 of sample 0 masked: changing those tokens leaves queries 0..3 alone.
        let a = attention(false);
        let mut m = vec![0f32; 2 * 5];
        m[3] = MASKED;
        m[4] = MASKED;
        let mask = Tensor::from_vec(m, (2, 1, 1, 5), &Device::Cpu).unwrap();
        let x1 = x(1);
        let x2 = Tensor::cat(
            &[&x1.narrow(1, 0, 3).unwrap(), &x(2).narrow(1, 3, 2).unwrap()],
            1,
        )
        .unwrap();
        let first = |x: &Tensor| {
            let y = a.forward_masked(x, Some(&mask)).unwrap();
            values(&y.get(0).unwrap().narrow(0, 0, 3).unwrap())
        };
        assert_eq!(first(&x1), first(&x2));
    }
}
