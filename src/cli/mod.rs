//! The command line: one module per subcommand, thin over the library.

pub mod add;
pub mod del;
pub mod features;
pub mod list;
pub mod recover;
pub mod serve;
pub mod target;

use clap::{Args, Parser, Subcommand};
use srp_ublk::session::SessionOptions;
use std::time::Duration;

/// How the SRP session is set up: shared by the front ends (`add` for ublk, `serve` for NBD).
#[derive(Debug, Args, Clone)]
pub struct SessionArgs {
    /// The LUN to serve.
    #[arg(long, default_value_t = 0)]
    pub lun: u64,
    /// SRP channels: ublk queues for `add`, concurrent connections for `serve`
    /// (default: online CPUs, capped by the target string's ch_count).
    #[arg(long, short = 'q')]
    pub queues: Option<u16>,
    /// Commands in flight per channel (capped by the credits the target grants, minus one).
    #[arg(long, short = 'd', default_value_t = 64)]
    pub depth: u16,
    /// Limit for each login step, in seconds.
    #[arg(long, default_value_t = 15)]
    pub timeout: u64,
}

impl SessionArgs {
    /// As session options.
    pub fn options(&self) -> SessionOptions {
        SessionOptions {
            channels: self.queues,
            depth: self.depth,
            lun: self.lun,
            timeout: Duration::from_secs(self.timeout),
        }
    }
}

/// srp-ublk: SRP LUNs over RDMA as /dev/ublkbN block devices and NBD exports.
#[derive(Debug, Parser)]
#[command(name = "srp-ublk", version, about, propagate_version = true)]
pub struct Cli {
    /// Log filter (tracing-subscriber EnvFilter syntax), e.g. "debug" or "srp_ublk=trace".
    #[arg(
        long,
        global = true,
        env = "SRP_UBLK_LOG",
        default_value = "info,libublk=warn"
    )]
    pub log: String,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Log in to an SRP target and create /dev/ublkbN; prints the device path when it is live.
    Add(add::AddArgs),
    /// Stop a device: log its channels out and remove it.
    Del(del::DelArgs),
    /// List srp-ublk devices with their targets, channels and credits.
    List(list::ListArgs),
    /// After a daemon crash: log in again and resume the device (ublk user recovery).
    Recover(recover::RecoverArgs),
    /// Serve a target's LUN (or a demo backend) as an NBD export, in the foreground.
    Serve(serve::ServeArgs),
    /// Show what this host offers: ublk driver, RDMA devices, ports and GIDs, modules.
    Features,
    /// Work with target strings (ib_srp add_target syntax, srp_daemon lines and rules).
    #[command(subcommand)]
    Target(target::TargetCmd),
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Add(a) => add::run(a),
        Command::Del(a) => del::run(a),
        Command::List(a) => list::run(a),
        Command::Recover(a) => recover::run(a),
        Command::Features => features::run(),
        Command::Serve(a) => serve::run(a),
        Command::Target(t) => target::run(t),
    }
}
