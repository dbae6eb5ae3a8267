//! `srp-ublk upgrade`: have running daemons re-execute the installed binary, keeping their devices
//! (same pid; ublk user recovery carries the I/O across), after a package upgrade replaced the file.
//! The daemon, on SIGUSR2, replaces its image with `add --recover` of its own device from the path it
//! was started from; the new image logs in and takes the device over as `recover` does. Applications
//! see a pause, no error.
//!
//! A vhost-user-blk export's server does the same with its own arguments (`--export NAME`, and
//! with `--all`): its VMM reconnects to the new image and gives it QEMU's inflight region, so the
//! requests the old image took and did not answer are taken again. An NBD export is left to its
//! unit's restart (a kernel NBD client does not reconnect).

use anyhow::bail;
use clap::Args;
use nix::sys::signal::Signal::SIGUSR2;
use serde_json::json;
use srp_ublk::session::exports::ExportState;
use srp_ublk::session::state::DeviceState;
use std::time::{Duration, Instant};

/// `srp-ublk upgrade ...`
#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// The device: N, /dev/ublkbN or a path that leads to it (/dev/disk/by-id/...).
    #[arg(short = 'n', long = "number", value_name = "DEVICE", value_parser = super::device::parse,
          required_unless_present_any = ["all", "export"])]
    pub id: Option<u32>,
    /// A vhost-user-blk export instead (`srp-ublk serve`'s --name, as `srp-ublk list` shows it).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["id", "all"])]
    pub export: Option<String>,
    /// Every srp-ublk device with a running daemon, and every vhost-user-blk export.
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
    let exports = exports(&a)?;
    let devs: Vec<DeviceState> = if a.export.is_some() {
        Vec::new()
    } else if a.all {
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
    for e in exports {
        let what = format!("export {}", e.name);
        match upgrade_export(&e, Duration::from_secs(a.timeout)) {
            Ok(took) => report.done(
                &what,
                format!(
                    "{what}: server pid {} runs the installed binary again; serving {took:.1?} \
                     after the signal (its VMM reconnects)",
                    e.pid
                ),
                json!({"pid": e.pid, "paused_ms": took.as_millis() as u64}),
            ),
            Err(err) => report.failed(&what, err.context(format!("upgrading {what}"))),
        }
    }
    report.finish("upgraded")
}

/// The exports to upgrade: `--export NAME`'s, or with `--all` every running vhost-user-blk one (an
/// NBD export's kernel clients would not reconnect: it is named, and left to its unit's restart).
fn exports(a: &UpgradeArgs) -> anyhow::Result<Vec<ExportState>> {
    if let Some(name) = &a.export {
        let found = super::exported::running_named(name)?;
        if let Some(e) = found.iter().find(|e| e.kind != "vhost-user-blk") {
            bail!(
                "export '{name}' is {}: its clients would lose their connection; restart it \
                 (`systemctl restart srp-ublk-serve@{name}`) when they can reconnect",
                e.kind
            );
        }
        return Ok(found);
    }
    if !a.all {
        return Ok(Vec::new());
    }
    let live = ExportState::all().into_iter().filter(ExportState::alive);
    let (vhost, other): (Vec<_>, Vec<_>) = live.partition(|e| e.kind == "vhost-user-blk");
    for e in other {
        eprintln!(
            "export {} ({}) is left as it is: restart it (`systemctl restart \
             srp-ublk-serve@{}`) when its clients can reconnect",
            e.name, e.kind, e.name
        );
    }
    Ok(vhost)
}

/// Signals export `e`'s server to re-execute and waits until its new image serves; returns how
/// long that took.
fn upgrade_export(e: &ExportState, timeout: Duration) -> anyhow::Result<Duration> {
    if !e.alive() {
        bail!("its server (pid {}) is gone", e.pid);
    }
    let t = Instant::now();
    let pid = nix::unistd::Pid::from_raw(e.pid as i32);
    nix::sys::signal::kill(pid, SIGUSR2)?;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = ExportState::read(&ExportState::path(e.pid));
        if now.is_ok_and(|n| n.image_started > e.image_started && n.alive()) {
            return Ok(t.elapsed());
        }
        if t.elapsed() > timeout {
            bail!(
                "no new image served the export within {timeout:?}; see its server's log \
                 (`journalctl -u {}`)",
                e.unit.as_deref().unwrap_or("its unit")
            );
        }
    }
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
