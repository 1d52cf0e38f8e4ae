//! `mosaic bench engine`: the gain of temporal-spatial multiplexing, measured (Mosaic §5.3.1).
//! On the device present — one GPU (`--device cuda`) or this machine's CPU — a zoo-built model
//! trains by the Mosaic plan for one GPU and by every module alone on the whole device one
//! after another (Megatron-LM's schedule; DistMM's whole-GPU stages are the same schedule on
//! one GPU), at each per-GPU batch; it prints the measured times of both (the steps' stages,
//! which the plan predicts, with the whole steps, which add drawing the batch on the host and
//! reading the loss back), the speed-up and the planner's prediction error for the plan it ran,
//! then, for each stage of the plan whose modules share the device, that stage against its
//! modules one after another and each module's slowdown in its slot beside its share of the
//! SMs, split in two by the same module in its slot with no neighbour (the plan's stages run
//! one module at a time, each on its quota): what its share of the SMs costs it and what its
//! neighbours do: where co-location pays and why. Every model and zoo plan is checked before any step;
//! a (model, batch) that fails to train is reported as such and the others still run.
//!
//! The plan comes from the zoo's profile of the model (the calibrated device model of
//! `--cluster`'s device, per-GPU batch as its batch), so its prediction is about the model at
//! its real size on that device: the error is printed for `--size 1` on a GPU only. With
//! `--plan-from measured` it comes from what this engine measures here first, Mosaic's pipeline
//! end to end: every module alone at the batch on every quota (`mosaic measure profile`'s sweep
//! at dp 1), then random colocations of its modules (`mosaic measure colocations`), to which
//! Eq. 8's interference coefficients are fitted (`mosaic fit`), so that the plan is made from
//! what this engine does here, neighbours included, and its error, printed at any size and on
//! either device, is the planner's own.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use mosaic_engine::measure::{
    available_cores, colocation_file, colocations_gpu, gpu_colocation_source, measure_machine,
    profile_file, sweep_gpu, ColocationConfig, EngineProfile, MeasuredColocation, Point,
    ProfileConfig, Profiler,
};
use mosaic_engine::models::{self, Model, Recipe};
use mosaic_engine::{Compute, Device, EngineError, Schedule, StepReport, TrainConfig, Trainer};
use mosaic_kit::stats::median;
use mosaic_plan::{solve, Plan, SolveOptions};
use mosaic_profile::{Interference, PerfModel, ProfileFile};
use serde::Serialize;
use serde_json::json;

use crate::commands::engine::{engine, one_process, set_engine_env, size_factor};
use crate::commands::measure::{colocation_line, point_line, WARMUP};
use crate::input::BadInput;

/// Arguments of `mosaic bench engine`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Zoo-built engine models to measure: clip, imagebind.
    #[arg(long, value_delimiter = ',', default_values_t = ["clip".to_string(), "imagebind".to_string()])]
    models: Vec<String>,
    /// Per-GPU batches (the paper's 16 samples on 1 and on 8 GPUs: 16 and 2).
    #[arg(long, value_delimiter = ',', default_values_t = [16usize, 2],
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=4096))]
    batches: Vec<usize>,
    /// Where the modules compute: cuda (green-context slots on GPU 0; the GPU build) or cpu.
    #[arg(long, default_value = "cuda", value_parser = ["cuda", "cpu"])]
    device: String,
    /// Scale the models down by this factor in (0, 1] (1: real size).
    #[arg(long, default_value_t = 1.0, value_parser = size_factor)]
    size: f64,
    /// The built-in cluster whose device the plan's profile describes (one GPU of it is used).
    #[arg(long, default_value = "h100x1")]
    cluster: String,
    /// Timed steps of each schedule, after 2 warm-up steps; the median counts (1–1,000).
    #[arg(long, default_value_t = 10,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    steps: usize,
    /// Where the plan's profile comes from: zoo (the device model of --cluster's device, for
    /// the real-size model) or measured (each module alone at the batch on every quota of this
    /// device, measured first).
    #[arg(long, default_value = "zoo", value_parser = ["zoo", "measured"])]
    plan_from: String,
    /// One JSON object per (model, batch) per line instead of the table.
    #[arg(long)]
    json: bool,
}

