//! `mosaic profile`: the analytical `mosaic-profiles/1` file of a built-in model on a built-in
//! cluster (the zoo's device model). Profiles measured on this machine by the engine are
//! `mosaic measure profile`'s.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::input::check_outputs;

/// Arguments of `mosaic profile`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A built-in model (see `mosaic zoo`).
    #[arg(long)]
    model: String,
    /// A built-in cluster, e.g. h100x8.
    #[arg(long)]
    cluster: String,
    /// A mosaic-calibration/1 file (`mosaic calibrate --out`): the device model's constants
    /// (default: the built-in fit to examples/h100-clip-profile.json).
    #[arg(long, value_name = "FILE")]
    calibration: Option<PathBuf>,
    /// Where to write the mosaic-profiles/1 file (default: standard output).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs `mosaic profile`.
pub fn run(args: Args) -> Result<()> {
    check_outputs(
        &[("--out", args.out.as_deref())],
        &[("--calibration", args.calibration.as_deref())],
    )?;
    let model = mosaic_zoo::model(&args.model)?;
    let cluster = mosaic_zoo::cluster(&args.cluster)?;
    let cal = super::calibrate::load(args.calibration.as_deref())?;
    let file = cal.profile(&model, &cluster);
    let json = serde_json::to_string_pretty(&file)? + "\n";
    match &args.out {
        Some(out) => {
            std::fs::write(out, json).with_context(|| format!("cannot write {}", out.display()))?;
            eprintln!(
                "wrote {} ({} modules of {} profiled on {})",
                out.display(),
                file.modules.len(),
                model.name,
                cluster.name
            );
        }
        None => print!("{json}"),
    }
    Ok(())
}
