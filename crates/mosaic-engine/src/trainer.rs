//! Stage-by-stage training of a model by a schedule (Mosaic §3.1–3.2).
//!
//! # One iteration
//! 1. The batch of the current data position is drawn.
//! 2. **Forward, stage by stage.** The modules of a stage run at the same time, each in its
//!    slot; a module's `dp` replicas run as tasks in that slot, replica `k` on shard `k` of
//!    the batch. The stage ends when its slowest module ends.
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
//! back-propagates its share of the loss. Parameter gradients of the replicas are then summed
//! by the [`Collective`] (see there why a sum). No tensor crosses a boundary with its graph,
//! which is what a module on another GPU or in another process will need.

use std::sync::Mutex;
use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use rayon::prelude::*;
use serde::Serialize;

use crate::collective::{Collective, InProcess};
use crate::error::EngineError;
use crate::model::{shards, Batch, Coupling, Input, Model, Output};
use crate::optim::{AdamW, AdamWConfig};
use crate::schedule::Schedule;
use crate::slot::{run_in_slots, Job, Slot, SlotMode, SlotPool};

/// Settings of a training run.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// Samples per step (the global batch, split among a module's replicas).
    pub batch: usize,
    /// The optimizer of every module.
    pub adamw: AdamWConfig,
    /// When slots are created.
    pub slots: SlotMode,
}

impl Default for TrainConfig {
    /// Batch 16, [`AdamWConfig::default`], pooled slots.
    fn default() -> Self {
        TrainConfig {
            batch: 16,
            adamw: AdamWConfig::default(),
            slots: SlotMode::Pooled,
        }
    }
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

/// What one training step did.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    /// Steps completed, this one included (= the data position after it).
    pub step: u64,
    /// The batch loss before the update.
    pub loss: f32,
    /// Wall-clock time of the step, in ms.
    pub step_ms: f64,
    /// Per stage, in execution order.
    pub stages: Vec<StageReport>,
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
    slots: SlotPool,
    collective: Box<dyn Collective>,
    device: Device,
}

/// A replica's forward state kept for its backward pass.
struct ReplicaTape {
    rows: std::ops::Range<usize>,
    out: Tensor,
    inputs: Vec<Option<Var>>,
}

struct Forward {
    replicas: Vec<ReplicaTape>,
    /// The whole batch's activation (detached), for an activation module.
    output: Option<Tensor>,
    /// The batch loss, for the loss module.
    loss: Option<f32>,
    began: Instant,
    ms: f64,
}

struct Backward {
    /// ∂loss/∂(producer output) per module input: `(producer, gradient)`.
    input_grads: Vec<(usize, Tensor)>,
    /// Summed parameter gradients, when not applied.
    param_grads: Option<Vec<Tensor>>,
    began: Instant,
    ms: f64,
}

/// Milliseconds since `since`, to 0.1 µs.
fn ms(since: Instant) -> f64 {
    micro(since.elapsed().as_secs_f64() * 1e3)
}

/// Rounds milliseconds to 0.1 µs (shorter logs; the clock's own resolution is finer).
fn micro(ms: f64) -> f64 {
    (ms * 1e4).round() / 1e4
}