/// One measured (model, batch).
struct Row {
    model: String,
    batch: usize,
    plan: String,
    predicted_ms: f64,
    /// By the plan.
    mosaic: Timed,
    /// Every module alone, one after another.
    sequential: Timed,
    /// The plan's stages of more than one module, each against its modules one after another.
    shared: Vec<SharedStage>,
    /// The interference the plan was made with, where fitted here (`--plan-from measured`).
    fitted: Option<Fitted>,
}

/// Eq. 8's coefficients fitted to colocations measured on this device.
#[derive(Clone, Copy, Serialize)]
struct Fitted {
    /// The fitted model: the fullest whose coefficients a profile can hold.
    model: mosaic_fit::Model,
    /// Its coefficients.
    interference: Interference,
    /// Colocations measured.
    colocations: usize,
}

impl Fitted {
    /// No interference: nothing was co-located.
    fn none() -> Fitted {
        Fitted {
            model: mosaic_fit::Model::Unaware,
            interference: Interference::default(),
            colocations: 0,
        }
    }
}

/// Colocations measured per module of the model for `--plan-from measured`: Eq. 8 has three
/// unknowns, and a colocation of k ≥ 2 modules gives k observations, so two per module give
/// at least four observations per unknown (12 for CLIP's three modules).
const COLOCATIONS_PER_MODULE: usize = 2;

/// A stage of the Mosaic plan whose modules share the device, against the same modules one
/// after another on the whole device: where co-location pays and where it loses.
#[derive(Serialize)]
struct SharedStage {
    /// The stage's time (forward and backward phases), its modules co-located, in ms.
    colocated_ms: f64,
    /// Its modules' times alone on the whole device, summed, in ms.
    one_by_one_ms: f64,
    /// Its modules.
    modules: Vec<SharedModule>,
}

/// A module of a [`SharedStage`]: its time in its slot against its time alone. Slowed down
/// less than `1 / sm`, it left SMs idle alone (what co-location recovers); more, its share
/// of the SMs starved it (memory traffic, launches) or its neighbours slowed it, which
/// `isolated_ms` tells apart.
#[derive(Serialize)]
struct SharedModule {
    name: String,
    /// Its SM quota in the stage.
    sm: f64,
    /// Forward plus backward pass in its slot, in ms.
    slot_ms: f64,
    /// Forward plus backward pass in a slot of its quota with no module beside it, in ms:
    /// `slot_ms / isolated_ms` is what its neighbours cost it, `isolated_ms / alone_ms` what
    /// its share of the SMs does.
    isolated_ms: f64,
    /// Whether it was launched alike with neighbours and without (replayed from CUDA graphs
    /// in both or neither, recomputing in both or neither), as the two trainers decide each
    /// for itself: where not, `slot_ms / isolated_ms` mixes its neighbours' cost with that.
    launched_alike: bool,
    /// Forward plus backward pass alone on the whole device, in ms.
    alone_ms: f64,
}

/// Medians over the timed steps of one schedule, in ms.
#[derive(Clone)]
struct Timed {
    /// The step.
    step_ms: f64,
    /// The step's stages, summed: the step less drawing the batch on the host and reading the
    /// loss back, what the plan predicts.
    stages_ms: f64,
    /// Each stage: its forward and backward phases.
    stages: Vec<f64>,
    /// Each module by name: its forward plus backward pass (its slowest replica).
    modules: BTreeMap<String, f64>,
    /// The modules that recompute their activations (a trial step ran out of memory).
    recomputing: Vec<String>,
    /// The modules whose passes were replayed from CUDA graphs in the timed steps.
    graphed: Vec<String>,
}

