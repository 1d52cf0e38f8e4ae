//! Stage-by-stage training of a model by a schedule (Mosaic §3.1–3.2).
//!
//! # One iteration (`passes`)
//! 1. The batch of the current data position is drawn.
//! 2. **Forward, stage by stage.** The modules of a stage run at the same time, each in its
//!    slot; a module's replicas on this rank run as tasks in that slot, replica `k` on shard
//!    `k` of the batch. Then the outputs are redistributed among the ranks. The stage ends
//!    when its slowest module ends.
//! 3. **Backward, stage by stage in reverse**, the same way; each module's optimizer step runs
//!    in its slot right after its backward pass.
//!
//! # How tensors cross module boundaries
//! Every module has its own autograd graph. A consumer does not see its producer's graph: it
//! receives the producer's output *detached* (all replicas' shards gathered into the batch,
//! then cut into the consumer's own shards) and wraps its inputs in fresh leaf variables.
//! Backward then runs consumer first: the consumer's backward yields ∂loss/∂input at those
//! leaves; the replicas' row shards are gathered (or, for a gathered consumer whose replicas
//! all saw the whole batch, summed) into ∂loss/∂output of the producer, summed over its
//! consumers in module order. The producer's replica `k` back-propagates `Σ y_k ⊙ g_k` (its
//! output shard times that gradient shard), whose gradient is exactly `g_k`; the loss module
//! back-propagates its share of the loss. Parameter gradients of a module's replicas are
//! summed: on this rank in replica order, then over the module's ranks by one all-reduce of a
//! single bucket on its group in the [`Collective`] (see there why a sum), from inside its
//! slot. No tensor crosses a boundary with its graph, which is what lets the boundary cross
//! processes: after each stage phase, on the trainer's thread, every rank gathers the row
//! shards the other ranks computed, so every rank holds the whole batch of every output and
//! gradient it may need. (Sending each only to its consumers' ranks would move less; at these
//! sizes the all-gather's simplicity wins.) Ranks run the same schedule and draw the same
//! batch, so their collective calls line up without coordination (`ranks`).
//!
//! # On a GPU
//! Modules whose host time rivals their GPU time replay their forward and backward passes
//! from CUDA graphs from the second step on (`launch`).

use std::sync::Mutex;
use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use serde::Serialize;

use super::collective::{Collective, InProcess};
use super::optim::{AdamW, AdamWConfig};
use super::schedule::Schedule;
use super::slot::cuda::Carving;
use super::slot::{Slot, SlotMode, SlotPool};
use crate::error::EngineError;
use crate::models::model::Model;

mod launch;
mod passes;
mod ranks;
use launch::Launch;

/// Settings of a training run.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// Samples per step (the global batch, split among a module's replicas).
    pub batch: usize,
    /// The optimizer of every module.
    pub adamw: AdamWConfig,
    /// When slots are created.
    pub slots: SlotMode,
    /// Where modules compute.
    pub compute: Compute,
    /// On a GPU, replay the passes of launch-bound modules from CUDA graphs from the second
    /// step on (see [`Trainer::launches`]).
    pub graphs: bool,
}

impl Default for TrainConfig {
    /// Batch 16, [`AdamWConfig::default`], pooled slots, on the CPU, CUDA graphs where
    /// they pay.
    fn default() -> Self {
        TrainConfig {
            batch: 16,
            adamw: AdamWConfig::default(),
            slots: SlotMode::Pooled,
            compute: Compute::Cpu,
            graphs: true,
        }
    }
}

/// Where a trainer's modules compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compute {
    /// On the CPU, each module in a thread-pool slot.
    #[default]
    Cpu,
    /// On CUDA device `n`, each module in a green-context slot of its stage with its tensors
    /// on the slot's stream (`super::on_gpu`; the GPU build).
    Cuda(usize),
}

/// A module's times in one step.
#[derive(Debug, Clone, Serialize)]
pub struct ModuleTiming {
    /// The module.
    pub name: String,
    /// Its forward pass, in ms.
    pub forward_ms: f64,
    /// Its backward pass and optimizer step, in ms.
    pub backward_ms: f64,
    /// Of its forward pass, the time the host took to issue the work, in ms: until it waited
    /// for its slot's stream. On a GPU, where kernels run asynchronously, a host time close to
    /// the pass's time means the module is launch-bound; on a CPU the two are the same.
    pub forward_host_ms: f64,
    /// The same for its backward pass and optimizer step, in ms.
    pub backward_host_ms: f64,
    /// Whether its forward pass was replayed from a CUDA graph (see [`Trainer::launches`]).
    pub graphed: bool,
}

