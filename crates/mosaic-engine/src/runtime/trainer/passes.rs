//! One iteration's passes over the schedule (see the parent module): forward stage by stage,
//! backward in reverse, each module's replicas in its slot, their gradients summed across
//! ranks in one order ([`Turns`]) and the optimizer stepped there.

use std::time::Instant;

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use super::launch;
use super::{
    micro, ms, Backward, Forward, Grads, Iteration, ModuleTiming, ReplicaTape, Replicas,
    StageReport, Trainer,
};
use crate::error::EngineError;
use crate::models::data::Batch;
use crate::models::model::{shards, Coupling, Input, Output, Shard};
use crate::runtime::collective::buffers::{bucket, unbucket};
use crate::runtime::collective::{Turn, Turns};
use crate::runtime::schedule::Placement;
use crate::runtime::slot::{run_in_slots, Job, Slot};

impl Trainer {
    /// Runs one iteration; `apply` steps the optimizers, else the summed gradients are
    /// kept.
    pub(super) fn iterate(&self, apply: bool) -> Result<Iteration, EngineError> {
        let start = Instant::now();
        let batch = self
            .model
            .data
            .batch(self.step, self.config.batch, &Device::Cpu)
            .map_err(EngineError::tensor("data"))?;
        let data_ms = ms(start);
        let (loss, mut stages, tapes) = self.forward_pass(&batch, apply)?;
        let grads = self.backward_pass(tapes, &mut stages, apply)?;
        Ok(Iteration {
            loss,
            data_ms,
            stages,
            grads,
        })
    }