/// Runs `mosaic bench engine`.
pub fn run(args: &Args) -> Result<()> {
    one_process("mosaic bench engine")?;
    set_engine_env();
    let cluster =
        mosaic_zoo::cluster(&args.cluster).map_err(|e| BadInput(format!("--cluster: {e}")))?;
    let compute = match args.device.as_str() {
        "cuda" => Compute::Cuda(0),
        _ => Compute::Cpu,
    };
    // Every model, and every plan from the zoo, before any step: bad input ends the run
    // before minutes of training.
    let zoo_built: Vec<&str> = (models::MODELS.iter().map(|m| m.0))
        .filter(|name| mosaic_zoo::model(name).is_ok())
        .collect();
    let mut rows = Vec::new();
    for name in &args.models {
        if !zoo_built.contains(&name.as_str()) {
            return Err(BadInput(format!(
                "--models: {name} is not a zoo-built engine model; expected {}",
                zoo_built.join(" or ")
            ))
            .into());
        }
        let mut spec = mosaic_zoo::model(name).map_err(|e| BadInput(format!("--models: {e}")))?;
        for &batch in &args.batches {
            spec.single_node_batch = batch as u32;
            spec.global_batch = batch as u32;
            let plan = match args.plan_from.as_str() {
                "measured" => None,
                _ => Some(plan_for(&spec, &cluster)?),
            };
            rows.push((name.as_str(), batch, plan));
        }
    }
    let mut header = !args.json;
    let mut failed = 0;
    for (name, batch, plan) in &rows {
        let plan = match plan {
            Some(plan) => Ok((plan.clone(), None)),
            None => plan_measured(name, *batch, args).map(|(p, f)| (p, Some(f))),
        };
        let row = plan.and_then(|(plan, fitted)| {
            let row = measure(name, *batch, &plan, args, compute)?;
            Ok(Row { fitted, ..row })
        });
        if std::mem::take(&mut header) {
            println!(
                "{:<10} {:>5}  {:>12} {:>12} {:>12} {:>8} {:>10}  plan",
                "model", "batch", "predicted ms", "Mosaic ms", "1-by-1 ms", "speed-up", "pred. err"
            );
        }
        match row {
            Ok(row) => print_row(&row, args)?,
            // Bad input fails every row alike: the run ends.
            Err(e) if e.downcast_ref::<BadInput>().is_some() => return Err(e),
            // One row failing (out of memory, a kernel, a slot) leaves the others to measure.
            Err(e) => {
                failed += 1;
                print_failed(name, *batch, &e, args)?;
            }
        }
    }
    if !args.json {
        let prediction = match (args.plan_from.as_str(), args.device.as_str()) {
            ("measured", "cpu") => {
                "from the modules measured alone and co-located on this CPU".to_string()
            }
            ("measured", _) => {
                "from the modules measured alone and co-located on this GPU".to_string()
            }
            _ => format!(
                "for the real model on one {} of {}",
                cluster.device.name, cluster.name
            ),
        };
        let threads = match args.device.as_str() {
            "cpu" => format!(
                "on the CPU a quota is round(quota × {}) threads; ",
                available_cores()
            ),
            _ => String::new(),
        };
        println!(
            "(Mosaic and 1-by-1: the stages' times, the batch drawn on the host and the loss \
             read back left out; {threads}the prediction is {prediction})"
        );
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} rows failed (above)", rows.len());
    }
    Ok(())
}

/// The Mosaic plan for one GPU of `cluster` on the zoo's profile of `spec`.
fn plan_for(spec: &mosaic_zoo::ModelSpec, cluster: &mosaic_zoo::ClusterSpec) -> Result<Plan> {
    let profile = mosaic_zoo::profile(spec, cluster);
    let perf = PerfModel::new(&profile, 0.1, Path::new(&spec.name)).with_context(|| {
        format!(
            "--batches: {} at per-GPU batch {} on one {}",
            spec.name, spec.single_node_batch, cluster.device.name
        )
    })?;
    solve(&perf, 1, &SolveOptions::default())
        .with_context(|| format!("planning {} on one GPU", spec.name))
}