/// A stage's times in one step.
#[derive(Debug, Clone, Serialize)]
pub struct StageReport {
    /// Forward phase: until its slowest module's forward ended, in ms.
    pub forward_ms: f64,
    /// Backward phase (with the optimizer steps), in ms.
    pub backward_ms: f64,
    /// Stage transition cost, forward phase: from the phase's start until its last module
    /// started running in its slot (slot lease or creation plus dispatch), in ms.
    pub forward_launch_ms: f64,
    /// The same for the backward phase, in ms.
    pub backward_launch_ms: f64,
    /// Per module.
    pub modules: Vec<ModuleTiming>,
}

/// One iteration's results (see [`Trainer::iterate`]).
struct Iteration {
    loss: f32,
    /// The wait for the batch, ms.
    data_ms: f64,
    stages: Vec<StageReport>,
    /// Every module's summed parameter gradients where not applied (empty for a module with
    /// no replica on this rank), else empty.
    grads: Vec<Vec<Tensor>>,
}

/// What one training step did.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    /// Steps completed, this one included (= the data position after it).
    pub step: u64,
    /// The batch loss before the update.
    pub loss: f32,
    /// Wall-clock time of the step, in ms.
    pub step_ms: f64,
    /// Of it, the wait for the batch, in ms (on a GPU the zoo's batches are drawn ahead, so
    /// near 0).
    pub data_ms: f64,
    /// Per stage, in execution order.
    pub stages: Vec<StageReport>,
}

/// How one module's passes are launched (see [`Trainer::launches`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModuleLaunch {
    /// The module.
    pub module: &'static str,
    /// Whether its forward pass is replayed from a CUDA graph.
    pub graphed: bool,
    /// Whether its backward pass is too.
    pub backward_graphed: bool,
    /// How, in words: op by op (and why) or which passes replay graphs.
    pub how: String,
}

/// The gradient of one parameter tensor, summed over replicas.
#[derive(Debug, Clone)]
pub struct ParamGrad {
    /// Its module.
    pub module: String,
    /// The parameter's name within the module.
    pub name: String,
    /// ∂loss/∂parameter.
    pub grad: Tensor,
}

/// A model, its schedule, its slots and its optimizers: everything a step needs.
pub struct Trainer {
    pub(crate) model: Model,
    pub(crate) schedule: Schedule,
    pub(crate) config: TrainConfig,
    pub(crate) optimizers: Vec<Mutex<AdamW>>,
    pub(crate) step: u64,
    /// How each module's passes are launched; dropped before the devices and slots its graphs
    /// use.
    launches: Vec<Mutex<Launch>>,
    /// Every module's candle device; on a GPU, bound to its slot's stream. Fields drop in
    /// order: the model, the optimizers and these before the slots whose streams they use.
    devices: Vec<Device>,
    slots: SlotPool,
    collective: Box<dyn Collective>,
    /// The rank of every replica, per module.
    ranks: Vec<Vec<usize>>,
    /// The ranks holding replicas, ascending, per module (its communication group).
    groups: Vec<Vec<usize>>,
    /// The modules recomputing activations (see [`Trainer::recomputing`]).
    recomputing: Vec<&'static str>,
}

/// A replica's forward state kept for its backward pass.
struct ReplicaTape {
    rows: std::ops::Range<usize>,
    out: Tensor,
    inputs: Vec<Option<Var>>,
}

/// What a module's forward pass leaves on this rank.
struct Replicas {
    /// Its replicas' tapes (none where its CUDA graph keeps them, see [`Launch`]).
    tapes: Vec<ReplicaTape>,
    /// This rank's rows of the activation (detached), for an activation module.
    output: Option<Tensor>,
    /// This rank's share of the batch loss, for the loss module.
    loss: Option<Tensor>,
}

/// What a module's backward pass yields on this rank.
#[derive(Clone)]
struct Grads {
    /// Its parameters' gradients summed over this rank's replicas (`None` with no replica).
    params: Option<Vec<Tensor>>,
    /// Per module input, this rank's part of ∂loss/∂input (`None` for data inputs, or with no
    /// replica here): its replicas' row shards, or for a gathered module their sum.
    inputs: Vec<Option<Tensor>>,
}

