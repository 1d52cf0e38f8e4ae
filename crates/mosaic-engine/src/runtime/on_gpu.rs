//! Training on a GPU (Mosaic §3.2): every module in a green-context slot of its stage, its
//! parameters, activations and gradients on candle's CUDA backend bound to the slot's stream
//! ([`Binding::Primary`](super::slot::cuda::Binding)), so its kernels run on its slot's SMs
//! only, launched from its own thread. The GPU build alone can ([`place`]); any other build
//! says how to make one.

use candle_core::Device;

use super::schedule::Schedule;
use super::slot::{SlotMode, SlotPool};
use crate::error::EngineError;
use crate::models::Model;

/// What a trainer on a GPU runs with: every module's slot, created before step 1, its candle
/// device (indexed by module), and the model with its parameters on those devices.
pub(crate) struct OnGpu {
    pub(crate) slots: SlotPool,
    pub(crate) devices: Vec<Device>,
    pub(crate) model: Model,
}

/// Why `doing` (e.g. "training on CUDA device 0") cannot be done in a build without GPU
/// compute, and how to make one.
#[cfg_attr(all(feature = "cuda", mosaic_gpu), allow(dead_code))]
pub(crate) fn needs_gpu_build(doing: &str) -> EngineError {
    EngineError::BadSetting {
        setting: "--device".into(),
        message: format!(
            "{doing} needs the GPU build of mosaic, and this one is not: build it with \
             `scripts/cuda-cargo build --release -p mosaic-cli --features cuda` (README, \"The \
             engine on a GPU\")"
        ),
    }
}

/// The error of a build without GPU compute.
#[cfg(not(all(feature = "cuda", mosaic_gpu)))]
pub(crate) fn place(
    _model: Model,
    _schedule: &Schedule,
    ordinal: usize,
    _mode: SlotMode,
) -> Result<OnGpu, EngineError> {
    Err(needs_gpu_build(&format!(
        "training on CUDA device {ordinal}"
    )))
}

