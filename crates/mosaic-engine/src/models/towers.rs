//! Encoder towers shared by the built-in models: a ViT over image patches, a token
//! transformer over text, and a frame transformer over audio spectrograms.

use candle_core::{Result, Tensor};

use super::model::{Net, Shard, TextLayout};
use super::nn::{run_blocks, run_blocks_masked, Block, BlockDims, LayerNorm, Linear, ParamBuilder};
use super::packed::{check_lengths, key_mask, Packing};

/// What a tower hands to the next module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// The first token (a ViT's CLS token): `[batch, dim]`.
    First,
    /// The last token (CLIP's text tower reads the end-of-text token): `[batch, dim]`.
    Last,
    /// Every token: `[batch, tokens, dim]`.
    Sequence,
}

fn pool(x: Tensor, how: Pool) -> Result<Tensor> {
    let t = x.dim(1)?;
    match how {
        Pool::First => x.narrow(1, 0, 1)?.squeeze(1),
        Pool::Last => x.narrow(1, t - 1, 1)?.squeeze(1),
        Pool::Sequence => Ok(x),
    }
}

/// A ViT (Dosovitskiy et al. 2021) on a square single-channel image: non-overlapping
/// patches, a linear patch embedding, an optional CLS token, learned positions, pre-norm
/// blocks and a final norm. Input `[batch, side, side]`.
pub struct Vit {
    side: usize,
    patch: usize,
    embed: Linear,
    cls: Option<Tensor>,
    pos: Tensor,
    blocks: Vec<Block>,
    ln: LayerNorm,
    pool: Pool,
}

impl Vit {
    /// A ViT on `side`×`side` images cut into `patch`×`patch` patches; `cls` prepends a
    /// learned token (and `Pool::First` returns it).
    pub fn new(
        pb: &mut ParamBuilder,
        side: usize,
        patch: usize,
        dims: BlockDims,
        cls: bool,
        pool: Pool,
    ) -> Result<Vit> {
        let tokens = (side / patch).pow(2) + usize::from(cls);
        Ok(Vit {
            side,
            patch,
            embed: Linear::new(pb, "patch_embed", patch * patch, dims.dim)?,
            cls: if cls {
                Some(pb.normal("cls", &[1, 1, dims.dim], 0.02)?)
            } else {
                None
            },
            pos: pb.normal("pos", &[tokens, dims.dim], 0.02)?,
            blocks: Block::stack(pb, dims, false)?,
            ln: LayerNorm::new(pb, "ln", dims.dim)?,
            pool,
        })
    }
}

impl Net for Vit {
    fn forward(&self, inputs: &[Tensor], _shard: &Shard) -> Result<Tensor> {
        let image = &inputs[0];
        let n = image.dim(0)?;
        let (g, p) = (self.side / self.patch, self.patch);
        let patches = image
            .reshape((n, g, p, g, p))?
            .permute((0, 1, 3, 2, 4))?
            .reshape((n, g * g, p * p))?;
        let mut x = self.embed.forward(&patches)?;
        if let Some(cls) = &self.cls {
            let dim = x.dim(2)?;
            x = Tensor::cat(&[&cls.broadcast_as((n, 1, dim))?, &x], 1)?;
        }
        let x = run_blocks(&self.blocks, x.broadcast_add(&self.pos)?)?;
        pool(self.ln.forward(&x)?, self.pool)
    }
}

/// A transformer over token ids `[batch, tokens]` (u32): token and position embeddings,
/// pre-norm blocks (causal for CLIP's text tower), a final norm.
///
/// Its inputs are the ids and, optionally, the samples' lengths `[batch]` (u32, `1..=tokens`):
/// tokens past a sample's length are padding and change nothing. With lengths, [`Pool::Last`]
/// reads a sample's last token, and [`Pool::Sequence`] returns zeros at its padding.
pub struct TextTower {
    tokens: Tensor,
    pos: Tensor,
    blocks: Vec<Block>,
    ln: LayerNorm,
    pool: Pool,
    layout: TextLayout,
}

impl TextTower {
    /// A tower over a `vocab`-token vocabulary and `len`-token texts, packing samples that have
    /// lengths ([`TextLayout::Packed`]).
    pub fn new(
        pb: &mut ParamBuilder,
        vocab: usize,
        len: usize,
        dims: BlockDims,
        causal: bool,
        pool: Pool,
    ) -> Result<TextTower> {
        Ok(TextTower {
            tokens: pb.normal("token_embed", &[vocab, dims.dim], 0.02)?,
            pos: pb.normal("pos", &[len, dims.dim], 0.02)?,
            blocks: Block::stack(pb, dims, causal)?,
            ln: LayerNorm::new(pb, "ln", dims.dim)?,
            pool,
            layout: TextLayout::Packed,
        })
    }

    /// The same tower running samples with lengths in `layout`.
    pub fn with_layout(self, layout: TextLayout) -> TextTower {
        TextTower { layout, ..self }
    }

    /// The tower on `ids` `[n, tokens]` whose samples have `lengths` (`None`: all full),
    /// laid out as `layout`; rows of the output follow the samples' order.
    pub fn run(&self, ids: &Tensor, lengths: Option<&[u32]>, layout: TextLayout) -> Result<Tensor> {
        let (n, t) = ids.dims2()?;
        let Some(lengths) = lengths else {
            let x = self.embed(&ids.flatten_all()?, None)?.reshape((n, t, ()))?;
            let x = run_blocks(&self.blocks, x)?;
            return pool(self.ln.forward(&x)?, self.pool);
        };
        if lengths.len() != n {
            return Err(candle_core::Error::Msg(format!(
                "{} lengths for {n} samples",
                lengths.len()
            )));
        }
        let packing = match layout {
            TextLayout::Packed => Packing::new(lengths, t)?,
            TextLayout::Padded => {
                check_lengths(lengths, t)?;
                return self.padded(ids, lengths);
            }
        };
        self.packed(ids, lengths, &packing)
    }