struct Forward {
    run: Replicas,
    /// Whether the pass was replayed from the module's CUDA graph, which keeps the tapes.
    graphed: bool,
    began: Instant,
    /// Until the host waited for the slot's stream.
    host_ms: f64,
    ms: f64,
}

struct Backward {
    /// Per module input, this rank's part of ∂loss/∂input (`None` for data inputs, or with no
    /// replica here): its replicas' row shards, or for a gathered module their sum.
    input_grads: Vec<Option<Tensor>>,
    /// Summed parameter gradients, when not applied.
    param_grads: Option<Vec<Tensor>>,
    began: Instant,
    /// Until the host waited for the slot's stream.
    host_ms: f64,
    ms: f64,
}

/// Milliseconds since `since`, to 0.1 µs.
fn ms(since: Instant) -> f64 {
    micro(since.elapsed().as_secs_f64() * 1e3)
}

/// Rounds milliseconds to 0.1 µs (shorter logs; the clock's own resolution is finer).
pub(crate) fn micro(ms: f64) -> f64 {
    (ms * 1e4).round() / 1e4
}

impl Trainer {
    /// A trainer for `model` by `schedule` in this process alone; see [`Trainer::with_collective`].
    pub fn new(
        model: Model,
        schedule: Schedule,
        config: TrainConfig,
    ) -> Result<Trainer, EngineError> {
        Self::with_collective(model, schedule, config, Box::new(InProcess))
    }

