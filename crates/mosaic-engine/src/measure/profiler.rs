//! The profiler of Mosaic §3.3 and §4 ("Performance Model") on this machine: a built-in
//! engine model's modules, ready to be measured one replica at a time, and the grid they are
//! measured on. [`Profiler::sweep`] (in [`super::sweep`]) and [`Profiler::colocations`] (in
//! [`super::colocate`]) use it.
//!
//! # The grid
//! - Quotas: `k / cores` for `k = 1..=cores` on a machine of at most
//!   [`MAX_QUOTA_STEPS`](super::MAX_QUOTA_STEPS) cores (every distinct slot size), else the
//!   paper's deciles `0.1, …, 1.0`; rounded to 0.01 so
//!   that they lie on `mosaic fit`'s 1 % lookup grid (the rounding never changes the slot's
//!   thread count, `round(quota × cores)`). See [`quota_grid`].
//! - Data-parallel degrees: the powers of two up to [`ProfileConfig::max_dp`] and at most the
//!   batch, so that every replica gets at least one sample. See [`dp_grid`].
//!
//! # One replica's iteration
//! A measurement is what **one data-parallel replica on its own device** sees: the replica's
//! iteration on its share of the batch (shard 0 of [`crate::models::model::shards`], the
//! largest when `dp` does not divide the batch) in a slot of `round(sm × cores)` threads. The
//! iteration is what [`crate::runtime::trainer`] does for one replica of one module:
//! 1. **forward**: the module's inputs for the shard (outputs of earlier modules wrapped in
//!    fresh leaf variables, as the trainer does at a module boundary) and its net's forward;
//! 2. **backward**: back-propagation from the replica's loss share (the loss module) or from
//!    `Σ y ⊙ g` with a fixed stand-in `g` for ∂loss/∂output (the other modules; the values of
//!    `g` do not change the work), then every parameter's and input's gradient read out;
//! 3. **all-reduce**: the gradient sum of `dp` replicas as the engine does it for replicas in
//!    one process: `dp` gradient sets (this replica's and `dp − 1` stand-in copies made before
//!    timing) added up in replica order, one tensor addition per parameter and replica. A
//!    collective between processes or devices (MPI, NCCL) costs something else and is not
//!    measured here; [`super::Point::parts`] keeps this phase separate. Zero at `dp = 1`;
//! 4. **optimizer**: the module's AdamW step.
//!
//! The activations and gradients that cross module boundaries (the trainer gathers and
//! redistributes them) are communication between modules, not part of a module's iteration,
//! and are not timed; neither is drawing the batch. Inputs from earlier modules are computed
//! once, when the profiler is created.

use std::sync::Mutex;
use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use mosaic_kit::rng::SplitMix64;
use serde::Serialize;

use super::bytes::{tape_bytes, tensor_bytes, Memory};
use super::machine::quota_grid;
use super::machine::Machine;
use crate::error::EngineError;
use crate::models::model::{Input, Model, Output, Shard};
use crate::models::nn::Params;
use crate::models::{self, Batch, Recipe};
use crate::runtime::graphed::{capture, differ, Capture, Captured, REPLAY_BOUND};
use crate::runtime::memory::check_sweep_memory;
use crate::runtime::optim::{AdamW, AdamWConfig};

/// Settings of a profiling sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileConfig {
    /// The global batch: a replica at data-parallel degree `dp` runs `batch / dp` samples.
    pub batch: usize,
    /// The largest data-parallel degree profiled (powers of two up to it).
    pub max_dp: usize,
    /// Untimed iterations before the timed ones at every grid point (at least one is run: the
    /// first iteration is where memory is counted).
    pub warmup: usize,
    /// Timed iterations per grid point; the median is kept.
    pub reps: usize,
    /// Seed of the model's parameters, its data and the stand-in gradients.
    pub seed: u64,
    /// The model's size factor in (0, 1] (the zoo-built models; the tiny ones have size 1).
    pub size: f64,
}

impl Default for ProfileConfig {
    /// Batch 16 (as `mosaic train`), dp up to 8, 2 warm-up and 21 timed iterations, seed 0,
    /// size 1.
    fn default() -> Self {
        ProfileConfig {
            batch: 16,
            max_dp: 8,
            warmup: 2,
            reps: 21,
            seed: 0,
            size: 1.0,
        }
    }
}

