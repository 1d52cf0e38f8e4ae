//! Engine models built from the zoo's architectures (`mosaic_zoo::model`): `clip` (CLIP
//! ViT-L/14) and `imagebind`, at the zoo's real sizes or scaled down by a size factor.
//!
//! Every encoder is the zoo's transformer stack — its layers, width, heads, MLP width and
//! causality, over its tokens — fed by the zoo's input embedding: a patch embedding (a matrix
//! from the patch to the width) for images, audio, depth, thermal and IMU, a token table of
//! the zoo's vocabulary for text; then learned positions, pre-norm blocks, a final norm and one
//! pooled feature per sample (the first token, or the last of a causal stack, as CLIP reads
//! its end-of-text token). `align` projects every encoder's feature into the zoo's joint width
//! and computes the symmetric InfoNCE loss between the first encoder and each other one with a
//! learned temperature: CLIP's loss with two encoders, ImageBind's image-centred one with six.
//! Modules the zoo marks frozen are built frozen: they run forward only.
//!
//! **Precision**: on a GPU the matrix products run in bf16 over f32 master weights and f32
//! AdamW state ([`ParamBuilder::computing_in`]), as autocast trains; on a CPU, in f32.
//!
//! **Size**: a factor s in (0, 1] scales depth, heads, width (a multiple of the heads), MLP
//! width, tokens, patch and vocabulary widths and the joint width, each rounded and kept
//! above a small floor: s = 1 is the zoo's size (CLIP's vision tower: 24 layers of 1024 over
//! 1297 tokens), s = 0.02 trains in milliseconds on a CPU.
//!
//! **Data**: every sample has three latent attributes of 8 values each; a modality's input is
//! the sum of one fixed random pattern per attribute value (σ 0.5), its own patterns, and a
//! text spells the attributes as tokens. Matching pairs means learning every encoding, so the
//! loss falls from ln(batch).
//!
//! **Departures**, stated: plain GELU MLPs and LayerNorm everywhere (no quick-GELU, none of
//! ImageBind's per-modality pre- and post-processing), and no separate CLS token (the zoo's
//! token count includes it; its position pools). Attention is the engine's fused kernels on a
//! GPU ([`super::flash`]) and composed of candle ops elsewhere; an encoder can recompute its
//! blocks' activations instead of keeping them ([`super::recompute`]).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use candle_core::{DType, Device, Result, Tensor};
use mosaic_kit::rng::SplitMix64;
use mosaic_zoo::{ModuleSpec, Role};

use super::data::{Batch, DataSource, Field};
use super::model::{Coupling, Input, Model, Module, Net, Output, Shard, TextLayout};
use super::nn::{
    l2_normalise, log_softmax, matmul_in, one_hot, run_blocks, Block, BlockDims, LayerNorm, Linear,
    ParamBuilder,
};
use super::recompute::run_blocks_recomputing;

const ATTRS: usize = 3;
const VALUES: usize = 8;

/// `x · s`, rounded, at least `floor`.
fn scale(x: u64, s: f64, floor: usize) -> usize {
    ((x as f64 * s).round() as usize).max(floor)
}

/// What an encoder reads.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reads {
    /// Patches of this many features each, one per token.
    Patches(usize),
    /// Token ids below this vocabulary size.
    Tokens(usize),
}

/// An encoder's shape at size `s`.
#[derive(Debug, Clone, Copy)]
struct Shape {
    dims: BlockDims,
    tokens: usize,
    reads: Reads,
    causal: bool,
}

impl Shape {
    fn of(m: &ModuleSpec, s: f64) -> Shape {
        let heads = scale(m.heads as u64, s, 1);
        let dim = heads * scale((m.hidden / m.heads.max(1)) as u64, s, 4);
        let mlp = ((m.ffn as f64 / m.hidden as f64) * dim as f64)
            .round()
            .max(4.0) as usize;
        let hidden = m.hidden.max(1) as u64;
        let reads = match m.extras.first() {
            Some(e) if e.lookup => Reads::Tokens(scale(e.weights / hidden, s, 16)),
            Some(e) => Reads::Patches(scale(e.weights / hidden, s, 4)),
            None => Reads::Patches(scale(hidden, s, 4)),
        };
        Shape {
            dims: BlockDims {
                dim,
                heads,
                mlp,
                layers: scale(m.layers as u64, s, 1),
            },
            tokens: scale(m.tokens as u64, s, 2),
            reads,
            causal: m.causal,
        }
    }
}

/// How an encoder embeds its input.
enum Embed {
    Patches(Linear),
    Tokens(Tensor),
}