impl Trainer {
    /// A trainer for `model` by `schedule`; creates the slot pool (every slot, in
    /// [`SlotMode::Pooled`]) and zeroed optimizers. The schedule must come from this model.
    pub fn new(
        model: Model,
        schedule: Schedule,
        config: TrainConfig,
    ) -> Result<Trainer, EngineError> {
        if config.batch == 0 {
            return Err(EngineError::BadSetting {
                setting: "--batch".into(),
                message: "expected at least 1 sample".into(),
            });
        }
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
            .find(|p| p.dp > config.batch);
        if let Some(p) = too_many {
            return Err(EngineError::BadSetting {
                setting: "--batch".into(),
                message: format!(
                    "{} samples cannot be split among the {} replicas of module \"{}\"",
                    config.batch, p.dp, p.name
                ),
            });
        }
        let slots = SlotPool::new(schedule.slot_specs(model.modules.len()), config.slots)?;
        let optimizers = model
            .modules
            .iter()
            .map(|m| {
                AdamW::new(&m.params, config.adamw)
                    .map(Mutex::new)
                    .map_err(EngineError::tensor(m.name))
            })
            .collect::<Result<_, _>>()?;
        Ok(Trainer {
            model,
            schedule,
            config,
            optimizers,
            step: 0,
            slots,
            collective: Box::new(InProcess),
            device: Device::Cpu,
        })
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

    /// The collective the replicas use.
    pub fn collective(&self) -> &dyn Collective {
        &*self.collective
    }

    /// One training step: forward and backward by the schedule, every module's optimizer
    /// step, and the next data position.
    pub fn step(&mut self) -> Result<StepReport, EngineError> {
        let start = Instant::now();
        let (loss, stages, _) = self.iterate(true)?;
        self.step += 1;
        Ok(StepReport {
            step: self.step,
            loss,
            step_ms: ms(start),
            stages,
        })
    }

    /// The loss and every parameter's gradient on the current batch, without updating
    /// anything (the data position stays).
    pub fn gradients(&self) -> Result<(f32, Vec<ParamGrad>), EngineError> {
        let (loss, _, grads) = self.iterate(false)?;
        let grads = grads.expect("gradients are kept when not applied");
        let mut out = Vec::new();
        for (m, g) in self.model.modules.iter().zip(grads) {
            for ((name, _), grad) in m.params.iter().zip(g) {
                out.push(ParamGrad {
                    module: m.name.to_string(),
                    name: name.to_string(),
                    grad,
                });
            }
        }
        Ok((loss, out))
    }

    /// Runs one iteration; `apply` steps the optimizers, else the summed gradients are
    /// returned per module.
    #[allow(clippy::type_complexity)]
    fn iterate(
        &self,
        apply: bool,
    ) -> Result<(f32, Vec<StageReport>, Option<Vec<Vec<Tensor>>>), EngineError> {
        let n = self.model.modules.len();
        let batch = self
            .model
            .data
            .batch(self.step, self.config.batch, &self.device)
            .map_err(EngineError::tensor("data"))?;

        // Forward, stage by stage.
        let mut outputs: Vec<Option<Tensor>> = vec![None; n];
        let mut tapes: Vec<Option<Forward>> = (0..n).map(|_| None).collect();
        let mut reports = Vec::with_capacity(self.schedule.stages.len());
        let mut loss = None;
        for stage in &self.schedule.stages {
            let t0 = Instant::now();
            let leases = stage
                .iter()
                .map(|p| self.slots.lease(p.module))
                .collect::<Result<Vec<_>, _>>()?;
            let (outs, batch) = (&outputs, &batch);
            let jobs: Vec<(&Slot, Job<'_, _>)> = stage
                .iter()
                .zip(&leases)
                .map(|(p, slot)| {
                    let job: Job<'_, Result<Forward, EngineError>> =
                        Box::new(move || self.forward_module(p.module, p.dp, batch, outs));
                    (&**slot, job)
                })
                .collect();
            let results = run_in_slots(jobs);
            drop(leases);
            let forward_ms = ms(t0);
            let mut launch = 0f64;
            let mut modules = Vec::with_capacity(stage.len());
            for (p, r) in stage.iter().zip(results) {
                let f = r?;
                launch = launch.max(micro((f.began - t0).as_secs_f64() * 1e3));
                modules.push(ModuleTiming {
                    name: p.name.clone(),
                    forward_ms: f.ms,
                    backward_ms: 0.0,
                });
                if f.loss.is_some() {
                    loss = f.loss;
                }
                outputs[p.module] = f.output.clone();
                tapes[p.module] = Some(f);
            }
            reports.push(StageReport {
                forward_ms,
                backward_ms: 0.0,
                forward_launch_ms: launch,
                backward_launch_ms: 0.0,
                modules,
            });
        }
        drop(outputs);

        // Backward, stage by stage in reverse. grads_in[producer][consumer].
        let mut grads_in: Vec<Vec<Option<Tensor>>> = vec![vec![None; n]; n];
        let mut param_grads: Vec<Vec<Tensor>> = vec![Vec::new(); n];
        for (si, stage) in self.schedule.stages.iter().enumerate().rev() {
            let t0 = Instant::now();
            let leases = stage
                .iter()
                .map(|p| self.slots.lease(p.module))
                .collect::<Result<Vec<_>, _>>()?;
            let jobs: Vec<(&Slot, Job<'_, _>)> = stage
                .iter()
                .zip(&leases)
                .map(|(p, slot)| {
                    let tape = tapes[p.module].take().expect("forward ran");
                    let from_consumers: Vec<Tensor> = grads_in[p.module]
                        .iter_mut()
                        .filter_map(Option::take)
                        .collect();
                    let job: Job<'_, Result<Backward, EngineError>> = Box::new(move || {
                        self.backward_module(p.module, tape, from_consumers, apply)
                    });
                    (&**slot, job)
                })
                .collect();
            let results = run_in_slots(jobs);
            drop(leases);
            let report = &mut reports[si];
            report.backward_ms = ms(t0);
            for ((p, r), timing) in stage.iter().zip(results).zip(&mut report.modules) {
                let b = r?;
                report.backward_launch_ms = report
                    .backward_launch_ms
                    .max(micro((b.began - t0).as_secs_f64() * 1e3));
                timing.backward_ms = b.ms;
                for (producer, g) in b.input_grads {
                    let cell = &mut grads_in[producer][p.module];
                    *cell = Some(match cell.take() {
                        None => g,
                        Some(acc) => (acc + g).map_err(EngineError::tensor(&p.name))?,
                    });
                }
                if let Some(g) = b.param_grads {
                    param_grads[p.module] = g;
                }
            }
        }
        let loss = loss.expect("the model has a loss module");
        Ok((loss, reports, (!apply).then_some(param_grads)))
    }

    /// Forward pass of module `m`'s `dp` replicas, inside its slot.
    fn forward_module(
        &self,
        m: usize,
        dp: usize,
        batch: &Batch,
        outputs: &[Option<Tensor>],
    ) -> Result<Forward, EngineError> {
        let began = Instant::now();
        let module = &self.model.modules[m];
        let replicas = shards(self.config.batch, dp)
            .into_par_iter()
            .map(|shard| -> candle_core::Result<ReplicaTape> {
                let mut xs = Vec::with_capacity(module.inputs.len());
                let mut vars = Vec::with_capacity(module.inputs.len());
                for input in &module.inputs {
                    let whole = match input {
                        Input::Data(key) => batch.tensors[key].clone(),
                        Input::Module(p) => outputs[*p].clone().expect("producers run earlier"),
                    };
                    let x = match module.coupling {
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
                let out = module.net.forward(&xs, &shard)?;
                Ok(ReplicaTape {
                    rows: shard.rows,
                    out,
                    inputs: vars,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()
            .map_err(EngineError::tensor(module.name))?;
        let (mut output, mut loss) = (None, None);
        let err = EngineError::tensor(module.name);
        match module.output {
            Output::Activation => {
                let shards = replicas.iter().map(|r| r.out.detach()).collect();
                output = Some(self.collective.all_gather_rows(shards).map_err(err)?);
            }
            Output::Loss => {
                let mut total = 0f32;
                for r in &replicas {
                    total += r
                        .out
                        .to_scalar::<f32>()
                        .map_err(EngineError::tensor(module.name))?;
                }
                loss = Some(total);
            }
        }
        Ok(Forward {
            replicas,
            output,
            loss,
            began,
            ms: ms(began),
        })
    }

    /// Backward pass of module `m`'s replicas and its optimizer step, inside its slot.
    /// `from_consumers` are ∂loss/∂output from each consumer, in module order.
    fn backward_module(
        &self,
        m: usize,
        tape: Forward,
        from_consumers: Vec<Tensor>,
        apply: bool,
    ) -> Result<Backward, EngineError> {
        let began = Instant::now();
        let module = &self.model.modules[m];
        let err = || EngineError::tensor(module.name);
        let mut out_grad: Option<Tensor> = None;
        for g in from_consumers {
            out_grad = Some(match out_grad {
                None => g,
                Some(acc) => (acc + g).map_err(err())?,
            });
        }
        type ReplicaGrads = (Vec<Tensor>, Vec<Option<Tensor>>);
        let per_replica = tape
            .replicas
            .par_iter()
            .map(|r| -> candle_core::Result<ReplicaGrads> {
                let grads = match module.output {
                    Output::Loss => r.out.backward()?,
                    Output::Activation => {
                        let g = out_grad
                            .as_ref()
                            .expect("an activation is consumed")
                            .narrow(0, r.rows.start, r.rows.len())?;
                        r.out.mul(&g)?.sum_all()?.backward()?
                    }
                };
                let params = module
                    .params
                    .iter()
                    .map(|(_, v)| match grads.get(v.as_tensor()) {
                        Some(g) => Ok(g.clone()),
                        None => v.as_tensor().zeros_like(),
                    })
                    .collect::<candle_core::Result<Vec<_>>>()?;
                let inputs = r
                    .inputs
                    .iter()
                    .map(|v| {
                        v.as_ref()
                            .map(|v| match grads.get(v.as_tensor()) {
                                Some(g) => Ok(g.clone()),
                                None => v.as_tensor().zeros_like(),
                            })
                            .transpose()
                    })
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Ok((params, inputs))
            })
            .collect::<candle_core::Result<Vec<_>>>()
            .map_err(err())?;
        let (params, inputs): (Vec<_>, Vec<_>) = per_replica.into_iter().unzip();
        let params = self.collective.all_reduce_sum(params).map_err(err())?;

        let mut input_grads = Vec::new();
        for (i, input) in module.inputs.iter().enumerate() {
            let Input::Module(producer) = input else {
                continue;
            };
            let local: Vec<Tensor> = inputs
                .iter()
                .map(|r| r[i].clone().expect("module inputs are variables"))
                .collect();
            let g = match module.coupling {
                Coupling::Sharded => self.collective.all_gather_rows(local),
                Coupling::Gathered => self
                    .collective
                    .all_reduce_sum(local.into_iter().map(|t| vec![t]).collect())
                    .map(|mut v| v.remove(0)),
            }
            .map_err(err())?;
            input_grads.push((*producer, g));
        }

        let param_grads = if apply {
            let mut opt = self.optimizers[m].lock().expect("optimizer lock");
            opt.step(&module.params, &params)
                .map_err(EngineError::tensor(module.name))?;
            None
        } else {
            Some(params)
        };
        Ok(Backward {
            input_grads,
            param_grads,
            began,
            ms: ms(began),
        })
    }
}
