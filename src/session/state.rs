//! The runtime state of a served device, as JSON under `/run/srp-ublk/`: what `list` shows and what
//! `del` (and later `recover`) need. Written by the daemon when the device goes live, refreshed with
//! live counters while it runs, removed when it stops.

use crate::wire::target::TargetSpec;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where state files live (`SRP_UBLK_RUN_DIR` overrides it, for tests).
pub fn run_dir() -> PathBuf {
    std::env::var_os("SRP_UBLK_RUN_DIR")
        .map_or_else(|| PathBuf::from("/run/srp-ublk"), PathBuf::from)
}

/// One queue's channel.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct QueueState {
    /// Queue id.
    pub qid: u16,
    /// The queue thread's tid.
    pub tid: i32,
    /// Credits granted at login.
    pub req_lim_login: i32,
    /// Credits now.
    pub req_lim: i32,
    /// SRP_CMDs sent.
    pub cmds: u64,
    /// Times a command waited for credits.
    pub credit_stalls: u64,
    /// running, blocked, fail-fast or lost (ib_srp's rport states).
    pub state: String,
    /// Reconnects that succeeded.
    #[serde(default)]
    pub reconnects: u64,
    /// REPORTED LUNS DATA HAS CHANGED unit attentions seen.
    #[serde(default)]
    pub luns_changed: u64,
    /// CAPACITY DATA HAS CHANGED unit attentions seen.
    #[serde(default)]
    pub capacity_changed: u64,
}

/// A served device.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DeviceState {
    /// ublk device id.
    pub dev_id: u32,
    /// `/dev/ublkbN`.
    pub bdev: String,
    /// The serving daemon's pid.
    pub pid: u32,
    /// The normalized target string.
    pub target: String,
    /// The LUN.
    pub lun: u64,
    /// Size in bytes.
    pub size: u64,
    /// Logical block size.
    pub block_size: u32,
    /// The LUN is write-protected (MODE SENSE WP): the device is read-only.
    #[serde(default)]
    pub read_only: bool,
    /// Queue depth.
    pub depth: u16,
    /// Completion mode.
    pub poll: String,
    /// reconnect_delay, fast_io_fail_tmo, dev_loss_tmo.
    #[serde(default)]
    pub timers: Option<crate::session::timers::Timers>,
    /// INQUIRY vendor / product.
    pub vendor: String,
    /// INQUIRY product.
    pub product: String,
    /// VPD 0x80.
    pub serial: Option<String>,
    /// The scsi_id-style identifier (ID_SERIAL, multipath WWID).
    pub wwid: Option<String>,
    /// The RDMA device the channels use.
    pub rdma_device: String,
    /// The daemon's log file.
    pub log: String,
    /// The systemd unit whose cgroup the daemon runs in (e.g. `srp-ublk@lab.service`), if any.
    #[serde(default)]
    pub unit: Option<String>,
    /// One entry per queue/channel.
    pub queues: Vec<QueueState>,
    /// The LUN's block mapping: what a daemon taking the device over without a login serves
    /// (after an RDMA device removal); absent in files of older versions.
    #[serde(default)]
    pub geometry: Option<crate::channel::block::Geometry>,
    /// The ublk buffer size per tag (largest I/O), with `geometry`.
    #[serde(default)]
    pub max_io: u32,
    /// A capacity the LUN reported that the device could not take (bytes; 0: none): this kernel's
    /// ublk cannot resize a live device.
    #[serde(default)]
    pub size_pending: u64,
    /// Capacity checks the daemon has done (`srp-ublk resize` waits for this to move).
    #[serde(default)]
    pub capacity_checks: u64,
    /// Capacity checks that failed (the daemon's log says why).
    #[serde(default)]
    pub capacity_check_failures: u64,
}

