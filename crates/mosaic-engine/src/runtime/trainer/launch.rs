//! How a module's passes are launched on a GPU: op by op, or replayed from CUDA graphs
//! ([`crate::runtime::graphed`]).
//!
//! Every module runs its first step op by op. A module whose host then spent at least
//! [`LAUNCH_BOUND`](crate::runtime::graphed::LAUNCH_BOUND) of its passes' time issuing work
//! kept its GPU waiting for launches: its next step captures its forward pass as one graph and
//! its backward pass (without the optimizer step and the all-reduce, which stay outside) as
//! another, and later steps replay them. Capturing follows PyTorch's `make_graphed_callables`:
//! the forward graph reads its inputs from buffers of its own, into which each step copies the
//! whole batch's inputs; its replicas' tapes (candle's autograd graph, whose tensors are the
//! graph's memory) are kept for the backward graph, which reads ∂loss/∂output from a buffer of
//! its own and writes the gradients in place. A module whose pass cannot be captured, whose
//! replay does not reproduce the pass, or whose graph later fails to launch, runs op by op from
//! then on, with the reason (`Trainer::launches`).

use candle_core::{Device, Result, Tensor};

use super::{Grads, ReplicaTape, Replicas};
use crate::runtime::graphed::{
    capture, differ, gpu_bound, launch_bound, Capture, Captured, REPLAY_BOUND,
};

/// How one module's passes are launched.
pub(crate) enum Launch {
    /// Op by op, until its first step says whether it is launch-bound.
    Undecided,
    /// Op by op, and why.
    OpByOp(String),
    /// Op by op until its next step, which captures its passes.
    Capture,
    /// Replayed from its CUDA graphs.
    Graphed(Box<ModuleGraphs>),
}

impl Launch {
    /// Whether a step that applies updates captures or replays the module's passes.
    pub(super) fn replays(&self) -> bool {
        matches!(self, Launch::Capture | Launch::Graphed(_))
    }

    /// After an op-by-op step whose module spent `host_ms` of `ms` issuing its work: capture
    /// from the next step if launch-bound, else op by op for good.
    pub(super) fn decide(&mut self, host_ms: f64, ms: f64) {
        if !matches!(self, Launch::Undecided) {
            return;
        }
        *self = if launch_bound(host_ms, ms) {
            Launch::Capture
        } else {
            Launch::OpByOp(gpu_bound(host_ms, ms))
        };
    }

    /// Whether the module's forward pass is replayed from a graph.
    pub(super) fn graphed(&self) -> bool {
        matches!(self, Launch::Graphed(_))
    }

    /// Whether the module's backward pass is replayed from a graph too.
    pub(super) fn backward_graphed(&self) -> bool {
        matches!(self, Launch::Graphed(g) if matches!(g.backward, Backward::Graphed(_)))
    }

    /// What it is, in words.
    pub(super) fn describe(&self) -> String {
        match self {
            Launch::Undecided => "op by op (its first step decides)".into(),
            Launch::OpByOp(why) => format!("op by op: {why}"),
            Launch::Capture => "op by op, captured as CUDA graphs at its next step".into(),
            Launch::Graphed(g) => match &g.backward {
                Backward::Graphed(_) => "forward and backward replayed from CUDA graphs".into(),
                Backward::Pending => "forward replayed from a CUDA graph".into(),
                Backward::OpByOp(why) => {
                    format!("forward replayed from a CUDA graph, backward op by op: {why}")
                }
            },
        }
    }
}

/// A module's captured passes and the buffers they read.
pub(crate) struct ModuleGraphs {
    // Graphs and their results first: the buffers they read outlive them.
    forward: Captured<Replicas>,
    backward: Backward,
    /// The whole batch of every input, where the forward graph reads it.
    inputs: Vec<Tensor>,
    /// ∂loss/∂output of the whole batch, where the backward graph reads it (`None` for the
    /// loss module, or before the backward graph exists).
    out_grad: Option<Tensor>,
}

/// The backward pass of a module whose forward pass is graphed.
enum Backward {
    /// Captured at the module's next backward pass.
    Pending,
    /// Op by op over the forward graph's tapes, and why.
    OpByOp(String),
    /// Replayed.
    Graphed(Captured<Grads>),
}

