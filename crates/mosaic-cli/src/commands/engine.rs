//! What the engine's commands (`train`, `measure`, `data`) share: their errors, candle's
//! threads, one process, and the schedule a run follows.

use std::path::{Path, PathBuf};

use anyhow::Result;
use mosaic_engine::models::{Field, Kind};
use mosaic_engine::{sequential_plan, EngineError, Model, Schedule};

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

/// The schedule of `model` by the plan at `plan` (a mosaic-plan/1 file), or by the default
/// plan over `gpus` GPUs (every module its own stage, on every GPU at quota 1.0).
pub fn schedule(
    model: &Model,
    plan: Option<&Path>,
    gpus: usize,
    batch: usize,
    cores: usize,
) -> Result<Schedule> {
    let (plan, file) = match plan {
        Some(path) => (mosaic_plan::load_plan(path)?, path.to_path_buf()),
        None => (
            sequential_plan(model, gpus),
            PathBuf::from("(default plan)"),
        ),
    };
    Schedule::from_plan(&plan, &file, model, batch, cores).map_err(engine)
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