/// The Mosaic plan for one GPU of this device from what the engine measures here first:
/// every module of the engine model `name` alone at per-GPU batch `batch` on every quota (dp
/// 1), timed over `--steps` iterations, and [`COLOCATIONS_PER_MODULE`] random colocations per
/// module, to which Eq. 8 is fitted.
fn plan_measured(name: &str, batch: usize, args: &Args) -> Result<(Plan, Fitted)> {
    let config = ProfileConfig {
        batch,
        max_dp: 1,
        warmup: WARMUP,
        reps: args.steps,
        seed: 0,
        size: args.size,
    };
    eprintln!(
        "measuring {name}'s modules alone at batch {batch} on every quota, then \
         {COLOCATIONS_PER_MODULE} random colocations of them per module…"
    );
    let draws = |profile: &EngineProfile| ColocationConfig {
        samples: COLOCATIONS_PER_MODULE * profile.modules.len(),
        seed: 0,
    };
    // The planner reads times and bandwidth utilisations; on the CPU the host's STREAM
    // bandwidth scales the latter (a short run does).
    let host = measure_machine(16, 1).map_err(engine)?;
    // Each point and colocation as it is measured (a run cut short still shows them).
    let point = |p: &Point| {
        eprintln!(
            "  {}",
            point_line(
                p,
                if args.device == "cuda" {
                    "SM"
                } else {
                    "thread"
                }
            )
        )
    };
    let sample =
        |i: usize, s: &MeasuredColocation| eprintln!("  [{}] {}", i + 1, colocation_line(s));
    let (profile, draws, colocations) = if args.device == "cuda" {
        let profile = sweep_gpu(name, config.clone(), host.clone(), 0, point).map_err(engine)?;
        let draws = draws(&profile);
        let (gpu, measured) =
            colocations_gpu(name, config.clone(), host, 0, &draws, sample).map_err(engine)?;
        let source = gpu_colocation_source(&gpu, name, &config, &draws);
        (
            profile,
            draws,
            colocation_file(&gpu.name, &measured, source),
        )
    } else {
        let profiler = Profiler::new(name, config, host).map_err(engine)?;
        let profile = profiler.sweep(point).map_err(engine)?;
        if profiler.quotas().len() < 2 {
            // One core: no two modules can share it, so no plan co-locates any.
            let plan = plan_on(&profile_file(&profile), name)?;
            return Ok((plan, Fitted::none()));
        }
        let draws = draws(&profile);
        let measured = profiler.colocations(&draws, sample).map_err(engine)?;
        let source = profiler.colocation_source(&draws);
        let machine = &profiler.machine().name;
        (profile, draws, colocation_file(machine, &measured, source))
    };
    let file = profile_file(&profile);
    let what = "(the measured profile)";
    let perf = PerfModel::new(&file, mosaic_fit::LOOKUP_GRANULARITY, Path::new(what))?;
    let obs = mosaic_fit::observations(&perf, &colocations, "(the measured colocations)")
        .with_context(|| format!("fitting {name}'s interference to its measured colocations"))?;
    let (model, interference) = mosaic_fit::fit_holdable(&obs);
    let plan = plan_on(&mosaic_fit::write_fitted(&file, interference), name)?;
    let fitted = Fitted {
        model,
        interference,
        colocations: draws.samples,
    };
    Ok((plan, fitted))
}

/// The Mosaic plan for one GPU of the measured profile `file` of model `name`.
fn plan_on(file: &ProfileFile, name: &str) -> Result<Plan> {
    let perf = PerfModel::new(file, 0.1, Path::new("(the measured profile)"))
        .with_context(|| format!("planning {name} on its measured profile"))?;
    solve(&perf, 1, &SolveOptions::default()).with_context(|| format!("planning {name} on one GPU"))
}

/// An error training one row: a schedule that does not fit the device is that row's failure
/// here (for `mosaic train` it is the user's plan, exit code 2), so the other rows still run.
fn row_failure(e: EngineError) -> anyhow::Error {
    match e {
        EngineError::DeviceMemory { .. } => e.into(),
        e => engine(e),
    }
}

