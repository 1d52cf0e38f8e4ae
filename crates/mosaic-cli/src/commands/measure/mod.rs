//! `mosaic measure`: the engine's measurements on this machine — a built-in engine model's
//! profile (`profile`), its modules co-located (`colocations`), execution slots pooled
//! against created on demand (`slots`), and image preprocessing in the training process against
//! in producer processes (`preprocess`).

mod colocations;
mod preprocess;
mod profile;
mod slots;

use anyhow::Result;
use mosaic_engine::measure::{Machine, ProfileConfig, Profiler};
use mosaic_engine::models::Recipe;
use mosaic_engine::{models, Device};

use super::engine::{engine, one_process, set_engine_env, size_factor};
pub(crate) use colocations::colocation_line;
pub(crate) use profile::point_line;

/// Untimed iterations before the timed ones of every measurement.
pub(crate) const WARMUP: usize = 2;

/// Arguments of `mosaic measure`: what it measures, and how.
#[derive(clap::Subcommand, Debug)]
pub enum Args {
    /// Measure an engine model's profile (mosaic-profiles/1): every module trained at every
    /// (dp, quota) grid point, a quota being a slot of round(quota × cores) threads, or with
    /// --device cuda a green context of the GPU's SMs.
    Profile(profile::Args),
    /// Measure random colocations (mosaic-colocations/1): modules running side by side, each
    /// in its own slot, alone and then together — the samples `mosaic fit` fits to.
    Colocations(colocations::Args),
    /// Measure stage transitions and step times with slots pooled before training against
    /// slots created on demand.
    Slots(slots::Args),
    /// Measure step times with image decoding, resizing and tokenising in the training process
    /// against in producer processes, at several resolutions and image counts.
    Preprocess(preprocess::Args),
}

/// The settings a profile and colocations are measured with.
#[derive(clap::Args, Debug)]
struct Sweep {
    /// An engine model: clip-tiny, omni-tiny, or the zoo-built clip and imagebind.
    #[arg(long)]
    model: String,
    /// Scale a zoo-built model (clip, imagebind) down by this factor in (0, 1] (1: real size).
    #[arg(long, default_value_t = 1.0, value_parser = size_factor)]
    size: f64,
    /// The global batch; a replica at data-parallel degree dp runs batch/dp samples.
    #[arg(long, default_value_t = 16, value_parser = at_least_one())]
    batch: usize,
    /// The largest data-parallel degree (powers of two up to it and the batch).
    #[arg(long, default_value_t = 8, value_parser = at_least_one())]
    max_dp: usize,
    /// Timed iterations of each measurement, after 2 warm-up ones; the median is kept (at most
    /// 10,000).
    #[arg(long, default_value_t = 21,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_REPS))]
    reps: usize,
    /// Seed of the parameters and the data (and of the colocations' random draws).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where the modules run: cpu (slots of this machine's cores) or cuda (green-context slots
    /// of GPU 0's SMs; the GPU build: scripts/cuda-cargo).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    device: String,
}

/// The most timed iterations of one measurement: a median of more is no better, and a run of
/// u64::MAX of them never ended.
const MAX_REPS: u64 = 10_000;

/// A count of at least one.
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}

/// Runs `mosaic measure`.
pub fn run(args: Args) -> Result<()> {
    one_process("mosaic measure")?;
    set_engine_env();
    match args {
        Args::Profile(a) => profile::run(&a),
        Args::Colocations(a) => colocations::run(&a),
        Args::Slots(a) => slots::run(&a),
        Args::Preprocess(a) => preprocess::run(&a),
    }
}

impl Sweep {
    /// Fails on an unknown model or a batch out of bounds: called before the machine is
    /// measured.
    fn check(&self) -> Result<()> {
        models::data::check_batch(self.batch).map_err(engine)?;
        // The model's name and size, checked on its cheapest build of that size or less.
        let smallest = Recipe::smallest(&self.model);
        let recipe = Recipe {
            size: self.size.min(smallest.size),
            ..smallest
        };
        models::build_placed(&recipe, &|_| Device::Cpu).map_err(engine)?;
        Ok(())
    }

    /// Whether the modules run on the GPU.
    fn on_gpu(&self) -> bool {
        self.device == "cuda"
    }

    /// The sweep's settings.
    fn config(&self) -> ProfileConfig {
        ProfileConfig {
            batch: self.batch,
            max_dp: self.max_dp,
            warmup: WARMUP,
            reps: self.reps,
            seed: self.seed,
            size: self.size,
        }
    }

    /// The profiler of the model on `machine`.
    fn profiler(&self, machine: Machine) -> Result<Profiler> {
        Profiler::new(&self.model, self.config(), machine).map_err(engine)
    }
}
