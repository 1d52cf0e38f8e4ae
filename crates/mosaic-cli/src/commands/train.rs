//! `mosaic train`: trains a built-in engine model on this machine by a plan, stage by stage,
//! each module in a slot created before the first step, with atomic checkpoints and resume;
//! `mosaic train template` writes the plan it follows by default, to edit.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use mosaic_engine::measure::available_cores;
use mosaic_engine::models::model::Input;
use mosaic_engine::models::{self, Recipe, TensorFile};
use mosaic_engine::runtime::checkpoint;
use mosaic_engine::runtime::feed::{self, FeedConfig, FeedOptions};
use mosaic_engine::runtime::memory::check_host_memory;
use mosaic_engine::runtime::slot::cuda::Carving;
use mosaic_engine::{
    rank_gpu, sequential_plan, AdamWConfig, Collective, Compute, Device, InProcess, Model,
    Schedule, StepReport, TrainConfig, Trainer,
};
use serde_json::json;

use super::engine::{engine, load_plan_for, one_process, schedule, set_engine_env, size_factor};
use crate::input::{check_output, create_output_dir, BadInput};

/// Arguments of `mosaic train`: a training run, or a verb.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(subcommand)]
    verb: Option<Verb>,
    #[command(flatten)]
    run: Option<RunArgs>,
}

/// What `mosaic train` does besides training.
#[derive(clap::Subcommand, Debug)]
enum Verb {
    /// Write the plan `mosaic train` follows without --plan (plain data parallelism), as a
    /// mosaic-plan/1 file to edit and pass to --plan.
    Template(TemplateArgs),
    /// A preprocessing producer (started by `mosaic train --producers K`, not by hand).
    #[command(hide = true)]
    Produce(ProduceArgs),
}

/// Arguments of `mosaic train produce`, the producer process a run with `--producers` starts.
#[derive(clap::Args, Debug)]
struct ProduceArgs {
    /// The trainer's Unix socket.
    #[arg(long)]
    socket: PathBuf,
    /// This producer's index: it makes the steps s with s mod K = index.
    #[arg(long)]
    worker: u32,
}

/// Arguments of a training run.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// A built-in engine model: clip-tiny (vision, text → align) or omni-tiny (vision, audio,
    /// text → backbone), tiny; or clip (CLIP ViT-L/14) or imagebind, the zoo's architectures
    /// at their real size (see --size).
    #[arg(long)]
    model: String,
    /// Scale clip or imagebind down by this factor in (0, 1]: depth, heads, widths and tokens
    /// (1: the zoo's real size; 0.02 trains in milliseconds on a CPU).
    #[arg(long, default_value_t = 1.0, value_parser = size_factor)]
    size: f64,
    /// A mosaic-plan/1 file whose module names are the model's (default: every module its own
    /// stage, replicated on every rank at quota 1.0; `mosaic train template` writes it).
    /// A module's dp replicas split the batch; replica k runs on the rank holding plan GPU
    /// `gpus[k]` (the plan's GPUs spread over the `mpirun` ranks in blocks; one process holds
    /// them all); sm sets the slot's threads, round(sm × cores), at least 1.
    #[arg(long)]
    plan: Option<PathBuf>,
    /// How ranks started by `mpirun` sum a module's gradients: over MPI in host memory, or
    /// with NCCL on each rank's GPU (a build with features mpi and cuda, a GPU per rank; the
    /// gradient bucket is flattened in host memory, so NCCL moves it through the GPU).
    #[arg(long, value_enum, default_value_t = Backend::Mpi)]
    collective: Backend,
    /// Where modules compute: on the CPU, each in a thread-pool slot; or on CUDA, each in a
    /// green-context slot of its stage holding its quota of the GPU's SMs, its tensors on the
    /// slot's stream (the GPU build: scripts/cuda-cargo). Under mpirun, a rank's GPU is its
    /// local rank.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Train until this many steps are done (a resumed run continues up to it).
    #[arg(long, default_value_t = 50)]
    steps: u64,
    /// Samples per step, split among a module's replicas (1–65,536; on the CPU a step must
    /// also fit this machine's available memory, estimated before step 1).
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// AdamW learning rate of every module [default: 3e-3, scaled by 32 / width for a
    /// zoo-built model wider than 32: 9.4e-5 for real-size CLIP].
    #[arg(long)]
    lr: Option<f64>,
    /// Seed of the initial parameters and of the synthetic data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep a checkpoint here (checkpoint.safetensors); a run finding one resumes from it.
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every N steps, and after the last step.
    #[arg(long, default_value_t = 10)]
    checkpoint_every: u64,
    /// Log one JSON object per line on standard output (start, step, checkpoint, done) instead
    /// of the progress bar.
    #[arg(long)]
    json_log: bool,
    /// Train on these tensors instead of the model's synthetic data: a safetensors file with
    /// one tensor per data input, samples along dimension 0 (`mosaic data write` writes one),
    /// read in order and cycled.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Train on real encoded images instead (models with one image and one text input:
    /// clip-tiny): each sample holds 1 to N PNG/JPEG images, drawn per sample, decoded, resized
    /// to the model's input and averaged, and a caption tokenised into its text (1–64).
    #[arg(long, value_name = "N", conflicts_with = "data",
          value_parser = clap::value_parser!(u32).range(1..=feed::MAX_IMAGES_PER_SAMPLE as i64))]
    images_per_sample: Option<u32>,
    /// Side of those encoded images in pixels (8–4096; default 256 when the image data is on).
    #[arg(long, value_name = "PX", conflicts_with = "data",
          value_parser = clap::value_parser!(u32)
              .range(feed::MIN_RESOLUTION as i64..=feed::MAX_RESOLUTION as i64))]
    image_resolution: Option<u32>,
    /// Preprocess those images in K producer processes (this binary, re-executed) that run up
    /// to 4 steps ahead and send each batch reordered for the data-parallel ranks over a Unix
    /// socket; 0 preprocesses on the training thread (0–64; default 0 when the image data is
    /// on).
    #[arg(long, value_name = "K", conflicts_with = "data",
          value_parser = clap::value_parser!(u64).range(0..=feed::MAX_PRODUCERS as u64))]
    producers: Option<u64>,
}