/// The data-parallel degrees profiled: powers of two up to `max_dp` and at most `batch`.
pub fn dp_grid(batch: usize, max_dp: usize) -> Vec<usize> {
    std::iter::successors(Some(1usize), |d| d.checked_mul(2))
        .take_while(|&d| d <= max_dp && d <= batch)
        .collect()
}

/// One iteration's phases, in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Timing {
    /// Forward pass.
    pub forward_ms: f64,
    /// Backward pass (with reading out the gradients).
    pub backward_ms: f64,
    /// Gradient all-reduce of the `dp` replicas (0 at dp 1).
    pub allreduce_ms: f64,
    /// AdamW step.
    pub optimizer_ms: f64,
    /// Of the forward and backward passes, the host's time until each had issued its last op
    /// (on the CPU, which runs an op as it issues it, all of it); not a phase of its own.
    pub host_ms: f64,
}

impl Timing {
    /// The whole iteration, in ms.
    pub fn total_ms(&self) -> f64 {
        self.forward_ms + self.backward_ms + self.allreduce_ms + self.optimizer_ms
    }
}

/// A phase's times, in ms: the host's until its pass returned, and until its device drained.
#[derive(Clone, Copy)]
struct Span {
    host_ms: f64,
    ms: f64,
}

/// Milliseconds since `t`.
fn elapsed_ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// What a module's timed iterations read: its whole-batch inputs and output-gradient stand-in.
struct Prepared {
    /// Whole-batch inputs in [`crate::Module::inputs`] order: data tensors, earlier modules'
    /// outputs.
    inputs: Vec<Tensor>,
    /// A stand-in for ∂loss/∂output over the whole batch (activation modules).
    out_grad: Option<Tensor>,
}

/// A replica's forward pass: its output and the variables wrapping its module inputs.
#[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))] // the GPU sweep's
type ForwardPass = (Tensor, Vec<Option<Var>>);

/// A replica's backward pass: its parameters' gradients and its module inputs'.
#[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))] // the GPU sweep's
type BackwardPass = (Vec<Tensor>, Vec<Option<Tensor>>);

/// A replica's passes captured as CUDA graphs ([`Profiler::capture`]).
#[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))] // the GPU sweep's
pub(super) struct GraphedPasses {
    // Dropped first: it reads the forward graph's tape.
    backward: Captured<BackwardPass>,
    forward: Captured<ForwardPass>,
}

/// Measures an engine model's modules on this machine.
pub struct Profiler {
    pub(super) model: Model,
    pub(super) config: ProfileConfig,
    pub(super) machine: Machine,
    /// Where each module's tensors are (indexed by module): the CPU, or a GPU slot's device.
    devices: Vec<Device>,
    prepared: Vec<Prepared>,
    optimizers: Vec<Mutex<AdamW>>,
}

impl Profiler {
    /// A profiler of the built-in model `model` on `machine` (from [`super::measure_machine`]). Fails
    /// on an unknown model or a setting that makes no sense (batch, reps or max dp of 0, a size
    /// outside (0, 1] or for a tiny model). Runs every module's forward pass once on the whole
    /// batch, for the inputs of the modules after it.
    pub fn new(
        model: &str,
        config: ProfileConfig,
        machine: Machine,
    ) -> Result<Profiler, EngineError> {
        Profiler::on(model, config, machine, &|_| Device::Cpu)
    }