/// A zoo encoder: embedding, positions, blocks, final norm, one pooled feature.
struct Encoder {
    embed: Embed,
    pos: Tensor,
    blocks: Vec<Block>,
    ln: LayerNorm,
    pool_last: bool,
    /// Whether the blocks recompute their activations in the backward pass.
    recompute: AtomicBool,
}

impl Net for Encoder {
    fn forward(&self, inputs: &[Tensor], _shard: &Shard) -> Result<Tensor> {
        let x = match &self.embed {
            Embed::Patches(linear) => linear.forward(&inputs[0])?,
            Embed::Tokens(table) => {
                let (b, t) = inputs[0].dims2()?;
                table
                    .index_select(&inputs[0].flatten_all()?, 0)?
                    .reshape((b, t, table.dim(1)?))?
            }
        };
        let x = x.broadcast_add(&self.pos)?;
        let x = if self.recompute.load(Relaxed) {
            run_blocks_recomputing(&self.blocks, x, None)?
        } else {
            run_blocks(&self.blocks, x)?
        };
        let x = self.ln.forward(&x)?;
        let at = if self.pool_last { x.dim(1)? - 1 } else { 0 };
        x.narrow(1, at, 1)?.squeeze(1)
    }

    fn set_recompute(&self, on: bool) -> bool {
        self.recompute.store(on, Relaxed);
        true
    }
}

/// InfoNCE between the first input and each other, over L2-normalised projections.
struct Align {
    projections: Vec<Tensor>,
    logit_scale: Tensor,
    compute: DType,
}

impl Net for Align {
    /// Gathered: the whole batch's features; the replica returns its rows' loss terms over
    /// 2 × batch × pairs, so the replicas' shares add up to the mean over pairs.
    fn forward(&self, inputs: &[Tensor], shard: &Shard) -> Result<Tensor> {
        let z = inputs
            .iter()
            .zip(&self.projections)
            .map(|(x, p)| l2_normalise(&matmul_in(x, &p.t()?, self.compute)?))
            .collect::<Result<Vec<_>>>()?;
        let scale = self.logit_scale.exp()?;
        let (start, len) = (shard.rows.start, shard.rows.len());
        let targets: Vec<u32> = shard.rows.clone().map(|i| i as u32).collect();
        let targets = one_hot(&targets, shard.batch, z[0].device())?;
        let ce = |rows: &Tensor| -> Result<Tensor> { (log_softmax(rows)? * &targets)?.sum_all() };
        let mut total: Option<Tensor> = None;
        for other in &z[1..] {
            let logits = z[0].matmul(&other.t()?)?.broadcast_mul(&scale)?;
            let pair =
                (ce(&logits.narrow(0, start, len)?)? + ce(&logits.t()?.narrow(0, start, len)?)?)?;
            total = Some(match total {
                None => pair,
                Some(t) => (t + pair)?,
            });
        }
        let pairs = (z.len() - 1) as f64;
        total
            .expect("align reads at least two encoders")
            .affine(-1.0 / (2.0 * shard.batch as f64 * pairs), 0.0)
    }
}

/// One encoder's input, as [`ZooData`] makes it.
struct Source {
    name: &'static str,
    shape: Shape,
    /// `patterns[a * VALUES + v]`: the input pattern of value `v` of attribute `a` (patches).
    patterns: Vec<Vec<f32>>,
}

/// The synthetic data of a zoo-built model (see the module documentation).
struct ZooData {
    sources: Vec<Source>,
    seed: u64,
}

impl DataSource for ZooData {
    /// Yes: a real-size batch sums tens of millions of pattern values on the host.
    fn worth_drawing_ahead(&self) -> bool {
        true
    }

    fn fields(&self) -> Vec<Field> {
        self.sources
            .iter()
            .map(|s| match s.shape.reads {
                Reads::Patches(width) => Field::real(s.name, vec![s.shape.tokens, width]),
                Reads::Tokens(vocab) => Field::ids(s.name, vec![s.shape.tokens], vocab),
            })
            .collect()
    }

