//! The command line: one module per subcommand, thin over the library.

pub mod target;

use clap::{Parser, Subcommand};

/// srp-ublk: SRP LUNs over RDMA as /dev/ublkbN block devices and NBD exports.
#[derive(Debug, Parser)]
#[command(name = "srp-ublk", version, about, propagate_version = true)]
pub struct Cli {
    /// Log filter (tracing-subscriber EnvFilter syntax), e.g. "debug" or "srp_ublk=trace".
    #[arg(long, global = true, env = "SRP_UBLK_LOG", default_value = "info")]
    pub log: String,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Work with target strings (ib_srp add_target syntax, srp_daemon lines and rules).
    #[command(subcommand)]
    Target(target::TargetCmd),
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Target(t) => target::run(t),
    }
}
