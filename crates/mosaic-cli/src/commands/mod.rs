//! One module per subcommand.

pub mod bench;
pub mod calibrate;
#[cfg(feature = "engine")]
pub mod check;
pub mod compare;
pub mod data;
#[cfg(feature = "engine")]
mod engine;
pub mod fit;
#[cfg(feature = "engine")]
pub mod measure;
pub mod plan;
pub mod profile;
pub mod report;
pub mod simulate;
#[cfg(feature = "engine")]
pub mod train;
pub mod zoo;

// A build without the engine still lists its commands, and refuses them saying how to rebuild.
#[cfg(not(feature = "engine"))]
pub use no_engine as check;
#[cfg(not(feature = "engine"))]
pub use no_engine as measure;
#[cfg(not(feature = "engine"))]
pub use no_engine as train;

/// An engine command (`train`, `measure`, `check`, `data`) in a build without the engine.
#[cfg(not(feature = "engine"))]
pub mod no_engine {
    use anyhow::Result;

    use crate::input::BadInput;

    /// Whatever was given, `--help` included: the command is not in this build.
    #[derive(clap::Args, Debug)]
    pub struct Args {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    }

    /// Refuses, saying how to get the engine (exit code 2).
    pub fn run(_args: Args) -> Result<()> {
        Err(BadInput(
            "this mosaic was built without the engine: rebuild with `cargo build --release -p \
             mosaic-cli --features engine` (it compiles the candle ML framework)"
                .into(),
        )
        .into())
    }
}