    /// Token plus position embeddings of flat `ids`, at `positions` (`None`: `0..tokens`
    /// repeated, the ids being `[n · tokens]`).
    fn embed(&self, ids: &Tensor, positions: Option<&Tensor>) -> Result<Tensor> {
        let x = self.tokens.index_select(ids, 0)?;
        match positions {
            Some(p) => x + self.pos.index_select(p, 0)?,
            None => {
                let (t, dim) = self.pos.dims2()?;
                x.reshape(((), t, dim))?
                    .broadcast_add(&self.pos)?
                    .reshape(((), dim))
            }
        }
    }

    /// One sample per row, keys past each sample's length masked.
    fn padded(&self, ids: &Tensor, lengths: &[u32]) -> Result<Tensor> {
        let (n, t) = ids.dims2()?;
        let dev = ids.device();
        let x = self.embed(&ids.flatten_all()?, None)?.reshape((n, t, ()))?;
        let mask = key_mask(lengths, t, dev)?;
        let x = self
            .ln
            .forward(&run_blocks_masked(&self.blocks, x, Some(&mask))?)?;
        let dim = x.dim(2)?;
        match self.pool {
            Pool::First => pool(x, Pool::First),
            Pool::Last => {
                let at: Vec<u32> = (lengths.iter().enumerate())
                    .map(|(i, &l)| (i * t) as u32 + l - 1)
                    .collect();
                let at = Tensor::from_vec(at, n, dev)?;
                x.reshape((n * t, dim))?.index_select(&at, 0)
            }
            Pool::Sequence => {
                let valid: Vec<f32> = (lengths.iter())
                    .flat_map(|&l| (0..t).map(move |p| f32::from(u8::from(p < l as usize))))
                    .collect();
                x.broadcast_mul(&Tensor::from_vec(valid, (n, t, 1), dev)?)
            }
        }
    }

    /// Samples packed by `packing` into rows of `tokens`, a block-diagonal mask; the outputs
    /// gathered back into the samples' order.
    fn packed(&self, ids: &Tensor, lengths: &[u32], packing: &Packing) -> Result<Tensor> {
        let (n, t) = ids.dims2()?;
        let dev = ids.device();
        let slots = packing.slots();
        let (at, positions) = packing.gather(t);
        let ids = ids
            .flatten_all()?
            .index_select(&Tensor::from_vec(at, slots, dev)?, 0)?;
        let positions = Tensor::from_vec(positions, slots, dev)?;
        let rows = packing.rows().len();
        let x = self.embed(&ids, Some(&positions))?.reshape((rows, t, ()))?;
        let mask = packing.mask(dev)?;
        let x = self
            .ln
            .forward(&run_blocks_masked(&self.blocks, x, Some(&mask))?)?;
        let dim = x.dim(2)?;
        let flat = x.reshape((slots, dim))?;
        let pick = |at: Vec<u32>, from: &Tensor| -> Result<Tensor> {
            let count = at.len();
            from.index_select(&Tensor::from_vec(at, count, dev)?, 0)
        };
        match self.pool {
            Pool::First => pick((0..n).map(|s| packing.slot(s, 0) as u32).collect(), &flat),
            Pool::Last => pick(
                (lengths.iter().enumerate())
                    .map(|(s, &l)| packing.slot(s, l as usize - 1) as u32)
                    .collect(),
                &flat,
            ),
            Pool::Sequence => {
                // Padding reads an appended row of zeros.
                let zero = Tensor::zeros((1, dim), flat.dtype(), dev)?;
                let padded = Tensor::cat(&[&flat, &zero], 0)?;
                let at = (lengths.iter().enumerate())
                    .flat_map(|(s, &l)| {
                        (0..t).map(move |p| {
                            if p < l as usize {
                                packing.slot(s, p) as u32
                            } else {
                                slots as u32
                            }
                        })
                    })
                    .collect();
                pick(at, &padded)?.reshape((n, t, dim))
            }
        }
    }
}

impl Net for TextTower {
    /// `inputs`: the ids `[n, tokens]` and, optionally, the lengths `[n]`.
    fn forward(&self, inputs: &[Tensor], _shard: &Shard) -> Result<Tensor> {
        let lengths: Option<Vec<u32>> = inputs.get(1).map(|l| l.to_vec1()).transpose()?;
        self.run(&inputs[0], lengths.as_deref(), self.layout)
    }
}

/// A transformer over spectrogram frames `[batch, frames, mels]`: a linear frame embedding,
/// positions, pre-norm blocks, a final norm; returns every frame.
pub struct AudioTower {
    embed: Linear,
    pos: Tensor,
    blocks: Vec<Block>,
    ln: LayerNorm,
}

impl AudioTower {
    /// A tower over `frames` frames of `mels` bins.
    pub fn new(
        pb: &mut ParamBuilder,
        frames: usize,
        mels: usize,
        dims: BlockDims,
    ) -> Result<AudioTower> {
        Ok(AudioTower {
            embed: Linear::new(pb, "frame_embed", mels, dims.dim)?,
            pos: pb.normal("pos", &[frames, dims.dim], 0.02)?,
            blocks: Block::stack(pb, dims, false)?,
            ln: LayerNorm::new(pb, "ln", dims.dim)?,
        })
    }
}

impl Net for AudioTower {
    fn forward(&self, inputs: &[Tensor], _shard: &Shard) -> Result<Tensor> {
        let x = self.embed.forward(&inputs[0])?.broadcast_add(&self.pos)?;
        let x = run_blocks(&self.blocks, x)?;
        self.ln.forward(&x)
    }
}