    /// A trainer for `model` by `schedule`, this process being rank `collective.rank()` of
    /// `collective.world()`: it runs the replicas whose plan GPUs map to its rank
    /// ([`Schedule::ranks`]). Creates the slot pool (every slot, in [`SlotMode::Pooled`]),
    /// zeroed optimizers and each module's communication group; on a GPU, runs a trial step
    /// (forward and backward, nothing updated) so that a plan that does not fit the device's
    /// memory fails here ([`EngineError::DeviceMemory`]), before step 1. The schedule must come
    /// from this model; every rank must call this with the same arguments.
    pub fn with_collective(
        model: Model,
        schedule: Schedule,
        config: TrainConfig,
        mut collective: Box<dyn Collective>,
    ) -> Result<Trainer, EngineError> {
        crate::models::data::check_batch(config.batch)?;
        if !(config.adamw.lr.is_finite() && config.adamw.lr > 0.0) {
            return Err(EngineError::BadSetting {
                setting: "--lr".into(),
                message: format!("{} is not a positive learning rate", config.adamw.lr),
            });
        }
        let too_many = schedule
            .stages
            .iter()
            .flatten()
            .find(|p| p.dp() > config.batch);
        if let Some(p) = too_many {
            return Err(EngineError::BadSetting {
                setting: "--batch".into(),
                message: format!(
                    "{} samples cannot be split among the {} replicas of module \"{}\"",
                    config.batch,
                    p.dp(),
                    p.name
                ),
            });
        }
        let ranks = schedule.ranks(model.modules.len(), collective.world())?;
        let groups: Vec<Vec<usize>> = ranks
            .iter()
            .map(|r| {
                let mut g = r.clone();
                g.sort_unstable();
                g.dedup();
                g
            })
            .collect();
        collective.create_groups(&groups)?;
        // Bound slots first so that, should anything fail before the trainer holds them, they
        // are dropped last: the model's tensors are freed on their streams first.
        let (slots, devices, model) = match config.compute {
            Compute::Cpu => {
                let specs = schedule.slot_specs(model.modules.len());
                let devices = vec![Device::Cpu; model.modules.len()];
                (SlotPool::new(specs, config.slots)?, devices, model)
            }
            Compute::Cuda(ordinal) => {
                let mut gpu = super::on_gpu::place(model, &schedule, ordinal, config.slots)?;
                if collective.sums_in_order() {
                    super::on_gpu::turns_can_be_taken(&schedule)?;
                }
                // The host draws the next batch while the GPU trains on this one (on a CPU the
                // slots' threads have every core).
                if gpu.model.data.worth_drawing_ahead() {
                    gpu.model.data = super::prefetch::Prefetched::wrap(gpu.model.data);
                }
                (gpu.slots, gpu.devices, gpu.model)
            }
        };
        let optimizers = AdamW::per_module(&model, config.adamw)?;
        let launch = || match config.compute {
            Compute::Cuda(_) if !config.graphs => {
                Launch::OpByOp("CUDA graphs are turned off".into())
            }
            Compute::Cuda(_) if !super::graphed::GRAPHS.is_on() => Launch::OpByOp(format!(
                "CUDA graphs are turned off ({}={})",
                super::graphed::GRAPHS.var,
                super::graphed::GRAPHS.off
            )),
            Compute::Cuda(_) => Launch::Undecided,
            Compute::Cpu => Launch::OpByOp("on the CPU".into()),
        };
        let launches = (model.modules.iter())
            .map(|_| Mutex::new(launch()))
            .collect();
        let mut trainer = Trainer {
            model,
            schedule,
            config,
            optimizers,
            step: 0,
            launches,
            devices,
            slots,
            collective,
            ranks,
            groups,
            recomputing: Vec::new(),
        };
        if let Compute::Cuda(ordinal) = trainer.config.compute {
            let (ranks, batch) = (trainer.collective.world(), trainer.config.batch);
            trainer.recomputing =
                super::memory::fit_or_recompute(&trainer.model, ranks, batch, ordinal, || {
                    let step = trainer.trial_step();
                    // Only one rank tries again: with several, a slot's stream may wait on an
                    // NCCL sum whose peers will not come, and waiting for it would keep this
                    // rank from ending the job.
                    if step.is_err() && ranks == 1 {
                        super::memory::release_pool(&trainer.devices, ordinal);
                    }
                    step
                })?;
        }
        Ok(trainer)
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The settings.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Steps completed: the data position of the next batch.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Slots created before training (0 on demand).
    pub fn slots_created(&self) -> usize {
        self.slots.created()
    }

    /// The SMs each module's slot holds (indexed by module), on a GPU; `None` for CPU slots
    /// and slots made on demand.
    pub fn slot_sms(&self) -> Vec<Option<u32>> {
        (0..self.model.modules.len())
            .map(|m| self.slots.pooled(m).and_then(Slot::sms))
            .collect()
    }

    /// How each module's slot was carved from its GPU (indexed by module); `None` for CPU
    /// slots and slots made on demand.
    pub fn slot_carving(&self) -> Vec<Option<Carving>> {
        (0..self.model.modules.len())
            .map(|m| self.slots.pooled(m).and_then(Slot::carving))
            .collect()
    }

    /// The modules that recompute their activations in the backward pass, because the plan
    /// did not fit the GPU's memory otherwise (found before step 1).
    pub fn recomputing(&self) -> &[&'static str] {
        &self.recomputing
    }

    /// How each module's passes are launched, in words, by module: op by op (and why) or
    /// replayed from CUDA graphs (on a GPU, for modules whose host time rivals their GPU
    /// time, from the second step on).
    pub fn launches(&self) -> Vec<ModuleLaunch> {
        (self.model.modules.iter())
            .zip(&self.launches)
            .map(|(m, l)| {
                let launch = l.lock().expect("launch lock");
                ModuleLaunch {
                    module: m.name,
                    graphed: launch.graphed(),
                    backward_graphed: launch.backward_graphed(),
                    how: launch.describe(),
                }
            })
            .collect()
    }

    /// The collective the replicas use.
    pub fn collective(&self) -> &dyn Collective {
        &*self.collective
    }

    /// One training step: forward and backward by the schedule, every module's optimizer
    /// step, and the next data position.
    pub fn step(&mut self) -> Result<StepReport, EngineError> {
        let start = Instant::now();
        let it = self.iterate(true).map_err(|e| match self.config.compute {
            Compute::Cuda(ordinal) => {
                super::memory::in_step(e, ordinal, self.step + 1, &self.recomputing)
            }
            Compute::Cpu => e,
        })?;
        self.step += 1;
        // Each stage's report lists its modules in the schedule's order.
        for (stage, report) in self.schedule.stages.iter().zip(&it.stages) {
            for (p, t) in stage.iter().zip(&report.modules) {
                let launch = self.launches[p.module()].get_mut().expect("launch lock");
                launch.decide(
                    t.forward_host_ms + t.backward_host_ms,
                    t.forward_ms + t.backward_ms,
                );
            }
        }
        Ok(StepReport {
            step: self.step,
            loss: it.loss,
            data_ms: it.data_ms,
            step_ms: ms(start),
            stages: it.stages,
        })
    }

    /// The loss and every parameter's gradient on the current batch, without updating
    /// anything (the data position stays).
    pub fn gradients(&self) -> Result<(f32, Vec<ParamGrad>), EngineError> {
        let it = self.iterate(false)?;
        let (loss, mut grads) = (it.loss, it.grads);
        let world = self.collective.world();
        for (m, module) in self.model.modules.iter().enumerate() {
            if self.groups[m].len() == world {
                continue;
            }
            // Ranks without a replica get the module's gradient from one that has it.
            let err = || EngineError::tensor(module.name);
            let like: Vec<Tensor> = module
                .params
                .iter()
                .map(|(_, v)| v.as_detached_tensor())
                .collect();
            if grads[m].is_empty() {
                grads[m] = (like.iter().map(Tensor::zeros_like))
                    .collect::<candle_core::Result<_>>()
                    .map_err(err())?;
            }
            grads[m] = self.broadcast_tensors(self.groups[m][0], &grads[m], module.name)?;
        }
        let mut out = Vec::new();
        for (m, g) in self.model.modules.iter().zip(grads) {
            for ((name, _), grad) in m.params.iter().zip(g) {
                out.push(ParamGrad {
                    module: m.name.to_string(),
                    name: name.to_string(),
                    // On the host: a tensor on a GPU slot's stream must not outlive the slot.
                    grad: grad
                        .to_device(&Device::Cpu)
                        .map_err(EngineError::tensor(m.name))?,
                });
            }
        }
        Ok((loss, out))
    }

    /// One step's forward and backward passes, nothing updated and the gradients dropped.
    pub(crate) fn trial_step(&self) -> Result<(), EngineError> {
        self.iterate(false).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::schedule::Placement;
    use mosaic_plan::Assignment;

    /// Rank 0 of two, whose sums start in order (as NCCL's must). Nothing crosses it: the
    /// tests take no step.
    struct FirstOfTwo;

    impl Collective for FirstOfTwo {
        fn name(&self) -> &'static str {
            "first-of-two"
        }
        fn rank(&self) -> usize {
            0
        }
        fn world(&self) -> usize {
            2
        }
        fn create_groups(&mut self, _: &[Vec<usize>]) -> Result<(), EngineError> {
            Ok(())
        }
        fn sums_in_order(&self) -> bool {
            true
        }
        fn all_reduce_module(&self, _: usize, _: &mut [f32]) -> Result<(), EngineError> {
            unreachable!("no step is taken")
        }
        fn all_gather(&self, _: &[f32]) -> Result<Vec<Vec<f32>>, EngineError> {
            unreachable!("no step is taken")
        }
        fn broadcast(&self, _: usize, _: &mut [f32]) -> Result<(), EngineError> {
            unreachable!("no step is taken")
        }
    }

    /// clip-tiny on two GPUs, a rank each: text and vision on both in one stage (text listed
    /// first), align on GPU 1 alone after them.
    fn two_gpus(model: &Model) -> Schedule {
        let place = |name: &str, gpus: Vec<u32>| {
            let module = model.modules.iter().position(|m| m.name == name).unwrap();
            Placement {
                assignment: Assignment {
                    module,
                    dp: gpus.len() as u32,
                    sm: 1.0,
                    gpus,
                },
                name: name.into(),
                threads: 1,
            }
        };
        Schedule {
            source: "test".into(),
            cores: 2,
            pool: 2,
            stages: vec![
                vec![place("text", vec![0, 1]), place("vision", vec![1, 0])],
                vec![place("align", vec![1])],
            ],
        }
    }

    fn turns_taken(frozen: &[&str], collective: Box<dyn Collective>) -> Vec<Vec<&'static str>> {
        let mut model = crate::models::build("clip-tiny", 0, &Device::Cpu).unwrap();
        for m in &mut model.modules {
            m.trainable &= !frozen.contains(&m.name);
        }
        let schedule = two_gpus(&model);
        let t =
            Trainer::with_collective(model, schedule, TrainConfig::default(), collective).unwrap();
        (t.schedule.stages.iter())
            .map(|stage| {
                (t.turns(stage).order().iter())
                    .map(|&m| t.model.modules[m].name)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_stages_sums_across_ranks_take_turns_in_the_plans_order() {
        assert_eq!(
            turns_taken(&[], Box::new(FirstOfTwo)),
            [vec!["text", "vision"], vec![]]
        );
        // A frozen module sums nothing; align has no replica on this rank.
        assert_eq!(
            turns_taken(&["text"], Box::new(FirstOfTwo)),
            [vec!["vision"], vec![]]
        );
        // MPI's sums need no order.
        let none: Vec<Vec<&str>> = vec![vec![], vec![]];
        assert_eq!(turns_taken(&[], Box::new(InProcess)), none);
    }
}