/// The forward pass `run` (module replicas on the whole batch's inputs) of a module whose
/// `launch` [`Launch::replays`], on the whole batch's `wholes`: captured now
/// ([`Launch::Capture`]) or replayed. Returns its result (the tapes stay with the graph) and
/// whether it was replayed; a module that cannot be graphed (or whose inputs change shape)
/// runs op by op and stays so.
pub(super) fn forward(
    launch: &mut Launch,
    device: &Device,
    wholes: Vec<Tensor>,
    run: &dyn Fn(&[Tensor]) -> Result<Replicas>,
) -> Result<(Replicas, bool)> {
    match std::mem::replace(launch, Launch::Undecided) {
        Launch::Graphed(g) => {
            let replayed = load(&g.inputs, &wholes, "an input").and_then(|()| {
                (g.forward.replay().map(shared))
                    .map_err(|e| format!("its forward graph failed to launch: {e}"))
            });
            match replayed {
                Ok(out) => {
                    *launch = Launch::Graphed(g);
                    Ok((out, true))
                }
                Err(why) => {
                    // The graphs go once the stream is done with them; where the failure
                    // left the device unusable, so does the pass.
                    device.synchronize()?;
                    drop(g);
                    *launch = Launch::OpByOp(why);
                    Ok((run(&wholes)?, false))
                }
            }
        }
        Launch::Capture => {
            // Buffers of the forward graph's own (a copy: the producer's output is rewritten).
            let inputs = (wholes.iter())
                .map(|w| w.contiguous()?.copy())
                .collect::<Result<Vec<_>>>()?;
            match capture(device, &|| run(&inputs), &differ_forward, REPLAY_BOUND)? {
                Capture::Graphed(forward) => {
                    let out = shared(forward.last());
                    *launch = Launch::Graphed(Box::new(ModuleGraphs {
                        forward,
                        backward: Backward::Pending,
                        inputs,
                        out_grad: None,
                    }));
                    Ok((out, true))
                }
                Capture::Refused { why, warm } => {
                    *launch = Launch::OpByOp(why);
                    Ok((warm, false))
                }
            }
        }
        other => {
            *launch = other;
            Ok((run(&wholes)?, false))
        }
    }
}

/// A module's backward pass on this rank: from its replicas' tapes and ∂loss/∂output of the
/// whole batch (`None` for the loss module) to its gradients.
pub(super) type BackwardPass<'a> = dyn Fn(&[ReplicaTape], Option<&Tensor>) -> Result<Grads> + 'a;

/// The backward pass `run` (from the replicas' tapes and ∂loss/∂output) of a module whose
/// forward pass was replayed from its graph: captured at the first call, replayed after, or op
/// by op over the graph's tapes where it cannot be graphed.
pub(super) fn backward(
    launch: &mut Launch,
    device: &Device,
    out_grad: Option<Tensor>,
    run: &BackwardPass<'_>,
) -> Result<Grads> {
    let Launch::Graphed(g) = launch else {
        candle_core::bail!("a forward pass replayed from a graph that is gone")
    };
    let tapes = &g.forward.last().tapes;
    match &g.backward {
        Backward::Graphed(c) => {
            let loaded = match (&g.out_grad, &out_grad) {
                (Some(buffer), Some(grad)) => load(
                    std::slice::from_ref(buffer),
                    std::slice::from_ref(grad),
                    "∂loss/∂output",
                ),
                _ => Ok(()),
            };
            let replayed = loaded.and_then(|()| {
                c.replay()
                    .cloned()
                    .map_err(|e| format!("its backward graph failed to launch: {e}"))
            });
            match replayed {
                Ok(grads) => Ok(grads),
                Err(why) => {
                    // Op by op over the forward graph's tapes from now on (see above).
                    device.synchronize()?;
                    let grads = run(tapes, out_grad.as_ref());
                    g.backward = Backward::OpByOp(why);
                    grads
                }
            }
        }
        Backward::OpByOp(_) => run(tapes, out_grad.as_ref()),
        Backward::Pending => {
            let buffer = out_grad.map(|t| t.contiguous()?.copy()).transpose()?;
            let pass = || run(tapes, buffer.as_ref());
            match capture(device, &pass, &differ_backward, REPLAY_BOUND)? {
                Capture::Graphed(c) => {
                    let out = c.last().clone();
                    g.backward = Backward::Graphed(c);
                    g.out_grad = buffer;
                    Ok(out)
                }
                Capture::Refused { why, warm } => {
                    g.backward = Backward::OpByOp(why);
                    Ok(warm)
                }
            }
        }
    }
}