/// Default `--image-resolution`.
const DEFAULT_RESOLUTION: u32 = 256;

/// Arguments of `mosaic train template`.
#[derive(clap::Args, Debug)]
struct TemplateArgs {
    /// A built-in engine model: clip-tiny, omni-tiny, clip or imagebind.
    #[arg(long)]
    model: String,
    /// GPUs of the plan: the ranks `mpirun -np N mosaic train --plan` will run it on (1: one
    /// process; at most 65,536). Every module is replicated on all of them at quota 1.0.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    gpus: u32,
    /// Where to write the plan (default: standard output).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// Runs `mosaic train`.
pub fn run(args: Args) -> Result<()> {
    match (args.verb, args.run) {
        (Some(Verb::Template(t)), _) => template(&t),
        (Some(Verb::Produce(p)), _) => produce(&p),
        (None, Some(run)) => train(&run),
        (None, None) => Err(BadInput("--model: give a built-in engine model".into()).into()),
    }
}

/// `mosaic train template`: the default plan, written for editing.
fn template(args: &TemplateArgs) -> Result<()> {
    one_process("mosaic train template")?;
    if let Some(out) = &args.out {
        check_output("--out", out)?;
    }
    let recipe = Recipe::smallest(&args.model);
    let model = models::build_placed(&recipe, &|_| Device::Cpu).map_err(engine)?;
    let plan = sequential_plan(&model, args.gpus as usize);
    let text = serde_json::to_string_pretty(&plan)? + "\n";
    let Some(out) = &args.out else {
        print!("{text}");
        return Ok(());
    };
    std::fs::write(out, text).with_context(|| format!("cannot write {}", out.display()))?;
    eprintln!(
        "wrote {} ({} stage(s) of {} on {} GPU(s)); edit its stages, dp and sm, then pass it to \
         `mosaic train --plan`",
        out.display(),
        plan.stages.len(),
        model.name,
        plan.gpus
    );
    Ok(())
}

/// `mosaic train produce`: one preprocessing producer, until its trainer hangs up.
fn produce(args: &ProduceArgs) -> Result<()> {
    feed::produce(&args.socket, args.worker)
        .with_context(|| format!("preprocessing producer {}", args.worker))
}

/// Who talks: only rank 0, as JSON lines or as text; the other ranks train silently beside it.
#[derive(Clone, Copy)]
struct Voice {
    /// JSON lines on standard output (`--json-log` on rank 0).
    json: bool,
    /// Nothing at all (ranks other than 0).
    quiet: bool,
}

/// A training run: the model, its plan, a resumed checkpoint, the steps, the summary.
fn train(args: &RunArgs) -> Result<()> {
    if args.checkpoint_every == 0 {
        return Err(BadInput("--checkpoint-every: expected at least 1 step".into()).into());
    }
    if let Some(dir) = &args.checkpoint_dir {
        check_checkpoint_dir(dir)?;
    }
    set_engine_env();
    let collective = collective(args.collective)?;
    let (rank, world) = (collective.rank(), collective.world());
    let voice = Voice {
        json: args.json_log && rank == 0,
        quiet: rank != 0,
    };
    let cores = available_cores();
    // The plan is read, and checked to be for this model, before the model is built.
    let plan = (args.plan.as_deref())
        .map(|p| load_plan_for(p, &args.model))
        .transpose()?;
    let mut model = load_model(args)?;
    let lr = args
        .lr
        .unwrap_or_else(|| AdamWConfig::lr_for(&recipe(args)));
    let schedule = schedule(&model, plan.as_ref(), world, args.batch, cores)?;
    if args.device == DeviceArg::Cpu {
        // Before the batch is drawn (a GPU run has its trial step instead).
        check_host_memory(&model, &schedule, args.batch, &*collective).map_err(engine)?;
    }
    let producers = attach_feed(args, &mut model, &schedule)?;
    let config = TrainConfig {
        batch: args.batch,
        adamw: AdamWConfig {
            lr,
            ..AdamWConfig::default()
        },
        compute: match args.device {
            DeviceArg::Cpu => Compute::Cpu,
            // The GPU of this rank on its machine, as NCCL picks it.
            DeviceArg::Cuda => Compute::Cuda(rank_gpu(collective.node()).map_err(engine)?),
        },
        ..TrainConfig::default()
    };
    let mut trainer =
        Trainer::with_collective(model, schedule, config, collective).map_err(engine)?;
    let resumed_from = resume(&mut trainer, args.checkpoint_dir.as_deref())?;
    announce(args, &trainer, resumed_from, cores, &producers, voice);
    let steps = train_steps(args, &mut trainer, voice)?;
    if !voice.quiet {
        conclude(args, &trainer, resumed_from, &steps, voice);
    }
    Ok(())
}

/// What `args` build the model from.
fn recipe(args: &RunArgs) -> Recipe {
    Recipe {
        size: args.size,
        ..Recipe::new(&args.model, args.seed)
    }
}

/// The built-in model, on the user's tensors with `--data`.
fn load_model(args: &RunArgs) -> Result<Model> {
    let mut model = models::build_placed(&recipe(args), &|_| Device::Cpu).map_err(engine)?;
    if let Some(path) = &args.data {
        let file = TensorFile::load(path, &model.data.fields()).map_err(engine)?;
        model.data = Box::new(file);
    }
    Ok(model)
}

/// With `--images-per-sample`, `--image-resolution` or `--producers`, replaces the model's
/// data by the image feed, reordered for the data-parallel degree of the module reading the
/// image; returns the producers' process ids.
fn attach_feed(args: &RunArgs, model: &mut Model, schedule: &Schedule) -> Result<Vec<u32>> {
    if args.images_per_sample.is_none()
        && args.image_resolution.is_none()
        && args.producers.is_none()
    {
        return Ok(Vec::new());
    }
    let fields = model.data.fields();
    let config = FeedConfig::for_fields(
        &fields,
        args.seed,
        args.images_per_sample.unwrap_or(1),
        args.image_resolution.unwrap_or(DEFAULT_RESOLUTION),
        1,
    )
    .map_err(engine)?;
    let reader = (model.modules.iter()).position(|m| {
        m.inputs
            .iter()
            .any(|i| matches!(i, Input::Data(n) if *n == config.image.name))
    });
    let dp = reader.map_or(1, |m| schedule.placement(m).dp());
    let config = FeedConfig {
        dp: u32::try_from(dp).unwrap_or(u32::MAX),
        ..config
    };
    let launcher = feed::Launcher::mosaic().context("cannot find this mosaic binary")?;
    let producers = args.producers.unwrap_or(0) as usize;
    let options = FeedOptions::for_work(&config, args.batch);
    let f = feed::feed(config, &fields, producers, &launcher, options).map_err(engine)?;
    model.data = f.source;
    Ok(f.pids)
}

/// What the run trains on, in words.
fn data_name(args: &RunArgs, producers: &[u32]) -> String {
    if let Some(p) = &args.data {
        return p.display().to_string();
    }
    if args.images_per_sample.is_none()
        && args.image_resolution.is_none()
        && args.producers.is_none()
    {
        return "synthetic".into();
    }
    format!(
        "encoded-image (1–{} images of {px}×{px} px a sample, preprocessed {})",
        args.images_per_sample.unwrap_or(1),
        match producers.len() {
            0 => "in the training process".to_string(),
            k => format!("by {k} producer process(es)"),
        },
        px = args.image_resolution.unwrap_or(DEFAULT_RESOLUTION),
    )
}

/// Refuses, before training, a `--checkpoint-dir` no checkpoint can be written to: a file, a
/// directory that cannot be created, or one whose checkpoint file is a directory.
fn check_checkpoint_dir(dir: &Path) -> Result<()> {
    create_output_dir("--checkpoint-dir", dir)?;
    let file = dir.join(checkpoint::CHECKPOINT_FILE);
    if file.exists() && !file.is_file() {
        return Err(BadInput(format!(
            "--checkpoint-dir {}: {} is not a file",
            dir.display(),
            file.display()
        ))
        .into());
    }
    Ok(())
}

/// Loads the latest checkpoint in `dir`, if any, and returns its step.
fn resume(trainer: &mut Trainer, dir: Option<&Path>) -> Result<Option<u64>> {
    let Some(path) = dir.and_then(checkpoint::latest) else {
        return Ok(None);
    };
    let meta = checkpoint::load(trainer, &path).map_err(engine)?;
    Ok(Some(meta.step))
}

/// What the run is: the `start` event, or one line on standard error.
fn announce(
    args: &RunArgs,
    trainer: &Trainer,
    resumed_from: Option<u64>,
    cores: usize,
    producers: &[u32],
    v: Voice,
) {
    let m = trainer.model();
    let world = trainer.collective().world();
    let data_name = data_name(args, producers);
    if v.json {
        let params: Vec<_> = m
            .modules
            .iter()
            .map(|x| json!({"name": x.name, "params": x.params.count()}))
            .collect();
        let start = json!({
            "event": "start", "model": m.name, "seed": m.seed, "batch": args.batch,
            "steps": args.steps, "cores": cores, "schedule": trainer.schedule(),
            "collective": trainer.collective().name(), "ranks": world, "modules": params,
            "slots_created": trainer.slots_created(), "carving": carving_names(trainer),
            "resumed_from": resumed_from,
            "data": data_name, "producers": producers, "recomputing": trainer.recomputing(),
        });
        println!("{start}");
    } else if !v.quiet {
        let ranks = if world > 1 {
            format!(" × {world} ranks ({})", trainer.collective().name())
        } else {
            String::new()
        };
        let sms = trainer.slot_sms();
        let (schedule, on) = match args.device {
            DeviceArg::Cpu => (trainer.schedule().describe(), format!("{cores} core(s)")),
            DeviceArg::Cuda => (
                (trainer.schedule()).describe_with(|p| match sms[p.module()] {
                    Some(n) => format!("{n}SM"),
                    None => format!("{:.2}", p.assignment.sm),
                }),
                "a GPU".to_string(),
            ),
        };
        eprintln!(
            "{} ({} parameters) by {schedule} on {on}{ranks}, batch {} of {data_name} data{}",
            m.name,
            m.param_count(),
            args.batch,
            match resumed_from {
                Some(s) => format!(", resuming at step {s}"),
                None => String::new(),
            }
        );
        let in_turn: Vec<&str> = (trainer.slot_carving().iter())
            .zip(&m.modules)
            .filter(|(c, _)| **c == Some(Carving::InTurn))
            .map(|(_, x)| x.name)
            .collect();
        if !in_turn.is_empty() {
            eprintln!(
                "the slots of {} were split off one at a time: the driver refused to carve \
                 their stage in one split",
                in_turn.join(", ")
            );
        }
        if !trainer.recomputing().is_empty() {
            eprintln!(
                "recomputing the activations of {} in the backward pass: the plan's step did not \
                 fit the GPU's memory otherwise",
                trainer.recomputing().join(", ")
            );
        }
    }
}

/// How each module's slot was carved from its GPU, by name (`null` off a GPU).
fn carving_names(trainer: &Trainer) -> Vec<Option<&'static str>> {
    (trainer.slot_carving().into_iter())
        .map(|c| c.map(Carving::name))
        .collect()
}

