//! `mosaic`: plan, profile and inspect temporal-spatial training plans of multimodal models.
//!
//! Every subcommand is one step of the pipeline in DESIGN.md and reads or writes a versioned
//! JSON file. Bad input exits with code 2 and one message naming the file and the field.

mod chart;
mod commands;
mod input;
mod render;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Plans the training of multimodal models by temporal-spatial GPU multiplexing (Mosaic).
#[derive(Parser)]
#[command(name = "mosaic", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Plan stages, data-parallel degrees, SM quotas and GPUs for a model.
    Plan(commands::plan::Args),
    /// Write a model's profile: analytical (a zoo model on a built-in cluster) or measured on this machine (--engine).
    Profile(commands::profile::Args),
    /// List the built-in models, devices and clusters.
    Zoo(commands::zoo::Args),
    /// Run the paper's headline experiments: every zoo model, every strategy, 8 and 32 H100s.
    Report(commands::report::Args),
    /// Measure planning speed and GAHC's quality against the exact search.
    Bench(commands::bench::Args),
    /// Compare Mosaic with Megatron-LM, DistMM, Spindle, DistTrain and FlowTrain on the same profiles and cluster.
    Compare(commands::compare::Args),
    /// Execute a plan in the event-driven simulator: iteration time, utilisation, a Chrome trace and an SVG picture.
    Simulate(commands::simulate::Args),
    /// Fit the interference coefficients to colocation measurements and report the model's accuracy.
    Fit(commands::fit::Args),
    /// Train a built-in engine model by a plan on this machine.
    #[cfg(feature = "engine")]
    Train(commands::train::Args),
    /// Train a built-in engine model by a plan (not in this build: rebuild with --features engine).
    #[cfg(not(feature = "engine"))]
    #[command(disable_help_flag = true)]
    Train {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plan(a) => commands::plan::run(a),
        Command::Profile(a) => commands::profile::run(a),
        Command::Zoo(a) => commands::zoo::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Report(a) => commands::report::run(a),
        Command::Compare(a) => commands::compare::run(a),
        Command::Simulate(a) => commands::simulate::run(a),
        Command::Fit(a) => commands::fit::run(a),
        #[cfg(feature = "engine")]
        Command::Train(a) => commands::train::run(a),
        #[cfg(not(feature = "engine"))]
        Command::Train { .. } => Err(input::BadInput(
            "this mosaic was built without the engine: rebuild with `cargo build --release -p \
             mosaic-cli --features engine` (it compiles the candle ML framework)"
                .into(),
        )
        .into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            let bad_input = e.downcast_ref::<input::BadInput>().is_some()
                || e.downcast_ref::<mosaic_profile::ProfileError>().is_some()
                || e.downcast_ref::<mosaic_zoo::ZooError>().is_some()
                || e.downcast_ref::<mosaic_sim::SimError>().is_some()
                || e.downcast_ref::<mosaic_fit::FitError>().is_some()
                || matches!(
                    e.downcast_ref::<mosaic_plan::PlanError>(),
                    Some(
                        mosaic_plan::PlanError::Unplaceable { .. } | mosaic_plan::PlanError::NoGpus
                    )
                );
            ExitCode::from(if bad_input { 2 } else { 1 })
        }
    }
}
