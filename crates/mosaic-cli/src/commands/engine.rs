//! What the engine's commands (`train`, `measure`, `data`) share: their errors, candle's
//! threads, one process, and the schedule a run follows.

use std::path::{Path, PathBuf};

use anyhow::Result;
use mosaic_engine::models::{self, Field, Kind};
use mosaic_engine::{sequential_plan, EngineError, Model, Schedule};
use mosaic_plan::Plan;

use crate::input::BadInput;

/// Turns an engine error into bad input (exit code 2) when it is the user's.
pub fn engine(e: EngineError) -> anyhow::Error {
    if e.is_bad_input() {
        BadInput(e.to_string()).into()
    } else {
        e.into()
    }
}

/// The process environment the engine runs in, where the user has not set it. Called before
/// any other thread exists and before any candle op or CUDA call, so setting the variables is
/// safe and takes effect:
/// - `CANDLE_NUM_THREADS=1` keeps every candle op on its slot's threads: candle runs elementwise
///   ops of 64 Ki elements or more on a process-wide pool of its own that no slot bounds; with
///   one "thread" that pool is empty and they run on the calling slot thread (see
///   mosaic_engine::slot).
/// - `CUDA_DEVICE_MAX_CONNECTIONS=32` gives each slot's stream a hardware work queue of its own
///   up to 32 slots (the driver's default is 8): streams that share a queue may wait on each
///   other's work, which CUDA 13.0's `cuda.h` names as what can keep disjoint green contexts
///   from running at once (`cuDevSmResourceSplitByCount`).
pub fn set_engine_env() {
    for (name, value) in [
        ("CANDLE_NUM_THREADS", "1"),
        ("CUDA_DEVICE_MAX_CONNECTIONS", "32"),
    ] {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, value);
        }
    }
}

/// A model's size factor in (0, 1] (`--size` of `train`, `measure` and `bench engine`).
pub fn size_factor(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 1.0 => Ok(x),
        _ => Err(format!("expected a factor in (0, 1], got {s:?}")),
    }
}

/// Refuses to run `what` as one of several ranks of an MPI launcher: it is one process's job
/// (a measurement, or a file every rank would write at once).
pub fn one_process(what: &str) -> Result<()> {
    let ranks = std::env::var("OMPI_COMM_WORLD_SIZE").or_else(|_| std::env::var("PMI_SIZE"));
    match ranks {
        Ok(n) if n != "1" => Err(BadInput(format!(
            "{what} runs in one process, but an MPI launcher started {n}: run it without mpirun"
        ))
        .into()),
        _ => Ok(()),
    }
}

/// A mosaic-plan/1 file read for the engine model `model` (as `--model` names it).
pub struct PlanFile {
    plan: Plan,
    path: PathBuf,
}

/// Reads the plan at `path` and refuses one whose `model` names another model than `model`:
/// it must name `model` itself or, for a tiny model, the zoo model whose modules it has
/// (`clip` for clip-tiny: `mosaic plan --model clip` plans train it). A plan that names no
/// model (one from `mosaic plan --profiles`, or written by hand) is read by its module names,
/// which [`schedule`] checks against the model's.
pub fn load_plan_for(path: &Path, model: &str) -> Result<PlanFile> {
    let plan = mosaic_plan::load_plan(path)?;
    if let Some(planned) = &plan.model {
        if !plan_is_for(planned, model) {
            let mut fits = vec![model.to_ascii_lowercase()];
            fits.extend(zoo_twin(model));
            return Err(BadInput(format!(
                "{}: field `model`: the plan is for {planned}, but --model is {model}: expected \
                 {} (`mosaic train template --model {model}` writes a plan for it)",
                path.display(),
                fits.join(" or ")
            ))
            .into());
        }
    }
    Ok(PlanFile {
        plan,
        path: path.to_path_buf(),
    })
}

/// The zoo model a tiny engine model mirrors, module for module (`clip` for `clip-tiny`).
fn zoo_twin(model: &str) -> Option<String> {
    let lower = model.to_ascii_lowercase();
    let base = lower.strip_suffix("-tiny")?;
    mosaic_zoo::model(base).ok().map(|m| m.name)
}

/// Whether a plan whose `model` is `planned` is one for the engine model `model`.
fn plan_is_for(planned: &str, model: &str) -> bool {
    mosaic_zoo::same_model(planned, model)
        || zoo_twin(model).is_some_and(|twin| mosaic_zoo::same_model(planned, &twin))
}

/// The schedule of `model` by `plan` (read by [`load_plan_for`]), or by the default plan over
/// `gpus` GPUs (every module its own stage, on every GPU at quota 1.0).
pub fn schedule(
    model: &Model,
    plan: Option<&PlanFile>,
    gpus: usize,
    batch: usize,
    cores: usize,
) -> Result<Schedule> {
    let default;
    let (plan, file) = match plan {
        Some(p) => (&p.plan, p.path.clone()),
        None => {
            default = sequential_plan(model, gpus);
            (&default, PathBuf::from("(default plan)"))
        }
    };
    Schedule::from_plan(plan, &file, model, batch, cores).map_err(engine)
}

/// Refuses `--model NAME` for `command`, which trains on this machine's CPU at the tiny
/// models' one size, unless NAME is one of `accepted` (the tiny models its `--help` lists).
pub fn tiny_model(command: &str, model: &str, accepted: &[&str]) -> Result<()> {
    if accepted.iter().any(|a| a.eq_ignore_ascii_case(model)) {
        return Ok(());
    }
    let why = if models::MODELS
        .iter()
        .any(|m| m.0.eq_ignore_ascii_case(model))
    {
        format!(
            "{command} runs the model at one size on this machine's CPU, and {model} is a \
             zoo-built model at its real size"
        )
    } else {
        format!("unknown engine model \"{model}\" (for {command})")
    };
    Err(BadInput(format!(
        "--model {model}: {why}; expected {}",
        accepted.join(" or ")
    ))
    .into())
}

/// `image [16, 16] f32, text [6] ids < 64`.
pub fn describe_fields(fields: &[Field]) -> String {
    let f: Vec<String> = fields
        .iter()
        .map(|f| {
            let dims: Vec<String> = f.dims.iter().map(ToString::to_string).collect();
            let kind = match (f.kind, f.lengths_of) {
                (Kind::Index(n), Some(of)) => {
                    format!("lengths of {of}, 1 to {} (optional)", n.saturating_sub(1))
                }
                (Kind::Real, _) => "f32".to_string(),
                (Kind::Index(n), None) => format!("ids < {n}"),
            };
            format!("{} [{}] {kind}", f.name, dims.join(", "))
        })
        .collect();
    f.join(", ")
}
