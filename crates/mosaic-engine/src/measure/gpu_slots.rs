//! Mosaic's Fig. 11a on a real GPU (feature `cuda`): green-context slots leased from a pool
//! against slots created and destroyed at every stage transition.

use std::time::Instant;

use mosaic_kit::stats::median;

use super::slots::GpuSlotBench;
use crate::error::EngineError;
use crate::runtime::slot::cuda::{GpuDevice, GpuSlotPool, Scratch};
use crate::runtime::slot::{Slot, SlotMode};

/// Enqueues a one-word fill of word `i` of `scratch` on every slot's stream (what starting a
/// stage's modules costs besides getting their slots).
fn launch(slots: &[Slot], scratch: &Scratch<'_>, value: u32) -> Result<(), EngineError> {
    for (i, slot) in slots.iter().enumerate() {
        let gpu = slot.as_gpu().expect("GPU pools hold GPU slots");
        scratch.set_async(gpu, i, value)?;
    }
    Ok(())
}

/// Waits for every slot's stream.
fn finish(slots: &[Slot]) -> Result<(), EngineError> {
    for slot in slots {
        let gpu = slot.as_gpu().expect("GPU pools hold GPU slots");
        gpu.enter()?.synchronize()?;
    }
    Ok(())
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Mosaic's Fig. 11a on a real GPU: `transitions` stage transitions cycling through `stages`
/// (each a list of quotas that run at the same time) on device `ordinal`, once with the slots
/// of every stage created before the first transition and leased from the pool, once with
/// each stage's slots created when it starts and destroyed when it ends. A transition ends
/// when every module of the new stage has work (a one-word fill) enqueued on its slot's stream;
/// the stage's streams are then waited for, outside the measurement. One warm-up pass over
/// the stages precedes each mode's measurements. Returns the medians.
pub fn bench_gpu_slots(
    ordinal: usize,
    stages: &[Vec<f64>],
    transitions: usize,
) -> Result<GpuSlotBench, EngineError> {
    if stages.is_empty() {
        return Err(EngineError::BadSetting {
            setting: "stages".into(),
            message: "no stage to measure transitions between".into(),
        });
    }
    let device = GpuDevice::open(ordinal)?;
    let named: Vec<Vec<(String, f64)>> = stages
        .iter()
        .enumerate()
        .map(|(s, qs)| {
            qs.iter()
                .enumerate()
                .map(|(m, &q)| (format!("stage{s}-module{m}"), q))
                .collect()
        })
        .collect();
    let widest = stages.iter().map(Vec::len).max().unwrap_or(0);
    let scratch = Scratch::new(&device, widest)?;

    let n = stages.len();
    let t = Instant::now();
    let pooled = GpuSlotPool::new(&device, named.clone(), SlotMode::Pooled)?;
    let pool_setup_ms = ms_since(t);
    let granted_sms = (0..n)
        .map(|s| {
            Ok(pooled
                .stage(s)?
                .iter()
                .map(|slot| slot.sms().unwrap_or(0))
                .collect())
        })
        .collect::<Result<Vec<Vec<u32>>, EngineError>>()?;
    let pooled_ms = pooled_transitions(&pooled, &scratch, n, transitions)?;
    drop(pooled);
    let on_demand = GpuSlotPool::new(&device, named, SlotMode::OnDemand)?;
    let [transition_ms, create_ms, destroy_ms] =
        on_demand_transitions(&on_demand, &scratch, n, transitions)?;
    let (major, minor) = device.compute_capability();
    Ok(GpuSlotBench {
        device: device.name().to_string(),
        compute_capability: format!("{major}.{minor}"),
        sms: device.sms(),
        granularity: device.granularity(),
        quotas: stages.to_vec(),
        granted_sms,
        transitions,
        pool_setup_ms,
        pooled_transition_ms: median(&pooled_ms).unwrap_or(0.0),
        on_demand_transition_ms: median(&transition_ms).unwrap_or(0.0),
        on_demand_create_ms: median(&create_ms).unwrap_or(0.0),
        on_demand_destroy_ms: median(&destroy_ms).unwrap_or(0.0),
    })
}

/// Each of `transitions` stage transitions of a pooled `pool` of `n` stages, after a warm-up
/// pass over them: from leasing the stage's slots until each has work enqueued, ms.
fn pooled_transitions(
    pool: &GpuSlotPool,
    scratch: &Scratch<'_>,
    n: usize,
    transitions: usize,
) -> Result<Vec<f64>, EngineError> {
    let mut out = Vec::with_capacity(transitions);
    for i in 0..n + transitions {
        let t = Instant::now();
        let slots = pool.stage(i % n)?;
        launch(&slots, scratch, i as u32)?;
        let ms = ms_since(t);
        finish(&slots)?;
        if i >= n {
            out.push(ms);
        }
    }
    Ok(out)
}

/// Each of `transitions` stage transitions of an on-demand `pool` of `n` stages, after a
/// warm-up pass over them: the transition (from creating the stage's slots until each has
/// work enqueued), its creation part, and the slots' destruction at the stage's end, ms.
fn on_demand_transitions(
    pool: &GpuSlotPool,
    scratch: &Scratch<'_>,
    n: usize,
    transitions: usize,
) -> Result<[Vec<f64>; 3], EngineError> {
    let (mut transition_ms, mut create_ms, mut destroy_ms) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n + transitions {
        let t = Instant::now();
        let slots = pool.stage(i % n)?;
        let created = ms_since(t);
        launch(&slots, scratch, i as u32)?;
        let ms = ms_since(t);
        finish(&slots)?;
        let t = Instant::now();
        drop(slots);
        let destroyed = ms_since(t);
        if i >= n {
            transition_ms.push(ms);
            create_ms.push(created);
            destroy_ms.push(destroyed);
        }
    }
    Ok([transition_ms, create_ms, destroy_ms])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::slot::cuda::driver_unavailable;

    /// The GPU path: skipped (with a line on standard error) where no driver or device is.
    #[test]
    fn pooled_green_context_slots_beat_on_demand_on_a_real_gpu() {
        if let Some(why) = driver_unavailable() {
            eprintln!("skipped: no CUDA driver/GPU ({why})");
            return;
        }
        let quotas = [0.25, 0.5, 0.25];

        let b = bench_gpu_slots(0, &[quotas.to_vec(), vec![0.5, 0.5], vec![1.0]], 12)
            .expect("bench green-context slots");
        eprintln!("{b:?}");
        assert_eq!(b.granted_sms.len(), 3);
        assert!(
            b.pooled_transition_ms < b.on_demand_transition_ms,
            "pooled {} ms vs on demand {} ms",
            b.pooled_transition_ms,
            b.on_demand_transition_ms
        );
    }
}