/// What the steps of a run leave for its summary.
struct Steps {
    /// The first step's loss.
    first: Option<f32>,
    /// The last step.
    last: Option<StepReport>,
    /// The last ten losses.
    recent: VecDeque<f32>,
    /// When the first step started.
    t0: Instant,
    /// The last checkpoint written, and its step.
    saved: Option<(PathBuf, u64)>,
}

/// Trains up to `--steps`, logging each step and checkpointing every `--checkpoint-every`.
fn train_steps(args: &RunArgs, trainer: &mut Trainer, v: Voice) -> Result<Steps> {
    let mut progress = Progress::new(args.steps, trainer.step_count(), args.json_log || v.quiet);
    let mut s = Steps {
        first: None,
        last: None,
        recent: VecDeque::new(),
        t0: Instant::now(),
        saved: None,
    };
    while trainer.step_count() < args.steps {
        let r = trainer.step().map_err(engine)?;
        if !r.loss.is_finite() {
            // Every rank sees the same loss (it is summed over the ranks), so all stop here.
            return Err(BadInput(format!(
                "step {}: the loss is {}: training diverged; lower --lr (now {:?}){}",
                r.step,
                r.loss,
                trainer.config().adamw.lr,
                match &args.data {
                    Some(p) => format!(" or check the values in --data {}", p.display()),
                    None => String::new(),
                }
            ))
            .into());
        }
        s.first.get_or_insert(r.loss);
        s.recent.push_back(r.loss);
        if s.recent.len() > 10 {
            s.recent.pop_front();
        }
        if v.json {
            let mut line = serde_json::to_value(&r)?;
            line["event"] = json!("step");
            println!("{line}");
        }
        progress.update(&r);
        let done = trainer.step_count() >= args.steps;
        if let Some(dir) = &args.checkpoint_dir {
            if done || r.step.is_multiple_of(args.checkpoint_every) {
                s.saved = Some((save(trainer, dir, r.step, v)?, r.step));
            }
        }
        s.last = Some(r);
    }
    progress.finish();
    Ok(s)
}

