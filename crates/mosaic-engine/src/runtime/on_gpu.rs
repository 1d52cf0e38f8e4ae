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

/// The CUDA device a rank at `node` ([`crate::Collective::node`]) trains on
/// ([`super::collective::gpu_of`]); 0 for a run of one process. Where no device can be counted,
/// the rank's index: opening it says why there is none.
pub fn rank_gpu(node: (usize, usize)) -> Result<usize, EngineError> {
    if node == (0, 1) {
        return Ok(0);
    }
    match super::slot::cuda::device_count() {
        Err(_) => Ok(node.0),
        Ok(devices) => {
            super::collective::gpu_of(node, devices).map_err(|message| EngineError::BadSetting {
                setting: "--device cuda".into(),
                message,
            })
        }
    }
}

/// Threads a GPU run needs in rayon's global pool, whose tasks launch a stage's modules (a GPU
/// slot has no thread of its own), one a module of the widest stage, and which rayon sizes by
/// the `cores` this process may run on.
fn launchers(schedule: &Schedule, cores: usize) -> usize {
    cores.max(widest(schedule))
}

/// Modules in the schedule's widest stage (1 for none).
fn widest(schedule: &Schedule) -> usize {
    schedule.stages.iter().map(Vec::len).max().unwrap_or(1)
}

/// Makes rayon's global pool hold [`launchers`] threads, if it does not exist yet; else says
/// where it holds fewer. `mpirun` binds each rank to one core by default, and with one thread
/// a stage's modules would launch one after another.
#[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))]
fn launching_threads(schedule: &Schedule) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let needed = launchers(schedule, cores);
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(needed)
        .build_global();
    if built.is_err() && rayon::current_num_threads() < needed {
        eprintln!(
            "warning: {} thread(s) launch the GPU's modules, where a stage has {needed}: its \
             modules take turns (under mpirun, start it with --bind-to none)",
            rayon::current_num_threads()
        );
    }
}

/// Refuses a GPU run whose stages' gradient sums start in one order
/// ([`super::collective::Turns`], NCCL's) where rayon's global pool has fewer threads than a
/// stage has modules: a module waiting for its turn would hold the thread that the one before
/// it needs, and the run would hang.
pub(crate) fn turns_can_be_taken(schedule: &Schedule) -> Result<(), EngineError> {
    turns_can_be_taken_by(schedule, rayon::current_num_threads())
}

/// [`turns_can_be_taken`] with `threads` launching.
fn turns_can_be_taken_by(schedule: &Schedule, threads: usize) -> Result<(), EngineError> {
    let widest = widest(schedule);
    if threads >= widest {
        return Ok(());
    }
    Err(EngineError::BadSetting {
        setting: "launching threads".into(),
        message: format!(
            "{threads} thread(s) launch the GPU's modules, where a stage has {widest} whose \
             gradient sums NCCL starts in turn, so the run would hang (under mpirun, start it \
             with --bind-to none)"
        ),
    })
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
    crate::kernels::KERNELS.check()?;
    super::graphed::GRAPHS.check()?;
    launching_threads(schedule);
    let gpu = GpuDevice::open(ordinal)?;
    super::memory::weights_fit(&model, ordinal)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One launching thread a module of the widest stage, at least, whatever the cores.
    #[test]
    fn a_gpu_run_launches_each_module_of_a_stage_from_a_thread() {
        let model = crate::models::build("clip-tiny", 0, &Device::Cpu).unwrap();
        let one_by_one = Schedule::sequential(&model, 1);
        assert_eq!(launchers(&one_by_one, 1), 1);
        assert_eq!(launchers(&one_by_one, 8), 8);
        let together = Schedule {
            stages: vec![one_by_one.stages.concat()],
            ..one_by_one.clone()
        };
        assert_eq!(
            launchers(&together, 1),
            3,
            "clip-tiny's three modules in one stage"
        );
        // Sums started in turn need every module of a stage on a thread of its own.
        assert!(turns_can_be_taken_by(&together, 3).is_ok());
        assert!(turns_can_be_taken_by(&one_by_one, 1).is_ok());
        let e = turns_can_be_taken_by(&together, 2).unwrap_err().to_string();
        assert!(
            e.contains("2 thread(s) launch the GPU's modules, where a stage has 3"),
            "{e}"
        );
    }
}
