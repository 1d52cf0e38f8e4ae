//! `mosaic train`: trains a built-in engine model on this machine by a plan, stage by stage,
//! each module in a slot created before the first step, with atomic checkpoints and resume.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use mosaic_engine::bench::{bench_slots, matmul_in_slots};
use mosaic_engine::checkpoint;
use mosaic_engine::models;
use mosaic_engine::slot::available_cores;
use mosaic_engine::{
    sequential_plan, AdamWConfig, Device, EngineError, Schedule, StepReport, TrainConfig, Trainer,
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
    /// stage, dp 1, quota 1.0; `--write-plan` writes it as a template). dp becomes in-process
    /// replicas splitting the batch, sm the slot's threads (round(sm × cores), at least 1);
    /// GPU lists are not used on a CPU.
    #[arg(long)]
    plan: Option<PathBuf>,
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
    let cores = available_cores();
    let model = models::build(&args.model, args.seed, &Device::Cpu).map_err(engine)?;
    let (plan, plan_file) = match &args.plan {
        Some(path) => (mosaic_sim::load_plan(path)?, path.clone()),
        None => (sequential_plan(&model), PathBuf::from("(default plan)")),
    };
    if let Some(out) = &args.write_plan {
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

    let mut trainer = Trainer::new(model, schedule, config).map_err(engine)?;
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
    if args.json_log {
        let start = json!({
            "event": "start", "model": m.name, "seed": m.seed, "batch": args.batch,
            "steps": args.steps, "cores": cores, "schedule": trainer.schedule(),
            "collective": trainer.collective().name(), "modules": params,
            "slots_created": trainer.slots_created(), "resumed_from": resumed_from,
        });
        println!("{start}");
    } else {
        eprintln!(
            "{} ({} parameters) by {} on {cores} core(s), batch {}{}",
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

    let mut progress = Progress::new(args.steps, trainer.step_count(), args.json_log);
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
        if args.json_log {
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
                if args.json_log {
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
    let Some(last) = last else {
        let msg = format!(
            "nothing to do: {} step(s) are already done (--steps {})",
            trainer.step_count(),
            args.steps
        );
        if args.json_log {
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
    if args.json_log {
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
