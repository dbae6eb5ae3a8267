//! `srp-ublk resize`: have a device's daemon re-read its LUN's capacity now and resize the device to
//! it -- what `echo 1 > /sys/class/scsi_device/H:C:T:L/device/rescan` does for an ib_srp disk, for
//! a LUN grown on the target when the target sends no CAPACITY DATA HAS CHANGED (the daemon checks
//! by itself when it does).

use anyhow::{bail, Context};
use clap::Args;
use srp_ublk::session::state::DeviceState;
use std::time::{Duration, Instant};

/// `srp-ublk resize ...`
#[derive(Debug, Args)]
pub struct ResizeArgs {
    /// The device: N, /dev/ublkbN or a path that leads to it (/dev/disk/by-id/...).
    #[arg(short = 'n', long = "number", value_name = "DEVICE", value_parser = super::device::parse)]
    pub id: u32,
    /// Seconds to wait for the daemon's answer.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Report as JSON (`device`, `size_before`, `size`).
    #[arg(long)]
    pub json: bool,
}

/// Runs `resize`.
pub fn run(a: ResizeArgs) -> anyhow::Result<()> {
    let id = a.id;
    let path = DeviceState::path(id);
    let before = super::device::state(id)?;
    if before.rdma_device.is_empty() {
        bail!("/dev/ublkb{id} is a demo backend: it has no LUN whose capacity could change");
    }
    if !super::daemon::alive(&before) {
        bail!(
            "/dev/ublkb{id} has no daemon ({}): `srp-ublk recover -n {id}` first",
            super::daemon::describe(&before)
        );
    }
    super::daemon::signal(&before, nix::sys::signal::SIGHUP)
        .with_context(|| format!("signalling the daemon of /dev/ublkb{id}"))?;
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    let after = loop {
        std::thread::sleep(Duration::from_millis(200));
        if let Ok(d) = DeviceState::read(&path) {
            if d.capacity_checks > before.capacity_checks
                || d.capacity_check_failures > before.capacity_check_failures
            {
                break d;
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "the daemon of /dev/ublkb{id} reported no capacity check within {} s; see its log {}",
                a.timeout,
                before.log
            );
        }
    };
    if after.capacity_check_failures > before.capacity_check_failures {
        bail!(
            "the capacity check of /dev/ublkb{id} failed; its log {} says why",
            after.log
        );
    }
    if after.size_pending > 0 {
        bail!(
            "LUN {} now has {} bytes, but this kernel's ublk cannot resize a live device \
             (UPDATE_SIZE, Linux 6.16): /dev/ublkb{id} stays at {} bytes; `srp-ublk del -n {id}` \
             and `add` it again for the new size",
            after.lun,
            after.size_pending,
            after.size
        );
    }
    if a.json {
        let j = serde_json::json!({
            "device": format!("/dev/ublkb{id}"), "size_before": before.size, "size": after.size,
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else if after.size == before.size {
        println!("/dev/ublkb{id}: capacity unchanged, {} bytes", after.size);
    } else {
        println!(
            "/dev/ublkb{id}: resized from {} to {} bytes",
            before.size, after.size
        );
    }
    Ok(())
}
