//! One module per subcommand.

pub mod bench;
pub mod plan;
pub mod profile;
pub mod zoo;