    fn batch(&self, step: u64, batch: usize, device: &Device) -> Result<Batch> {
        let mut rng = SplitMix64::stream(self.seed, "zoo/batch", step);
        let attrs: Vec<[usize; ATTRS]> = (0..batch)
            .map(|_| std::array::from_fn(|_| rng.below(VALUES as u64) as usize))
            .collect();
        let mut b = Batch::default();
        for s in &self.sources {
            let t = s.shape.tokens;
            let tensor = match s.shape.reads {
                Reads::Patches(width) => {
                    // A sample is the sum of its attributes' patterns, in attribute order, a
                    // pattern at a time (one pass each, which the compiler vectorises).
                    let mut values = Vec::with_capacity(batch * t * width);
                    for a in &attrs {
                        let start = values.len();
                        values.extend_from_slice(&s.patterns[a[0]]);
                        for (j, &v) in a.iter().enumerate().skip(1) {
                            let pattern = &s.patterns[j * VALUES + v];
                            for (x, p) in values[start..].iter_mut().zip(pattern) {
                                *x += p;
                            }
                        }
                    }
                    Tensor::from_vec(values, (batch, t, width), device)?
                }
                Reads::Tokens(vocab) => {
                    let ids: Vec<u32> = attrs
                        .iter()
                        .flat_map(|a| {
                            (0..t)
                                .map(move |i| ((i % ATTRS * VALUES + a[i % ATTRS]) % vocab) as u32)
                        })
                        .collect();
                    Tensor::from_vec(ids, (batch, t), device)?
                }
            };
            b.tensors.insert(s.name, tensor);
        }
        Ok(b)
    }
}

/// A name that lives as long as the program (module names are `&'static str`; a model is
/// built a few times per run).
fn leak(name: &str) -> &'static str {
    Box::leak(name.to_string().into_boxed_str())
}

/// The width of `name`'s widest encoder at size `size` (CLIP's vision tower at size 1: 1024).
pub fn widest(name: &str, size: f64) -> Result<usize> {
    let spec = mosaic_zoo::model(name).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    Ok((spec.modules.iter())
        .filter(|m| m.role == Role::Encoder)
        .map(|m| Shape::of(m, size).dims.dim)
        .max()
        .unwrap_or(0))
}

/// One transformer block of a zoo encoder.
#[derive(Debug, Clone, Copy)]
pub struct EncoderBlock {
    /// Its dimensions (`layers` as in the whole encoder).
    pub dims: BlockDims,
    /// The tokens it runs over.
    pub tokens: usize,
    /// Whether its attention is causal.
    pub causal: bool,
}

