//! One training step of an engine model on the GPU against the CPU, then ten that must lower
//! the loss; later, a run on the GPU checkpointed and resumed, and the same steps with
//! launch-bound modules replayed from CUDA graphs.

use std::time::Instant;

use candle_core::Device;
use mosaic_kit::stats::{relative_error as rel_err, worst};

use super::{tensor, Res};
use crate::models::nn::to_f32s;
use crate::models::{self, Model};
use crate::runtime::checkpoint;
use crate::runtime::graphed::GRAPHS;
use crate::runtime::trainer::{Compute, ParamGrad, TrainConfig, Trainer};
use crate::Schedule;

/// The encoders in one stage at equal quotas, the loss module after them.
fn colocated_schedule(model: &Model) -> Schedule {
    let mut s = Schedule::sequential(model, 1);
    let last = s.stages.pop().expect("a model has modules");
    let encoders: Vec<_> = s.stages.drain(..).flatten().collect();
    let quota = 1.0 / encoders.len() as f64;
    let encoders = encoders
        .into_iter()
        .map(|mut p| {
            p.assignment.sm = quota;
            p
        })
        .collect();
    s.stages = vec![encoders, last];
    s
}

/// Largest relative error of the loss and of any gradient, GPU against CPU, and of a step's
/// loss replayed from CUDA graphs against launched op by op.
pub(super) type Bounds = (f32, f32, f32);
/// f32 on both devices. Graphs and op by op differ by LayerNorm's backward, which sums its
/// weights' gradients with atomics in no fixed order (f32 rounding, ~1e-7 of a loss), grown
/// over eleven steps; a graph replaying stale memory is off by a batch's change of loss, 1–8 %
/// (`mosaic train --model clip-tiny --steps 6` on the CPU: 2.90, 2.76, 2.80, 2.81, 2.68, 2.92).
pub(super) const F32_BOUNDS: Bounds = (1e-4, 1e-2, 1e-3);
/// bf16 products on the GPU against f32 on the CPU (bf16 keeps 8 bits of mantissa); with
/// graphs, a sum's order can tip a bf16 rounding, 4e-3 of a value.
pub(super) const BF16_BOUNDS: Bounds = (2e-2, 2e-1, 1e-2);

/// Steps trained on the GPU: the first op by op, which decides which modules are launch-bound;
/// the second captures their passes; the rest replay them.
const STEPS: usize = 11;

/// A trainer of `name` at `size` on `compute`, modules one after another or the encoders
/// `colocated`, launch-bound modules replaying CUDA graphs where `graphs`.
fn trainer(compute: Compute, name: &str, size: f64, colocated: bool, graphs: bool) -> Res<Trainer> {
    let recipe = models::Recipe {
        size,
        ..models::Recipe::new(name, 0)
    };
    let model = models::build_placed(&recipe, &|_| Device::Cpu)?;
    let schedule = if colocated {
        colocated_schedule(&model)
    } else {
        Schedule::sequential(&model, 1)
    };
    let config = TrainConfig {
        compute,
        graphs,
        ..TrainConfig::default()
    };
    Trainer::new(model, schedule, config)
}

/// The largest relative error of any of `grads` against the same parameter's in `reference`
/// (NaN where any is).
fn worst_gradient(grads: &[ParamGrad], reference: &[ParamGrad]) -> Res<f32> {
    let mut err = 0f32;
    for (g, r) in grads.iter().zip(reference) {
        let g = to_f32s(&g.grad).map_err(tensor)?;
        let r = to_f32s(&r.grad).map_err(tensor)?;
        err = worst([err, rel_err(&g, &r)]);
    }
    Ok(err)
}

/// Loss and every gradient on the GPU against the CPU (same seed, batch 16), recomputed
/// activations against kept ones, then [`STEPS`] steps on the GPU, every module launched op by
/// op, whose loss must fall; their losses are kept in `losses` for [`train_graphed`].
pub(super) fn train(
    ordinal: usize,
    (name, size, colocated): (&str, f64, bool),
    (loss_bound, grad_bound, _): Bounds,
    losses: &mut Option<Vec<f32>>,
) -> Res<(bool, String)> {
    let (cpu_loss, cpu_grads) = trainer(Compute::Cpu, name, size, colocated, false)?.gradients()?;
    let mut gpu = trainer(Compute::Cuda(ordinal), name, size, colocated, false)?;
    let (gpu_loss, gpu_grads) = gpu.gradients()?;
    let grad_err = worst_gradient(&gpu_grads, &cpu_grads)?;
    let loss_err = (gpu_loss - cpu_loss).abs() / cpu_loss.abs().max(1e-30);
    // Recomputing the encoders' activations on the GPU changes nothing (zoo-built models).
    let mut recompute_err = 0f32;
    if gpu
        .model()
        .modules
        .iter()
        .any(|m| m.net.set_recompute(true))
    {
        let (_, again) = gpu.gradients()?;
        recompute_err = worst_gradient(&again, &gpu_grads)?;
        gpu.model().modules.iter().for_each(|m| {
            m.net.set_recompute(false);
        });
    }
    let mut steps = Vec::with_capacity(STEPS);
    for _ in 0..STEPS - 1 {
        steps.push(gpu.step()?.loss);
    }
    let started = Instant::now();
    let timed = gpu.step()?;
    let wall = started.elapsed().as_secs_f64() * 1e3;
    steps.push(timed.loss);
    let (first, last) = (steps[0], steps[STEPS - 2]);
    let finite = steps.iter().all(|l| l.is_finite());
    // How much of each module's time the host spent issuing its work (launch-bound near 1).
    let launch: Vec<String> = (timed.stages.iter().flat_map(|s| &s.modules))
        .map(|t| {
            let share =
                (t.forward_host_ms + t.backward_host_ms) / (t.forward_ms + t.backward_ms).max(1e-9);
            format!("{} {:.0}%", t.name, 100.0 * share)
        })
        .collect();
    let pass = loss_err < loss_bound
        && grad_err < grad_bound
        && recompute_err < 1e-3
        && finite
        && last < first;
    *losses = pass.then_some(steps);
    Ok((
        pass,
        format!(
            "loss {gpu_loss:.5} vs CPU {cpu_loss:.5} (rel {loss_err:.1e}, bound \
             {loss_bound:.0e}), gradients max rel err {grad_err:.1e} (bound \
             {grad_bound:.0e}), recomputed {recompute_err:.1e} (bound 1e-3); 10 steps op by op \
             {first:.3} → {last:.3}; a step {:.2} ms ({wall:.2} ms wall); host launch share {}",
            timed.step_ms,
            launch.join(", "),
        ),
    ))
}

