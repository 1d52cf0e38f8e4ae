//! `mosaic`: plan, profile and inspect temporal-spatial training plans of multimodal models.
//!
//! Every subcommand is one step of the pipeline in `docs/design.md` and reads or writes a
//! versioned JSON file. Bad input exits with code 2 and one message naming the file and the
//! field.

mod chart;
mod commands;
mod input;

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
    /// Write the analytical profile of a built-in model on a built-in cluster.
    Profile(commands::profile::Args),
    /// List the built-in models, devices and clusters.
    Zoo(commands::zoo::Args),
    /// Run the paper's headline experiments: every zoo model, every strategy, 8 and 32 H100s.
    Report(commands::report::Args),
    /// Measure planning speed and GAHC's quality against the exact search.
    #[command(args_conflicts_with_subcommands = true)]
    Bench(commands::bench::Args),
    /// Compare Mosaic with Megatron-LM, DistMM, Spindle, DistTrain and FlowTrain on the same profiles and cluster.
    Compare(commands::compare::Args),
    /// Execute a plan in the event-driven simulator (iteration time, utilisation, a Chrome trace, an SVG picture), or simulate colocations.
    Simulate(commands::simulate::Args),
    /// Fit the analytical device model's constants to a measured profile (mosaic-calibration/1).
    Calibrate(commands::calibrate::Args),
    /// Fit the interference coefficients to colocation measurements and report the model's accuracy.
    Fit(commands::fit::Args),
    /// Train a built-in engine model by a plan on this machine (needs the engine feature).
    #[cfg_attr(not(feature = "engine"), command(disable_help_flag = true))]
    Train(commands::train::Args),
    /// Measure an engine model on this machine: its profile, colocations, slots (needs the engine feature).
    #[cfg_attr(feature = "engine", command(subcommand))]
    #[cfg_attr(not(feature = "engine"), command(disable_help_flag = true))]
    Measure(commands::measure::Args),
    /// Check the engine's GPU paths on the GPU present, each pass or fail with its figure (needs the engine feature).
    #[cfg_attr(feature = "engine", command(subcommand))]
    #[cfg_attr(not(feature = "engine"), command(disable_help_flag = true))]
    Check(commands::check::Args),
    /// Simulate the peers' batching policies on variable-size samples (DP × PP, 1F1B), or write an engine model's data (`data write`).
    #[command(args_conflicts_with_subcommands = true)]
    Data(commands::data::Args),
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
        Command::Calibrate(a) => commands::calibrate::run(a),
        Command::Train(a) => commands::train::run(a),
        Command::Measure(a) => commands::measure::run(a),
        Command::Check(a) => commands::check::run(a),
        Command::Data(a) => commands::data::run(a),
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
                || e.downcast_ref::<mosaic_plan::PlanFileError>().is_some()
                || e.downcast_ref::<mosaic_sim::SimError>().is_some()
                || e.downcast_ref::<mosaic_fit::FitError>().is_some()
                || e.downcast_ref::<mosaic_data::samples::SamplesError>()
                    .is_some()
                || e.downcast_ref::<std::io::Error>().is_some_and(bad_path)
                || matches!(
                    e.downcast_ref::<mosaic_plan::PlanError>(),
                    Some(
                        mosaic_plan::PlanError::Unplaceable { .. }
                            | mosaic_plan::PlanError::NoGpus
                            | mosaic_plan::PlanError::TooManyGpus { .. }
                    )
                );
            ExitCode::from(if bad_input { 2 } else { 1 })
        }
    }
}

/// A file-system error that means a path on the command line is wrong (`cannot write FILE`: a
/// directory, a missing directory, no permission), not that the machine failed (a full disk).
/// Only an I/O error a command returned itself, with its context, is seen here: the typed
/// errors of the libraries say for themselves whether the input is bad.
fn bad_path(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        NotFound
            | PermissionDenied
            | AlreadyExists
            | IsADirectory
            | NotADirectory
            | ReadOnlyFilesystem
            | InvalidFilename
    )
}