/// The result a trainer step hands on: the graph's output and loss (shared, rewritten by the
/// next replay), without the tapes.
fn shared(r: &Replicas) -> Replicas {
    Replicas {
        tapes: Vec::new(),
        output: r.output.clone(),
        loss: r.loss.clone(),
    }
}

/// Copies each of `values` into its buffer, on the buffer's stream; an error (what changed)
/// where one does not match its buffer's shape and type.
fn load(buffers: &[Tensor], values: &[Tensor], what: &str) -> std::result::Result<(), String> {
    for (buffer, value) in buffers.iter().zip(values) {
        if buffer.shape() != value.shape() || buffer.dtype() != value.dtype() {
            return Err(format!(
                "{what} changed from {:?} {:?} to {:?} {:?} between steps, which a CUDA graph \
                 cannot follow",
                buffer.dims(),
                buffer.dtype(),
                value.dims(),
                value.dtype()
            ));
        }
        (value.contiguous())
            .and_then(|v| buffer.slice_set(&v, 0, 0))
            .map_err(|e| format!("{what} could not be copied into its graph's buffer: {e}"))?;
    }
    Ok(())
}

/// How far a replayed forward pass is from the pass launched op by op: its output or loss.
fn differ_forward(replayed: &Replicas, warm: &Replicas) -> Result<f32> {
    let of = |r: &Replicas| r.output.clone().or_else(|| r.loss.clone());
    differ(&[of(replayed)], &[of(warm)])
}

/// How far a replayed backward pass is from the pass launched op by op: every gradient.
fn differ_backward(replayed: &Grads, warm: &Grads) -> Result<f32> {
    let all = |g: &Grads| -> Vec<Option<Tensor>> {
        let params = g.params.iter().flatten().cloned().map(Some);
        params.chain(g.inputs.iter().cloned()).collect()
    };
    differ(&all(replayed), &all(warm))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_is_graphed_when_its_host_is_at_least_half_of_its_step() {
        let mut busy = Launch::Undecided;
        busy.decide(0.5, 1.0);
        assert!(matches!(busy, Launch::Capture));
        let mut idle = Launch::Undecided;
        idle.decide(0.1, 1.0);
        assert!(
            matches!(&idle, Launch::OpByOp(why) if why.contains("10 %")),
            "{}",
            idle.describe()
        );
        // Decided once: a later step changes nothing.
        idle.decide(1.0, 1.0);
        assert!(!idle.replays());
    }

    /// A module whose capture is refused (here: no GPU) trains its step on the warm-up's
    /// result and op by op after, exactly as one never meant for graphs.
    #[test]
    fn a_refused_capture_trains_as_if_never_tried() {
        use crate::runtime::trainer::{TrainConfig, Trainer};
        use crate::Schedule;
        let build = || {
            let model = crate::models::build("clip-tiny", 0, &Device::Cpu).unwrap();
            let schedule = Schedule::sequential(&model, 1);
            Trainer::new(model, schedule, TrainConfig::default()).unwrap()
        };
        let (mut plain, mut tried) = (build(), build());
        for launch in &tried.launches {
            *launch.lock().unwrap() = Launch::Capture;
        }
        for _ in 0..3 {
            let (a, b) = (plain.step().unwrap(), tried.step().unwrap());
            assert_eq!(a.loss.to_bits(), b.loss.to_bits());
            assert!(b.stages.iter().flat_map(|s| &s.modules).all(|m| !m.graphed));
        }
        for l in tried.launches() {
            assert!(!l.graphed, "{}", l.module);
            assert!(
                l.how.starts_with("op by op: CUDA graphs need"),
                "{}: {}",
                l.module,
                l.how
            );
        }
    }

    #[test]
    fn an_input_that_changes_shape_is_refused_with_what_changed() {
        let buffer = Tensor::zeros((2, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        let same = Tensor::ones((2, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        load(std::slice::from_ref(&buffer), &[same], "an input").unwrap();
        assert_eq!(buffer.sum_all().unwrap().to_scalar::<f32>().unwrap(), 6.0);
        let wider = Tensor::ones((2, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        let e = load(&[buffer], &[wider], "an input").unwrap_err();
        assert!(e.contains("[2, 3]") && e.contains("[2, 4]"), "{e}");
    }
}
