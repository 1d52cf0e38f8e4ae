//! `clip-tiny`: CLIP (Radford et al., ICML 2021) at toy size. A ViT image tower and a causal
//! text transformer, each its own module, and `align`, the module that projects both into a
//! joint space and computes the symmetric InfoNCE loss over the batch with a learned
//! temperature. Module names match the zoo's `clip` (`vision`, `text` → `align`), so a plan
//! made for `--model clip` can drive `clip-tiny`.
//!
//! Data: every sample has three latent attributes, each one of 8 values (512 combinations).
//! The image (16×16) is the sum of one fixed random pattern per attribute value (σ 0.5) plus
//! noise (σ 0.2); the text has a skewed length (log-normal, median 6 tokens, 4 to 16; the
//! `text_len` field) and spells the attributes as tokens `8j + a_j`, in order and repeated
//! over its length (a quarter of the repeats random filler tokens), with an end-of-text token
//! last; the text tower reads that
//! last token (samples packed, see [`super::packed`]). The towers have to learn both encodings
//! to match pairs, so the loss falls from ln(batch).

use candle_core::{Device, Result, Tensor};

use mosaic_kit::rng::SplitMix64;

use super::data::{Batch, DataSource, Field};
use super::model::{Coupling, Input, Model, Module, Net, Output, Shard, TextLayout};
use super::nn::{l2_normalise, log_softmax, one_hot, BlockDims, ParamBuilder};
use super::towers::{Pool, TextTower, Vit};

const DIMS: BlockDims = BlockDims {
    dim: 32,
    heads: 4,
    mlp: 64,
    layers: 1,
};
const SIDE: usize = 16;
const PATCH: usize = 4;
const ATTRS: usize = 3;
const VALUES: usize = 8;
/// The text tower's length: the longest text.
const TEXT_LEN: usize = 16;
/// The shortest text: the attributes and the end-of-text token.
const TEXT_MIN: u32 = ATTRS as u32 + 1;
/// The texts' lengths: skewed, most short, a few full.
const TEXT_LENGTHS: mosaic_data::Distribution = mosaic_data::Distribution::LogNormal {
    median: 6.0,
    sigma: 0.6,
    max: TEXT_LEN as u32,
};
const VOCAB: usize = 64;
const EOT: u32 = VOCAB as u32 - 1;
/// What follows a text's end (a filler; never read: the tower masks it).
const PAD: u32 = (ATTRS * VALUES) as u32;
/// Joint embedding width.
const EMBED: usize = 32;

/// The symmetric contrastive loss of CLIP over L2-normalised projections, with a learned
/// log-temperature (initialised to ln(1/0.07), as CLIP does).
struct Align {
    visual_proj: Tensor,
    text_proj: Tensor,
    logit_scale: Tensor,
}

impl Net for Align {
    /// Gathered: `inputs` are the whole batch's image and text features; the replica returns
    /// the loss terms of its rows (image i against every text, text i against every image),
    /// divided by 2 × batch, so the replicas' shares add up to the mean loss.
    fn forward(&self, inputs: &[Tensor], shard: &Shard) -> Result<Tensor> {
        let zi = l2_normalise(&inputs[0].matmul(&self.visual_proj.t()?)?)?;
        let zt = l2_normalise(&inputs[1].matmul(&self.text_proj.t()?)?)?;
        let logits = zi
            .matmul(&zt.t()?)?
            .broadcast_mul(&self.logit_scale.exp()?)?;
        let (start, len) = (shard.rows.start, shard.rows.len());
        let targets: Vec<u32> = shard.rows.clone().map(|i| i as u32).collect();
        let targets = one_hot(&targets, shard.batch, logits.device())?;
        let image_rows = logits.narrow(0, start, len)?;
        let text_rows = logits.t()?.narrow(0, start, len)?;
        let ce = |rows: &Tensor| -> Result<Tensor> { (log_softmax(rows)? * &targets)?.sum_all() };
        let total = (ce(&image_rows)? + ce(&text_rows)?)?;
        total.affine(-1.0 / (2.0 * shard.batch as f64), 0.0)
    }
}

struct ClipData {
    /// `patterns[j][v]`: the image pattern of value `v` of attribute `j`.
    patterns: Vec<Vec<Vec<f32>>>,
    seed: u64,
}

impl ClipData {
    fn new(seed: u64) -> ClipData {
        let mut rng = SplitMix64::stream(seed, "clip-tiny/patterns", 0);
        let patterns = (0..ATTRS)
            .map(|_| (0..VALUES).map(|_| rng.normals(SIDE * SIDE, 0.5)).collect())
            .collect();
        ClipData { patterns, seed }
    }
}

