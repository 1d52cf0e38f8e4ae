//! What the engine trains: a DAG of modules, each a separately placed unit with its own
//! parameters, fed by a [`DataSource`].
//!
//! A module reads named data tensors and the outputs of earlier modules, and produces either
//! an activation (per sample, rows = samples) for later modules or its replica's share of the
//! loss. The engine, not the module, moves tensors across module boundaries: see
//! [`crate::runtime::trainer`] for how activations and gradients cross them.

use std::ops::Range;

use candle_core::{Result, Tensor, Var};

use super::data::DataSource;
use super::nn::Params;

/// How a text tower ([`super::towers::TextTower`]) runs a batch whose samples have lengths
/// (see [`super::packed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextLayout {
    /// FlowTrain-style: samples packed into rows of the tower's length, a block-diagonal mask,
    /// positions restarting at each sample; fewer rows, so less compute (the engine's way).
    Packed,
    /// One sample per row, keys past its length masked: the reference.
    Padded,
}

/// Where a module input comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A tensor of the batch, by name (e.g. `image`).
    Data(&'static str),
    /// The output of another module, by index in [`Model::modules`].
    Module(usize),
}

/// How a module's data-parallel replicas see the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coupling {
    /// Samples are independent: replica `k` gets only the rows of its shard.
    Sharded,
    /// The module couples samples (a contrastive loss compares every pair in the batch):
    /// every replica gets the whole batch of its inputs, as CLIP training all-gathers features,
    /// and computes only its shard's terms of the loss.
    Gathered,
}

/// What a module produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A per-sample activation `[rows, ...]` consumed by later modules.
    Activation,
    /// A scalar: the replica's share of the batch loss (the shares add up to the loss, which
    /// is a mean over the whole batch).
    Loss,
}

/// The part of the batch one data-parallel replica owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// Replica index, `0..count`.
    pub index: usize,
    /// The module's data-parallel degree.
    pub count: usize,
    /// The rows (samples) of the batch this replica owns.
    pub rows: Range<usize>,
    /// Samples in the whole batch (losses are means over it).
    pub batch: usize,
}

/// Splits `batch` samples into `count` contiguous shards, the first `batch % count` one larger.
pub fn shards(batch: usize, count: usize) -> Vec<Shard> {
    let (base, extra) = (batch / count, batch % count);
    let mut start = 0;
    (0..count)
        .map(|index| {
            let len = base + usize::from(index < extra);
            let rows = start..start + len;
            start += len;
            Shard {
                index,
                count,
                rows,
                batch,
            }
        })
        .collect()
}

/// A module's computation. Implementations hold the tensors of their [`Params`] (the same
/// storage as the optimizer's variables) and must use only ops with a backward pass
/// (see [`super::nn`]). On a GPU a launch-bound module's passes are replayed from CUDA graphs
/// (`crate::runtime::graphed`), so a forward pass must depend on nothing but its inputs and
/// parameters: whatever it computes on the host from its inputs it must read back first, which
/// a capture refuses (the module then stays op by op).
pub trait Net: Send + Sync {
    /// The replica's forward pass. `inputs` follow [`Module::inputs`]: the shard's rows for a
    /// [`Coupling::Sharded`] module, the whole batch for a [`Coupling::Gathered`] one.
    fn forward(&self, inputs: &[Tensor], shard: &Shard) -> Result<Tensor>;

    /// Turns activation recomputation ([`super::recompute`]) on or off for later forward
    /// passes; returns whether this net can recompute (the default cannot).
    fn set_recompute(&self, _on: bool) -> bool {
        false
    }
}

/// A separately placed unit of a model: its inputs, its parameters and its computation.
pub struct Module {
    /// The name plans use.
    pub name: &'static str,
    /// What it reads, in the order [`Net::forward`] receives them.
    pub inputs: Vec<Input>,
    /// How its replicas see the batch.
    pub coupling: Coupling,
    /// What it produces.
    pub output: Output,
    /// Its parameters (one copy per process; in-process replicas share it).
    pub params: Params,
    /// Trained, or frozen: run forward only, its parameters never change (the zoo marks
    /// frozen modules, e.g. ImageBind's image and text encoders).
    pub trainable: bool,
    /// Its computation.
    pub net: Box<dyn Net>,
}

impl Module {
    /// Whether its replicas back-propagate: to train it, or (frozen) for the gradients of the
    /// other modules' outputs it reads. A frozen module that reads only data never does.
    pub(crate) fn back_propagates(&self) -> bool {
        self.trainable || self.inputs.iter().any(|i| matches!(i, Input::Module(_)))
    }

    /// A replica's inputs cut from the whole batch's `wholes` (in [`Module::inputs`] order):
    /// its shard's rows for a sharded module, everything for a gathered one. Inputs from other
    /// modules become fresh leaf variables (returned beside, `None` for data inputs), so that
    /// backward stops at the module boundary and yields ∂loss/∂input there.
    pub(crate) fn replica_inputs(
        &self,
        wholes: impl IntoIterator<Item = Tensor>,
        shard: &Shard,
    ) -> Result<(Vec<Tensor>, Vec<Option<Var>>)> {
        let mut xs = Vec::with_capacity(self.inputs.len());
        let mut vars = Vec::with_capacity(self.inputs.len());
        for (input, whole) in self.inputs.iter().zip(wholes) {
            let x = match self.coupling {
                Coupling::Sharded => whole.narrow(0, shard.rows.start, shard.rows.len())?,
                Coupling::Gathered => whole,
            };
            match input {
                Input::Module(_) => {
                    let v = Var::from_tensor(&x)?;
                    xs.push(v.as_tensor().clone());
                    vars.push(Some(v));
                }
                Input::Data(_) => {
                    xs.push(x);
                    vars.push(None);
                }
            }
        }
        Ok((xs, vars))
    }

