//! `mosaic check gpu`: every GPU path of the engine run on the GPU present, each printed as
//! pass, fail or skip with the figure it rests on ([`mosaic_engine::measure::check_gpu`]).
//! Exit code 1 when a check fails; skips (no GPU, or a build without a path) are not failures.

use anyhow::{anyhow, Result};
use mosaic_engine::measure::{check_gpu, GpuCheck, Outcome};

use super::engine::{one_process, set_engine_env};

/// Arguments of `mosaic check`: what it checks.
#[derive(clap::Subcommand, Debug)]
pub enum Args {
    /// Run every GPU path of the engine on a GPU, in a few minutes: the driver, green-context
    /// slots, candle's CUDA ops against the CPU, a training step of every engine model against
    /// the CPU, SM confinement and co-location by timing. Run it first on a new GPU machine.
    Gpu(GpuArgs),
}

/// Arguments of `mosaic check gpu`.
#[derive(clap::Args, Debug)]
pub struct GpuArgs {
    /// The CUDA device to check.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1023))]
    device: u32,
    /// One JSON object per check per line (`name`, `outcome`, `figure`, `seconds`) instead of
    /// the table.
    #[arg(long)]
    json: bool,
}

/// Runs `mosaic check`.
pub fn run(args: Args) -> Result<()> {
    let Args::Gpu(args) = args;
    one_process("mosaic check gpu")?;
    set_engine_env();
    // Each row as its check ends, with the seconds it took: a check that hangs leaves the
    // rows before it on screen.
    let mut last = std::time::Instant::now();
    let mut print = |c: &GpuCheck| {
        let secs = last.elapsed().as_secs_f64();
        last = std::time::Instant::now();
        if args.json {
            let row = serde_json::json!({
                "name": c.name, "outcome": c.outcome, "figure": c.figure, "seconds": secs,
            });
            println!("{row}");
        } else {
            let tag = match c.outcome {
                Outcome::Pass => "pass",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "skip",
            };
            println!("{tag}  {:<44} {} ({secs:.1} s)", c.name, c.figure);
        }
    };
    let checks = check_gpu(args.device as usize, &mut print);
    let count = |o: Outcome| checks.iter().filter(|c| c.outcome == o).count();
    let (failed, passed, skipped) = (
        count(Outcome::Fail),
        count(Outcome::Pass),
        count(Outcome::Skip),
    );
    if !args.json {
        println!("{passed} passed, {failed} failed, {skipped} skipped");
    }
    if failed > 0 {
        return Err(anyhow!("{failed} of {} GPU checks failed", checks.len()));
    }
    Ok(())
}
