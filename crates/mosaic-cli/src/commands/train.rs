//! `mosaic train`: trains a built-in engine model on this machine by a plan, stage by stage,
//! each module in a slot created before the first step, with atomic checkpoints and resume.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use mosaic_engine::bench::{bench_slots, matmul_in_slots};
use mosaic_engine::checkpoint;
use mosaic_engine::data::{self, Field, Kind, TensorFile};
use mosaic_engine::models;
use mosaic_engine::slot::available_cores;
use mosaic_engine::{
    sequential_plan, AdamWConfig, Collective, Device, EngineError, InProcess, Schedule, StepReport,
    TrainConfig, Trainer,
};
use serde_json::json;

use crate::input::BadInput;

/// Arguments of `mosaic train`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A built-in engine model: clip-tiny (vision, text → align) or omni-tiny (vision, audio,
    /// text → backbone).
    #[arg(long)]
    model: String,
    /// A mosaic-plan/1 file whose module names are the model's (default: every module its own
    /// stage, replicated on every rank at quota 1.0; `--write-plan` writes it as a template).
    /// A module's dp replicas split the batch; replica k runs on the rank holding plan GPU
    /// gpus[k] (the plan's GPUs spread over the `mpirun` ranks in blocks; one process holds
    /// them all); sm sets the slot's threads, round(sm × cores), at least 1.
    #[arg(long)]
    plan: Option<PathBuf>,
    /// How ranks started by `mpirun` sum a module's gradients: over MPI in host memory, or
    /// with NCCL on each rank's GPU (a build with features mpi and cuda, a GPU per rank; the
    /// compute stays on the CPU, so NCCL moves the host gradients through the GPU).
    #[arg(long, value_enum, default_value_t = Backend::Mpi)]
    collective: Backend,
    /// Train until this many steps are done (a resumed run continues up to it).
    #[arg(long, default_value_t = 50)]
    steps: u64,
    /// Samples per step, split among a module's replicas.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// AdamW learning rate of every module.
    #[arg(long, default_value_t = AdamWConfig::default().lr)]
    lr: f64,
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
    /// one tensor per data input, samples along dimension 0 (`--write-data` writes one), read
    /// in order and cycled.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Write the synthetic batches the run would train on (--steps × --batch samples) as a
    /// safetensors file for --data, and exit: the format, and a file to replace with your own.
    #[arg(long, conflicts_with_all = ["bench_slots", "write_plan"])]
    write_data: Option<PathBuf>,
    /// Write the plan the run would follow (a mosaic-plan/1 file to edit) and exit.
    #[arg(long, conflicts_with = "bench_slots")]
    write_plan: Option<PathBuf>,
    /// Measure stage transitions and step times with pooled slots against slots created on
    /// demand, over --steps steps each, and exit (nothing is checkpointed).
    #[arg(long)]
    bench_slots: bool,
}

/// Turns an engine error into bad input (exit code 2) when it is the user's.
fn engine(e: EngineError) -> anyhow::Error {
    if e.is_bad_input() {
        BadInput(e.to_string()).into()
    } else {
        e.into()
    }
}