/// Medians over `steps` timed steps of `schedule`, after two warm-up steps.
fn time(
    model: Model,
    schedule: Schedule,
    batch: usize,
    steps: usize,
    compute: Compute,
) -> Result<Timed> {
    let config = TrainConfig {
        batch,
        compute,
        ..TrainConfig::default()
    };
    let mut trainer = Trainer::new(model, schedule, config).map_err(row_failure)?;
    for _ in 0..2 {
        trainer.step().map_err(row_failure)?;
    }
    let reports = (0..steps)
        .map(|_| trainer.step().map_err(row_failure))
        .collect::<Result<Vec<StepReport>>>()?;
    let recomputing = trainer
        .recomputing()
        .iter()
        .map(|m| m.to_string())
        .collect();
    let graphed = (trainer.launches().into_iter())
        .filter(|l| l.graphed)
        .map(|l| l.module.to_string())
        .collect();
    Ok(Timed {
        recomputing,
        graphed,
        ..medians(&reports)
    })
}

/// The medians of `reports` (at least one, every one of the same schedule).
fn medians(reports: &[StepReport]) -> Timed {
    let of = |xs: Vec<f64>| median(&xs).expect("at least one timed step");
    let stage = |r: &StepReport, k: usize| r.stages[k].forward_ms + r.stages[k].backward_ms;
    let stages = (0..reports[0].stages.len())
        .map(|k| of(reports.iter().map(|r| stage(r, k)).collect()))
        .collect();
    let stages_ms = of((reports.iter())
        .map(|r| (0..r.stages.len()).map(|k| stage(r, k)).sum())
        .collect());
    let mut per_step: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in reports {
        let mut slowest: BTreeMap<&str, f64> = BTreeMap::new();
        for m in r.stages.iter().flat_map(|s| &s.modules) {
            let t = slowest.entry(&m.name).or_insert(0.0);
            *t = t.max(m.forward_ms + m.backward_ms);
        }
        for (name, t) in slowest {
            per_step.entry(name.to_string()).or_default().push(t);
        }
    }
    Timed {
        step_ms: of(reports.iter().map(|r| r.step_ms).collect()),
        stages_ms,
        stages,
        modules: per_step.into_iter().map(|(n, ts)| (n, of(ts))).collect(),
        recomputing: Vec::new(),
        graphed: Vec::new(),
    }
}

/// `schedule` with every stage split into one stage per module, each keeping its quota: every
/// module in its slot with no neighbour.
fn isolated(schedule: &Schedule) -> Schedule {
    let stages = (schedule.stages.iter().flatten())
        .map(|p| vec![p.clone()])
        .collect();
    Schedule {
        source: format!("{}, one module at a time", schedule.source),
        stages,
        ..schedule.clone()
    }
}

/// The stages of `schedule` with more than one module, from their times by it (`by_plan`),
/// their modules' times in their slots one at a time (`isolated`) and one after another on the
/// whole device (`alone`).
fn shared_stages(
    schedule: &Schedule,
    by_plan: &Timed,
    isolated: &Timed,
    alone: &Timed,
) -> Vec<SharedStage> {
    let of = |t: &Timed, name: &str| t.modules.get(name).copied().unwrap_or(f64::NAN);
    let how = |t: &Timed, name: &String| (t.graphed.contains(name), t.recomputing.contains(name));
    (schedule.stages.iter().zip(&by_plan.stages))
        .filter(|(stage, _)| stage.len() > 1)
        .map(|(stage, &colocated_ms)| {
            let modules: Vec<SharedModule> = stage
                .iter()
                .map(|p| SharedModule {
                    name: p.name.clone(),
                    sm: p.assignment.sm,
                    slot_ms: of(by_plan, &p.name),
                    isolated_ms: of(isolated, &p.name),
                    launched_alike: how(by_plan, &p.name) == how(isolated, &p.name),
                    alone_ms: of(alone, &p.name),
                })
                .collect();
            SharedStage {
                colocated_ms,
                one_by_one_ms: modules.iter().map(|m| m.alone_ms).sum(),
                modules,
            }
        })
        .collect()
}

