//! `omni-tiny`: three modality encoders feeding a transformer backbone, the shape of
//! ImageBind's towers under OFASys' universal model at toy size. `vision` (a ViT), `audio` (a
//! frame transformer over a spectrogram) and `text` (a token transformer) each hand their whole
//! token sequence to `backbone`, which tags each with a learned modality embedding, runs its own
//! blocks over the concatenation (16 + 16 + 8 tokens), mean-pools and classifies.
//!
//! Data: every sample has one binary attribute per modality; the label is the 3-bit number
//! they spell (8 classes), so the backbone needs all three encoders. The image is a fixed
//! random pattern of its attribute plus noise, the spectrogram likewise, and the text is
//! random filler tokens with the attribute's token at a random position, of a skewed length
//! (log-normal, median 4 of at most 8 tokens; the `text_len` field): the text tower packs the
//! texts ([`super::packed`]) and returns zeros past each one's end, which the backbone masks
//! and leaves out of its mean.

use candle_core::{Device, Result, Tensor};

use mosaic_kit::rng::SplitMix64;

use super::data::{Batch, DataSource, Field};
use super::model::{Coupling, Input, Model, Module, Net, Output, Shard, TextLayout};
use super::nn::{
    log_softmax, one_hot, run_blocks_masked, Block, BlockDims, LayerNorm, Linear, ParamBuilder,
};
use super::packed::{check_lengths, key_mask};
use super::towers::{AudioTower, Pool, TextTower, Vit};

const ENCODER: BlockDims = BlockDims {
    dim: 32,
    heads: 4,
    mlp: 64,
    layers: 1,
};
const BACKBONE: BlockDims = BlockDims {
    dim: 32,
    heads: 4,
    mlp: 64,
    layers: 2,
};
const SIDE: usize = 16;
const PATCH: usize = 4;
const FRAMES: usize = 16;
const MELS: usize = 8;
const TEXT_LEN: usize = 8;
const VOCAB: usize = 32;
const CLASSES: usize = 8;
/// The texts' lengths: skewed, most short, a few full.
const TEXT_LENGTHS: mosaic_data::Distribution = mosaic_data::Distribution::LogNormal {
    median: 4.0,
    sigma: 0.5,
    max: TEXT_LEN as u32,
};
/// What follows a text's end (a filler; never read).
const PAD: u32 = 2;

/// The fusion transformer and its classifier; its replica's share of the mean cross-entropy.
struct Backbone {
    modality: Tensor,
    blocks: Vec<Block>,
    ln: LayerNorm,
    head: Linear,
}

impl Net for Backbone {
    /// Sharded: `inputs` are the shard's vision, audio and text sequences, labels and text
    /// lengths; text tokens past a sample's length are masked and left out of the mean.
    fn forward(&self, inputs: &[Tensor], shard: &Shard) -> Result<Tensor> {
        let tagged = (0..3)
            .map(|m| inputs[m].broadcast_add(&self.modality.get(m)?))
            .collect::<Result<Vec<_>>>()?;
        let x = Tensor::cat(&tagged.iter().collect::<Vec<_>>(), 1)?;
        let (n, t, _) = x.dims3()?;
        let lengths: Vec<u32> = inputs[4].to_vec1()?;
        check_lengths(&lengths, TEXT_LEN)?;
        // Every token but the text's padding: the first t − TEXT_LEN, then the text's own.
        let head = t.checked_sub(TEXT_LEN).ok_or_else(|| {
            candle_core::Error::Msg(format!("{t} tokens, fewer than the text's {TEXT_LEN}"))
        })?;
        let keys: Vec<u32> = lengths.iter().map(|&l| head as u32 + l).collect();
        let mask = key_mask(&keys, t, x.device())?;
        let x = self
            .ln
            .forward(&run_blocks_masked(&self.blocks, x, Some(&mask))?)?;
        let weights: Vec<f32> = (keys.iter())
            .flat_map(|&k| (0..t).map(move |p| if p < k as usize { 1.0 / k as f32 } else { 0.0 }))
            .collect();
        let weights = Tensor::from_vec(weights, (n, t, 1), x.device())?;
        let logits = self.head.forward(&x.broadcast_mul(&weights)?.sum(1)?)?;
        let labels: Vec<u32> = inputs[3].to_vec1()?;
        let targets = one_hot(&labels, CLASSES, logits.device())?;
        (log_softmax(&logits)? * targets)?
            .sum_all()?
            .affine(-1.0 / shard.batch as f64, 0.0)
    }
}

struct OmniData {
    image: [Vec<f32>; 2],
    audio: [Vec<f32>; 2],
    seed: u64,
}

impl DataSource for OmniData {
    fn fields(&self) -> Vec<Field> {
        vec![
            Field::real("audio", vec![FRAMES, MELS]),
            Field::real("image", vec![SIDE, SIDE]),
            Field::ids("label", vec![], CLASSES),
            Field::ids("text", vec![TEXT_LEN], VOCAB),
            Field::lengths("text_len", "text", TEXT_LEN),
        ]
    }