/// Runs `mosaic train`.
pub fn run(args: Args) -> Result<()> {
    if args.checkpoint_every == 0 {
        return Err(BadInput("--checkpoint-every: expected at least 1 step".into()).into());
    }
    // candle runs elementwise ops of 64 Ki elements or more on a process-wide pool of its own
    // that no slot bounds; with one "thread" that pool is empty and they run on the calling
    // slot thread (see mosaic_engine::slot). No other thread exists yet, and no candle op has
    // run, so setting the variable here is safe and takes effect.
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    let collective = collective(args.collective)?;
    let (rank, world) = (collective.rank(), collective.world());
    if world > 1 && args.bench_slots {
        return Err(
            BadInput("--bench-slots measures one process; run it without mpirun".into()).into(),
        );
    }
    let cores = available_cores();
    let mut model = models::build(&args.model, args.seed, &Device::Cpu).map_err(engine)?;
    if let Some(out) = &args.write_data {
        if rank == 0 {
            data::write_batches(&*model.data, args.steps, args.batch, out).map_err(engine)?;
            eprintln!(
                "wrote {} ({} steps × {} samples of {}'s inputs: {}); train on it with --data",
                out.display(),
                args.steps.max(1),
                args.batch,
                model.name,
                describe_fields(&model.data.fields())
            );
        }
        return Ok(());
    }
    if let Some(path) = &args.data {
        let file = TensorFile::load(path, &model.data.fields()).map_err(engine)?;
        model.data = Box::new(file);
    }
    let (plan, plan_file) = match &args.plan {
        Some(path) => (mosaic_sim::load_plan(path)?, path.clone()),
        None => (
            sequential_plan(&model, world),
            PathBuf::from("(default plan)"),
        ),
    };
    // Only rank 0 talks; the others train silently beside it.
    let json_log = args.json_log && rank == 0;
    let quiet = rank != 0;
    if let Some(out) = &args.write_plan {
        if quiet {
            return Ok(());
        }
        let text = serde_json::to_string_pretty(&plan)? + "\n";
        std::fs::write(out, text).with_context(|| format!("cannot write {}", out.display()))?;
        eprintln!(
            "wrote {} ({} stage(s) of {}); edit its stages, dp and sm, then pass it to --plan",
            out.display(),
            plan.stages.len(),
            model.name
        );
        return Ok(());
    }
    let schedule =
        Schedule::from_plan(&plan, &plan_file, &model, args.batch, cores).map_err(engine)?;
    let config = TrainConfig {
        batch: args.batch,
        adamw: AdamWConfig {
            lr: args.lr,
            ..AdamWConfig::default()
        },
        ..TrainConfig::default()
    };
    if args.bench_slots {
        let name = model.name;
        drop(model);
        return bench(
            name,
            args.seed,
            &schedule,
            &config,
            args.steps,
            args.json_log,
        );
    }

    let mut trainer =
        Trainer::with_collective(model, schedule, config, collective).map_err(engine)?;
    let mut resumed_from = None;
    if let Some(dir) = &args.checkpoint_dir {
        if let Some(path) = checkpoint::latest(dir) {
            let meta = checkpoint::load(&mut trainer, &path).map_err(engine)?;
            resumed_from = Some(meta.step);
        }
    }
    let m = trainer.model();
    let params: Vec<_> = m
        .modules
        .iter()
        .map(|x| json!({"name": x.name, "params": x.params.count()}))
        .collect();
    let data_name = args
        .data
        .as_ref()
        .map_or("synthetic".to_string(), |p| p.display().to_string());
    if json_log {
        let start = json!({
            "event": "start", "model": m.name, "seed": m.seed, "batch": args.batch,
            "steps": args.steps, "cores": cores, "schedule": trainer.schedule(),
            "collective": trainer.collective().name(), "ranks": world, "modules": params,
            "slots_created": trainer.slots_created(), "resumed_from": resumed_from,
            "data": data_name,
        });
        println!("{start}");
    } else if !quiet {
        let ranks = if world > 1 {
            format!(" × {world} ranks ({})", trainer.collective().name())
        } else {
            String::new()
        };
        eprintln!(
            "{} ({} parameters) by {} on {cores} core(s){ranks}, batch {} of {data_name} data{}",
            m.name,
            m.param_count(),
            trainer.schedule().describe(),
            args.batch,
            match resumed_from {
                Some(s) => format!(", resuming at step {s}"),
                None => String::new(),
            }
        );
    }

    let mut progress = Progress::new(args.steps, trainer.step_count(), args.json_log || quiet);
    let (mut first, mut last): (Option<f32>, Option<StepReport>) = (None, None);
    let mut recent = std::collections::VecDeque::new();
    let t0 = Instant::now();
    let mut saved = None;
    while trainer.step_count() < args.steps {
        let r = trainer.step().map_err(engine)?;
        first.get_or_insert(r.loss);
        recent.push_back(r.loss);
        if recent.len() > 10 {
            recent.pop_front();
        }
        if json_log {
            let mut line = serde_json::to_value(&r)?;
            line["event"] = json!("step");
            println!("{line}");
        }
        progress.update(&r);
        let done = trainer.step_count() >= args.steps;
        if let Some(dir) = &args.checkpoint_dir {
            if done || r.step.is_multiple_of(args.checkpoint_every) {
                let c0 = Instant::now();
                let path = checkpoint::save(&trainer, dir).map_err(engine)?;
                if json_log {
                    let ms = c0.elapsed().as_secs_f64() * 1e3;
                    let line = json!({"event": "checkpoint", "step": r.step,
                                      "path": path.display().to_string(), "ms": ms});
                    println!("{line}");
                }
                saved = Some((path, r.step));
            }
        }
        last = Some(r);
    }
    progress.finish();
    if quiet {
        return Ok(());
    }
    let Some(last) = last else {
        let msg = format!(
            "nothing to do: {} step(s) are already done (--steps {})",
            trainer.step_count(),
            args.steps
        );
        if json_log {
            println!(
                "{}",
                json!({"event": "done", "step": trainer.step_count(), "note": msg})
            );
        } else {
            eprintln!("{msg}");
        }
        return Ok(());
    };
    let ran = last.step - resumed_from.unwrap_or(0);
    let ms_per_step = t0.elapsed().as_secs_f64() * 1e3 / ran as f64;
    if json_log {
        let done = json!({"event": "done", "step": last.step, "loss": last.loss,
                          "ms_per_step": ms_per_step});
        println!("{done}");
    } else {
        println!(
            "{}: steps {}–{}, loss {:.4} → {:.4} (mean of the last {}: {:.4}), {:.1} ms/step{}",
            trainer.model().name,
            resumed_from.unwrap_or(0) + 1,
            last.step,
            first.unwrap_or(last.loss),
            last.loss,
            recent.len(),
            recent.iter().sum::<f32>() / recent.len() as f32,
            ms_per_step,
            match &saved {
                Some((p, s)) => format!("; checkpoint {} (step {s})", p.display()),
                None => String::new(),
            }
        );
    }
    Ok(())
}

