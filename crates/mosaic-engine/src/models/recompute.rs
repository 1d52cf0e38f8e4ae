//! Activation recomputation (gradient checkpointing, Chen et al. 2016; Megatron-LM's full
//! recomputation): a stack of transformer blocks whose forward pass keeps only each block's
//! input, and whose backward pass runs each block forward again, with its tape, just before
//! back-propagating through it. The tape then holds one block's activations at a time instead
//! of every block's — what lets real-size CLIP train at per-GPU batch 16 here, where candle's
//! unfused attention keeps several `batch × heads × tokens²` score tensors per block — for one
//! more forward pass per block. The zoo's device model assumes the same of a module whose
//! activations do not fit (`mosaic_zoo::analytic`).
//!
//! Each block becomes one node of candle's tape on its input ([`super::grad_op`]): its value is
//! the block's output, computed beforehand from the detached input (so no tape is kept), and
//! its backward pass recomputes the block with its tape and back-propagates through it.
//! candle's custom ops return only their input's gradient, so the parameters' gradients go to a
//! per-thread stash, which [`Module::replica_backward`](super::model::Module) merges after
//! `backward` (candle runs a backward pass on the calling thread).

use std::cell::RefCell;

use candle_core::{Result, Tensor, TensorId, Var};

use super::grad_op::{backward_from, with_backward};
use super::nn::Block;

thread_local! {
    /// Parameter gradients the blocks' backward passes produced on this thread.
    static STASH: RefCell<Vec<(TensorId, Tensor)>> = const { RefCell::new(Vec::new()) };
}

/// Where this thread's stash ends now: a backward pass takes what is added after it.
pub(crate) fn stash_mark() -> usize {
    STASH.with(|s| s.borrow().len())
}

/// Takes the parameter gradients stashed on this thread after `mark`. Backward passes nest on
/// one thread (a thread waiting inside one runs another replica's to completion), so the
/// stash is a stack and each pass takes its own top.
pub(crate) fn take_stash(mark: usize) -> Vec<(TensorId, Tensor)> {
    STASH.with(|s| {
        let mut s = s.borrow_mut();
        let mark = mark.min(s.len());
        s.split_off(mark)
    })
}

/// Runs `blocks` on `x` (each attention with the additive `mask`), keeping only each block's
/// input on the tape (see the module documentation). Same values and gradients as
/// [`super::nn::run_blocks_masked`].
pub fn run_blocks_recomputing(
    blocks: &[Block],
    mut x: Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    for block in blocks {
        let y = block.forward_masked(&x.detach(), mask)?;
        let (block, mask) = (block.clone(), mask.cloned());
        let backward =
            move |x: &Tensor, _y: &Tensor, grad: &Tensor| recompute(&block, mask.as_ref(), x, grad);
        x = with_backward(&x, y, "recomputed-block", Box::new(backward))?;
    }
    Ok(x)
}