    /// [`Profiler::new`] with each module's tensors on `place(module)` (GPU slots' devices, for
    /// [`super::sweep_gpu`] and [`super::colocations_gpu`]); `machine` is the host.
    pub(super) fn on(
        model: &str,
        config: ProfileConfig,
        machine: Machine,
        place: &dyn Fn(&str) -> Device,
    ) -> Result<Profiler, EngineError> {
        crate::models::data::check_batch(config.batch)?;
        for (setting, value) in [("--reps", config.reps), ("--max-dp", config.max_dp)] {
            if value == 0 {
                return Err(EngineError::BadSetting {
                    setting: setting.into(),
                    message: "expected at least 1".into(),
                });
            }
        }
        let recipe = Recipe {
            size: config.size,
            ..Recipe::new(model, config.seed)
        };
        let model = models::build_placed(&recipe, place)?;
        let devices: Vec<Device> = model.modules.iter().map(|m| place(m.name)).collect();
        if devices.iter().all(Device::is_cpu) {
            // Before the whole batch is drawn and pushed through every module.
            check_sweep_memory(&model, config.batch, machine.cores)?;
        }
        let batch = model
            .data
            .batch(0, config.batch, &Device::Cpu)
            .map_err(EngineError::tensor("data"))?;
        let prepared = prepare(&model, &devices, &batch, &config)?;
        let optimizers = AdamW::per_module(&model, AdamWConfig::default())?;
        Ok(Profiler {
            model,
            config,
            machine,
            devices,
            prepared,
            optimizers,
        })
    }

    /// The model being profiled.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The machine.
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// The settings.
    pub fn config(&self) -> &ProfileConfig {
        &self.config
    }

    /// The quotas of the sweep ([`quota_grid`] of the machine's cores).
    pub fn quotas(&self) -> Vec<f64> {
        quota_grid(self.machine.cores)
    }

    /// The data-parallel degrees of the sweep ([`dp_grid`]).
    pub fn dps(&self) -> Vec<usize> {
        dp_grid(self.config.batch, self.config.max_dp)
    }

    /// Grid points of the whole sweep.
    pub fn grid_points(&self) -> usize {
        self.model.modules.len() * self.dps().len() * self.quotas().len()
    }

    /// One replica's iteration of module `m` on `shard` (see the module documentation), with
    /// `others` the other replicas' gradients for the all-reduce; counts the memory when
    /// `count` is set (outside the timed phases).
    pub(super) fn iterate(
        &self,
        m: usize,
        shard: &Shard,
        others: &[Vec<Tensor>],
        count: bool,
    ) -> candle_core::Result<(Timing, Option<Memory>)> {
        let module = &self.model.modules[m];
        let prep = &self.prepared[m];
        let ((xs, vars, out), forward) = self.phase(m, || {
            let (xs, vars) = module.replica_inputs(prep.inputs.iter().cloned(), shard)?;
            let out = module.net.forward(&xs, shard)?;
            Ok((xs, vars, out))
        })?;
        let memory = count.then(|| self.count_memory(m, &out, &xs, &vars));
        let ((params, _inputs), backward) = self.phase(m, || {
            module.replica_backward(&out, prep.out_grad.as_ref(), &shard.rows, &vars)
        })?;
        Ok((self.update(m, params, others, forward, backward)?, memory))
    }

    /// [`Profiler::iterate`] with the forward and backward passes replayed from `graphs`.
    #[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))] // the GPU sweep's
    pub(super) fn iterate_graphed(
        &self,
        m: usize,
        graphs: &GraphedPasses,
        others: &[Vec<Tensor>],
    ) -> candle_core::Result<Timing> {
        let (_, forward) = self.phase(m, || graphs.forward.replay().map(drop))?;
        let (params, backward) = self.phase(m, || Ok(graphs.backward.replay()?.0.clone()))?;
        self.update(m, params, others, forward, backward)
    }

    /// `pass`, which launches its work on module `m`'s device, and its [`Span`]: a GPU runs
    /// the launched kernels later, so a phase ends when the device's stream has drained.
    fn phase<T>(
        &self,
        m: usize,
        pass: impl FnOnce() -> candle_core::Result<T>,
    ) -> candle_core::Result<(T, Span)> {
        let t = Instant::now();
        let out = pass()?;
        let host_ms = elapsed_ms(t);
        self.devices[m].synchronize()?;
        Ok((
            out,
            Span {
                host_ms,
                ms: elapsed_ms(t),
            },
        ))
    }

