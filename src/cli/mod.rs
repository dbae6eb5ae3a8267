//! The command line: one module per subcommand, thin over the library.

pub mod add;
pub mod conf;
mod daemon;
pub mod del;
pub mod device;
pub mod discover;
mod exported;
pub mod features;
mod handover;
mod join;
pub mod list;
pub mod logfile;
pub mod logging;
pub mod manual;
mod port;
pub mod recover;
mod report;
pub mod resize;
pub mod serve;
pub mod spawn;
pub mod stats;
pub mod status;
pub mod target;
pub mod udev_id;
pub mod up;
pub mod upgrade;
pub mod vhost;

use clap::{Args, Parser, Subcommand};
use srp_ublk::session::state::DeviceState;
use srp_ublk::session::timers::{parse_tmo, TimerError, Timers, Tmo};
use srp_ublk::session::SessionOptions;
use srp_ublk::wire::target::{RkeyScope, TargetSpec};
use std::time::Duration;

/// How the SRP session is set up: shared by the front ends (`add` for ublk, `serve` for NBD).
#[derive(Debug, Args, Clone)]
pub struct SessionArgs {
    /// The LUN to serve (default: the target string's lun=, else 0). `add` also takes a list
    /// ("0,2") or "all" (every LUN the target reports, as ib_srp attaches them): one device per
    /// LUN, all served by one daemon over the target port's channels. A LUN of a port whose
    /// daemon runs joins it (with "all": the LUNs it does not serve yet).
    #[arg(long, value_parser = parse_lun_sel, value_name = "N|N,M,...|all")]
    pub lun: Option<LunSel>,
    /// SRP channels: ublk queues for `add`; for `serve`, NBD connections served at once or
    /// vhost-user-blk virtqueues (default: the online CPUs, at most 4, capped by the target
    /// string's ch_count).
    #[arg(long, short = 'q')]
    pub queues: Option<u16>,
    /// Commands in flight per channel (capped by the credits the target grants, minus one).
    #[arg(long, short = 'd', default_value_t = 64)]
    pub depth: u16,
    /// Limit for each login step, in seconds.
    #[arg(long, default_value_t = 15)]
    pub timeout: u64,
    /// How long the target may reach a data buffer: "command" (only while its command is
    /// outstanding, in its direction and byte range: a memory window per command) or "login"
    /// (every buffer, both ways, for the whole login: one registration, no containment).
    /// Default: the target string's rkey_scope=, else command.
    #[arg(long, value_name = "command|login")]
    pub rkey_scope: Option<RkeyScope>,
}

/// ib_srp's SRP transport-class timers, for `add` and `serve`.
#[derive(Debug, Clone, Args)]
pub struct TimerArgs {
    /// Seconds between reconnect attempts after a channel goes down, or "off" (ib_srp's
    /// reconnect_delay).
    #[arg(long, default_value = "10", value_parser = tmo("reconnect_delay"), value_name = "SECS|off")]
    pub reconnect_delay: Tmo,
    /// Seconds a channel may be down before its I/O fails with EIO instead of waiting, or "off"
    /// (ib_srp's fast_io_fail_tmo; dm-multipath relies on it).
    #[arg(long, default_value = "15", value_parser = tmo("fast_io_fail_tmo"), value_name = "SECS|off")]
    pub fast_io_fail_tmo: Tmo,
    /// Seconds a channel may be down before the device is removed (for `serve`: its I/O fails for
    /// good), or "off" (ib_srp's dev_loss_tmo).
    #[arg(long, default_value = "600", value_parser = tmo("dev_loss_tmo"), value_name = "SECS|off")]
    pub dev_loss_tmo: Tmo,
}

fn tmo(name: &'static str) -> impl Fn(&str) -> Result<Tmo, TimerError> + Clone {
    move |s| parse_tmo(name, s)
}

