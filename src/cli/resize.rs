//! `srp-ublk resize`: have a device's daemon (or a vhost-user-blk export's server) re-read its
//! LUN's capacity now and resize the device to it -- what `echo 1 >
//! /sys/class/scsi_device/H:C:T:L/device/rescan` does for an ib_srp disk, for a LUN grown on the
//! target when the target sends no CAPACITY DATA HAS CHANGED (the daemon checks by itself when it
//! does). An export's VMM is told, and its guest sees the new size.

use anyhow::{bail, Context};
use clap::Args;
use srp_ublk::session::exports::ExportState;
use srp_ublk::session::state::DeviceState;
use std::time::{Duration, Instant};

/// `srp-ublk resize ...`
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("what").required(true).args(["id", "export"]))]
pub struct ResizeArgs {
    /// The device: N, /dev/ublkbN or a path that leads to it (/dev/disk/by-id/...).
    #[arg(short = 'n', long = "number", value_name = "DEVICE", value_parser = super::device::parse)]
    pub id: Option<u32>,
    /// A vhost-user-blk export instead (`srp-ublk serve`'s --name, as `srp-ublk list` shows it).
    #[arg(long, value_name = "NAME")]
    pub export: Option<String>,
    /// Seconds to wait for the daemon's answer.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Report as JSON (`device`, `size_before`, `size`).
    #[arg(long)]
    pub json: bool,
}

/// Runs `resize`.
pub fn run(a: ResizeArgs) -> anyhow::Result<()> {
    let Some(id) = a.id else {
        return export(&a, a.export.as_deref().unwrap_or_default());
    };
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
    let checked = |d: &DeviceState| {
        d.capacity_checks > before.capacity_checks
            || d.capacity_check_failures > before.capacity_check_failures
    };
    let Some(after) = await_check(a.timeout, || DeviceState::read(&path).ok().filter(checked))
    else {
        bail!(
            "the daemon of /dev/ublkb{id} reported no capacity check within {} s; see its log {}",
            a.timeout,
            before.log
        );
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

/// `resize --export NAME`: SIGHUP to the export's server, then its state file's capacity counters.
fn export(a: &ResizeArgs, name: &str) -> anyhow::Result<()> {
    let mut found = super::exported::running_named(name)?;
    if found.len() > 1 {
        bail!(
            "{} servers run an export named '{name}': stop all but one",
            found.len()
        );
    }
    let before = found.remove(0);
    if before.kind != "vhost-user-blk" {
        bail!(
            "export '{name}' is {}: an NBD client reads the size when it connects; restart the \
             export (`systemctl restart`) for the LUN's new size",
            before.kind
        );
    }
    let pid = nix::unistd::Pid::from_raw(before.pid as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::SIGHUP)
        .with_context(|| format!("signalling the server of export '{name}' (pid {pid})"))?;
    let checked = |e: &ExportState| {
        e.capacity_checks > before.capacity_checks
            || e.capacity_check_failures > before.capacity_check_failures
    };
    let Some(after) = await_check(a.timeout, || {
        ExportState::read(&ExportState::path(before.pid))
            .ok()
            .filter(checked)
    }) else {
        bail!(
            "the server of export '{name}' (pid {pid}) reported no capacity check within {} s; \
             see its log (`journalctl -u {}`)",
            a.timeout,
            before.unit.as_deref().unwrap_or("its unit")
        );
    };
    if after.capacity_check_failures > before.capacity_check_failures {
        bail!("the capacity check of export '{name}' failed; the server's log says why");
    }
    if a.json {
        let j = serde_json::json!({
            "export": name, "size_before": before.size, "size": after.size,
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else if after.size == before.size {
        println!("export '{name}': capacity unchanged, {} bytes", after.size);
    } else {
        println!(
            "export '{name}': resized from {} to {} bytes; its VMM is told",
            before.size, after.size
        );
    }
    Ok(())
}

/// What `read` gives once it gives anything (the state file after the daemon's check), looked at
/// every 200 ms for `timeout` seconds at most.
fn await_check<T>(timeout: u64, read: impl Fn() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + Duration::from_secs(timeout);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        if let Some(t) = read() {
            return Some(t);
        }
        if Instant::now() >= deadline {
            return None;
        }
    }
}
