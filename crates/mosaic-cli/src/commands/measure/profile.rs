//! `mosaic measure profile`: an engine model's mosaic-profiles/1 file, measured on this machine.

use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use mosaic_engine::measure::{
    dp_grid, measure_machine, profile_file, sweep_gpu, EngineProfile, Launched, Machine, Point,
    UNDISTURBED,
};
use mosaic_engine::runtime::graphed::LAUNCH_BOUND;

use super::{Sweep, WARMUP};
use crate::commands::engine::engine;
use crate::input::check_output;

/// Size of each STREAM-triad array: 3 × 64 MiB, well above the caches of the machines this
/// was written on (2 MiB L2 per core) and measured to have reached the DRAM plateau there.
const STREAM_MIB: usize = 64;
/// STREAM-triad runs per slot size (the best is kept).
const STREAM_REPS: usize = 5;

/// Arguments of `mosaic measure profile`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    sweep: Sweep,
    /// Where to write the mosaic-profiles/1 file (default: standard output).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// Measures the machine, then every grid point, and writes the profile.
pub fn run(args: &Args) -> Result<()> {
    args.sweep.check()?;
    if let Some(out) = &args.out {
        check_output("--out", out)?;
    }
    let profile = if args.sweep.on_gpu() {
        on_gpu(args)?
    } else {
        on_cpu(args)?
    };
    write(&profile, args)
}

/// Every grid point on GPU 0, partition by partition.
fn on_gpu(args: &Args) -> Result<EngineProfile> {
    let sweep = &args.sweep;
    eprintln!(
        "profiling {} on CUDA device 0 at dp {{{}}} × the device's SM partitions (its deciles \
         and the whole GPU), one green context at a time: {WARMUP} warm-up + {} timed \
         iterations each, batch {}",
        sweep.model,
        dp_list(sweep.batch, sweep.max_dp),
        sweep.reps,
        sweep.batch
    );
    // The host is named in the profile's source; its bandwidth is not used (the least STREAM
    // run there is).
    let host = measure_machine(1, 1).map_err(engine)?;
    let mut done = 0;
    let profile = sweep_gpu(&sweep.model, sweep.config(), host, 0, |p| {
        done += 1;
        eprintln!("[{done}] {}", point_line(p, "SM"));
    })
    .map_err(engine)?;
    let graphed = (profile.points.iter())
        .filter(|p| p.launched == Launched::Graphed)
        .count();
    eprintln!(
        "{graphed} of {} points replayed their passes from CUDA graphs, as the trainer replays a \
         module whose host issues its work in at least {:.0} % of its passes' time \
         (MOSAIC_GRAPHS=off: none)",
        profile.points.len(),
        100.0 * LAUNCH_BOUND
    );
    Ok(profile)
}

/// The dp grid, comma-separated.
fn dp_list(batch: usize, max_dp: usize) -> String {
    let dps: Vec<String> = dp_grid(batch, max_dp)
        .iter()
        .map(usize::to_string)
        .collect();
    dps.join(", ")
}

/// Every grid point on this machine's CPU, after measuring the machine.
fn on_cpu(args: &Args) -> Result<EngineProfile> {
    let profiler = args.sweep.profiler(machine()?)?;
    let total = profiler.grid_points();
    let quotas: Vec<String> = profiler.quotas().iter().map(|q| format!("{q}")).collect();
    eprintln!(
        "profiling {} ({}) at dp {{{}}} × quota {{{}}}: {total} grid points, {WARMUP} warm-up + \
         {} timed iterations each, batch {}",
        profiler.model().name,
        profiler.model().module_names(),
        dp_list(args.sweep.batch, args.sweep.max_dp),
        quotas.join(", "),
        args.sweep.reps,
        args.sweep.batch
    );
    let width = total.to_string().len();
    let mut done = 0;
    profiler
        .sweep(|p| {
            done += 1;
            eprintln!("[{done:>width$}/{total}] {}", point_line(p, "thread"));
        })
        .map_err(engine)
}

/// Writes `profile` where `--out` says, after checking the planner reads it.
fn write(profile: &EngineProfile, args: &Args) -> Result<()> {
    let file = profile_file(profile);
    let json = serde_json::to_string_pretty(&file)? + "\n";
    // What is written must be what the planner reads.
    mosaic_profile::parse(&json, "the measured profile")
        .map_err(|e| anyhow!("internal error: {e}"))?;
    let Some(out) = &args.out else {
        print!("{json}");
        return Ok(());
    };
    std::fs::write(out, &json).with_context(|| format!("cannot write {}", out.display()))?;
    eprintln!(
        "wrote {} ({} modules of {}, {} samples each, measured on {})",
        out.display(),
        file.modules.len(),
        profile.model,
        file.modules[0].samples.len(),
        file.device.name
    );
    Ok(())
}

/// This machine, with its STREAM-triad bandwidth in slots of every profiled size.
fn machine() -> Result<Machine> {
    eprintln!("measuring this machine (STREAM triad, 3 × {STREAM_MIB} MiB arrays)…");
    let machine = measure_machine(STREAM_MIB, STREAM_REPS).map_err(engine)?;
    let stream: Vec<String> = machine
        .stream
        .iter()
        .map(|s| {
            format!(
                "{} thread{} {:.1} GB/s{}",
                s.threads,
                if s.threads == 1 { "" } else { "s" },
                s.gbps,
                if s.busy < UNDISTURBED {
                    format!(
                        " (the slot was busy {:.0}% of the time: other processes had its cores)",
                        100.0 * s.busy
                    )
                } else {
                    String::new()
                }
            )
        })
        .collect();
    eprintln!(
        "device: {}, {:.1} GiB; STREAM triad: {}",
        machine.name,
        machine.memory_gib,
        stream.join(", ")
    );
    Ok(machine)
}

/// One grid point as a progress line; `unit` names the slot's cores (thread, SM).
pub(crate) fn point_line(p: &Point, unit: &str) -> String {
    let t = &p.parts;
    format!(
        "{} dp {} quota {:.2} ({} {unit}{}, {} sample{}): {:.3} ms (forward {:.3}, backward \
         {:.3}, all-reduce {:.3}, AdamW {:.3}), {:.3} MiB, ~{:.2} GB/s (bw_util {:.4}), \
         sm_util {:.2}{}{}",
        p.module,
        p.dp,
        p.sm,
        p.cores,
        if p.cores == 1 { "" } else { "s" },
        p.rows,
        if p.rows == 1 { "" } else { "s" },
        p.time_ms,
        t.forward_ms,
        t.backward_ms,
        t.allreduce_ms,
        t.optimizer_ms,
        p.memory.total() as f64 / (1u64 << 20) as f64,
        p.achieved_gbps,
        p.bw_util,
        p.sm_util,
        if p.recomputed {
            ", recomputing activations (it did not fit otherwise)"
        } else {
            ""
        },
        match &p.launched {
            Launched::OpByOp => String::new(),
            Launched::Graphed => ", replayed from CUDA graphs (launch-bound)".into(),
            Launched::Refused(why) => format!(", op by op although launch-bound: {why}"),
        }
    )
}
