//! Encoder towers shared by the built-in models: a ViT over image patches, a token
//! transformer over text, and a frame transformer over audio spectrograms.

use candle_core::{Result, Tensor};

use super::model::{Net, Shard};
use super::nn::{run_blocks, Block, BlockDims, LayerNorm, Linear, ParamBuilder};

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
pub struct TextTower {
    tokens: Tensor,
    pos: Tensor,
    blocks: Vec<Block>,
    ln: LayerNorm,
    pool: Pool,
}

impl TextTower {
    /// A tower over a `vocab`-token vocabulary and `len`-token texts.
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
        })
    }
}

impl Net for TextTower {
    fn forward(&self, inputs: &[Tensor], _shard: &Shard) -> Result<Tensor> {
        let ids = &inputs[0];
        let (n, t) = ids.dims2()?;
        let dim = self.tokens.dim(1)?;
        let x = self
            .tokens
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((n, t, dim))?
            .broadcast_add(&self.pos)?;
        let x = run_blocks(&self.blocks, x)?;
        pool(self.ln.forward(&x)?, self.pool)
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