impl TimerArgs {
    /// The timers, checked with ib_srp's rules.
    pub fn timers(&self) -> Result<Timers, TimerError> {
        let t = Timers {
            reconnect_delay: self.reconnect_delay,
            fast_io_fail_tmo: self.fast_io_fail_tmo,
            dev_loss_tmo: self.dev_loss_tmo,
        };
        t.validate()?;
        Ok(t)
    }
}

/// Which LUNs: some, or every LUN the target reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LunSel {
    /// These.
    List(Vec<u64>),
    /// REPORT LUNS decides.
    All,
}

fn parse_lun_sel(s: &str) -> Result<LunSel, String> {
    if s == "all" {
        return Ok(LunSel::All);
    }
    let luns = s
        .split(',')
        .map(|t| t.trim().parse::<u64>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| format!("'{s}': expected a LUN number, a list like 0,2, or all"))?;
    if luns.is_empty() {
        return Err("no LUN given".into());
    }
    Ok(LunSel::List(luns))
}

impl SessionArgs {
    /// `target` with this command line's overrides of its options (`--rkey-scope`).
    pub fn apply(&self, mut target: TargetSpec) -> TargetSpec {
        if let Some(s) = self.rkey_scope {
            target.opts.rkey_scope = Some(s);
        }
        target
    }

    /// The one LUN to serve: `--lun N`, else the target string's `lun=`, else 0.
    pub fn single_lun(&self, target: Option<&TargetSpec>) -> anyhow::Result<u64> {
        let from_target = target.and_then(|t| t.lun);
        match (&self.lun, from_target) {
            (None, t) => Ok(t.unwrap_or(0)),
            (Some(LunSel::List(l)), t) if l.len() == 1 && t.is_none_or(|t| t == l[0]) => Ok(l[0]),
            (Some(LunSel::List(l)), Some(t)) if l.len() == 1 => anyhow::bail!(
                "--lun {} and the target string's lun={t} disagree: give one of them",
                l[0]
            ),
            (Some(_), _) => anyhow::bail!(
                "this command serves one LUN: give --lun N (lists and 'all' are for `add`)"
            ),
        }
    }

    /// As session options for the LUNs of one target port, each a device over the same
    /// channels (`luns` is not empty).
    pub fn port_options(&self, luns: &[u64]) -> SessionOptions {
        SessionOptions {
            channels: self.queues,
            depth: self.depth,
            lun: luns.first().copied().unwrap_or(0),
            more_luns: luns.iter().skip(1).copied().collect(),
            timeout: Duration::from_secs(self.timeout),
            share_nexus: false,
            max_segments: 1,
        }
    }

    /// As session options for one LUN: channel 0 logs in with MULTI while another daemon or
    /// export serves the target's nexus (SINGLE would end its channels).
    pub fn options(&self, target: Option<&TargetSpec>) -> anyhow::Result<SessionOptions> {
        Ok(SessionOptions {
            channels: self.queues,
            depth: self.depth,
            lun: self.single_lun(target)?,
            more_luns: Vec::new(),
            timeout: Duration::from_secs(self.timeout),
            share_nexus: target.is_some_and(DeviceState::nexus_shared),
            max_segments: 1,
        })
    }
}

/// srp-ublk: SRP LUNs over RDMA as /dev/ublkbN block devices and NBD exports.
#[derive(Debug, Parser)]
#[command(
    name = "srp-ublk",
    version = VERSION,
    long_version = LONG_VERSION,
    about,
    long_about = LONG_ABOUT,
    propagate_version = true
)]
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

/// `srp-ublk -V`: the version and the commit it was built from (what a daemon writes in its
/// state file, so that `list` shows a mixed state after an upgrade).
pub(crate) const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("SRP_UBLK_COMMIT"),
    ")"
);

/// `srp-ublk --version`: also what it needs from the host.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("SRP_UBLK_COMMIT"),
    ")\n",
    "needs: Linux 6.0 or later with ublk_drv (UBLK_F_USER_RECOVERY, USER_RECOVERY_REISSUE, \
     NEED_GET_DATA), libibverbs and librdmacm with the RDMA device's provider\n",
    "tested: Linux 6.12 and 6.18 (Debian) over soft-RoCE; live resize needs 6.16 (UPDATE_SIZE)\n",
    "see what this host has: srp-ublk features"
);