    /// An iteration's last two phases, the all-reduce of this replica's gradients `params`
    /// with the `others` (0 without others) and module `m`'s AdamW step, timed after its
    /// `forward` and `backward` passes.
    fn update(
        &self,
        m: usize,
        params: Vec<Tensor>,
        others: &[Vec<Tensor>],
        forward: Span,
        backward: Span,
    ) -> candle_core::Result<Timing> {
        let (params, allreduce) = self.phase(m, || all_reduce(params, others))?;
        let ((), step) = self.phase(m, || {
            let mut optimizer = self.optimizers[m].lock().expect("optimizer lock");
            optimizer.step(&self.model.modules[m].params, &params)
        })?;
        Ok(Timing {
            forward_ms: forward.ms,
            backward_ms: backward.ms,
            allreduce_ms: if others.is_empty() { 0.0 } else { allreduce.ms },
            optimizer_ms: step.ms,
            host_ms: forward.host_ms + backward.host_ms,
        })
    }

    /// Module `m`'s forward pass on `shard` and its backward pass captured as CUDA graphs, as
    /// the trainer replays a launch-bound module's ([`crate::runtime::graphed`]); why not,
    /// where either cannot be captured or its replay differs from the pass launched op by op.
    #[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))] // the GPU sweep's
    pub(super) fn capture(
        &self,
        m: usize,
        shard: &Shard,
    ) -> candle_core::Result<Result<GraphedPasses, String>> {
        let module = &self.model.modules[m];
        let prep = &self.prepared[m];
        let device = &self.devices[m];
        // The inputs are the profiler's own, where every replay reads them.
        let forward = || -> candle_core::Result<ForwardPass> {
            let (xs, vars) = module.replica_inputs(prep.inputs.iter().cloned(), shard)?;
            Ok((module.net.forward(&xs, shard)?, vars))
        };
        let differ_forward =
            |a: &ForwardPass, b: &ForwardPass| differ(&[Some(a.0.clone())], &[Some(b.0.clone())]);
        let forward = match capture(device, &forward, &differ_forward, REPLAY_BOUND)? {
            Capture::Graphed(f) => f,
            Capture::Refused { why, .. } => return Ok(Err(format!("the forward pass: {why}"))),
        };
        let (out, vars) = forward.last();
        let backward = || module.replica_backward(out, prep.out_grad.as_ref(), &shard.rows, vars);
        let differ_backward = |a: &BackwardPass, b: &BackwardPass| {
            let all = |g: &BackwardPass| -> Vec<Option<Tensor>> {
                (g.0.iter().cloned().map(Some))
                    .chain(g.1.iter().cloned())
                    .collect()
            };
            differ(&all(a), &all(b))
        };
        Ok(
            match capture(device, &backward, &differ_backward, REPLAY_BOUND)? {
                Capture::Graphed(backward) => Ok(GraphedPasses { backward, forward }),
                Capture::Refused { why, .. } => Err(format!("the backward pass: {why}")),
            },
        )
    }

    /// What a replica of module `m` holds once its forward pass produced `out` from `xs`
    /// (`vars` marks the inputs from other modules; the rest are data).
    fn count_memory(&self, m: usize, out: &Tensor, xs: &[Tensor], vars: &[Option<Var>]) -> Memory {
        let module = &self.model.modules[m];
        let data: Vec<&Tensor> = xs
            .iter()
            .zip(vars)
            .filter(|(_, v)| v.is_none())
            .map(|(x, _)| x)
            .collect();
        let opt = self.optimizers[m].lock().expect("optimizer lock");
        let params = tensor_bytes(module.params.iter().map(|(_, v)| v.as_tensor()));
        Memory {
            params,
            grads: params,
            optimizer: tensor_bytes(opt.m.iter().chain(&opt.v)),
            activations: tape_bytes(out, &module.params) + tensor_bytes(data),
        }
    }
}

