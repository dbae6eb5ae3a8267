//! `srp-ublk upgrade`: have running daemons re-execute the installed binary, keeping their devices
//! (same pid; ublk user recovery carries the I/O across), after a package upgrade replaced the file.
//! The daemon, on SIGUSR2, replaces its image with `add --recover` of its own device from the path it
//! was started from; the new image logs in and takes the device over as `recover` does. Applications
//! see a pause, no error.

use anyhow::bail;
use clap::Args;
use nix::sys::signal::Signal::SIGUSR2;
use serde_json::json;
use srp_ublk::session::state::DeviceState;
use std::time::{Duration, Instant};

/// `srp-ublk upgrade ...`
#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// The device: N, /dev/ublkbN or a path that leads to it (/dev/disk/by-id/...).
    #[arg(short = 'n', long = "number", value_name = "DEVICE", value_parser = super::device::parse,
          required_unless_present = "all")]
    pub id: Option<u32>,
    /// Every srp-ublk device with a running daemon.
    #[arg(long, short = 'a', conflicts_with = "id")]
    pub all: bool,
    /// Seconds to wait for each daemon's new image to serve its device.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Report as JSON: an object per device (`device`, `ok`, `pid`, `paused_ms` or `error`).
    #[arg(long)]
    pub json: bool,
}

/// Runs `upgrade`.
pub fn run(a: UpgradeArgs) -> anyhow::Result<()> {
    let devs: Vec<DeviceState> = if a.all {
        DeviceState::all()
            .into_iter()
            .filter(super::daemon::alive)
            .collect()
    } else {
        let id = a.id.unwrap_or(0);
        let d = super::device::state(id)?;
        if !super::daemon::alive(&d) {
            bail!(
                "/dev/ublkb{id} has no running daemon ({}): `srp-ublk recover -n {id}` starts one \
                 from the installed binary",
                super::daemon::describe(&d)
            );
        }
        vec![d]
    };
    let mut report = super::report::Report::new(a.json);
    // one signal per daemon: a target port's daemon moves all its devices at once
    for group in super::recover::by_daemon(devs) {
        match upgrade_daemon(&group, Duration::from_secs(a.timeout)) {
            Ok(took) => {
                for d in &group {
                    report.done(
                        &d.bdev,
                        format!(
                            "{}: daemon pid {} runs the installed binary again; serving {took:.1?} \
                             after the signal (I/O paused at most that long)",
                            d.bdev, d.pid
                        ),
                        json!({"pid": d.pid, "paused_ms": took.as_millis() as u64}),
                    )
                }
            }
            Err(e) => {
                let names = super::handover::names(&group);
                report.failed(&names, e.context(format!("upgrading {names}")))
            }
        }
    }
    report.finish("upgraded")
}

/// Signals the daemon that serves `devs` (one device, or a target port's) to re-execute, and
/// waits until a new image serves every one of them; returns how long that took.
fn upgrade_daemon(devs: &[DeviceState], timeout: Duration) -> anyhow::Result<Duration> {
    let Some(d) = devs.first() else {
        return Ok(Duration::ZERO);
    };
    if d.rdma_device.is_empty() {
        bail!("a demo backend has nothing to carry across a new image: delete and add it");
    }
    let t = Instant::now();
    super::daemon::signal(d, SIGUSR2)?;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        if devs.iter().all(served_by_a_new_image) {
            return Ok(t.elapsed());
        }
        if t.elapsed() > timeout {
            bail!(
                "no new image served the device within {timeout:?}; see the daemon log {}",
                d.log
            );
        }
    }
}

/// Whether a new image of its daemon serves device `d` (`d` as it was before the signal): its
/// state file rewritten by a live daemon, or gone (the device was deleted meanwhile).
fn served_by_a_new_image(d: &DeviceState) -> bool {
    match DeviceState::read(&DeviceState::path(d.dev_id)) {
        Ok(now) => now.image_started > d.image_started && super::daemon::alive(&now),
        Err(_) => !DeviceState::path(d.dev_id).exists(),
    }
}
