//! `srp-ublk udev-id ublkbN`: the udev properties of an srp-ublk device (IMPORT{program} in
//! udev/60-srp-ublk.rules). Prints nothing and exits 1 for a ublk device srp-ublk does not serve.

use anyhow::{bail, Context};
use clap::Args;
use srp_ublk::session::ids::udev_properties;
use srp_ublk::session::state::DeviceState;

/// `srp-ublk udev-id NAME`
#[derive(Debug, Args)]
pub struct UdevIdArgs {
    /// The device: ublkbN, /dev/ublkbN or N.
    pub device: String,
}

/// Runs `udev-id`.
pub fn run(a: UdevIdArgs) -> anyhow::Result<()> {
    let name = a.device.trim_start_matches("/dev/");
    let id: u32 = name
        .strip_prefix("ublkb")
        .unwrap_or(name)
        .parse()
        .with_context(|| format!("'{}': expected ublkbN, /dev/ublkbN or N", a.device))?;
    let path = DeviceState::path(id);
    if !path.exists() {
        bail!(
            "/dev/ublkb{id} is not served by srp-ublk (no {})",
            path.display()
        );
    }
    let d = DeviceState::read(&path).with_context(|| format!("reading {}", path.display()))?;
    for (k, v) in udev_properties(&d) {
        println!("{k}={v}");
    }
    Ok(())
}