fn measure(name: &str, batch: usize, plan: &Plan, args: &Args, compute: Compute) -> Result<Row> {
    let cores = available_cores();
    let build = || -> Result<Model> {
        let recipe = Recipe {
            size: args.size,
            ..Recipe::new(name, 0)
        };
        models::build_placed(&recipe, &|_| Device::Cpu).map_err(engine)
    };
    let model = build()?;
    let mosaic = Schedule::from_plan(plan, Path::new("(the Mosaic plan)"), &model, batch, cores)
        .map_err(engine)?;
    let described = mosaic.describe_with(|p| format!("{:.2}", p.assignment.sm));
    let by_plan = time(model, mosaic.clone(), batch, args.steps, compute)?;
    let model = build()?;
    let sequential = Schedule::sequential(&model, cores);
    let alone = time(model, sequential, batch, args.steps, compute)?;
    // Only where some stage is shared (else every module already ran with no neighbour).
    let one_at_a_time = if mosaic.stages.iter().any(|s| s.len() > 1) {
        time(build()?, isolated(&mosaic), batch, args.steps, compute)?
    } else {
        by_plan.clone()
    };
    Ok(Row {
        model: name.to_string(),
        batch,
        plan: described,
        predicted_ms: plan.iteration_ms,
        shared: shared_stages(&mosaic, &by_plan, &one_at_a_time, &alone),
        mosaic: by_plan,
        sequential: alone,
        fitted: None,
    })
}

fn print_row(row: &Row, args: &Args) -> Result<()> {
    let predicts = args.plan_from == "measured" || (args.size == 1.0 && args.device == "cuda");
    let (mosaic_ms, sequential_ms) = (row.mosaic.stages_ms, row.sequential.stages_ms);
    let error = predicts.then(|| (row.predicted_ms - mosaic_ms) / mosaic_ms);
    if args.json {
        let line = json!({
            "model": row.model, "batch": row.batch, "device": args.device, "size": args.size,
            "plan": row.plan, "predicted_ms": row.predicted_ms, "mosaic_ms": mosaic_ms,
            "sequential_ms": sequential_ms, "speedup": sequential_ms / mosaic_ms,
            "mosaic_step_ms": row.mosaic.step_ms, "sequential_step_ms": row.sequential.step_ms,
            "recomputing": {
                "mosaic": row.mosaic.recomputing, "sequential": row.sequential.recomputing,
            },
            "graphed": {"mosaic": row.mosaic.graphed, "sequential": row.sequential.graphed},
            "plan_from": args.plan_from,
            "prediction_error": error,
            "interference": row.fitted,
            "shared_stages": row.shared,
        });
        println!("{}", serde_json::to_string(&line)?);
    } else {
        let error = error.map_or("n/a".to_string(), |e| format!("{:+.1}%", 100.0 * e));
        println!(
            "{:<10} {:>5}  {:>12.1} {:>12.2} {:>12.2} {:>7.2}× {:>10}  {}",
            row.model,
            row.batch,
            row.predicted_ms,
            mosaic_ms,
            sequential_ms,
            sequential_ms / mosaic_ms,
            error,
            row.plan
        );
        println!(
            "    whole steps: {:.2} ms by the plan, {:.2} one after another",
            row.mosaic.step_ms, row.sequential.step_ms
        );
        if let Some(f) = &row.fitted {
            let e = f.interference;
            println!(
                "    planned with interference fitted to {} colocations measured here ({}): e1 \
                 {:.3}, e2 {:.3}, e3 {:.3}",
                f.colocations,
                f.model.name(),
                e.e1,
                e.e2,
                e.e3
            );
        }
        for (schedule, timed) in [
            ("the plan", &row.mosaic),
            ("one after another", &row.sequential),
        ] {
            if !timed.recomputing.is_empty() {
                println!(
                    "    recomputing activations by {schedule}: {}",
                    timed.recomputing.join(", ")
                );
            }
            if !timed.graphed.is_empty() {
                println!(
                    "    replayed from CUDA graphs by {schedule}: {}",
                    timed.graphed.join(", ")
                );
            }
        }
        for stage in &row.shared {
            println!("{}", describe_stage(stage));
        }
    }
    Ok(())
}