    fn batch(&self, step: u64, batch: usize, device: &Device) -> Result<Batch> {
        let mut rng = SplitMix64::stream(self.seed, "omni-tiny/batch", step);
        let (mut image, mut audio, mut text, mut label) = (vec![], vec![], vec![], vec![]);
        let lengths = mosaic_data::generate(TEXT_LENGTHS, batch, rng.next_u64());
        for &len in &lengths {
            let bits: Vec<usize> = (0..3).map(|_| rng.below(2) as usize).collect();
            let noise = rng.normals(SIDE * SIDE, 1.0);
            image.extend(self.image[bits[0]].iter().zip(&noise).map(|(p, n)| p + n));
            let noise = rng.normals(FRAMES * MELS, 1.0);
            audio.extend(self.audio[bits[1]].iter().zip(&noise).map(|(p, n)| p + n));
            let at = rng.below(u64::from(len)) as usize;
            for pos in 0..TEXT_LEN {
                text.push(if pos == at {
                    bits[2] as u32
                } else if pos >= len as usize {
                    PAD
                } else {
                    2 + rng.below(VOCAB as u64 - 2) as u32
                });
            }
            label.push((4 * bits[0] + 2 * bits[1] + bits[2]) as u32);
        }
        let mut b = Batch::default();
        let t = &mut b.tensors;
        t.insert(
            "image",
            Tensor::from_vec(image, (batch, SIDE, SIDE), device)?,
        );
        t.insert(
            "audio",
            Tensor::from_vec(audio, (batch, FRAMES, MELS), device)?,
        );
        t.insert("text", Tensor::from_vec(text, (batch, TEXT_LEN), device)?);
        t.insert("label", Tensor::from_vec(label, batch, device)?);
        t.insert("text_len", Tensor::from_vec(lengths, batch, device)?);
        Ok(b)
    }
}

/// Builds `omni-tiny` with parameters and data drawn from `seed`, its text tower running
/// texts as `layout` says.
pub fn build(seed: u64, place: &dyn Fn(&str) -> Device, layout: TextLayout) -> Result<Model> {
    let pb = |name: &str| {
        ParamBuilder::new(
            SplitMix64::stream(seed, &format!("init/{name}"), 0),
            &place(name),
        )
    };
    let encoder =
        |name: &'static str, data: &'static str, net: Box<dyn Net>, p: ParamBuilder| Module {
            name,
            inputs: vec![Input::Data(data)],
            coupling: Coupling::Sharded,
            output: Output::Activation,
            params: p.finish(),
            trainable: true,
            net,
        };

    let mut p = pb("vision");
    let net = Vit::new(&mut p, SIDE, PATCH, ENCODER, false, Pool::Sequence)?;
    let vision = encoder("vision", "image", Box::new(net), p);

    let mut p = pb("audio");
    let net = AudioTower::new(&mut p, FRAMES, MELS, ENCODER)?;
    let audio = encoder("audio", "audio", Box::new(net), p);

    let mut p = pb("text");
    let net = TextTower::new(&mut p, VOCAB, TEXT_LEN, ENCODER, false, Pool::Sequence)?
        .with_layout(layout);
    let mut text = encoder("text", "text", Box::new(net), p);
    text.inputs.push(Input::Data("text_len"));

    let mut p = pb("backbone");
    let net = Backbone {
        modality: p.normal("modality_embed", &[3, BACKBONE.dim], 0.02)?,
        blocks: Block::stack(&mut p, BACKBONE, false)?,
        ln: LayerNorm::new(&mut p, "ln", BACKBONE.dim)?,
        head: Linear::new(&mut p, "head", BACKBONE.dim, CLASSES)?,
    };
    let backbone = Module {
        name: "backbone",
        inputs: vec![
            Input::Module(0),
            Input::Module(1),
            Input::Module(2),
            Input::Data("label"),
            Input::Data("text_len"),
        ],
        coupling: Coupling::Sharded,
        output: Output::Loss,
        params: p.finish(),
        trainable: true,
        net: Box::new(net),
    };

    let mut rng = SplitMix64::stream(seed, "omni-tiny/patterns", 0);
    let mut pattern = |n: usize| rng.normals(n, 0.7);
    let data = OmniData {
        image: [pattern(SIDE * SIDE), pattern(SIDE * SIDE)],
        audio: [pattern(FRAMES * MELS), pattern(FRAMES * MELS)],
        seed,
    };
    Ok(Model {
        name: "omni-tiny",
        description: "three encoders (vision ViT, audio, text) feeding a transformer backbone \
                      that classifies (ImageBind/OFASys-like)",
        seed,
        layout,
        size: 1.0,
        modules: vec![vision, audio, text, backbone],
        data: Box::new(data),
    })
}
