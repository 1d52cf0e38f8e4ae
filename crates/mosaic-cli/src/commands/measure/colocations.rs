//! `mosaic measure colocations`: random colocations of an engine model's modules, measured on
//! this machine, as a mosaic-colocations/1 file for `mosaic fit`.

use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use mosaic_engine::measure::{
    colocation_file, colocations_gpu, gpu_colocation_source, measure_machine, ColocationConfig,
    MeasuredColocation, MAX_ATTEMPTS, UNDISTURBED,
};

use super::Sweep;
use crate::commands::engine::engine;
use crate::input::check_output;

/// Arguments of `mosaic measure colocations`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    sweep: Sweep,
    /// Colocations to draw and measure (1 to 100,000): 2 or more modules at random dp and
    /// quotas that fit the machine together.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    count: u64,
    /// Where to write the mosaic-colocations/1 file.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

/// Measures `--count` colocations and writes them.
pub fn run(args: &Args) -> Result<()> {
    args.sweep.check()?;
    check_output("--out", &args.out)?;
    // Colocations read only the machine's name and cores, not its bandwidth: the least STREAM
    // run there is (1 MiB arrays, once), a few milliseconds.
    let machine = measure_machine(1, 1).map_err(engine)?;
    let n = args.count;
    let config = ColocationConfig {
        samples: n as usize,
        seed: args.sweep.seed,
    };
    let width = n.to_string().len();
    let progress = |i: usize, s: &MeasuredColocation| {
        eprintln!("[{:>width$}/{n}] {}", i + 1, colocation_line(s));
    };
    let (file, measured, on_cpu) = if args.sweep.on_gpu() {
        eprintln!(
            "measuring {n} random colocations of {}'s modules on CUDA device 0, each module \
             alone and then together in its stage's green context…",
            args.sweep.model
        );
        let (gpu, measured) = colocations_gpu(
            &args.sweep.model,
            args.sweep.config(),
            machine,
            0,
            &config,
            progress,
        )
        .map_err(engine)?;
        let source = gpu_colocation_source(&gpu, &args.sweep.model, &args.sweep.config(), &config);
        (
            colocation_file(&gpu.name, &measured, source),
            measured,
            false,
        )
    } else {
        let profiler = args.sweep.profiler(machine)?;
        eprintln!(
            "measuring {n} random colocations of {}'s modules on {}, each module alone and then \
             together in its own slot…",
            profiler.model().name,
            profiler.machine().name
        );
        let measured = profiler.colocations(&config, progress).map_err(engine)?;
        let source = profiler.colocation_source(&config);
        let file = colocation_file(&profiler.machine().name, &measured, source);
        (file, measured, true)
    };
    let json = serde_json::to_string_pretty(&file)? + "\n";
    mosaic_profile::parse_colocations(&json, "the measured colocations")
        .map_err(|e| anyhow!("internal error: {e}"))?;
    std::fs::write(&args.out, &json)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    summarise(&measured, &args.out, on_cpu);
    Ok(())
}

/// The slowdowns together vs alone, and (on CPU slots) how many colocations other processes
/// disturbed.
fn summarise(measured: &[MeasuredColocation], out: &std::path::Path, on_cpu: bool) {
    let slowdowns: Vec<f64> = measured
        .iter()
        .flat_map(|s| s.modules.iter().map(|m| m.slowdown()))
        .collect();
    let mean = slowdowns.iter().sum::<f64>() / slowdowns.len().max(1) as f64;
    let max = slowdowns.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    eprintln!(
        "wrote {} ({} colocations; slowdown together vs alone: mean {:+.1}%, max {:+.1}%)",
        out.display(),
        measured.len(),
        100.0 * mean,
        100.0 * max
    );
    let disturbed = measured.iter().filter(|s| !s.undisturbed()).count();
    if on_cpu && disturbed > 0 {
        eprintln!(
            "note: {disturbed} of {} colocations stayed disturbed after {MAX_ATTEMPTS} attempts \
             (a slot got under {:.0}% of the core time together that it had alone): other \
             processes were running on this machine, and those times include their load",
            measured.len(),
            100.0 * UNDISTURBED
        );
    }
}

/// One colocation as a progress line.
pub(crate) fn colocation_line(s: &MeasuredColocation) -> String {
    let line = s
        .modules
        .iter()
        .map(|m| {
            format!(
                "{} dp {} quota {:.2}: {:.3} ms alone, {:.3} together ({:+.1}%; slot busy {:.0}% \
                 → {:.0}%)",
                m.module,
                m.dp,
                m.sm,
                m.alone_ms,
                m.colocated_ms,
                100.0 * m.slowdown(),
                100.0 * m.alone_busy,
                100.0 * m.together_busy
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    match s.attempts {
        1 => line,
        n => format!("{line} [best of {n} attempts]"),
    }
}