/// What srp-ublk(8) and `srp-ublk --help` say it is.
const LONG_ABOUT: &str = "srp-ublk is a userspace SRP (SCSI RDMA Protocol) initiator. It logs in \
to an SRP target over RDMA (InfiniBand, RoCE or iWARP) and presents a LUN as a block device, \
/dev/ublkbN (through the kernel's ublk driver), or for VM hosts as an NBD export or a \
vhost-user-blk disk (`serve`). Each device queue has its own SRP channel on its own thread. It takes the target strings of the \
kernel's ib_srp (add_target) and of srp_daemon, keeps ib_srp's reconnect_delay, \
fast_io_fail_tmo and dev_loss_tmo, and runs under systemd from /etc/srp-ublk/targets.d (`up`). \
Each device is served by a daemon that `add` starts; `list`, `stats`, `del`, `recover` and \
`upgrade` act on it through /run/srp-ublk.";

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Log in to an SRP target and create /dev/ublkbN; prints the device path when it is live.
    Add(add::AddArgs),
    /// List what an RDMA/CM target offers: one target string per LUN (`add --target` takes it as
    /// printed), with vendor, product, size and WWID.
    Discover(discover::DiscoverArgs),
    /// Stop a device: log its channels out and remove it.
    Del(del::DelArgs),
    /// List srp-ublk devices and exports with their targets, channels and credits.
    List(list::ListArgs),
    /// After a daemon crash: log in again and resume the device (ublk user recovery).
    Recover(recover::RecoverArgs),
    /// Re-read the LUN capacity of a device (or a vhost-user-blk export) now and resize it to it.
    Resize(resize::ResizeArgs),
    /// What each device, export and queue is doing: IOPS, MB/s, latency percentiles, errors,
    /// reconnects; or every counter in the Prometheus text format (--prometheus FILE).
    Stats(stats::StatsArgs),
    /// Serve a target's LUN (or a demo backend) as an NBD export, or as a vhost-user-blk disk for a
    /// VMM, in the foreground.
    Serve(serve::ServeArgs),
    /// Show what this host offers: ublk driver, RDMA devices, ports and GIDs, modules.
    Features(features::FeaturesArgs),
    /// Attach the targets configured in /etc/srp-ublk/targets.d (all, or those named).
    Up(up::UpArgs),
    /// Detach the devices of the targets configured in /etc/srp-ublk/targets.d.
    Down(up::DownArgs),
    /// Have running daemons re-execute the installed binary (after a package upgrade), keeping
    /// their devices: a pause, no I/O error.
    Upgrade(upgrade::UpgradeArgs),
    /// Print the udev properties of an srp-ublk device (for udev/60-srp-ublk.rules).
    UdevId(udev_id::UdevIdArgs),
    /// Work with target strings (ib_srp add_target syntax, srp_daemon lines and rules).
    #[command(subcommand)]
    Target(target::TargetCmd),
    /// Print a shell's completion script (bash, zsh, fish, elvish, powershell).
    Completions(manual::CompletionsArgs),
    /// Write the man pages into a directory (for packaging).
    #[command(hide = true)]
    Man(manual::ManArgs),
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Add(a) => add::run(a),
        Command::Del(a) => del::run(a),
        Command::Discover(a) => discover::run(a),
        Command::List(a) => list::run(a),
        Command::Recover(a) => recover::run(a),
        Command::Resize(a) => resize::run(a),
        Command::Features(a) => features::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Stats(a) => stats::run(a),
        Command::Target(t) => target::run(t),
        Command::UdevId(a) => udev_id::run(a),
        Command::Up(a) => up::run_up(a),
        Command::Down(a) => up::run_down(a),
        Command::Upgrade(a) => upgrade::run(a),
        Command::Completions(a) => manual::completions(a),
        Command::Man(a) => manual::man(a),
    }
}