    /// Runs one job per module of `stage`, each in its module's slot, all at the same time
    /// (see [`run_in_slots`]); slots created for the stage are dropped when it ends.
    fn run_stage<'s, T: Send>(
        &'s self,
        stage: &'s [Placement],
        mut job: impl FnMut(&'s Placement) -> Job<'s, T>,
    ) -> Result<Vec<T>, EngineError> {
        let leases = stage
            .iter()
            .map(|p| self.slots.lease(p.module()))
            .collect::<Result<Vec<_>, _>>()?;
        let jobs: Vec<(&Slot, Job<'_, T>)> = stage
            .iter()
            .zip(&leases)
            .map(|(p, slot)| (&**slot, job(p)))
            .collect();
        let results = run_in_slots(jobs);
        drop(leases);
        Ok(results)
    }

    /// Forward, stage by stage: the batch loss, every stage's report (forward part), and every
    /// module's forward state for the backward pass.
    #[allow(clippy::type_complexity)]
    fn forward_pass(
        &self,
        batch: &Batch,
        apply: bool,
    ) -> Result<(f32, Vec<StageReport>, Vec<Option<Forward>>), EngineError> {
        let n = self.model.modules.len();
        let mut outputs: Vec<Option<Tensor>> = vec![None; n];
        let mut tapes: Vec<Option<Forward>> = (0..n).map(|_| None).collect();
        let mut reports = Vec::with_capacity(self.schedule.stages.len());
        let mut loss = None;
        for stage in &self.schedule.stages {
            let t0 = Instant::now();
            let outs = &outputs;
            let results = self.run_stage(stage, |p| {
                Box::new(move || self.forward_module(p.module(), p.dp(), batch, outs, apply))
            })?;
            let mut launch = 0f64;
            let mut modules = Vec::with_capacity(stage.len());
            for (p, r) in stage.iter().zip(results) {
                let mut f = r?;
                launch = launch.max(micro((f.began - t0).as_secs_f64() * 1e3));
                modules.push(ModuleTiming {
                    name: p.name.clone(),
                    forward_ms: f.ms,
                    backward_ms: 0.0,
                    forward_host_ms: f.host_ms,
                    backward_host_ms: 0.0,
                    graphed: f.graphed,
                });
                let err = EngineError::tensor(&p.name);
                match self.model.modules[p.module()].output {
                    Output::Activation => {
                        outputs[p.module()] =
                            Some(self.gather_rows(p.module(), f.run.output.take())?);
                    }
                    Output::Loss => {
                        let total = self.sum_over_ranks(f.run.loss.take())?;
                        loss = Some(total.to_scalar::<f32>().map_err(err)?);
                    }
                }
                tapes[p.module()] = Some(f);
            }
            reports.push(StageReport {
                forward_ms: ms(t0),
                backward_ms: 0.0,
                forward_launch_ms: launch,
                backward_launch_ms: 0.0,
                modules,
            });
        }
        let loss = loss.expect("the model has a loss module");
        Ok((loss, reports, tapes))
    }

    /// Backward, stage by stage in reverse, filling in the backward part of `reports`: every
    /// module's summed parameter gradients when not `apply`ed (else empty).
    fn backward_pass(
        &self,
        mut tapes: Vec<Option<Forward>>,
        reports: &mut [StageReport],
        apply: bool,
    ) -> Result<Vec<Vec<Tensor>>, EngineError> {
        let n = self.model.modules.len();
        // grads_in[producer][consumer]: ∂loss/∂output of the producer, from the consumer.
        let mut grads_in: Vec<Vec<Option<Tensor>>> = vec![vec![None; n]; n];
        let mut param_grads: Vec<Vec<Tensor>> = vec![Vec::new(); n];
        for (si, stage) in self.schedule.stages.iter().enumerate().rev() {
            let t0 = Instant::now();
            let turns = self.turns(stage);
            let results = self.run_stage(stage, |p| {
                let tape = tapes[p.module()].take().expect("forward ran");
                let from_consumers: Vec<Tensor> = grads_in[p.module()]
                    .iter_mut()
                    .filter_map(Option::take)
                    .collect();
                let turn = turns.turn(p.module());
                Box::new(move || {
                    self.backward_module(p.module(), tape, from_consumers, turn, apply)
                })
            })?;
            let report = &mut reports[si];
            for ((p, r), timing) in stage.iter().zip(results).zip(&mut report.modules) {
                let b = r?;
                report.backward_launch_ms = report
                    .backward_launch_ms
                    .max(micro((b.began - t0).as_secs_f64() * 1e3));
                timing.backward_ms = b.ms;
                timing.backward_host_ms = b.host_ms;
                self.hand_back(p.module(), b.input_grads, &mut grads_in)?;
                if let Some(g) = b.param_grads {
                    param_grads[p.module()] = g;
                }
            }
            report.backward_ms = ms(t0);
        }
        Ok(param_grads)
    }

    /// Hands module `m`'s ∂loss/∂input (this rank's part, per input) to its producers, as the
    /// whole batch on every rank: added into `grads_in[producer][m]`.
    fn hand_back(
        &self,
        m: usize,
        input_grads: Vec<Option<Tensor>>,
        grads_in: &mut [Vec<Option<Tensor>>],
    ) -> Result<(), EngineError> {
        let module = &self.model.modules[m];
        for (input, local) in module.inputs.iter().zip(input_grads) {
            let Input::Module(producer) = *input else {
                continue;
            };
            let g = match module.coupling {
                Coupling::Sharded => self.gather_rows(m, local)?,
                Coupling::Gathered => self.sum_over_ranks(local)?,
            };
            let cell = &mut grads_in[producer][m];
            *cell = Some(match cell.take() {
                None => g,
                Some(acc) => (acc + g).map_err(EngineError::tensor(module.name))?,
            });
        }
        Ok(())
    }

    /// The shards of module `m`'s replicas that run on this rank.
    fn local_shards(&self, m: usize, dp: usize) -> Vec<Shard> {
        let me = self.collective.rank();
        shards(self.config.batch, dp)
            .into_iter()
            .filter(|s| self.ranks[m][s.index] == me)
            .collect()
    }

    /// Forward pass of module `m`'s replicas on this rank, inside its slot; replayed from its
    /// CUDA graph in a step that `apply`s updates, where it has one (see [`Launch`]).
    fn forward_module(
        &self,
        m: usize,
        dp: usize,
        batch: &Batch,
        outputs: &[Option<Tensor>],
        apply: bool,
    ) -> Result<Forward, EngineError> {
        let began = Instant::now();
        let module = &self.model.modules[m];
        let device = &self.devices[m];
        let err = || EngineError::tensor(module.name);
        // The whole batch of every input, on this module's device (a copy from the host or
        // from the producer's slot; none on the CPU).
        let wholes = module
            .inputs
            .iter()
            .map(|input| match input {
                Input::Data(key) => batch.tensors[key].to_device(device),
                Input::Module(p) => outputs[*p]
                    .as_ref()
                    .expect("producers run earlier")
                    .to_device(device),
            })
            .collect::<candle_core::Result<Vec<_>>>()
            .map_err(err())?;
        let mut launch = self.launches[m].lock().expect("launch lock");
        let (run, graphed) = if apply && launch.replays() {
            let run = |inputs: &[Tensor]| self.forward_replicas(m, dp, inputs);
            launch::forward(&mut launch, device, wholes, &run).map_err(err())?
        } else {
            (self.forward_replicas(m, dp, &wholes).map_err(err())?, false)
        };
        drop(launch);
        // The module's work is done when its stream is (the stage waits for its slowest).
        let host_ms = ms(began);
        device.synchronize().map_err(err())?;
        Ok(Forward {
            run,
            graphed,
            began,
            host_ms,
            ms: ms(began),
        })
    }

    /// Module `m`'s replicas on this rank run forward on the whole batch's `inputs` (on its
    /// device), their output or loss share gathered.
    fn forward_replicas(
        &self,
        m: usize,
        dp: usize,
        inputs: &[Tensor],
    ) -> candle_core::Result<Replicas> {
        let module = &self.model.modules[m];
        // A module that never back-propagates lets its tape go at once.
        let keeps_tape = module.back_propagates();
        let replica = |shard: Shard| -> candle_core::Result<ReplicaTape> {
            let (xs, vars) = module.replica_inputs(inputs.iter().cloned(), &shard)?;
            let out = module.net.forward(&xs, &shard)?;
            let out = if keeps_tape { out } else { out.detach() };
            Ok(ReplicaTape {
                rows: shard.rows,
                out,
                inputs: vars,
            })
        };
        let tapes = each_replica(&self.devices[m], self.local_shards(m, dp), replica)?;
        let local = tapes.iter().map(|r| r.out.detach()).collect();
        let (output, loss) = match module.output {
            Output::Activation => (cat_rows(local)?, None),
            Output::Loss => (None, sum_all(local)?),
        };
        Ok(Replicas {
            tapes,
            output,
            loss,
        })
    }

    /// The order in which `stage`'s modules start their gradient sums across ranks on this rank,
    /// where the collective needs one (see [`Turns`]): the stage's order, every rank's alike.
    pub(super) fn turns(&self, stage: &[Placement]) -> Turns {
        if !self.collective.sums_in_order() {
            return Turns::default();
        }
        Turns::new(
            (stage.iter().map(Placement::module))
                .filter(|&m| self.sums_across_ranks(m))
                .collect(),
        )
    }

    /// Whether module `m`'s gradients are summed across ranks at each step on this rank: it
    /// trains, has parameters, and has replicas here and on another rank.
    fn sums_across_ranks(&self, m: usize) -> bool {
        let (module, group) = (&self.model.modules[m], &self.groups[m]);
        module.trainable
            && !module.params.is_empty()
            && group.len() > 1
            && group.contains(&self.collective.rank())
    }

    /// Backward pass of module `m`'s replicas on this rank and its optimizer step, inside its
    /// slot. `from_consumers` are ∂loss/∂output from each consumer, in module order; `turn` is
    /// its place among the stage's gradient sums.
    fn backward_module(
        &self,
        m: usize,
        tape: Forward,
        from_consumers: Vec<Tensor>,
        turn: Turn<'_>,
        apply: bool,
    ) -> Result<Backward, EngineError> {
        let began = Instant::now();
        let module = &self.model.modules[m];
        let device = &self.devices[m];
        let err = || EngineError::tensor(module.name);
        // Copied from the consumers' devices; the originals are kept until this module's
        // stream is done with the copies.
        let here = from_consumers
            .iter()
            .map(|g| g.to_device(device))
            .collect::<candle_core::Result<Vec<_>>>()
            .map_err(err())?;
        let out_grad = sum_all(here).map_err(err())?;
        let grads = if !module.back_propagates() {
            Grads {
                params: None,
                inputs: vec![None; module.inputs.len()],
            }
        } else if tape.graphed {
            let mut launch = self.launches[m].lock().expect("launch lock");
            let run =
                |tapes: &[ReplicaTape], g: Option<&Tensor>| self.backward_replicas(m, tapes, g);
            launch::backward(&mut launch, device, out_grad, &run).map_err(err())?
        } else {
            (self.backward_replicas(m, &tape.run.tapes, out_grad.as_ref())).map_err(err())?
        };
        let Grads {
            params,
            inputs: input_grads,
        } = grads;

        let param_grads = if !module.trainable {
            // Frozen: no update, no all-reduce; zero gradients when asked for.
            let zeros = || {
                module
                    .params
                    .iter()
                    .map(|(_, v)| v.as_tensor().zeros_like())
            };
            (!apply)
                .then(|| zeros().collect::<candle_core::Result<Vec<_>>>())
                .transpose()
                .map_err(err())?
        } else {
            // No replica on this rank: nothing to reduce or update.
            match self.reduce_params(m, params, turn)? {
                Some(params) if apply => {
                    let mut opt = self.optimizers[m].lock().expect("optimizer lock");
                    opt.step(&module.params, &params).map_err(err())?;
                    None
                }
                params => params,
            }
        };
        let host_ms = ms(began);
        device.synchronize().map_err(err())?;
        drop(from_consumers);
        Ok(Backward {
            input_grads,
            param_grads,
            began,
            host_ms,
            ms: ms(began),
        })
    }

    /// Back-propagates module `m`'s replicas on this rank from their `tapes`, given
    /// ∂loss/∂output of the whole batch (`None` for the loss module).
    fn backward_replicas(
        &self,
        m: usize,
        tapes: &[ReplicaTape],
        out_grad: Option<&Tensor>,
    ) -> candle_core::Result<Grads> {
        let module = &self.model.modules[m];
        let per_replica = each_replica(&self.devices[m], tapes, |r| {
            module.replica_backward(&r.out, out_grad, &r.rows, &r.inputs)
        })?;
        let (replicas, inputs): (Vec<_>, Vec<_>) = per_replica.into_iter().unzip();
        // Parameter gradients summed in replica order.
        let mut replicas = replicas.into_iter();
        let params = match replicas.next() {
            None => None,
            Some(mut params) => {
                for r in replicas {
                    for (a, t) in params.iter_mut().zip(r) {
                        *a = (&*a + t)?;
                    }
                }
                Some(params)
            }
        };
        // ∂loss/∂input of this rank's replicas, per input: their row shards in replica order,
        // or for a gathered module (every replica saw the whole batch) their sum.
        let inputs = (0..module.inputs.len())
            .map(|i| {
                let local: Vec<Tensor> = inputs.iter().filter_map(|r| r[i].clone()).collect();
                match module.coupling {
                    Coupling::Sharded => cat_rows(local),
                    Coupling::Gathered => sum_all(local),
                }
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Grads { params, inputs })
    }

    /// Module `m`'s parameter gradients, summed over this rank's replicas (`None` with no
    /// replica on this rank), summed over the ranks of its group by one all-reduce of a single
    /// bucket, started in its `turn`.
    fn reduce_params(
        &self,
        m: usize,
        params: Option<Vec<Tensor>>,
        turn: Turn<'_>,
    ) -> Result<Option<Vec<Tensor>>, EngineError> {
        let err = || EngineError::tensor(self.model.modules[m].name);
        let Some(mut params) = params else {
            return Ok(None);
        };
        if self.sums_across_ranks(m) {
            // One bucket per module: a single all-reduce of every parameter's gradient, on the
            // module's device (a GPU's memory, with NCCL).
            let bucket = bucket(&params).map_err(err())?;
            turn.wait();
            let sum = (self.collective).all_reduce_bucket(m, &bucket)?;
            drop(turn);
            params = unbucket(&sum, &params).map_err(err())?;
        }
        Ok(Some(params))
    }
}

/// `f` over a module's replicas on this rank, in order: as tasks of the module's slot on a
/// CPU, one after another on a GPU (they share the slot's stream and cuBLAS handle, which one
/// thread at a time may use).
fn each_replica<I, T, F>(device: &Device, replicas: I, f: F) -> candle_core::Result<Vec<T>>
where
    I: IntoParallelIterator + IntoIterator<Item = <I as IntoParallelIterator>::Item>,
    T: Send,
    F: Fn(<I as IntoParallelIterator>::Item) -> candle_core::Result<T> + Sync + Send,
{
    if device.is_cpu() {
        replicas.into_par_iter().map(f).collect()
    } else {
        replicas.into_iter().map(f).collect()
    }
}

/// This rank's replicas' row shards as one tensor, in replica order (`None` if it has none).
fn cat_rows(local: Vec<Tensor>) -> candle_core::Result<Option<Tensor>> {
    match local.len() {
        0 => Ok(None),
        1 => Ok(local.into_iter().next()),
        _ => Tensor::cat(&local.iter().collect::<Vec<_>>(), 0).map(Some),
    }
}

/// The sum of this rank's replicas' tensors, in replica order (`None` if it has none).
fn sum_all(local: Vec<Tensor>) -> candle_core::Result<Option<Tensor>> {
    let mut acc: Option<Tensor> = None;
    for t in local {
        acc = Some(match acc {
            None => t,
            Some(a) => (a + t)?,
        });
    }
    Ok(acc)
}