/// The systemd service a process runs in, from its `/proc/PID/cgroup` text: the last path component
/// ending in `.service` (cgroup v2 `0::/system.slice/system-srp\x2dublk.slice/srp-ublk@lab.service`).
pub fn unit_from_cgroup(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.rsplit_once(':').map(|(_, path)| path))
        .flat_map(|path| path.rsplit('/'))
        .find(|c| c.ends_with(".service"))
        .map(String::from)
}

/// The systemd service this process runs in, if any.
pub fn own_unit() -> Option<String> {
    std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| unit_from_cgroup(&t))
}

impl DeviceState {
    /// The state file of device `dev_id`.
    pub fn path(dev_id: u32) -> PathBuf {
        run_dir().join(format!("ublkb{dev_id}.json"))
    }

    /// Writes the state file atomically.
    pub fn write(&self) -> std::io::Result<()> {
        let dir = run_dir();
        std::fs::create_dir_all(&dir)?;
        let path = Self::path(self.dev_id);
        let tmp = path.with_extension("json.tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(tmp, path)
    }

    /// Reads one state file.
    pub fn read(path: &Path) -> std::io::Result<DeviceState> {
        let b = std::fs::read(path)?;
        serde_json::from_slice(&b)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    /// Every device with a state file, sorted by id.
    pub fn all() -> Vec<DeviceState> {
        let mut v: Vec<DeviceState> = std::fs::read_dir(run_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .filter_map(|e| DeviceState::read(&e.path()).ok())
            .collect();
        v.sort_by_key(|d| d.dev_id);
        v
    }

    /// Every device whose target a login to `target` would share the I_T nexus with (its other
    /// LUNs included), sorted by id.
    pub fn of_nexus(target: &TargetSpec) -> Vec<DeviceState> {
        Self::all()
            .into_iter()
            .filter(|d| TargetSpec::parse(&d.target).is_ok_and(|t| t.same_nexus(target)))
            .collect()
    }

    /// Whether the serving daemon is alive.
    pub fn daemon_alive(&self) -> bool {
        // a zombie (killed, not yet reaped by its parent: `up --supervise` is one) is dead too
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|s| proc_state(&s))
            .is_some_and(|st| st != 'Z' && st != 'X')
    }

    /// Removes the state file.
    pub fn remove(dev_id: u32) {
        let _ = std::fs::remove_file(Self::path(dev_id));
    }
}

/// The state letter of a /proc/PID/stat line ("123 (comm) S ..."; comm may hold spaces and ')').
fn proc_state(stat: &str) -> Option<char> {
    stat.rsplit_once(") ")?.1.chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_state_after_the_last_paren() {
        assert_eq!(proc_state("42 (srp-ublk) S 1 42"), Some('S'));
        assert_eq!(proc_state("42 (a) b) Z 1 42"), Some('Z'));
        assert_eq!(proc_state("garbage"), None);
    }

    #[test]
    fn unit_from_the_cgroup_path() {
        assert_eq!(
            unit_from_cgroup("0::/system.slice/system-srp\\x2dublk.slice/srp-ublk@lab.service\n"),
            Some("srp-ublk@lab.service".into())
        );
        assert_eq!(
            unit_from_cgroup("0::/user.slice/user-0.slice/session-3.scope\n"),
            None
        );
        assert_eq!(unit_from_cgroup("0::/\n"), None);
        assert_eq!(unit_from_cgroup(""), None);
    }

    #[test]
    fn round_trip_through_a_run_dir() {
        let dir = std::env::temp_dir().join(format!("srp-ublk-state-{}", std::process::id()));
        std::env::set_var("SRP_UBLK_RUN_DIR", &dir);
        let s = DeviceState {
            dev_id: 3,
            bdev: "/dev/ublkb3".into(),
            pid: 1,
            target: "t".into(),
            ..Default::default()
        };
        s.write().unwrap();
        assert_eq!(DeviceState::all(), vec![s.clone()]);
        DeviceState::remove(3);
        assert!(DeviceState::all().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
        std::env::remove_var("SRP_UBLK_RUN_DIR");
    }
}