/// Opens CUDA device `ordinal`, cuts every stage's slots from its SMs
/// (`GpuDevice::create_stage`: the modules of a stage on disjoint SMs), binds a candle device
/// to each slot's stream and moves `model`'s parameters onto its modules' devices (same
/// values). Slots are created here, before training, whatever `mode` says: a module's
/// parameters live on its slot's stream, so the slot must outlive them.
#[cfg(all(feature = "cuda", mosaic_gpu))]
pub(crate) fn place(
    model: Model,
    schedule: &Schedule,
    ordinal: usize,
    mode: SlotMode,
) -> Result<OnGpu, EngineError> {
    use super::slot::cuda::{Binding, GpuDevice};
    use super::slot::Slot;
    use crate::models;

    if mode == SlotMode::OnDemand {
        return Err(EngineError::BadSetting {
            setting: "slots".into(),
            message: "training on a GPU keeps each module's tensors on its slot's stream, so \
                      slots are pooled; `mosaic measure slots` compares pooled with on-demand \
                      green contexts"
                .into(),
        });
    }
    let gpu = GpuDevice::open(ordinal)?;
    weights_fit(&model, ordinal)?;
    let n = model.modules.len();
    let mut slots: Vec<Option<Slot>> = (0..n).map(|_| None).collect();
    for stage in &schedule.stages {
        let modules: Vec<(&str, f64)> = stage
            .iter()
            .map(|p| (p.name.as_str(), p.assignment.sm))
            .collect();
        for (p, slot) in stage.iter().zip(gpu.create_stage(&modules)?) {
            slots[p.module()] = Some(Slot::Gpu(slot));
        }
    }
    let slots: Vec<Slot> = slots
        .into_iter()
        .map(|s| s.expect("a schedule places every module"))
        .collect();
    let devices = slots
        .iter()
        .map(|s| {
            let slot = s.as_gpu().expect("a GPU slot");
            // SAFETY: the trainer drops its model, optimizers and devices before its slots
            // (field order), and hands out no tensor on a slot's device.
            unsafe { slot.candle_device(Binding::Primary) }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let placed = models::build_placed(&model.recipe(), &|name| {
        let m = model.index_of(name).expect("the same model's modules");
        devices[m].clone()
    })?;
    let mut placed = Model {
        data: model.data,
        ..placed
    };
    for (to, from) in placed.modules.iter_mut().zip(&model.modules) {
        for ((_, var), (_, value)) in to.params.iter().zip(from.params.iter()) {
            let value = value
                .as_tensor()
                .to_device(var.device())
                .map_err(EngineError::tensor(to.name))?;
            var.set(&value).map_err(EngineError::tensor(to.name))?;
        }
    }
    let specs = schedule.slot_specs(n);
    Ok(OnGpu {
        slots: SlotPool::from_slots(specs, slots),
        devices,
        model: placed,
    })
}

/// Fails, saying by how much, when the model's parameters, gradients and AdamW moments alone
/// (every module's, resident for the whole run) exceed the free memory of CUDA device
/// `ordinal`.
#[cfg(all(feature = "cuda", mosaic_gpu))]
fn weights_fit(model: &Model, ordinal: usize) -> Result<(), EngineError> {
    // Bytes a parameter holds on the GPU for the whole run: its f32 value, gradient and two
    // AdamW moments.
    const BYTES_PER_PARAM: u64 = 16;
    let (free, total) = cudarc::driver::CudaContext::new(ordinal)
        .and_then(|ctx| ctx.mem_get_info())
        .map_err(|e| EngineError::Cuda {
            what: format!("cuMemGetInfo (device {ordinal})"),
            message: e.to_string(),
        })?;
    let params: u64 = model.modules.iter().map(|m| m.params.count() as u64).sum();
    let need = params * BYTES_PER_PARAM;
    if need <= free as u64 {
        return Ok(());
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    Err(EngineError::DeviceMemory {
        device: ordinal,
        message: format!(
            "{}'s {:.1} M parameters need {:.1} GiB for values, gradients and AdamW moments \
             ({BYTES_PER_PARAM} bytes each), and {:.1} of the device's {:.1} GiB are free; \
             train a smaller model (--size)",
            model.name,
            params as f64 / 1e6,
            gib(need),
            gib(free as u64),
            gib(total as u64)
        ),
    })
}

/// Runs one step's forward and backward passes on the GPU without updating anything, so that
/// a plan whose activations do not fit fails before step 1, naming the module and what to
/// change, instead of in the middle of training. When the step runs out of memory, every
/// module that can turns activation recomputation on ([`crate::models::recompute`]; a frozen
/// one then holds one block's activations at a time in its forward pass too) and the step is
/// tried again; returns the modules that recompute.
pub(crate) fn probe_memory(
    trainer: &super::trainer::Trainer,
    ordinal: usize,
) -> Result<Vec<&'static str>, EngineError> {
    let first = match trainer.trial_step() {
        Err(e) if e.is_out_of_memory() => e,
        other => return other.map(|_| Vec::new()),
    };
    // Another rank may be waiting in a collective of the failed step, which a second try
    // would answer out of order: with several ranks the run stops (and mpirun stops them all).
    let alone = trainer.collective().world() == 1;
    let recomputing: Vec<&'static str> = (trainer.model().modules.iter())
        .filter(|m| alone && m.net.set_recompute(true))
        .map(|m| m.name)
        .collect();
    let e = if recomputing.is_empty() {
        first
    } else {
        match trainer.trial_step() {
            Err(e) if e.is_out_of_memory() => e,
            other => return other.map(|_| recomputing),
        }
    };
    let module = match &e {
        EngineError::Tensor { module, .. } => format!("module \"{module}\""),
        _ => "a module".to_string(),
    };
    let recomputed = if recomputing.is_empty() {
        String::new()
    } else {
        format!(
            " even with {} recomputing activations",
            recomputing.join(", ")
        )
    };
    Err(EngineError::DeviceMemory {
        device: ordinal,
        message: format!(
            "{module} ran out of memory in a trial step at batch {} by this plan{recomputed} \
             (every module's weights, gradients and AdamW moments stay on the GPU, and a \
             stage's modules hold their activations at once): lower --batch, train a smaller \
             model (--size), or plan fewer modules per stage; {e}",
            trainer.config().batch
        ),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

    use candle_core::Tensor;

    use super::*;
    use crate::models::model::{Net, Shard};
    use crate::runtime::trainer::{TrainConfig, Trainer};

    /// A net that runs out of GPU memory (as candle reports it) unless it recomputes, or
    /// always.
    struct Tight {
        inner: Box<dyn Net>,
        recomputing: AtomicBool,
        always: bool,
    }

    impl Net for Tight {
        fn forward(&self, inputs: &[Tensor], shard: &Shard) -> candle_core::Result<Tensor> {
            if self.always || !self.recomputing.load(Relaxed) {
                return Err(candle_core::Error::Cuda(
                    "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into(),
                ));
            }
            self.inner.forward(inputs, shard)
        }

        fn set_recompute(&self, on: bool) -> bool {
            self.recomputing.store(on, Relaxed);
            true
        }
    }

    /// A net that is never run: what stands in while the real one is wrapped.
    struct Nothing;

    impl Net for Nothing {
        fn forward(&self, _: &[Tensor], _: &Shard) -> candle_core::Result<Tensor> {
            unreachable!("a placeholder")
        }
    }

    fn trainer(always: bool) -> Trainer {
        let mut model = crate::models::build("clip-tiny", 0, &Device::Cpu).unwrap();
        let vision = &mut model.modules[0];
        let inner = std::mem::replace(&mut vision.net, Box::new(Nothing));
        vision.net = Box::new(Tight {
            inner,
            recomputing: AtomicBool::new(false),
            always,
        });
        let schedule = Schedule::sequential(&model, 1);
        Trainer::new(model, schedule, TrainConfig::default()).unwrap()
    }

    #[test]
    fn a_step_that_runs_out_of_memory_recomputes_or_names_the_module() {
        let fits = probe_memory(&trainer(false), 0).unwrap();
        assert_eq!(fits, ["vision"], "the net that can recompute does");
        let e = probe_memory(&trainer(true), 3).unwrap_err();
        assert!(e.is_bad_input() && e.is_out_of_memory(), "{e}");
        let text = e.to_string();
        assert!(
            text.starts_with("CUDA device 3: out of memory: module \"vision\""),
            "{text}"
        );
        assert!(
            text.contains("even with vision recomputing") && text.contains("--batch"),
            "{text}"
        );
    }
}