/// Writes a checkpoint of step `step`, logging it as JSON.
fn save(trainer: &Trainer, dir: &Path, step: u64, v: Voice) -> Result<PathBuf> {
    let c0 = Instant::now();
    let path = checkpoint::save(trainer, dir).map_err(engine)?;
    if v.json {
        let ms = c0.elapsed().as_secs_f64() * 1e3;
        let line = json!({"event": "checkpoint", "step": step,
                          "path": path.display().to_string(), "ms": ms});
        println!("{line}");
    }
    Ok(path)
}

/// The run's summary: the `done` event, or the loss curve's ends and the speed.
fn conclude(args: &RunArgs, trainer: &Trainer, resumed_from: Option<u64>, s: &Steps, v: Voice) {
    let Some(last) = &s.last else {
        let msg = format!(
            "nothing to do: {} step(s) are already done (--steps {})",
            trainer.step_count(),
            args.steps
        );
        if v.json {
            println!(
                "{}",
                json!({"event": "done", "step": trainer.step_count(), "note": msg})
            );
        } else {
            eprintln!("{msg}");
        }
        return;
    };
    let ran = last.step - resumed_from.unwrap_or(0);
    let ms_per_step = s.t0.elapsed().as_secs_f64() * 1e3 / ran as f64;
    // On a GPU, how each module's passes were launched (op by op, or from CUDA graphs).
    let launches = match args.device {
        DeviceArg::Cpu => Vec::new(),
        DeviceArg::Cuda => trainer.launches(),
    };
    if v.json {
        let launches: serde_json::Map<String, serde_json::Value> = (launches.into_iter())
            .map(|l| (l.module.to_string(), l.how.into()))
            .collect();
        let done = json!({"event": "done", "step": last.step, "loss": last.loss,
                          "ms_per_step": ms_per_step, "launches": launches});
        println!("{done}");
        return;
    }
    for l in launches {
        eprintln!("{}: {}", l.module, l.how);
    }
    println!(
        "{}: steps {}–{}, loss {:.4} → {:.4} (mean of the last {}: {:.4}), {:.1} ms/step{}",
        trainer.model().name,
        resumed_from.unwrap_or(0) + 1,
        last.step,
        s.first.unwrap_or(last.loss),
        last.loss,
        s.recent.len(),
        s.recent.iter().sum::<f32>() / s.recent.len() as f32,
        ms_per_step,
        match &s.saved {
            Some((p, step)) => format!("; checkpoint {} (step {step})", p.display()),
            None => String::new(),
        }
    );
}

