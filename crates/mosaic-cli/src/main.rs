//! `mosaic`: plan, profile and inspect temporal-spatial training plans of multimodal models.
//!
//! Every subcommand is one step of the pipeline in `docs/design.md` and reads or writes a
//! versioned JSON file. Bad input exits with code 2 and one message naming the file and the
//! field. Output that cannot be written ends the process without a panic: a closed pipe
//! (`mosaic profile … | head`) quietly with code 141, as if by SIGPIPE; any other failure
//! (a full disk) with one line and code 1.

mod chart;
mod commands;
mod input;

use std::io::Write;
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
    output_failures_exit();
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
    // What is still buffered goes out now, where a failure can be told (at exit it is lost).
    if let Err(e) = std::io::stdout().flush() {
        output_failed("stdout", &e.to_string());
    }
    match result {
        Ok(()) => {
            #[cfg(feature = "mpi")]
            mosaic_engine::Mpi::end(0);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", clip_message(&e.to_string()));
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {}", clip_message(&cause.to_string()));
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
            let code = if bad_input { 2 } else { 1 };
            // A rank of an `mpirun` job ends them all: the others may wait for it.
            #[cfg(feature = "mpi")]
            mosaic_engine::Mpi::end(i32::from(code));
            ExitCode::from(code)
        }
    }
}

/// The most characters of one message line: the libraries quote names clipped, and this
/// bounds what else a message may echo of the input (a parser's excerpt, a list of names).
const MAX_MESSAGE_CHARS: usize = 2000;

/// A message line, its middle left out past [`MAX_MESSAGE_CHARS`].
fn clip_message(message: &str) -> std::borrow::Cow<'_, str> {
    mosaic_kit::text::clip_middle(message, MAX_MESSAGE_CHARS)
}

/// Exit code of a write to a closed pipe: 128 + SIGPIPE, what a shell reports for a command
/// that the signal ended (`mosaic profile … | head` then ends as `cat` would, without a word).
const BROKEN_PIPE_EXIT: i32 = 141;

/// Makes a failed write to standard output or error end the process cleanly instead of with a
/// panic: `println!` panics when it cannot write, and the hook set here catches that one
/// panic, wherever it is printed from. A closed pipe (`| head`) ends the process quietly with
/// [`BROKEN_PIPE_EXIT`], as the Unix convention has it; any other failure (`> /dev/full`)
/// with one line on standard error and exit code 1. Every other panic goes to the default
/// hook. (SIGPIPE itself stays ignored, as Rust sets it: the engine's data feed reads a
/// closed socket as an error, not as the end of the process.)
fn output_failures_exit() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        for stream in ["stdout", "stderr"] {
            if let Some(why) = message.strip_prefix(&format!("failed printing to {stream}: ")) {
                output_failed(stream, why);
            }
        }
        default(info)
    }));
}

/// Ends the process after a failed write to `stream` (`stdout` or `stderr`), `why` the OS
/// error: quietly for a closed pipe, else with one line on standard error (where it can be
/// written) and exit code 1.
fn output_failed(stream: &str, why: &str) -> ! {
    if why.contains("Broken pipe") || why.contains("os error 32") {
        std::process::exit(BROKEN_PIPE_EXIT);
    }
    let name = if stream == "stdout" {
        "standard output"
    } else {
        "standard error"
    };
    let _ = writeln!(std::io::stderr(), "error: cannot write to {name}: {why}");
    std::process::exit(1)
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