impl DataSource for ClipData {
    fn fields(&self) -> Vec<Field> {
        vec![
            Field::real("image", vec![SIDE, SIDE]),
            Field::ids("text", vec![TEXT_LEN], VOCAB),
            Field::lengths("text_len", "text", TEXT_LEN),
        ]
    }

    fn batch(&self, step: u64, batch: usize, device: &Device) -> Result<Batch> {
        let mut rng = SplitMix64::stream(self.seed, "clip-tiny/batch", step);
        let mut images = Vec::with_capacity(batch * SIDE * SIDE);
        let mut tokens = Vec::with_capacity(batch * TEXT_LEN);
        let lengths: Vec<u32> = mosaic_data::generate(TEXT_LENGTHS, batch, rng.next_u64())
            .into_iter()
            .map(|l| l.max(TEXT_MIN))
            .collect();
        let fillers = u64::from(EOT) - (ATTRS * VALUES) as u64;
        for &len in &lengths {
            let attrs: Vec<usize> = (0..ATTRS)
                .map(|_| rng.below(VALUES as u64) as usize)
                .collect();
            let noise = rng.normals(SIDE * SIDE, 0.2);
            images.extend((0..SIDE * SIDE).map(|p| {
                noise[p]
                    + (0..ATTRS)
                        .map(|j| self.patterns[j][attrs[j]][p])
                        .sum::<f32>()
            }));
            // The attributes in order, repeated over the text (a filler now and then), and
            // the end token last.
            let body = len as usize - 1;
            for p in 0..TEXT_LEN {
                tokens.push(if p == body {
                    EOT
                } else if p > body {
                    PAD
                } else if p >= ATTRS && rng.chance(0.25) {
                    (ATTRS * VALUES) as u32 + rng.below(fillers) as u32
                } else {
                    (VALUES * (p % ATTRS) + attrs[p % ATTRS]) as u32
                });
            }
        }
        let mut b = Batch::default();
        b.tensors.insert(
            "image",
            Tensor::from_vec(images, (batch, SIDE, SIDE), device)?,
        );
        b.tensors
            .insert("text", Tensor::from_vec(tokens, (batch, TEXT_LEN), device)?);
        b.tensors
            .insert("text_len", Tensor::from_vec(lengths, batch, device)?);
        Ok(b)
    }
}

/// Builds `clip-tiny` with parameters and data drawn from `seed`, its text tower running
/// texts as `layout` says.
pub fn build(seed: u64, place: &dyn Fn(&str) -> Device, layout: TextLayout) -> Result<Model> {
    let pb = |name: &str| {
        ParamBuilder::new(
            SplitMix64::stream(seed, &format!("init/{name}"), 0),
            &place(name),
        )
    };

    let mut p = pb("vision");
    let vision = Vit::new(&mut p, SIDE, PATCH, DIMS, true, Pool::First)?;
    let vision = Module {
        name: "vision",
        inputs: vec![Input::Data("image")],
        coupling: Coupling::Sharded,
        output: Output::Activation,
        params: p.finish(),
        trainable: true,
        net: Box::new(vision),
    };

    let mut p = pb("text");
    let text = TextTower::new(&mut p, VOCAB, TEXT_LEN, DIMS, true, Pool::Last)?.with_layout(layout);
    let text = Module {
        name: "text",
        inputs: vec![Input::Data("text"), Input::Data("text_len")],
        coupling: Coupling::Sharded,
        output: Output::Activation,
        params: p.finish(),
        trainable: true,
        net: Box::new(text),
    };

    let mut p = pb("align");
    let std = (DIMS.dim as f64).powf(-0.5);
    let align = Align {
        visual_proj: p.normal("visual_proj", &[EMBED, DIMS.dim], std)?,
        text_proj: p.normal("text_proj", &[EMBED, DIMS.dim], std)?,
        logit_scale: p.constant("logit_scale", &[1], (1.0f32 / 0.07).ln())?,
    };
    let align = Module {
        name: "align",
        inputs: vec![Input::Module(0), Input::Module(1)],
        coupling: Coupling::Gathered,
        output: Output::Loss,
        params: p.finish(),
        trainable: true,
        net: Box::new(align),
    };

    Ok(Model {
        name: "clip-tiny",
        description: "CLIP at toy size: ViT image tower and causal text tower aligned by a \
                      contrastive head (vision, text → align)",
        seed,
        layout,
        size: 1.0,
        modules: vec![vision, text, align],
        data: Box::new(ClipData::new(seed)),
    })
}