/// A (model, batch) whose measurement failed, and why.
fn print_failed(model: &str, batch: usize, e: &anyhow::Error, args: &Args) -> Result<()> {
    if args.json {
        let line = json!({
            "model": model, "batch": batch, "device": args.device, "size": args.size,
            "error": format!("{e:#}"),
        });
        println!("{}", serde_json::to_string(&line)?);
    } else {
        println!("{model:<10} {batch:>5}  failed: {e:#}");
    }
    Ok(())
}

/// One line for a shared stage: its time co-located against one after another, then each
/// module's time in its slot and alone, their ratio, and 1/quota beside it (that ratio were the
/// module's time to scale with its SMs): the slowest slot is the stage's length.
fn describe_stage(stage: &SharedStage) -> String {
    let modules: Vec<String> = (stage.modules.iter())
        .map(|m| {
            format!(
                "{} {:.1}/{:.1} ms {:.2} ({:.2}; neighbours {:.2}{}, share {:.2})",
                m.name,
                m.slot_ms,
                m.alone_ms,
                m.slot_ms / m.alone_ms,
                1.0 / m.sm,
                m.slot_ms / m.isolated_ms,
                if m.launched_alike {
                    ""
                } else {
                    " launched otherwise"
                },
                m.isolated_ms / m.alone_ms
            )
        })
        .collect();
    format!(
        "    a stage of {}: {:.2} ms co-located, {:.2} one after another ({:.2}×); in its slot \
         / alone, the ratio (1/quota; of it, in its slot with neighbours / without, and without \
         / alone): {}",
        stage.modules.len(),
        stage.colocated_ms,
        stage.one_by_one_ms,
        stage.one_by_one_ms / stage.colocated_ms,
        modules.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use mosaic_engine::runtime::trainer::{ModuleTiming, StageReport};
    use mosaic_engine::Placement;
    use mosaic_plan::Assignment;

    use super::*;

    /// A row whose schedule does not fit the device fails alone; a bad setting ends the run.
    #[test]
    fn only_bad_input_ends_the_benchmark() {
        let memory = EngineError::DeviceMemory {
            device: 0,
            message: "vision needs 90 GiB".into(),
        };
        assert!(row_failure(memory).downcast_ref::<BadInput>().is_none());
        let setting = EngineError::BadSetting {
            setting: "--batch".into(),
            message: "0".into(),
        };
        assert!(row_failure(setting).downcast_ref::<BadInput>().is_some());
    }

    /// A step whose stages hold `(module, forward ms, backward ms)`, `step_ms` long.
    fn step(step_ms: f64, stages: &[&[(&str, f64, f64)]]) -> StepReport {
        let stages = (stages.iter())
            .map(|modules| StageReport {
                forward_ms: modules.iter().map(|m| m.1).fold(0.0, f64::max),
                backward_ms: modules.iter().map(|m| m.2).fold(0.0, f64::max),
                forward_launch_ms: 0.0,
                backward_launch_ms: 0.0,
                modules: (modules.iter())
                    .map(|&(name, forward_ms, backward_ms)| ModuleTiming {
                        name: name.to_string(),
                        forward_ms,
                        backward_ms,
                        forward_host_ms: 0.0,
                        backward_host_ms: 0.0,
                        graphed: false,
                    })
                    .collect(),
            })
            .collect();
        StepReport {
            step: 1,
            loss: 0.0,
            step_ms,
            data_ms: 0.0,
            stages,
        }
    }

    fn placed(module: usize, name: &str, sm: f64) -> Placement {
        Placement {
            assignment: Assignment {
                module,
                dp: 1,
                sm,
                gpus: vec![0],
            },
            name: name.to_string(),
            threads: 1,
        }
    }

    #[test]
    fn medians_take_each_stage_and_each_modules_slowest_replica() {
        let reports = [
            step(
                10.0,
                &[&[("a", 1.0, 2.0), ("a", 2.0, 2.0)], &[("b", 1.0, 1.0)]],
            ),
            step(30.0, &[&[("a", 3.0, 3.0)], &[("b", 2.0, 1.0)]]),
            step(20.0, &[&[("a", 5.0, 5.0)], &[("b", 1.0, 1.0)]]),
        ];
        let t = medians(&reports);
        assert_eq!(t.step_ms, 20.0);
        // The steps' stages summed: 4 + 2, 6 + 3, 10 + 2.
        assert_eq!(t.stages_ms, 9.0);
        // Stage 0: 2 + 2, 3 + 3, 5 + 5; stage 1: 2, 3, 2.
        assert_eq!(t.stages, [6.0, 2.0]);
        // a's slowest replica: 4, 6, 10.
        assert_eq!(t.modules["a"], 6.0);
        assert_eq!(t.modules["b"], 2.0);
    }

    /// vision at 0.75 beside text at 0.25, then align on the whole device.
    fn two_encoders_then_align() -> Schedule {
        Schedule {
            source: "plan".into(),
            cores: 1,
            pool: 1,
            stages: vec![
                vec![placed(0, "vision", 0.75), placed(1, "text", 0.25)],
                vec![placed(2, "align", 1.0)],
            ],
        }
    }

    #[test]
    fn one_at_a_time_splits_every_stage_and_keeps_each_quota() {
        let split = isolated(&two_encoders_then_align());
        let stages: Vec<Vec<(&str, f64)>> = (split.stages.iter())
            .map(|s| {
                s.iter()
                    .map(|p| (p.name.as_str(), p.assignment.sm))
                    .collect()
            })
            .collect();
        assert_eq!(
            stages,
            [
                vec![("vision", 0.75)],
                vec![("text", 0.25)],
                vec![("align", 1.0)]
            ]
        );
    }

    #[test]
    fn a_shared_stage_is_held_against_its_modules_one_after_another() {
        let schedule = two_encoders_then_align();
        let by_plan = medians(&[step(
            12.0,
            &[
                &[("vision", 4.0, 5.0), ("text", 3.0, 7.0)],
                &[("align", 1.0, 1.0)],
            ],
        )]);
        let alone = medians(&[step(
            20.0,
            &[
                &[("vision", 3.0, 4.0)],
                &[("text", 2.0, 3.0)],
                &[("align", 1.0, 1.0)],
            ],
        )]);
        let isolated = medians(&[step(
            18.0,
            &[
                &[("vision", 3.0, 5.0)],
                &[("text", 3.0, 2.0)],
                &[("align", 1.0, 1.0)],
            ],
        )]);
        let shared = shared_stages(&schedule, &by_plan, &isolated, &alone);
        assert_eq!(shared.len(), 1, "align alone in its stage is not shared");
        let s = &shared[0];
        assert_eq!((s.colocated_ms, s.one_by_one_ms), (4.0 + 7.0, 7.0 + 5.0));
        let slot_alone: Vec<(f64, f64)> =
            s.modules.iter().map(|m| (m.slot_ms, m.alone_ms)).collect();
        assert_eq!(slot_alone, [(9.0, 7.0), (10.0, 5.0)]);
        let line = describe_stage(s);
        assert!(
            line.contains("11.00 ms co-located, 12.00 one after another (1.09×)")
                && line.contains(
                    "vision 9.0/7.0 ms 1.29 (1.33; neighbours 1.12, share 1.14), text 10.0/5.0 \
                     ms 2.00 (4.00; neighbours 2.00, share 1.00)"
                ),
            "{line}"
        );
    }
}