/// Where modules compute (`--device`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum DeviceArg {
    /// CPU thread-pool slots.
    Cpu,
    /// Green-context slots on this rank's GPU.
    Cuda,
}

/// How the ranks of an `mpirun` run sum gradients (`--collective`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    /// MPI all-reduce of host memory.
    Mpi,
    /// NCCL all-reduce on each rank's GPU.
    Nccl,
}

/// The ranks of this run: MPI's when an MPI launcher started this process, else this process
/// alone; `backend` sums gradients across MPI's ranks.
#[cfg(feature = "mpi")]
fn collective(backend: Backend) -> Result<Box<dyn Collective>> {
    let Some(mpi) = mosaic_engine::Mpi::launched().map_err(engine)? else {
        if backend == Backend::Nccl {
            return Err(BadInput(
                "--collective nccl: sums gradients across ranks started by mpirun, but this \
                 process runs alone (start it with `mpirun -np N`)"
                    .into(),
            )
            .into());
        }
        return Ok(Box::new(InProcess));
    };
    match backend {
        Backend::Mpi => Ok(Box::new(mpi)),
        Backend::Nccl => nccl(mpi),
    }
}

/// NCCL over MPI's ranks: every rank fails alike, naming why, where one cannot use it.
#[cfg(all(feature = "mpi", feature = "cuda"))]
fn nccl(mpi: mosaic_engine::Mpi) -> Result<Box<dyn Collective>> {
    let nccl = mosaic_engine::Nccl::new(mpi).context(
        "--collective nccl: NCCL cannot be used here (--collective mpi sums on the host)",
    )?;
    Ok(Box::new(nccl))
}