    /// Back-propagates a replica's output `out` (of the batch's `rows`): from the loss share
    /// itself for the loss module, else from `Σ out ⊙ g` with `g` the rows of `out_grad`, the
    /// whole batch's ∂loss/∂output, whose gradient is exactly `g`. Returns ∂loss/∂parameter
    /// for every parameter and ∂loss/∂input at each of the replica's `inputs` variables (zeros
    /// where the graph does not reach one).
    #[allow(clippy::type_complexity)]
    pub(crate) fn replica_backward(
        &self,
        out: &Tensor,
        out_grad: Option<&Tensor>,
        rows: &Range<usize>,
        inputs: &[Option<Var>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        // Recomputed blocks hand their parameters' gradients over beside the tape: what this
        // backward pass adds to this thread's stash, even if it fails (a replica whose
        // backward pass a waiting thread runs meanwhile takes only its own, above its mark).
        let mark = super::recompute::stash_mark();
        let grads = (|| match self.output {
            Output::Loss => out.backward(),
            Output::Activation => {
                let g = out_grad
                    .expect("an activation module has a gradient for its output")
                    .narrow(0, rows.start, rows.len())?;
                super::grad_op::backward_from(out, &g)
            }
        })();
        let stash = super::recompute::take_stash(mark);
        let grads = grads?;
        let read = |v: &Var| {
            let mut g = grads.get(v.as_tensor()).cloned();
            for (_, s) in stash.iter().filter(|(id, _)| *id == v.id()) {
                g = Some(match g {
                    Some(g) => (g + s)?,
                    None => s.clone(),
                });
            }
            match g {
                Some(g) => Ok(g),
                None => v.as_tensor().zeros_like(),
            }
        };
        let params = (self.params.iter())
            .map(|(_, v)| read(v))
            .collect::<Result<Vec<_>>>()?;
        let inputs = (inputs.iter())
            .map(|v| v.as_ref().map(read).transpose())
            .collect::<Result<Vec<_>>>()?;
        Ok((params, inputs))
    }
}

/// A multimodal model the engine can train: modules in topological order and its data.
pub struct Model {
    /// Its name (`clip-tiny`, `omni-tiny`).
    pub name: &'static str,
    /// One line on what it is.
    pub description: &'static str,
    /// The seed its parameters and data were drawn from.
    pub seed: u64,
    /// How its text tower runs texts.
    pub layout: TextLayout,
    /// Its size factor (1: as built; see [`super::zoo`]).
    pub size: f64,
    /// Modules; every input of a module refers to an earlier one.
    pub modules: Vec<Module>,
    /// The data it trains on.
    pub data: Box<dyn DataSource>,
}

impl Model {
    /// What it was built from, to build it again elsewhere ([`super::build_placed`]).
    pub fn recipe(&self) -> super::Recipe {
        super::Recipe {
            name: self.name.to_string(),
            seed: self.seed,
            layout: self.layout,
            size: self.size,
        }
    }

    /// The index of the module called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.modules.iter().position(|m| m.name == name)
    }

    /// Module names, comma-separated (for error messages).
    pub fn module_names(&self) -> String {
        self.modules
            .iter()
            .map(|m| m.name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The modules `m` reads from.
    pub fn producers(&self, m: usize) -> impl Iterator<Item = usize> + '_ {
        self.modules[m].inputs.iter().filter_map(|i| match i {
            Input::Module(p) => Some(*p),
            Input::Data(_) => None,
        })
    }

    /// Scalar parameters over all modules.
    pub fn param_count(&self) -> usize {
        self.modules.iter().map(|m| m.params.count()).sum()
    }

    /// Checks the invariants the trainer relies on: producers come earlier, exactly one
    /// module (the last) produces the loss, every other module's output is consumed, and only
    /// the loss module may be gathered.
    pub(crate) fn check(&self) {
        let n = self.modules.len();
        for (i, m) in self.modules.iter().enumerate() {
            for p in self.producers(i) {
                assert!(
                    p < i,
                    "{}: module {} reads a later module",
                    self.name,
                    m.name
                );
            }
            let is_last = i + 1 == n;
            assert_eq!(
                m.output == Output::Loss,
                is_last,
                "{}: the last module, and only it, produces the loss",
                self.name
            );
            assert!(
                m.coupling == Coupling::Sharded || m.output == Output::Loss,
                "{}: only the loss module may be gathered",
                self.name
            );
            if !is_last {
                assert!(
                    (0..n).any(|c| self.producers(c).any(|p| p == i)),
                    "{}: nothing consumes module {}",
                    self.name,
                    m.name
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_batch() {
        for (batch, count) in [(16, 1), (16, 2), (16, 3), (5, 5), (7, 4)] {
            let s = shards(batch, count);
            assert_eq!(s.len(), count);
            assert_eq!(s[0].rows.start, 0);
            assert_eq!(s[count - 1].rows.end, batch);
            assert!(s.windows(2).all(|w| w[0].rows.end == w[1].rows.start));
            assert!(s.iter().all(|x| !x.rows.is_empty()));
        }
    }
}