/// Runs `block` again from its input `x`, with its tape, and back-propagates `grad` (the
/// gradient of its output) through it: the input's gradient is returned, the parameters' are
/// stashed.
fn recompute(
    block: &Block,
    mask: Option<&Tensor>,
    x: &Tensor,
    grad: &Tensor,
) -> Result<Option<Tensor>> {
    let input = Var::from_tensor(&x.detach())?;
    let y = block.forward_masked(input.as_tensor(), mask)?;
    let grads = backward_from(&y, grad)?;
    STASH.with(|s| {
        let mut s = s.borrow_mut();
        for p in block.params() {
            if let Some(g) = grads.get(p) {
                s.push((p.id(), g.clone()));
            }
        }
    });
    Ok(grads.get(input.as_tensor()).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::tape_bytes;
    use crate::models::nn::{run_blocks, BlockDims, ParamBuilder};
    use candle_core::Device;
    use mosaic_kit::rng::SplitMix64;

    fn stack(layers: usize) -> (Vec<Block>, crate::models::nn::Params) {
        let mut pb = ParamBuilder::new(SplitMix64::new(3), &Device::Cpu);
        let dims = BlockDims {
            dim: 16,
            heads: 2,
            mlp: 32,
            layers,
        };
        let blocks = (0..layers)
            .map(|i| Block::new(&mut pb, &format!("b{i}"), dims, false))
            .collect::<Result<Vec<_>>>()
            .unwrap();
        (blocks, pb.finish())
    }

    /// The loss `Σ y ⊙ w` of a stack's output, and every parameter's and the input's
    /// gradient, with or without recomputation.
    fn grads(recompute: bool) -> (f32, Vec<Vec<f32>>, usize) {
        let (blocks, params) = stack(3);
        let x = Var::from_tensor(
            &Tensor::from_vec(
                SplitMix64::new(5).normals(2 * 7 * 16, 1.0),
                (2, 7, 16),
                &Device::Cpu,
            )
            .unwrap(),
        )
        .unwrap();
        let w = Tensor::from_vec(
            SplitMix64::new(6).normals(2 * 7 * 16, 1.0),
            (2, 7, 16),
            &Device::Cpu,
        )
        .unwrap();
        let y = if recompute {
            run_blocks_recomputing(&blocks, x.as_tensor().clone(), None).unwrap()
        } else {
            run_blocks(&blocks, x.as_tensor().clone()).unwrap()
        };
        let tape = tape_bytes(&y, &params) as usize;
        let loss = y.mul(&w).unwrap().sum_all().unwrap();
        let mark = stash_mark();
        let store = loss.backward().unwrap();
        let stash = take_stash(mark);
        let mut out = vec![store
            .get(x.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()];
        for (_, v) in params.iter() {
            let g = match store.get(v.as_tensor()) {
                Some(g) => g.clone(),
                None => stash
                    .iter()
                    .find(|(id, _)| *id == v.id())
                    .unwrap()
                    .1
                    .clone(),
            };
            out.push(g.flatten_all().unwrap().to_vec1().unwrap());
        }
        (loss.to_scalar().unwrap(), out, tape)
    }

    #[test]
    fn nested_backward_passes_take_their_own_stash() {
        let push = |v: f32| {
            let t = Tensor::new(&[v], &Device::Cpu).unwrap();
            STASH.with(|s| s.borrow_mut().push((t.id(), t)));
        };
        let values = |taken: Vec<(TensorId, Tensor)>| -> Vec<f32> {
            taken
                .iter()
                .map(|(_, t)| t.to_vec1::<f32>().unwrap()[0])
                .collect()
        };
        let outer = stash_mark();
        push(1.0);
        // A waiting thread runs another replica's backward pass to completion.
        let inner = stash_mark();
        push(2.0);
        push(3.0);
        assert_eq!(values(take_stash(inner)), [2.0, 3.0]);
        push(4.0);
        assert_eq!(values(take_stash(outer)), [1.0, 4.0]);
        assert_eq!(stash_mark(), outer);
    }

    #[test]
    fn recomputation_gives_the_same_gradients_from_a_smaller_tape() {
        let (loss, plain, plain_tape) = grads(false);
        let (loss_r, recomputed, tape) = grads(true);
        assert_eq!(loss, loss_r);
        assert_eq!(plain.len(), recomputed.len());
        for (a, b) in plain.iter().zip(&recomputed) {
            let scale = a.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
            let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(diff / scale < 1e-5, "{diff} of {scale}");
        }
        // Each block's input and the output only (4 tensors of 2 × 7 × 16 f32), against the
        // whole tape of three blocks.
        assert!(tape <= 4 * 2 * 7 * 16 * 4, "{tape} bytes");
        assert!(plain_tape > 5 * tape, "{plain_tape} vs {tape}");
        assert_eq!(stash_mark(), 0, "the stash is taken");
    }
}

/// The tape of real-size CLIP ViT-L/14 vision blocks (24 × 1024 wide, 16 heads, MLP 4096, 1297
/// tokens) at batch 1 with bf16 products, with and without recomputation: what
/// the README's memory figures rest on. Ignored (a few GB and seconds on the CPU):
/// `cargo test -p mosaic-engine --profile ci --lib tape_of_real_size -- --ignored --nocapture`.
#[cfg(test)]
mod real_size {
    use super::*;
    use crate::measure::tape_bytes;
    use crate::models::nn::{run_blocks, BlockDims, ParamBuilder};
    use candle_core::{DType, Device};
    use mosaic_kit::rng::SplitMix64;

    #[test]
    #[ignore]
    fn tape_of_real_size_clip_vision_blocks() {
        let layers = 2;
        let dims = BlockDims {
            dim: 1024,
            heads: 16,
            mlp: 4096,
            layers,
        };
        let mut pb = ParamBuilder::new(SplitMix64::new(1), &Device::Cpu).computing_in(DType::BF16);
        let blocks = Block::stack(&mut pb, dims, false).unwrap();
        let params = pb.finish();
        let x = Tensor::zeros((1, 1297, 1024), DType::F32, &Device::Cpu).unwrap();
        let x = Var::from_tensor(&x).unwrap();
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let plain = tape_bytes(
            &run_blocks(&blocks, x.as_tensor().clone()).unwrap(),
            &params,
        );
        let kept = tape_bytes(
            &run_blocks_recomputing(&blocks, x.as_tensor().clone(), None).unwrap(),
            &params,
        );
        let per_block = plain / layers as u64;
        println!(
            "batch 1, per block: {:.3} GiB on the tape without recomputation, {:.4} GiB kept \
             with it; at batch 16 over 24 blocks: {:.1} GiB against {:.2} GiB kept + {:.1} GiB \
             for the block being recomputed",
            gib(per_block),
            gib(kept / layers as u64),
            gib(per_block * 16 * 24),
            gib(kept / layers as u64 * 16 * 24),
            gib(per_block * 16)
        );
        assert!(kept * 20 < plain);
    }
}