/// NCCL needs the `cuda` feature.
#[cfg(all(feature = "mpi", not(feature = "cuda")))]
fn nccl(_mpi: mosaic_engine::Mpi) -> Result<Box<dyn Collective>> {
    Err(BadInput(
        "--collective nccl: this mosaic was built without CUDA: rebuild with \
         `cargo build --release -p mosaic-cli --features mpi,cuda`"
            .into(),
    )
    .into())
}

/// This process alone; refuses to run as one of several ranks, which would train copies.
#[cfg(not(feature = "mpi"))]
fn collective(backend: Backend) -> Result<Box<dyn Collective>> {
    let ranks = std::env::var("OMPI_COMM_WORLD_SIZE").or_else(|_| std::env::var("PMI_SIZE"));
    if backend == Backend::Nccl || ranks.is_ok_and(|n| n != "1") {
        return Err(BadInput(
            "ranks started by an MPI launcher (or --collective nccl), but this mosaic was built \
             without MPI: rebuild with `cargo build --release -p mosaic-cli --features mpi` \
             (needs libopenmpi-dev)"
                .into(),
        )
        .into());
    }
    Ok(Box::new(InProcess))
}

/// The progress line on standard error: a bar on a terminal, a line every tenth otherwise.
struct Progress {
    total: u64,
    start: u64,
    quiet: bool,
    tty: bool,
    every: u64,
}

impl Progress {
    fn new(total: u64, start: u64, quiet: bool) -> Progress {
        Progress {
            total,
            start,
            quiet,
            tty: std::io::stderr().is_terminal(),
            every: (total / 10).max(1),
        }
    }

    fn update(&mut self, r: &StepReport) {
        if self.quiet {
            return;
        }
        let width = 24;
        let filled = (r.step * width / self.total.max(1)).min(width) as usize;
        let bar = format!(
            "{}{}",
            "█".repeat(filled),
            "·".repeat(width as usize - filled)
        );
        let line = format!(
            "step {:>w$}/{} {bar} loss {:.4} · {:.1} ms/step",
            r.step,
            self.total,
            r.loss,
            r.step_ms,
            w = self.total.to_string().len()
        );
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r{line}");
            let _ = err.flush();
        } else if r.step == self.start + 1
            || r.step.is_multiple_of(self.every)
            || r.step == self.total
        {
            let _ = writeln!(err, "{line}");
        }
    }

    fn finish(&self) {
        if !self.quiet && self.tty {
            eprintln!();
        }
    }
}
