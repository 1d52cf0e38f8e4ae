//! One training step of an engine model on the GPU against the CPU, then ten that must lower
//! the loss.

use std::time::Instant;

use candle_core::Device;
use mosaic_kit::stats::relative_error as rel_err;

use super::{tensor, Res};
use crate::models::nn::to_f32s;
use crate::models::{self, Model};
use crate::runtime::trainer::{Compute, TrainConfig, Trainer};
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

/// Largest relative error of the loss and of any gradient, GPU against CPU.
pub(super) type Bounds = (f32, f32);
/// f32 on both devices.
pub(super) const F32_BOUNDS: Bounds = (1e-4, 1e-2);
/// bf16 products on the GPU against f32 on the CPU (bf16 keeps 8 bits of mantissa).
pub(super) const BF16_BOUNDS: Bounds = (2e-2, 2e-1);

/// Largest relative difference between a step's loss with CUDA graphs and op by op (they
/// differ by the fused attention's atomic dQ sums; a graph replaying wrong memory is off by
/// far more).
const GRAPHED_LOSS_BOUND: f32 = 1e-2;

/// Loss and every gradient on the GPU against the CPU (same seed, batch 16), then eleven
/// steps on the GPU whose loss must fall, launch-bound modules replayed from CUDA graphs
/// from the second, against the same steps op by op.
pub(super) fn train(
    ordinal: usize,
    name: &str,
    size: f64,
    colocated: bool,
    (loss_bound, grad_bound): Bounds,
) -> Res<(bool, String)> {
    let trainer = |compute: Compute, graphs: bool| -> Res<Trainer> {
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
    };
    let (cpu_loss, cpu_grads) = trainer(Compute::Cpu, false)?.gradients()?;
    let mut gpu = trainer(Compute::Cuda(ordinal), true)?;
    let (gpu_loss, gpu_grads) = gpu.gradients()?;
    let mut grad_err = 0f32;
    for (c, g) in cpu_grads.iter().zip(&gpu_grads) {
        let c = to_f32s(&c.grad).map_err(tensor)?;
        let g = to_f32s(&g.grad).map_err(tensor)?;
        grad_err = grad_err.max(rel_err(&g, &c));
    }
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
        for (a, b) in gpu_grads.iter().zip(&again) {
            let a = to_f32s(&a.grad).map_err(tensor)?;
            let b = to_f32s(&b.grad).map_err(tensor)?;
            recompute_err = recompute_err.max(rel_err(&b, &a));
        }
        gpu.model().modules.iter().for_each(|m| {
            m.net.set_recompute(false);
        });
    }
    let first = gpu.step()?;
    let mut losses = vec![first.loss];
    let mut last = first.clone();
    for _ in 0..9 {
        last = gpu.step()?;
        losses.push(last.loss);
    }
    let started = Instant::now();
    let timed = gpu.step()?;
    let wall = started.elapsed().as_secs_f64() * 1e3;
    losses.push(timed.loss);
    // The same steps with every module launched op by op.
    let mut op_by_op = trainer(Compute::Cuda(ordinal), false)?;
    let mut graph_err = 0f32;
    for loss in &losses {
        let plain = op_by_op.step()?.loss;
        graph_err = graph_err.max((loss - plain).abs() / plain.abs().max(1e-30));
    }
    let launches = gpu.launches();
    let graphed: Vec<&str> = (launches.iter())
        .filter(|l| l.graphed)
        .map(|l| l.module)
        .collect();
    let not_graphed: Vec<String> = (launches.iter())
        .filter(|l| !l.graphed)
        .map(|l| {
            format!(
                "{}: {}",
                l.module,
                l.how.chars().take(160).collect::<String>()
            )
        })
        .collect();
    // How much of each module's time the host spent issuing its work (launch-bound near 1).
    let launch: Vec<String> = (timed.stages.iter().flat_map(|s| &s.modules))
        .map(|t| {
            let share =
                (t.forward_host_ms + t.backward_host_ms) / (t.forward_ms + t.backward_ms).max(1e-9);
            format!("{} {:.0}%", t.name, 100.0 * share)
        })
        .collect();
    Ok((
        loss_err < loss_bound
            && grad_err < grad_bound
            && recompute_err < 1e-3
            && last.loss < first.loss
            && !graphed.is_empty()
            && graph_err < GRAPHED_LOSS_BOUND,
        format!(
            "loss {gpu_loss:.5} vs CPU {cpu_loss:.5} (rel {loss_err:.1e}, bound \
             {loss_bound:.0e}), gradients max rel err {grad_err:.1e} (bound \
             {grad_bound:.0e}), recomputed {recompute_err:.1e} (bound 1e-3); 10 steps \
             {:.3} → {:.3}; a step {:.2} ms ({wall:.2} ms wall); host launch share {}; \
             CUDA graphs replayed for [{}], losses {graph_err:.1e} from op by op (bound \
             {GRAPHED_LOSS_BOUND:.0e}); not graphed: [{}]",
            first.loss,
            last.loss,
            timed.step_ms,
            launch.join(", "),
            graphed.join(", "),
            not_graphed.join("; ")
        ),
    ))
}
