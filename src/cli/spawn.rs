//! Starting an `add` daemon and waiting for it: its log (a file of its own, or the journal its
//! parent writes to), the READY or ERROR line it sends back, and what `add` then says.

use anyhow::{bail, Context};
use srp_ublk::frontend::ublk::LiveInfo;
use srp_ublk::session::state::{run_dir, DeviceState};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Set in the daemon's environment by `add`: print READY/ERROR lines on stdout for the parent.
pub(crate) const DAEMON_ENV: &str = "SRP_UBLK_DAEMON";
pub(crate) const LOG_ENV: &str = "SRP_UBLK_LOG_FILE";
/// A state file's `log` when the daemon logs to the journal.
pub(crate) const JOURNAL_LOG: &str = "journal";

/// Starts `srp-ublk ARGV` (an `add`) as a daemon in its own process group, logging under
/// /run/srp-ublk/logs (or to the journal, as `add` does under systemd), and returns once it reports
/// the device live (announcing it as `out` says) or fails.
pub fn spawn_daemon(
    argv: &[std::ffi::OsString],
    login_timeout: u64,
    announce: Announce,
) -> anyhow::Result<()> {
    spawn_port_daemon(argv, login_timeout, announce, 1)
}

/// [`spawn_daemon`] for a daemon that brings `devices` devices up (a target port's LUNs): waits
/// for a READY line from each.
pub fn spawn_port_daemon(
    argv: &[std::ffi::OsString],
    login_timeout: u64,
    announce: Announce,
    devices: usize,
) -> anyhow::Result<()> {
    let mut cmd = Command::new(std::env::current_exe().context("cannot find my own executable")?);
    cmd.args(argv)
        .env(DAEMON_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    // under systemd the daemon logs to the journal as the unit does (it inherits the unit's
    // stderr); elsewhere to a file of its own
    let file = if super::logging::stderr_is_journal() {
        None
    } else {
        let logs = run_dir().join("logs");
        std::fs::create_dir_all(&logs)
            .with_context(|| format!("cannot create {}", logs.display()))?;
        let (log, log_file) = new_log(&logs)?;
        cmd.env(LOG_ENV, &log).stderr(Stdio::from(log_file));
        Some(log)
    };
    let mut child = cmd.spawn().context("cannot start the srp-ublk daemon")?;
    let log = match file {
        Some(path) => path.display().to_string(),
        None => match srp_ublk::session::state::own_unit() {
            Some(unit) => format!("the journal (journalctl -u {unit})"),
            None => "the journal".to_string(),
        },
    };
    let out = child.stdout.take().context("no pipe to the daemon")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let limit = setup_limit(login_timeout);
    for _ in 0..devices.max(1) {
        await_ready(&mut child, &rx, limit, &log, announce)?;
    }
    Ok(())
}

/// How long a daemon may take to bring a device up, for a login limit of `login_timeout` s: a
/// login, the LUNs' interrogation and the device's start, with room for retries.
pub(super) fn setup_limit(login_timeout: u64) -> Duration {
    Duration::from_secs(login_timeout * 4 + 60)
}

/// How a live device is announced on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Announce {
    /// Its path, and on stderr what it and the host's devices pin.
    Path,
    /// The daemon's JSON (`add --json`).
    Json,
    /// Nothing: the caller reports it.
    Quiet,
}

impl Announce {
    /// [`Announce::Json`] with `json`, [`Announce::Path`] otherwise.
    pub fn json_if(json: bool) -> Announce {
        if json {
            Announce::Json
        } else {
            Announce::Path
        }
    }
}

/// A new log file for one daemon in `logs`: one `add` (or `up`) may start several daemons in the
/// same second, so each gets a name of its own.
fn new_log(logs: &std::path::Path) -> anyhow::Result<(std::path::PathBuf, std::fs::File)> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    (0..1000)
        .find_map(|n| {
            let log = logs.join(format!("add-{stamp}-{}-{n}.log", std::process::id()));
            match srp_ublk::session::state::create_new(&log, 0o640) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
                r => Some(
                    r.map(|f| (log.clone(), f))
                        .with_context(|| format!("cannot create {}", log.display())),
                ),
            }
        })
        .unwrap_or_else(|| {
            Err(anyhow::anyhow!(
                "cannot create a log file in {}: 1000 taken",
                logs.display()
            ))
        })
}

/// What a device that just came up holds, and what every srp-ublk device on the host holds (from
/// the state files: the daemon writes its own before it says READY).
fn live_summary(id: u32) -> String {
    let all = DeviceState::all();
    let this = match all.iter().find(|d| d.dev_id == id) {
        Some(d) => format!(
            "/dev/ublkb{id}: LUN {}, {} queue(s) x depth {}, {:.1} MiB pinned",
            d.lun,
            d.queues.len(),
            d.depth,
            d.memory.as_ref().map_or(0, |m| m.pinned_bytes) as f64 / (1u64 << 20) as f64
        ),
        None => format!("/dev/ublkb{id}"),
    };
    let exports = srp_ublk::session::exports::ExportState::all();
    format!(
        "{this}; on this host: {}",
        super::list::host_total(&all, &exports)
    )
}

/// Says that device `info` is live, as `out` asks.
pub(super) fn announce_live(info: &LiveInfo, out: Announce) {
    match out {
        Announce::Json => println!("{}", serde_json::to_string(info).unwrap_or_default()),
        Announce::Path => {
            println!("{}", info.bdev);
            eprintln!("srp-ublk: {}", live_summary(info.dev_id));
        }
        Announce::Quiet => {}
    }
}

/// Waits for the daemon's READY (the device is up: its name, or the READY line with `json`) or
/// ERROR line; a daemon that exits or stays silent past `limit` fails with its log's path.
fn await_ready(
    child: &mut std::process::Child,
    rx: &std::sync::mpsc::Receiver<String>,
    limit: Duration,
    log: &str,
    out: Announce,
) -> anyhow::Result<()> {
    loop {
        match rx.recv_timeout(limit) {
            Ok(line) => {
                if let Some(ready) = line.strip_prefix("READY ") {
                    let info: LiveInfo =
                        serde_json::from_str(ready).context("bad READY line from the daemon")?;
                    announce_live(&info, out);
                    return Ok(());
                }
                if let Some(rest) = line.strip_prefix("ERROR ") {
                    let _ = child.wait();
                    let (exit, msg) = super::status::parse_error_line(rest);
                    return Err(super::status::failed(exit, msg));
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().ok();
                bail!("the daemon exited during setup ({status:?}); see {log}");
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                bail!("the daemon did not bring the device up within {limit:?}; see {log}");
            }
        }
    }
}