/// What every module's timed iterations read: its whole-batch inputs from `batch` (of
/// `config.batch` samples) and earlier modules' outputs (every activation module's forward
/// pass runs once, on the whole batch), and a stand-in for ∂loss/∂output drawn from
/// `config.seed`.
fn prepare(
    model: &Model,
    devices: &[Device],
    batch: &Batch,
    config: &ProfileConfig,
) -> Result<Vec<Prepared>, EngineError> {
    let mut outputs: Vec<Option<Tensor>> = vec![None; model.modules.len()];
    let mut prepared = Vec::with_capacity(model.modules.len());
    for (i, m) in model.modules.iter().enumerate() {
        let err = EngineError::tensor(m.name);
        let inputs: Vec<Tensor> = m
            .inputs
            .iter()
            .map(|input| match input {
                Input::Data(key) => batch.tensors[key].clone(),
                Input::Module(p) => outputs[*p].clone().expect("producers come earlier"),
            })
            .map(|x| x.to_device(&devices[i]))
            .collect::<candle_core::Result<_>>()
            .map_err(EngineError::tensor(m.name))?;
        let out_grad = match m.output {
            Output::Loss => None,
            Output::Activation => {
                let whole = Shard {
                    index: 0,
                    count: 1,
                    rows: 0..config.batch,
                    batch: config.batch,
                };
                let out = m.net.forward(&inputs, &whole).map_err(err)?.detach();
                let values = SplitMix64::stream(config.seed, "profile/out-grad", i as u64)
                    .normals(out.elem_count(), 0.01);
                let g = Tensor::from_vec(values, out.shape(), out.device())
                    .and_then(|g| g.to_dtype(out.dtype()))
                    .map_err(EngineError::tensor(m.name))?;
                outputs[i] = Some(out);
                Some(g)
            }
        };
        prepared.push(Prepared { inputs, out_grad });
    }
    Ok(prepared)
}

/// The gradient sum of `dp` replicas as the engine does it in one process: `params` plus each
/// of the `others`, in replica order, one tensor addition per parameter and replica.
fn all_reduce(params: Vec<Tensor>, others: &[Vec<Tensor>]) -> candle_core::Result<Vec<Tensor>> {
    let mut sum = params;
    for other in others {
        for (acc, g) in sum.iter_mut().zip(other) {
            *acc = (&*acc + g)?;
        }
    }
    Ok(sum)
}

/// `dp − 1` deep copies of `params`: stand-ins for the other replicas' gradients.
pub(super) fn stand_in_grads(params: &Params, dp: usize) -> candle_core::Result<Vec<Vec<Tensor>>> {
    (1..dp)
        .map(|_| {
            params
                .iter()
                .map(|(_, v)| Ok(v.as_tensor().copy()?.detach()))
                .collect()
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::measure::machine::tests::machine;
    use crate::measure::MAX_QUOTA_STEPS;
    use crate::runtime::slot::threads_for;

    pub(crate) fn quick(batch: usize, max_dp: usize) -> ProfileConfig {
        ProfileConfig {
            batch,
            max_dp,
            warmup: 1,
            reps: 2,
            seed: 3,
            size: 1.0,
        }
    }

    #[test]
    fn grids_follow_the_machine_and_the_batch() {
        assert_eq!(quota_grid(1), [1.0]);
        assert_eq!(quota_grid(2), [0.5, 1.0]);
        assert_eq!(quota_grid(3), [0.33, 0.67, 1.0]);
        assert_eq!(quota_grid(64).len(), MAX_QUOTA_STEPS);
        assert_eq!(quota_grid(64)[0], 0.1);
        for cores in 1..=MAX_QUOTA_STEPS {
            let threads: Vec<usize> = quota_grid(cores)
                .iter()
                .map(|&q| threads_for(q, cores))
                .collect();
            assert_eq!(threads, (1..=cores).collect::<Vec<_>>(), "{cores} cores");
        }
        assert_eq!(dp_grid(16, 8), [1, 2, 4, 8]);
        assert_eq!(dp_grid(5, 8), [1, 2, 4]);
        assert_eq!(dp_grid(1, 8), [1]);
        assert_eq!(dp_grid(16, 3), [1, 2]);
    }

    #[test]
    fn bad_settings_and_models_are_named() {
        let e = Profiler::new("clip-huge", quick(8, 4), machine(2))
            .err()
            .unwrap();
        assert!(e.is_bad_input());
        assert!(e.to_string().contains("clip-huge") && e.to_string().contains("omni-tiny"));
        let e = Profiler::new("clip-tiny", quick(0, 4), machine(2))
            .err()
            .unwrap();
        assert!(e.to_string().starts_with("--batch"), "{e}");
    }
}
