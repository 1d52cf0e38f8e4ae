//! One module per subcommand.

pub mod bench;
pub mod compare;
pub mod fit;
pub mod plan;
pub mod profile;
pub mod report;
pub mod simulate;
#[cfg(feature = "engine")]
pub mod train;
pub mod zoo;
