//! Preprocessing in the training process against disaggregated into producer processes
//! (DistTrain §8, Fig. 21; `mosaic measure preprocess`): short training runs of a model on the
//! image feed ([`crate::runtime::feed`]) at several image counts and resolutions, each once with
//! the preprocessing on the trainer's thread and once with `K` producers, timing every step and
//! the trainer's time in the data source.

use candle_core::Device;
use serde::Serialize;

use super::machine::available_cores;
use crate::error::EngineError;
use crate::models;
use crate::runtime::feed::{feed, FeedConfig, FeedOptions, Launcher};
use crate::runtime::schedule::Schedule;
use crate::runtime::trainer::{TrainConfig, Trainer};

/// What [`measure_preprocess`] runs.
#[derive(Debug, Clone, PartialEq)]
pub struct PreprocessConfig {
    /// The built-in model (one with an image and a text input: `clip-tiny`).
    pub model: String,
    /// Sides of the encoded images, in pixels.
    pub resolutions: Vec<u32>,
    /// Most images per sample (a sample draws 1 to this many).
    pub images: Vec<u32>,
    /// Producer processes of the disaggregated runs (at least 1).
    pub producers: usize,
    /// Timed steps per run.
    pub steps: u64,
    /// Untimed steps first (the producers' queue fills meanwhile).
    pub warmup: u64,
    /// Samples per step.
    pub batch: usize,
    /// Seed of the model and the data.
    pub seed: u64,
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct PreprocessRun {
    /// Producer processes (0: in the training process).
    pub producers: usize,
    /// Median step time, ms (the batch fetch included, as in training).
    pub step_ms: f64,
    /// Median time the trainer's thread spent getting the batch, ms: preparing it in process,
    /// waiting for and converting it otherwise.
    pub data_ms: f64,
    /// Median time preparing a batch took where it ran, ms (in a producer, next to others).
    pub prep_ms: f64,
    /// Start-up: making the raw data (and starting the producers), ms.
    pub setup_ms: f64,
}

/// One (resolution, images) cell: the in-process run and the disaggregated one.
#[derive(Debug, Clone, Serialize)]
pub struct PreprocessRow {
    /// Side of the encoded images, px.
    pub resolution: u32,
    /// Most images per sample.
    pub images_per_sample: u32,
    /// Images decoded per step, averaged over the timed steps.
    pub images_per_step: f64,
    /// Preprocessing on the trainer's thread.
    pub in_process: PreprocessRun,
    /// Preprocessing in producers.
    pub disaggregated: PreprocessRun,
}

/// Runs every (resolution, images) cell with preprocessing in process and in
/// `config.producers` producers started by `launcher`, on the sequential schedule of this
/// machine's cores.
pub fn measure_preprocess(
    config: &PreprocessConfig,
    launcher: &Launcher,
) -> Result<Vec<PreprocessRow>, EngineError> {
    let mut rows = Vec::new();
    for &resolution in &config.resolutions {
        for &images in &config.images {
            let (in_process, count) = run(config, launcher, resolution, images, 0)?;
            let (disaggregated, _) = run(config, launcher, resolution, images, config.producers)?;
            rows.push(PreprocessRow {
                resolution,
                images_per_sample: images,
                images_per_step: count,
                in_process,
                disaggregated,
            });
        }
    }
    Ok(rows)
}

/// One short training run; also the mean images decoded per timed step.
fn run(
    c: &PreprocessConfig,
    launcher: &Launcher,
    resolution: u32,
    images: u32,
    producers: usize,
) -> Result<(PreprocessRun, f64), EngineError> {
    let mut model = models::build(&c.model, c.seed, &Device::Cpu)?;
    let schedule = Schedule::sequential(&model, available_cores());
    let config = FeedConfig::for_fields(&model.data.fields(), c.seed, images, resolution, 1)?;
    let t0 = std::time::Instant::now();
    let options = FeedOptions::for_work(&config, c.batch);
    let f = feed(config, &model.data.fields(), producers, launcher, options)?;
    let setup_ms = t0.elapsed().as_secs_f64() * 1e3;
    model.data = f.source;
    let train = TrainConfig {
        batch: c.batch,
        ..TrainConfig::default()
    };
    let mut trainer = Trainer::new(model, schedule, train)?;
    for _ in 0..c.warmup {
        trainer.step()?;
    }
    let skip = f.stats.timings().len();
    let mut steps = Vec::with_capacity(c.steps as usize);
    for _ in 0..c.steps {
        steps.push(trainer.step()?.step_ms);
    }
    let timed: Vec<_> = f.stats.timings().split_off(skip);
    let median = |v: Vec<f64>| mosaic_kit::stats::median(&v).unwrap_or(0.0);
    let counted =
        timed.iter().map(|t| f64::from(t.images)).sum::<f64>() / timed.len().max(1) as f64;
    Ok((
        PreprocessRun {
            producers,
            step_ms: median(steps),
            data_ms: median(timed.iter().map(|t| t.trainer_ms).collect()),
            prep_ms: median(timed.iter().map(|t| t.producer_ms).collect()),
            setup_ms,
        },
        counted,
    ))
}
