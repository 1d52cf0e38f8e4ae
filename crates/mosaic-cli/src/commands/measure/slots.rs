//! `mosaic measure slots`: execution slots pooled before training against slots created on
//! demand at every stage transition, and a slot's bound on candle's threads.

use std::path::PathBuf;

use anyhow::Result;
use mosaic_engine::measure::{
    available_cores, bench_gpu_slots, bench_slots, matmul_in_slots, MatmulInSlot, SlotBench,
};
use mosaic_engine::runtime::memory::check_host_memory;
use mosaic_engine::runtime::slot::cuda::driver_unavailable;
use mosaic_engine::{models, Device, InProcess, TrainConfig};
use serde_json::json;

use crate::commands::engine::{engine, load_plan_for, schedule, tiny_model};

/// Arguments of `mosaic measure slots`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A built-in engine model: clip-tiny or omni-tiny (both modes train it on the CPU; a
    /// plan for the zoo's CLIP runs on clip-tiny, whose modules have its names).
    #[arg(long)]
    model: String,
    /// A mosaic-plan/1 file whose stages and quotas set the slots (default: every module its
    /// own stage at quota 1.0, as `mosaic train template` writes it).
    #[arg(long)]
    plan: Option<PathBuf>,
    /// Steps timed in each mode, after a warm-up step (nothing is checkpointed; at most
    /// 100,000).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    steps: u64,
    /// Samples per step, split among a module's replicas (1–65,536, and a step must fit this
    /// machine's available memory, estimated before the first).
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Seed of the parameters and of the synthetic data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the figures as JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

/// Trains `--steps` steps with pooled slots and as many with slots created on demand.
pub fn run(args: &Args) -> Result<()> {
    // Both modes train on the CPU, and the green-context slots take only the plan's quotas: a
    // real-size model would add hours, not figures (a zoo plan for CLIP runs on clip-tiny).
    tiny_model("measure slots", &args.model, &models::tiny_models())?;
    let plan = (args.plan.as_deref())
        .map(|p| load_plan_for(p, &args.model))
        .transpose()?;
    let model = models::build(&args.model, args.seed, &Device::Cpu).map_err(engine)?;
    let schedule = schedule(&model, plan.as_ref(), 1, args.batch, available_cores())?;
    check_host_memory(&model, &schedule, args.batch, &InProcess).map_err(engine)?;
    let config = TrainConfig {
        batch: args.batch,
        ..TrainConfig::default()
    };
    let name = model.name;
    drop(model);
    let b = bench_slots(name, args.seed, &schedule, &config, args.steps).map_err(engine)?;
    let matmul = matmul_in_slots(512, 10).map_err(engine)?;
    gpu_slots(&schedule, args.json)?;
    if args.json {
        println!(
            "{}",
            json!({"event": "bench-slots", "slots": b, "matmul_512": matmul})
        );
    } else {
        print_table(&b, &matmul);
    }
    Ok(())
}

/// Green-context slots for the stages' modules on plan GPU 0, pooled vs on demand.
fn gpu_slots(schedule: &mosaic_engine::Schedule, json_out: bool) -> Result<()> {
    let stages: Vec<Vec<f64>> = (schedule.stages.iter())
        .map(|s| {
            s.iter()
                .filter(|p| p.assignment.gpus.contains(&0))
                .map(|p| p.assignment.sm)
                .collect()
        })
        .filter(|q: &Vec<f64>| !q.is_empty())
        .collect();
    if let Some(why) = driver_unavailable() {
        eprintln!("no GPU: CUDA slots not measured ({why})");
        return Ok(());
    }
    let g = bench_gpu_slots(0, &stages, 20).map_err(engine)?;
    if json_out {
        println!("{}", json!({"event": "bench-gpu-slots", "gpu": g}));
    } else {
        println!(
            "green-context slots on {} ({} SMs), SMs per stage {:?}: pool set up in {:.3} ms; \
             transition median {:.4} ms pooled, {:.4} ms on demand",
            g.device,
            g.sms,
            g.granted_sms,
            g.pool_setup_ms,
            g.pooled_transition_ms,
            g.on_demand_transition_ms
        );
    }
    Ok(())
}

/// The figures as a table.
fn print_table(b: &SlotBench, matmul: &[MatmulInSlot]) {
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
}
