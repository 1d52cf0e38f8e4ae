//! `mosaic data write`: the data an engine model trains on, as files (`mosaic train --data`).

use std::path::PathBuf;

use anyhow::Result;
use mosaic_engine::models;
use mosaic_engine::models::data;
use mosaic_engine::Device;

use super::super::engine::{describe_fields, engine, one_process, tiny_model};
use crate::input::check_output;

/// Arguments of `mosaic data write`.
#[derive(clap::Args, Debug)]
pub(super) struct WriteArgs {
    /// A built-in engine model: clip-tiny or omni-tiny.
    #[arg(long)]
    model: String,
    /// The safetensors file to write: one tensor per data input, samples along dimension 0.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Steps of data to write (--steps × --batch samples, at most 2^20 and 2 GiB: the file is
    /// built in memory first; `mosaic train --steps` and `--batch` with the same values
    /// reproduce the synthetic run bit for bit).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    steps: u64,
    /// Samples per step.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Seed of the synthetic data (as `mosaic train --seed`).
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Runs `mosaic data write`.
pub fn run(args: &WriteArgs) -> Result<()> {
    one_process("mosaic data write")?;
    check_output("--out", &args.out)?;
    // A zoo-built model at its real size is gigabytes to build and megabytes a sample.
    tiny_model("mosaic data write", &args.model, &models::tiny_models())?;
    let model = models::build(&args.model, args.seed, &Device::Cpu).map_err(engine)?;
    data::write_batches(&*model.data, args.steps, args.batch, &args.out).map_err(engine)?;
    eprintln!(
        "wrote {} ({} steps × {} samples of {}'s inputs: {}); train on it with `mosaic train \
         --data`",
        args.out.display(),
        args.steps,
        args.batch,
        model.name,
        describe_fields(&model.data.fields())
    );
    Ok(())
}
