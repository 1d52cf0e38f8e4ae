//! `mosaic measure preprocess`: step time with the image preprocessing in the training process
//! against in producer processes (DistTrain's Fig. 21), at several resolutions and image
//! counts.

use anyhow::{Context, Result};
use mosaic_engine::measure::available_cores;
use mosaic_engine::measure::{measure_preprocess, PreprocessConfig, PreprocessRow};
use mosaic_engine::runtime::feed::{
    FeedConfig, Launcher, MAX_IMAGES_PER_SAMPLE, MAX_PRODUCERS, MAX_RESOLUTION, MIN_RESOLUTION,
};
use mosaic_engine::runtime::memory::check_host_memory;
use mosaic_engine::{models, Device, EngineError, InProcess, Schedule};
use serde_json::json;

use crate::commands::engine::{engine, tiny_model};
use crate::input::BadInput;

/// Arguments of `mosaic measure preprocess`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A built-in engine model with one image and one text input: clip-tiny.
    #[arg(long, default_value = "clip-tiny")]
    model: String,
    /// Sides of the encoded PNG/JPEG images, in pixels, comma-separated (8–4096).
    #[arg(long, value_delimiter = ',', default_value = "256,512,1024",
          value_parser = clap::value_parser!(u32).range(MIN_RESOLUTION as i64..=MAX_RESOLUTION as i64))]
    resolutions: Vec<u32>,
    /// Most images per sample, comma-separated: a sample draws 1 to N (1–64).
    #[arg(long, value_delimiter = ',', default_value = "1,4",
          value_parser = clap::value_parser!(u32).range(1..=MAX_IMAGES_PER_SAMPLE as i64))]
    images: Vec<u32>,
    /// Producer processes of the disaggregated runs (1–64).
    #[arg(long, default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(1..=MAX_PRODUCERS as u64))]
    producers: u64,
    /// Timed steps of each run, after 2 warm-up steps (1–10,000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    steps: u64,
    /// Samples per step.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Seed of the parameters and the data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object per (resolution, images) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Untimed steps before the timed ones (the producers' queue fills meanwhile).
const WARMUP: u64 = 2;

/// Runs every (resolution, images) in process and with the producers, and prints the medians.
pub fn run(args: &Args) -> Result<()> {
    models::data::check_batch(args.batch).map_err(engine)?;
    check_model(args)?;
    let config = PreprocessConfig {
        model: args.model.clone(),
        resolutions: args.resolutions.clone(),
        images: args.images.clone(),
        producers: args.producers as usize,
        steps: args.steps,
        warmup: WARMUP,
        batch: args.batch,
        seed: args.seed,
    };
    let launcher = Launcher::mosaic().context("cannot find this mosaic binary")?;
    if !args.json {
        eprintln!(
            "{}: batch {}, {} timed step(s) after {WARMUP} per run, {} core(s); preprocessing \
             in process vs {} producer(s)",
            args.model,
            args.batch,
            args.steps,
            available_cores(),
            args.producers
        );
    }
    let rows = measure_preprocess(&config, &launcher).map_err(engine)?;
    if args.json {
        for r in &rows {
            println!("{}", json!({"event": "preprocess", "row": r}));
        }
    } else {
        print_table(&rows);
    }
    Ok(())
}

/// Refuses, naming `--model`, a model the image feed cannot make samples of (it reads more
/// than one image and one text) or one too large to train on this machine's CPU, and a
/// `--batch` whose step does not fit its memory: before any image is made.
fn check_model(args: &Args) -> Result<()> {
    // Why the feed cannot make a tiny model's samples, if it cannot.
    let refusal = |name: &str| -> Result<Option<String>> {
        let model = models::build(name, 0, &Device::Cpu).map_err(engine)?;
        Ok(
            match FeedConfig::for_fields(&model.data.fields(), 0, 1, MIN_RESOLUTION, 1) {
                Ok(_) => None,
                Err(EngineError::BadSetting { message, .. }) => Some(message),
                Err(e) => Some(e.to_string()),
            },
        )
    };
    let tiny = (models::tiny_models().into_iter())
        .map(|name| Ok((name, refusal(name)?)))
        .collect::<Result<Vec<_>>>()?;
    let feedable: Vec<&str> = (tiny.iter())
        .filter(|(_, why)| why.is_none())
        .map(|(name, _)| *name)
        .collect();
    if let Some((_, Some(why))) = (tiny.iter()).find(|(n, _)| n.eq_ignore_ascii_case(&args.model)) {
        return Err(BadInput(format!(
            "--model {}: {why}; expected {}",
            args.model,
            feedable.join(" or ")
        ))
        .into());
    }
    tiny_model("measure preprocess", &args.model, &feedable)?;
    let model = models::build(&args.model, args.seed, &Device::Cpu).map_err(engine)?;
    let schedule = Schedule::sequential(&model, available_cores());
    check_host_memory(&model, &schedule, args.batch, &InProcess).map_err(engine)
}

/// The medians as a table.
fn print_table(rows: &[PreprocessRow]) {
    println!(
        "{:>6} {:>7} {:>10} | {:>10} {:>10} | {:>10} {:>10} {:>12} | {:>7}",
        "px",
        "images",
        "img/step",
        "step ms",
        "prep ms",
        "step ms",
        "wait ms",
        "producer ms",
        "speedup"
    );
    println!(
        "{:>6} {:>7} {:>10} | {:^21} | {:^34} |",
        "", "≤/sample", "", "in process", "producers"
    );
    for r in rows {
        let (a, b) = (&r.in_process, &r.disaggregated);
        println!(
            "{:>6} {:>7} {:>10.1} | {:>10.2} {:>10.2} | {:>10.2} {:>10.2} {:>12.2} | {:>6.2}×",
            r.resolution,
            r.images_per_sample,
            r.images_per_step,
            a.step_ms,
            a.data_ms,
            b.step_ms,
            b.data_ms,
            b.prep_ms,
            a.step_ms / b.step_ms.max(1e-9)
        );
    }
    println!(
        "(medians; prep ms: preprocessing on the training thread; wait ms: the training thread \
         waiting for the producers' batch; producer ms: preparing it in a producer)"
    );
}
