//! `mosaic check gpu`: every GPU path of the engine run on the GPU present, each printed as
//! pass, fail or skip with the figure it rests on ([`mosaic_engine::measure::check_gpu`]).
//! Exit code 1 when a check fails, or hangs; skips (no GPU, or a build without a path) are not
//! failures.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

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

/// Longest one check may run before `check gpu` calls it hung: a GPU fault can leave a kernel,
/// a collective or the driver waiting forever. Every check took under 40 s together on an
/// H200 (2026-11-28); a slower machine's CPU references take longer, not minutes.
const CHECK_LIMIT: Duration = Duration::from_secs(180);

/// Calls `on_hang` with the name of the last check that ended (`None` before the first) when
/// no check ends within `limit` of the one before; [`Progress::ended`] says one did. The watch
/// ends with the returned handle.
fn watch(limit: Duration, on_hang: impl FnOnce(Option<String>) + Send + 'static) -> Arc<Progress> {
    let progress = Arc::new(Progress(Mutex::new((Instant::now(), None))));
    let watched: Weak<Progress> = Arc::downgrade(&progress);
    let tick = (limit / 10).min(Duration::from_secs(1));
    std::thread::spawn(move || loop {
        std::thread::sleep(tick);
        let Some(progress) = watched.upgrade() else {
            return;
        };
        let (since, last) = progress
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if since.elapsed() > limit {
            return on_hang(last);
        }
    });
    progress
}

/// When the last check ended, and its name.
struct Progress(Mutex<(Instant, Option<String>)>);

impl Progress {
    /// Check `name` has just ended.
    fn ended(&self, name: &str) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) =
            (Instant::now(), Some(name.into()));
    }
}

/// A check's row: JSON (`name`, `outcome`, `figure`, `seconds`) or a line of the table.
fn row(c: &GpuCheck, secs: f64, json: bool) -> String {
    if json {
        serde_json::json!({
            "name": c.name, "outcome": c.outcome, "figure": c.figure, "seconds": secs,
        })
        .to_string()
    } else {
        let tag = match c.outcome {
            Outcome::Pass => "pass",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "skip",
        };
        format!("{tag}  {:<44} {} ({secs:.1} s)", c.name, c.figure)
    }
}

/// Runs `mosaic check`.
pub fn run(args: Args) -> Result<()> {
    let Args::Gpu(args) = args;
    one_process("mosaic check gpu")?;
    set_engine_env();
    // A check that hangs fails the run: its row says after which check, the rows before it
    // stay on screen, and the process ends with exit code 1 (a thread stuck in the driver
    // cannot be stopped otherwise).
    let json = args.json;
    let progress = watch(CHECK_LIMIT, move |last| {
        let after = last.map_or("the start".into(), |name| format!("\"{name}\""));
        let figure = format!(
            "no check ended within {} s of {after}: the next one hangs, and the checks after \
             it did not run",
            CHECK_LIMIT.as_secs()
        );
        let hung = GpuCheck {
            name: "hung".into(),
            outcome: Outcome::Fail,
            figure,
        };
        println!("{}", row(&hung, CHECK_LIMIT.as_secs_f64(), json));
        eprintln!("error: a GPU check hung");
        std::process::exit(1);
    });
    // Each row as its check ends, with the seconds it took.
    let mut last = Instant::now();
    let mut print = |c: &GpuCheck| {
        progress.ended(&c.name);
        let secs = last.elapsed().as_secs_f64();
        last = Instant::now();
        println!("{}", row(c, secs, json));
    };
    let checks = check_gpu(args.device as usize, &mut print);
    drop(progress);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_check_that_hangs_is_called_so_after_the_last_that_ended() {
        let (tx, rx) = mpsc::channel();
        let progress = watch(Duration::from_millis(100), move |last| {
            tx.send(last).unwrap();
        });
        // Checks that keep ending are no hang.
        for name in ["driver", "slots", "NVML"] {
            std::thread::sleep(Duration::from_millis(40));
            progress.ended(name);
        }
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            Some("NVML".to_string())
        );
        drop(progress);
    }

    #[test]
    fn the_watch_ends_with_the_checks() {
        let (tx, rx) = mpsc::channel();
        let progress = watch(Duration::from_millis(100), move |last| {
            tx.send(last).unwrap();
        });
        drop(progress);
        assert!(rx.recv_timeout(Duration::from_millis(400)).is_err());
    }
}
