//! The device a command acts on (`-n/--number DEVICE` of every command that takes one), named the
//! way an administrator has it at hand: its number (`3`), its node (`/dev/ublkb3` or `ublkb3`), or
//! any path that resolves to the node (`/dev/disk/by-id/wwn-0x...`, `/dev/disk/by-path/srp-...`).

use std::path::{Path, PathBuf};

/// ublk_drv's device numbers: 0 to 2^20 - 1 (its minors).
const UBLK_MAX_DEVICES: u32 = 1 << 20;

/// Why a device argument names no ublk device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceNameError {
    /// A number beyond what ublk_drv allocates.
    #[error("{0} is not a ublk device number (0 to {max})", max = UBLK_MAX_DEVICES - 1)]
    OutOfRange(u64),
    /// A path that does not exist.
    #[error("{0}: no such device (give N, /dev/ublkbN or a /dev/disk/by-id path; `srp-ublk list` shows the devices)")]
    Missing(PathBuf),
    /// A path that is something other than a ublk block device.
    #[error("{0} is not an srp-ublk device (/dev/ublkbN)")]
    NotUblk(PathBuf),
    /// A path that leads (through links) to something other than a ublk block device.
    #[error("{given} leads to {resolved}, which is not an srp-ublk device (/dev/ublkbN)")]
    LeadsElsewhere {
        /// The path as given.
        given: PathBuf,
        /// Where it leads.
        resolved: PathBuf,
    },
}

/// The device number of `N`, `ublkbN` or `/dev/ublkbN`, when `s` is one of those.
fn number_of(s: &str) -> Option<Result<u32, DeviceNameError>> {
    let digits = s
        .strip_prefix("/dev/ublkb")
        .or_else(|| s.strip_prefix("ublkb"))
        .unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(match digits.parse::<u64>() {
        Ok(n) if n < u64::from(UBLK_MAX_DEVICES) => Ok(n as u32),
        Ok(n) => Err(DeviceNameError::OutOfRange(n)),
        Err(_) => Err(DeviceNameError::OutOfRange(u64::MAX)),
    })
}

/// Parses a device argument (clap's value parser for `-n/--number`): the number of the ublk device
/// it names. A path other than /dev/ublkbN is followed through its symlinks.
pub fn parse(s: &str) -> Result<u32, DeviceNameError> {
    if let Some(n) = number_of(s) {
        return n;
    }
    let given = Path::new(s);
    let resolved = given
        .canonicalize()
        .map_err(|_| DeviceNameError::Missing(given.to_path_buf()))?;
    match resolved.to_str().and_then(number_of) {
        Some(n) if resolved.starts_with("/dev") => n,
        _ if resolved == given => Err(DeviceNameError::NotUblk(resolved)),
        _ => Err(DeviceNameError::LeadsElsewhere {
            given: given.to_path_buf(),
            resolved,
        }),
    }
}

/// The state file of srp-ublk device `id`; a failure with exit status 4 (not found) naming the
/// device when it has none.
pub fn state(id: u32) -> anyhow::Result<srp_ublk::session::state::DeviceState> {
    use srp_ublk::session::state::DeviceState;
    let path = DeviceState::path(id);
    DeviceState::read(&path).map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::NotFound => format!("no {}", path.display()),
            _ => format!("{}: {e}", path.display()),
        };
        super::status::failed(
            super::status::Exit::NotFound,
            format!("no srp-ublk device /dev/ublkb{id} ({why}; see `srp-ublk list`)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_nodes_name_their_device() {
        assert_eq!(parse("3").unwrap(), 3);
        assert_eq!(parse("ublkb12").unwrap(), 12);
        assert_eq!(parse("/dev/ublkb0").unwrap(), 0);
        assert_eq!(parse("1048575").unwrap(), 1_048_575);
    }

    #[test]
    fn what_names_no_ublk_device_says_why() {
        let e = parse("1048576").unwrap_err().to_string();
        assert_eq!(e, "1048576 is not a ublk device number (0 to 1048575)");
        assert!(parse("99999999999999999999999").is_err());
        let e = parse("/dev/disk/by-id/no-such-disk")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/dev/disk/by-id/no-such-disk: no such device"),
            "{e}"
        );
        // a path that exists but is no ublk device: named, with where it leads
        let e = parse("/proc/self/..").unwrap_err().to_string();
        assert_eq!(
            e,
            "/proc/self/.. leads to /proc, which is not an srp-ublk device (/dev/ublkbN)"
        );
        let e = parse("/dev/null").unwrap_err().to_string();
        assert_eq!(e, "/dev/null is not an srp-ublk device (/dev/ublkbN)");
    }

    #[test]
    fn a_symlink_is_followed_to_what_it_leads_to() {
        let dir = std::env::temp_dir().join(format!("srp-ublk-device-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // followed to where it leads (a link to an existing /dev/ublkbN is tested in the lab:
        // systemd suite 50, through udev's by-id link)
        let link = dir.join("wwn-0x6001405");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        let e = parse(link.to_str().unwrap()).unwrap_err().to_string();
        assert!(
            e.ends_with("leads to /dev/null, which is not an srp-ublk device (/dev/ublkbN)"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