/// The transformer block of the zoo model `name`'s encoder `module` at size `size`; an error
/// naming the model's encoders when it has no such one.
pub fn encoder_block(
    name: &str,
    module: &str,
    size: f64,
) -> std::result::Result<EncoderBlock, String> {
    let spec = mosaic_zoo::model(name).map_err(|e| e.to_string())?;
    let encoders: Vec<_> = (spec.modules.iter())
        .filter(|m| m.role == Role::Encoder)
        .collect();
    match encoders.iter().find(|m| m.name == module) {
        Some(m) => {
            let shape = Shape::of(m, size);
            Ok(EncoderBlock {
                dims: shape.dims,
                tokens: shape.tokens,
                causal: shape.causal,
            })
        }
        None => Err(format!(
            "{name} has no encoder \"{module}\"; its encoders: {}",
            encoders
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Builds the zoo model `name` (`clip` or `imagebind`) at size `size`, parameters and data
/// from `seed`, each module's parameters on `place(module)`, its products in bf16 there if that
/// is a GPU.
pub fn build(name: &str, seed: u64, size: f64, place: &dyn Fn(&str) -> Device) -> Result<Model> {
    let products = |device: &Device| {
        if device.is_cuda() {
            DType::BF16
        } else {
            DType::F32
        }
    };
    build_computing(name, seed, size, place, &products)
}

/// [`build`], each module's products in the dtype `products` gives for its device (the tests
/// run the GPU's bf16 form on a CPU).
fn build_computing(
    name: &str,
    seed: u64,
    size: f64,
    place: &dyn Fn(&str) -> Device,
    products: &dyn Fn(&Device) -> DType,
) -> Result<Model> {
    if !(size > 0.0 && size <= 1.0) {
        candle_core::bail!("size {size}: expected a factor in (0, 1]");
    }
    let spec = mosaic_zoo::model(name).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let builder = |module: &str| {
        let device = place(module);
        let compute = products(&device);
        ParamBuilder::new(
            SplitMix64::stream(seed, &format!("init/{module}"), 0),
            &device,
        )
        .computing_in(compute)
    };
    let mut modules = Vec::new();
    let mut sources = Vec::new();
    let mut widths = Vec::new();
    for m in spec.modules.iter().filter(|m| m.role == Role::Encoder) {
        let shape = Shape::of(m, size);
        let name = leak(&m.name);
        let mut p = builder(name);
        let dim = shape.dims.dim;
        let embed = match shape.reads {
            Reads::Patches(width) => {
                Embed::Patches(Linear::new(&mut p, "patch_embed", width, dim)?)
            }
            Reads::Tokens(vocab) => Embed::Tokens(p.normal("token_embed", &[vocab, dim], 0.02)?),
        };
        let net = Encoder {
            embed,
            pos: p.normal("pos_embed", &[shape.tokens, dim], 0.02)?,
            blocks: Block::stack(&mut p, shape.dims, shape.causal)?,
            ln: LayerNorm::new(&mut p, "ln", dim)?,
            pool_last: shape.causal,
            recompute: AtomicBool::new(false),
        };
        let mut rng = SplitMix64::stream(seed, &format!("zoo/patterns/{name}"), 0);
        let patterns = match shape.reads {
            Reads::Patches(width) => (0..ATTRS * VALUES)
                .map(|_| rng.normals(shape.tokens * width, 0.5))
                .collect(),
            Reads::Tokens(_) => Vec::new(),
        };
        sources.push(Source {
            name,
            shape,
            patterns,
        });
        widths.push(dim);
        modules.push(Module {
            name,
            inputs: vec![Input::Data(name)],
            coupling: Coupling::Sharded,
            output: Output::Activation,
            params: p.finish(),
            trainable: m.trainable,
            net: Box::new(net),
        });
    }
    let head = spec
        .modules
        .iter()
        .find(|m| m.role == Role::Head)
        .expect("clip and imagebind end in a contrastive head");
    let name = leak(&head.name);
    let mut p = builder(name);
    let joint = scale(head.hidden as u64, size, 4);
    let projections = widths
        .iter()
        .enumerate()
        .map(|(i, &w)| p.normal(&format!("proj_{i}"), &[joint, w], (w as f64).powf(-0.5)))
        .collect::<Result<Vec<_>>>()?;
    let align = Align {
        projections,
        logit_scale: p.constant("logit_scale", &[1], (1.0f32 / 0.07).ln())?,
        compute: p.compute_dtype(),
    };
    modules.push(Module {
        name,
        inputs: (0..widths.len()).map(Input::Module).collect(),
        coupling: Coupling::Gathered,
        output: Output::Loss,
        params: p.finish(),
        trainable: head.trainable,
        net: Box::new(align),
    });
    Ok(Model {
        name: leak(&spec.name),
        description: leak(&spec.description),
        seed,
        layout: TextLayout::Packed,
        size,
        modules,
        data: Box::new(ZooData { sources, seed }),
    })
}

#[cfg(test)]
mod tests {
    use super::super::nn::to_f32s;
    use super::*;

    #[test]
    fn a_patch_input_is_its_attributes_patterns_summed_in_order() {
        let m = (encoders("imagebind").into_iter())
            .find(|m| matches!(Shape::of(m, 0.05).reads, Reads::Patches(_)))
            .expect("an encoder reading patches");
        let shape = Shape::of(&m, 0.05);
        let Reads::Patches(width) = shape.reads else {
            unreachable!()
        };
        let n = shape.tokens * width;
        let mut rng = SplitMix64::new(9);
        let patterns: Vec<Vec<f32>> = (0..ATTRS * VALUES).map(|_| rng.normals(n, 0.5)).collect();
        let data = ZooData {
            sources: vec![Source {
                name: "x",
                shape,
                patterns: patterns.clone(),
            }],
            seed: 4,
        };
        let got = to_f32s(&data.batch(3, 5, &Device::Cpu).unwrap().tensors["x"]).unwrap();
        // Each sample's attributes as the batch draws them, and each value the sum of their
        // patterns' values, in attribute order.
        let mut rng = SplitMix64::stream(4, "zoo/batch", 3);
        let attrs: Vec<[usize; ATTRS]> = (0..5)
            .map(|_| std::array::from_fn(|_| rng.below(VALUES as u64) as usize))
            .collect();
        let want: Vec<f32> = (attrs.iter())
            .flat_map(|a| {
                let patterns = &patterns;
                (0..n).map(move |i| (0..ATTRS).map(|j| patterns[j * VALUES + a[j]][i]).sum())
            })
            .collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
    }

    #[test]
    fn an_unknown_encoder_is_named_with_the_ones_there_are() {
        let message = encoder_block("clip", "audio", 0.05).unwrap_err();
        assert!(
            message.contains("\"audio\"") && message.contains("vision, text"),
            "{message}"
        );
    }

    fn encoders(name: &str) -> Vec<ModuleSpec> {
        let spec = mosaic_zoo::model(name).unwrap();
        spec.modules
            .into_iter()
            .filter(|m| m.role == Role::Encoder)
            .collect()
    }

    #[test]
    fn at_size_one_every_encoder_has_the_zoos_shape() {
        for name in ["clip", "imagebind"] {
            for m in encoders(name) {
                let s = Shape::of(&m, 1.0);
                let d = s.dims;
                let want = (m.layers, m.hidden, m.heads, m.ffn, m.tokens, m.causal);
                let got = (d.layers, d.dim, d.heads, d.mlp, s.tokens, s.causal);
                let got = (
                    got.0 as u32,
                    got.1 as u32,
                    got.2 as u32,
                    got.3 as u32,
                    got.4 as u32,
                    got.5,
                );
                assert_eq!(got, want, "{name}/{}", m.name);
            }
        }
        let clip = encoders("clip");
        // ViT-L/14 on 512² images: 3×14×14 pixels a patch, 36² patches + CLS; CLIP's BPE.
        assert_eq!(Shape::of(&clip[0], 1.0).reads, Reads::Patches(588));
        assert_eq!(Shape::of(&clip[0], 1.0).tokens, 1297);
        assert_eq!(Shape::of(&clip[1], 1.0).reads, Reads::Tokens(49408));
        let imu = encoders("imagebind").pop().unwrap();
        assert_eq!(Shape::of(&imu, 1.0).reads, Reads::Patches(48));
    }

    #[test]
    fn tiny_sizes_keep_every_dimension_above_its_floor() {
        for m in encoders("imagebind") {
            let s = Shape::of(&m, 1e-6);
            assert_eq!((s.dims.layers, s.dims.heads, s.dims.dim), (1, 1, 4));
            assert!(s.dims.mlp >= 4 && s.tokens == 2);
            assert!(matches!(s.reads, Reads::Patches(4) | Reads::Tokens(16)));
        }
    }

    /// The loss of `model` on its first batch of `batch` samples, one replica per module, and
    /// the gradient of every parameter (frozen ones too: the test back-propagates through all).
    fn loss_and_grads(model: &Model, batch: usize) -> (f32, Vec<(String, Vec<f32>)>) {
        let data = model.data.batch(0, batch, &Device::Cpu).unwrap();
        let shard = &super::super::model::shards(batch, 1)[0];
        let mut outputs: Vec<Tensor> = Vec::new();
        for m in &model.modules {
            let inputs: Vec<Tensor> = (m.inputs.iter())
                .map(|i| match i {
                    Input::Data(name) => data.tensors[name].clone(),
                    Input::Module(k) => outputs[*k].clone(),
                })
                .collect();
            outputs.push(m.net.forward(&inputs, shard).unwrap());
        }
        let loss = outputs.last().unwrap();
        assert_eq!(loss.dtype(), DType::F32, "{}: the loss is f32", model.name);
        let grads = loss.backward().unwrap();
        let named = (model.modules.iter())
            .flat_map(|m| m.params.iter().map(move |(n, v)| (m.name, n, v)))
            .map(|(m, n, v)| {
                let g = grads
                    .get(v.as_tensor())
                    .unwrap_or_else(|| panic!("{m}.{n}: none"));
                (format!("{m}.{n}"), to_f32s(g).unwrap())
            })
            .collect();
        (loss.to_scalar::<f32>().unwrap(), named)
    }

    #[test]
    fn with_bf16_products_as_on_a_gpu_every_parameter_learns_and_the_loss_matches_f32() {
        // The GPU's precision run on the CPU: products, projections and attention in bf16, the
        // residual stream, norms and loss in f32. A dtype that does not meet another fails here,
        // not first on a GPU.
        for name in ["clip", "imagebind"] {
            let run = |dtype: DType| {
                let model = build_computing(name, 3, 0.02, &|_| Device::Cpu, &|_| dtype).unwrap();
                loss_and_grads(&model, 4)
            };
            let ((bf16, grads), (f32, _)) = (run(DType::BF16), run(DType::F32));
            for (param, g) in &grads {
                assert!(g.iter().all(|v| v.is_finite()), "{name}: {param}");
                assert!(
                    g.iter().any(|&v| v != 0.0),
                    "{name}: {param} got no gradient"
                );
            }
            let err = (bf16 - f32).abs() / f32.abs();
            assert!(
                err < 2e-2,
                "{name}: loss {bf16} in bf16 against {f32} in f32"
            );
        }
    }

    #[test]
    fn a_size_outside_zero_to_one_is_refused() {
        for size in [0.0, -1.0, 1.5, f64::NAN] {
            assert!(build("clip", 0, size, &|_| Device::Cpu).is_err(), "{size}");
        }
    }
}
