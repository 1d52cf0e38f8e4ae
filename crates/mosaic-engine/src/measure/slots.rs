//! Measurements of the slot pool (Mosaic §5.3.1, Fig. 11): stage transitions with pre-created
//! slots against slots created on demand, and whether a slot bounds candle's threads; the
//! results of the GPU counterpart, [`bench_gpu_slots`].

use std::time::Instant;

use candle_core::{Device, Tensor};
use serde::Serialize;

use super::machine::available_cores;
use crate::error::EngineError;
use crate::models;
use crate::runtime::schedule::Schedule;
use crate::runtime::slot::cuda::SmGranularity;
use crate::runtime::slot::{Slot, SlotMode};
use crate::runtime::trainer::{TrainConfig, Trainer};

/// The GPU counterpart of [`bench_slots`]: green-context slots pooled against created per
/// stage, on a real GPU.
#[cfg(feature = "cuda")]
pub use super::gpu_slots::bench_gpu_slots;

/// One slot mode's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ModeFigures {
    /// Slots created before the first step.
    pub slots_before_training: usize,
    /// Time to create them, in ms (0 on demand).
    pub setup_ms: f64,
    /// Stage transitions measured (two per stage and step: forward and backward).
    pub transitions: usize,
    /// Mean transition cost: from a phase's start until its last module runs in its slot, ms.
    pub launch_ms_mean: f64,
    /// Largest transition cost, ms.
    pub launch_ms_max: f64,
    /// Mean step time, ms.
    pub step_ms_mean: f64,
}

/// Pooled against on-demand slots on the same model, schedule and steps.
#[derive(Debug, Clone, Serialize)]
pub struct SlotBench {
    /// The model.
    pub model: String,
    /// The schedule (see [`Schedule::describe`]).
    pub schedule: String,
    /// Steps measured per mode (after one warm-up step).
    pub steps: u64,
    /// Slots created before training.
    pub pooled: ModeFigures,
    /// Slots created at every stage transition and dropped after it.
    pub on_demand: ModeFigures,
}

fn figures(
    model: &str,
    seed: u64,
    schedule: &Schedule,
    config: &TrainConfig,
    mode: SlotMode,
    steps: u64,
) -> Result<ModeFigures, EngineError> {
    let m = models::build(model, seed, &Device::Cpu)?;
    let config = TrainConfig {
        slots: mode,
        ..config.clone()
    };
    let t0 = Instant::now();
    let mut trainer = Trainer::new(m, schedule.clone(), config)?;
    let setup_ms = t0.elapsed().as_secs_f64() * 1e3;
    trainer.step()?; // warm-up
    let (mut launches, mut step_ms) = (Vec::new(), 0.0);
    for _ in 0..steps {
        let r = trainer.step()?;
        step_ms += r.step_ms;
        for s in &r.stages {
            launches.push(s.forward_launch_ms);
            launches.push(s.backward_launch_ms);
        }
    }
    Ok(ModeFigures {
        slots_before_training: trainer.slots_created(),
        setup_ms: if mode == SlotMode::Pooled {
            setup_ms
        } else {
            0.0
        },
        transitions: launches.len(),
        launch_ms_mean: launches.iter().sum::<f64>() / launches.len().max(1) as f64,
        launch_ms_max: launches.iter().cloned().fold(0.0, f64::max),
        step_ms_mean: step_ms / steps.max(1) as f64,
    })
}

/// Trains `steps` steps (after a warm-up step) of `model` by `schedule` twice, with pooled
/// and with on-demand slots, and returns both modes' transition costs and step times.
pub fn bench_slots(
    model: &str,
    seed: u64,
    schedule: &Schedule,
    config: &TrainConfig,
    steps: u64,
) -> Result<SlotBench, EngineError> {
    Ok(SlotBench {
        model: model.to_string(),
        schedule: schedule.describe(),
        steps,
        pooled: figures(model, seed, schedule, config, SlotMode::Pooled, steps)?,
        on_demand: figures(model, seed, schedule, config, SlotMode::OnDemand, steps)?,
    })
}

/// A candle matmul timed inside slots of different sizes.
#[derive(Debug, Clone, Serialize)]
pub struct MatmulInSlot {
    /// Threads of the slot.
    pub threads: usize,
    /// Best time of one `n×n` by `n×n` f32 matmul over the repetitions, ms (the best, not
    /// the mean: another process taking a core slows only some repetitions).
    pub ms: f64,
}

/// Times an `n×n` f32 matmul (best of `reps`) inside a slot of 1 thread and one of every core:
/// if a slot bounds candle's threads, the one-thread slot is about `cores` times slower.
pub fn matmul_in_slots(n: usize, reps: usize) -> Result<Vec<MatmulInSlot>, EngineError> {
    let cores = available_cores();
    let a = Tensor::ones((n, n), candle_core::DType::F32, &Device::Cpu)
        .map_err(EngineError::tensor("matmul"))?;
    let mut out = Vec::new();
    let mut sizes = vec![1];
    if cores > 1 {
        sizes.push(cores);
    }
    for threads in sizes {
        let slot = Slot::cpu("matmul", threads as f64 / cores as f64, threads)?;
        let ms = slot.run(|| -> candle_core::Result<f64> {
            a.matmul(&a)?; // warm-up
            let mut best = f64::INFINITY;
            for _ in 0..reps.max(1) {
                let t0 = Instant::now();
                a.matmul(&a)?;
                best = best.min(t0.elapsed().as_secs_f64() * 1e3);
            }
            Ok(best)
        });
        out.push(MatmulInSlot {
            threads,
            ms: ms.map_err(EngineError::tensor("matmul"))?,
        });
    }
    Ok(out)
}

/// Pooled against on-demand green-context slots over the same stage transitions.
#[derive(Debug, Clone, Serialize)]
pub struct GpuSlotBench {
    /// The device's name.
    pub device: String,
    /// Its compute capability, e.g. `9.0`.
    pub compute_capability: String,
    /// Its SMs.
    pub sms: u32,
    /// Partition sizes the device allows.
    pub granularity: SmGranularity,
    /// The stages' quotas, as asked.
    pub quotas: Vec<Vec<f64>>,
    /// SMs granted to each slot of each stage (pooled slots, read back from the driver).
    pub granted_sms: Vec<Vec<u32>>,
    /// Stage transitions measured per mode (after one warm-up pass over the stages).
    pub transitions: usize,
    /// Time to create the pool's slots before training, ms.
    pub pool_setup_ms: f64,
    /// Median pooled transition: lease the stage's slots and enqueue work on each stream, ms.
    pub pooled_transition_ms: f64,
    /// Median on-demand transition: create the stage's slots and enqueue work on each, ms.
    pub on_demand_transition_ms: f64,
    /// Median creation part of an on-demand transition, ms.
    pub on_demand_create_ms: f64,
    /// Median time to destroy a stage's on-demand slots at its end, ms (not in the transition).
    pub on_demand_destroy_ms: f64,
}

/// The GPU counterpart of [`bench_slots`]. Built without the `cuda` feature there are no
/// green-context slots: always [`EngineError::Cuda`] saying so.
#[cfg(not(feature = "cuda"))]
pub fn bench_gpu_slots(
    ordinal: usize,
    _stages: &[Vec<f64>],
    _transitions: usize,
) -> Result<GpuSlotBench, EngineError> {
    Err(EngineError::Cuda {
        what: format!("loading the driver (device {ordinal})"),
        message: crate::runtime::slot::cuda::driver_unavailable().unwrap_or_default(),
    })
}
