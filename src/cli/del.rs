//! `srp-ublk del`: stop a device's daemon (which logs its channels out and removes the device), with
//! bounded waits and a clear message when something does not go away.

use super::daemon;
use anyhow::bail;
use clap::Args;
use nix::sys::signal::Signal::SIGTERM;
use serde_json::json;
use srp_ublk::session::state::DeviceState;
use std::path::Path;
use std::time::{Duration, Instant};

/// `srp-ublk del ...`
#[derive(Debug, Args)]
pub struct DelArgs {
    /// The device: N, /dev/ublkbN or a path that leads to it (/dev/disk/by-id/...).
    #[arg(short = 'n', long = "number", value_name = "DEVICE", value_parser = super::device::parse,
          required_unless_present = "all")]
    pub id: Option<u32>,
    /// Every srp-ublk device.
    #[arg(long, short = 'a', conflicts_with = "id")]
    pub all: bool,
    /// Seconds to wait for each device to go away.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Report as JSON: an object per device (`device`, `ok`, `error`).
    #[arg(long)]
    pub json: bool,
}

/// Runs `del`.
pub fn run(a: DelArgs) -> anyhow::Result<()> {
    let targets: Vec<DeviceState> = if a.all {
        DeviceState::all()
    } else {
        let id = a.id.unwrap_or(0);
        let ours = DeviceState::path(id).exists();
        if !ours && Path::new(&format!("/dev/ublkb{id}")).exists() {
            bail!(
                "/dev/ublkb{id} is not served by srp-ublk (no {}); remove it with the tool that created it",
                DeviceState::path(id).display()
            );
        }
        vec![super::device::state(id)?]
    };
    let mut report = super::report::Report::new(a.json);
    for d in targets {
        match del_one(&d, Duration::from_secs(a.timeout)) {
            Ok(()) => report.done(&d.bdev, format!("deleted {}", d.bdev), json!({})),
            Err(e) => report.failed(&d.bdev, e),
        }
    }
    report.finish("deleted")
}

fn nodes_gone(d: &DeviceState) -> bool {
    !Path::new(&d.bdev).exists() && !Path::new(&format!("/dev/ublkc{}", d.dev_id)).exists()
}

/// Deletes `d`: its daemon, when it runs, logs the channels out and removes the device; a device
/// whose daemon is gone (or whose pid now names another process, never signalled) is removed here
/// at once.
pub(crate) fn del_one(d: &DeviceState, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    if daemon::alive(d) && !siblings(d).is_empty() {
        return del_of_port(d, deadline, timeout);
    }
    if daemon::alive(d) {
        daemon::signal(d, SIGTERM)?;
        while daemon::alive(d) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let running = daemon::alive(d);
    if !running {
        // the daemon left the device behind (or is exiting as it removes it): remove it ourselves
        if let Some(c) = daemon::ctrl(d.dev_id) {
            let _ = c.kill_dev();
            let _ = c.del_dev();
        }
        while !nodes_gone(d) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if nodes_gone(d) {
            DeviceState::remove(d.dev_id);
            return Ok(());
        }
    }
    bail!(
        "{} still present after {timeout:?} (daemon pid {} {}); is it still open? \
         check `fuser -m {}` and the daemon log {}",
        d.bdev,
        d.pid,
        if running { "running" } else { "gone" },
        d.bdev,
        d.log
    )
}

/// The other devices `d`'s daemon serves (the LUNs of one target port), by their state files.
fn siblings(d: &DeviceState) -> Vec<DeviceState> {
    DeviceState::all()
        .into_iter()
        .filter(|o| o.pid == d.pid && o.pid_start == d.pid_start && o.dev_id != d.dev_id)
        .collect()
}

/// Deletes `d`, one of the devices of a daemon that serves others too: the device is stopped
/// here (as its daemon's SIGTERM would stop them all), and the daemon, whose queues let go of
/// it, deletes it and its state file while the other devices go on.
fn del_of_port(d: &DeviceState, deadline: Instant, timeout: Duration) -> anyhow::Result<()> {
    let Some(c) = daemon::ctrl(d.dev_id) else {
        bail!(
            "{}: cannot open its ublk device (is ublk_drv loaded?); its daemon (pid {}) serves \
             other devices too and is left running",
            d.bdev,
            d.pid
        );
    };
    let _ = c.kill_dev();
    // the daemon removes the state file once it has deleted the device
    let done = || nodes_gone(d) && !DeviceState::path(d.dev_id).exists();
    while !done() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if nodes_gone(d) {
        DeviceState::remove(d.dev_id);
        return Ok(());
    }
    bail!(
        "{} still present after {timeout:?} (its daemon, pid {}, serves other devices too and \
         goes on); is it still open? check `fuser -m {}` and the daemon log {}",
        d.bdev,
        d.pid,
        d.bdev,
        d.log
    )
}