/// `image [16, 16] f32, text [6] ids < 64`.
fn describe_fields(fields: &[Field]) -> String {
    let f: Vec<String> = fields
        .iter()
        .map(|f| {
            let dims: Vec<String> = f.dims.iter().map(ToString::to_string).collect();
            let kind = match f.kind {
                Kind::Real => "f32".to_string(),
                Kind::Index(n) => format!("ids < {n}"),
            };
            format!("{} [{}] {kind}", f.name, dims.join(", "))
        })
        .collect();
    f.join(", ")
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

/// `--bench-slots`: pooled against on-demand slots, and a slot's bound on candle's threads.
fn bench(
    model: &str,
    seed: u64,
    schedule: &Schedule,
    config: &TrainConfig,
    steps: u64,
    json_out: bool,
) -> Result<()> {
    let b = bench_slots(model, seed, schedule, config, steps.max(1)).map_err(engine)?;
    let matmul = matmul_in_slots(512, 10).map_err(engine)?;
    #[cfg(feature = "cuda")]
    {
        // Green-context slots for the stages' modules on plan GPU 0, pooled vs on demand.
        use mosaic_engine::slot::cuda::{bench_gpu_slots, driver_unavailable};
        let stages: Vec<Vec<f64>> = (schedule.stages.iter())
            .map(|s| {
                s.iter()
                    .filter(|p| p.gpus.contains(&0))
                    .map(|p| p.sm)
                    .collect()
            })
            .filter(|q: &Vec<f64>| !q.is_empty())
            .collect();
        if let Some(why) = driver_unavailable() {
            eprintln!("no GPU: CUDA slots not measured ({why})");
        } else {
            let g = bench_gpu_slots(0, &stages, 20).map_err(engine)?;
            if json_out {
                println!("{}", json!({"event": "bench-gpu-slots", "gpu": g}));
            } else {
                println!(
                    "green-context slots on {} ({} SMs), SMs per stage {:?}: pool set up in {:.3} ms; \
                     transition median {:.4} ms pooled, {:.4} ms on demand",
                    g.device, g.sms, g.granted_sms, g.pool_setup_ms, g.pooled_transition_ms,
                    g.on_demand_transition_ms
                );
            }
        }
    }
    if json_out {
        println!(
            "{}",
            json!({"event": "bench-slots", "slots": b, "matmul_512": matmul})
        );
        return Ok(());
    }
    println!(
        "slot pool: {} by {}, {} steps after a warm-up step, {} stage transitions per mode",
        b.model, b.schedule, b.steps, b.pooled.transitions
    );
    println!(
        "{:<10} {:>22} {:>26} {:>14}",
        "slots", "created before step 1", "transition mean/max (ms)", "step (ms)"
    );
    for (name, f) in [("pooled", &b.pooled), ("on demand", &b.on_demand)] {
        let created = if f.slots_before_training > 0 {
            format!("{} in {:.3} ms", f.slots_before_training, f.setup_ms)
        } else {
            "0".into()
        };
        println!(
            "{name:<10} {created:>22} {:>26} {:>14.2}",
            format!("{:.4} / {:.4}", f.launch_ms_mean, f.launch_ms_max),
            f.step_ms_mean
        );
    }
    println!("(a transition: from a stage phase's start until its last module runs in its slot)");
    let cells: Vec<String> = matmul
        .iter()
        .map(|m| format!("{} thread(s) {:.2} ms", m.threads, m.ms))
        .collect();
    println!(
        "candle 512×512 matmul inside a slot of {}",
        cells.join(", of ")
    );
    Ok(())
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