/// [`STEPS`] steps on the GPU with launch-bound modules replayed from CUDA graphs from the
/// second, against the same steps launched op by op (`op_by_op`, [`train`]'s): every loss within
/// the bound, and some module's forward and backward passes both replayed. Skipped where
/// `MOSAIC_GRAPHS=off` turns graphs off.
pub(super) fn train_graphed(
    ordinal: usize,
    (name, size, colocated): (&str, f64, bool),
    (_, _, bound): Bounds,
    op_by_op: Option<&[f32]>,
) -> Res<Option<(bool, String)>> {
    if !GRAPHS.is_on() {
        return Ok(None);
    }
    let Some(op_by_op) = op_by_op else {
        return Ok(Some((
            false,
            "not compared: the same model trained op by op failed above".into(),
        )));
    };
    let mut gpu = trainer(Compute::Cuda(ordinal), name, size, colocated, true)?;
    let mut graph_err = 0f32;
    for plain in op_by_op {
        let loss = gpu.step()?.loss;
        graph_err = worst([graph_err, (loss - plain).abs() / plain.abs().max(1e-30)]);
    }
    let launches = gpu.launches();
    let replayed: Vec<&str> = (launches.iter())
        .filter(|l| l.graphed && l.backward_graphed)
        .map(|l| l.module)
        .collect();
    let how: Vec<String> = (launches.iter())
        .map(|l| format!("{}: {:.160}", l.module, l.how))
        .collect();
    Ok(Some((
        !replayed.is_empty() && graph_err < bound,
        format!(
            "{} steps, losses {graph_err:.1e} from op by op (bound {bound:.0e}); forward and \
             backward replayed for [{}]; {}",
            op_by_op.len(),
            replayed.join(", "),
            how.join("; ")
        ),
    )))
}

/// Steps of each half of [`resume`]'s run.
const HALF: usize = 3;

/// A run of `name` on the GPU checkpointed after [`HALF`] steps, as `mosaic train --device cuda
/// --checkpoint-dir` does, then resumed by a fresh trainer on the GPU: the data position and
/// every parameter, AdamW moment and step count it reads back onto its slots' devices (in place
/// of the tensors the fused AdamW kernel updates) equal to the run's at the checkpoint, bit for
/// bit, and its next [`HALF`] losses within `bound` of the run's own (op by op, they differ
/// only by LayerNorm's atomic sums).
pub(super) fn resume(ordinal: usize, name: &str, bound: f32) -> Res<(bool, String)> {
    let dir = std::env::temp_dir().join(format!("mosaic-check-gpu-{}", std::process::id()));
    let result = resume_through(ordinal, name, bound, &dir);
    std::fs::remove_dir_all(&dir).ok();
    result
}

/// [`resume`], its checkpoint in `dir`.
fn resume_through(
    ordinal: usize,
    name: &str,
    bound: f32,
    dir: &std::path::Path,
) -> Res<(bool, String)> {
    let gpu = || trainer(Compute::Cuda(ordinal), name, 1.0, false, false);
    let mut run = gpu()?;
    for _ in 0..HALF {
        run.step()?;
    }
    let path = checkpoint::save(&run, dir)?;
    let saved = state(&run)?;
    let mut rest = Vec::with_capacity(HALF);
    for _ in 0..HALF {
        rest.push(run.step()?.loss);
    }
    drop(run);
    let mut resumed = gpu()?;
    checkpoint::load(&mut resumed, &path)?;
    let exact = state(&resumed)? == saved;
    let mut err = 0f32;
    for want in &rest {
        let loss = resumed.step()?.loss;
        err = worst([err, (loss - want).abs() / want.abs().max(1e-30)]);
    }
    Ok((
        exact && err < bound,
        format!(
            "{name}: the data position, every parameter, AdamW moment and step count restored \
             at step {HALF} {}; the next {HALF} losses {err:.1e} from the run's own (bound \
             {bound:.0e})",
            if exact { "bit for bit" } else { "CHANGED" }
        ),
    ))
}

/// The data position, and every parameter, AdamW moment and AdamW step count of `trainer`, as
/// bits.
fn state(trainer: &Trainer) -> Res<Vec<Vec<u32>>> {
    let wide = |x: u64| vec![x as u32, (x >> 32) as u32];
    let mut out = vec![wide(trainer.step_count())];
    for (m, opt) in trainer.model().modules.iter().zip(&trainer.optimizers) {
        let opt = opt.lock().expect("optimizer lock");
        out.push(wide(opt.t));
        let params = m.params.iter().map(|(_, v)| v.as_tensor());
        for t in params.chain(&opt.m).chain(&opt.v) {
            let bits = to_f32s(t)
                .map_err(tensor)?
                .iter()
                .map(|x| x.to_bits())
                .collect();
            out.push(bits);
        }
    }
    Ok(out)
}
