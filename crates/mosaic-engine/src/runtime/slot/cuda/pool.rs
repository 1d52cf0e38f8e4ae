//! The green-context slots of a plan's stages, created before training or per stage.

use std::ops::Deref;

use super::device::GpuDevice;
use crate::error::EngineError;
use crate::runtime::slot::{Slot, SlotMode};

/// The green-context slots of a plan's stages: created before training
/// ([`SlotMode::Pooled`]) or by every stage that starts ([`SlotMode::OnDemand`]). Each stage
/// is partitioned with [`GpuDevice::create_stage`].
#[derive(Debug)]
pub struct GpuSlotPool {
    device: GpuDevice,
    mode: SlotMode,
    stages: Vec<Vec<(String, f64)>>,
    slots: Vec<Vec<Slot>>,
}

/// A stage's slots: the pool's, or created for the stage and destroyed when dropped.
#[derive(Debug)]
pub enum StageSlots<'a> {
    /// Borrowed from the pool.
    Pooled(&'a [Slot]),
    /// Created on demand.
    Fresh(Vec<Slot>),
}

impl Deref for StageSlots<'_> {
    type Target = [Slot];
    fn deref(&self) -> &[Slot] {
        match self {
            StageSlots::Pooled(s) => s,
            StageSlots::Fresh(s) => s,
        }
    }
}

fn create_stage_slots(
    device: &GpuDevice,
    stage: &[(String, f64)],
) -> Result<Vec<Slot>, EngineError> {
    let modules: Vec<(&str, f64)> = stage.iter().map(|(m, q)| (m.as_str(), *q)).collect();
    Ok(device
        .create_stage(&modules)?
        .into_iter()
        .map(Slot::Gpu)
        .collect())
}

impl GpuSlotPool {
    /// The pool for `stages` (each a list of `(module, quota)` that run at the same time) on
    /// `device`; in [`SlotMode::Pooled`] every slot is created now.
    pub fn new(
        device: &GpuDevice,
        stages: Vec<Vec<(String, f64)>>,
        mode: SlotMode,
    ) -> Result<GpuSlotPool, EngineError> {
        let slots = match mode {
            SlotMode::Pooled => stages
                .iter()
                .map(|s| create_stage_slots(device, s))
                .collect::<Result<_, _>>()?,
            SlotMode::OnDemand => Vec::new(),
        };
        Ok(GpuSlotPool {
            device: device.clone(),
            mode,
            stages,
            slots,
        })
    }

    /// The mode.
    pub fn mode(&self) -> SlotMode {
        self.mode
    }

    /// Slots created ahead of training (0 on demand).
    pub fn created(&self) -> usize {
        self.slots.iter().map(Vec::len).sum()
    }

    /// The slots of stage `stage`, in its module order.
    ///
    /// # Panics
    /// If there is no stage `stage`.
    pub fn stage(&self, stage: usize) -> Result<StageSlots<'_>, EngineError> {
        match self.mode {
            SlotMode::Pooled => Ok(StageSlots::Pooled(&self.slots[stage])),
            SlotMode::OnDemand => Ok(StageSlots::Fresh(create_stage_slots(
                &self.device,
                &self.stages[stage],
            )?)),
        }
    }
}
