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

/// Whether the target string `text` (a state file's) names a target a login to `target` would
/// share the I_T nexus with.
fn on_nexus(text: &str, target: &TargetSpec) -> bool {
    TargetSpec::parse(text).is_ok_and(|t| t.same_nexus(target))
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
    /// Times a command waited for a free send slot.
    #[serde(default)]
    pub slot_stalls: u64,
    /// Times a command waited for room in the queue's buffers (its pool or staging buffers).
    #[serde(default)]
    pub buffer_stalls: u64,
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
    /// Commands aborted after timing out.
    #[serde(default)]
    pub aborts: u64,
    /// Operations, bytes, errors and latencies since the queue started.
    #[serde(default)]
    pub io: crate::stats::IoCounters,
    /// vhost-user-blk: data bytes the target moved straight to or from guest memory.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub zero_copy_bytes: u64,
    /// vhost-user-blk: data bytes copied through the queue's buffers.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub copied_bytes: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
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
    /// The daemon's start time (clock ticks after boot, `/proc/PID/stat` field 22): a process that
    /// got the pid after the daemon died has another. Absent in files of older versions.
    #[serde(default)]
    pub pid_start: Option<u64>,
    /// When the daemon last wrote the counters (ms since the epoch): `stats` measures rates between
    /// two such times.
    #[serde(default)]
    pub updated_ms: u64,
    /// When the daemon's current image started serving (ms since the epoch): `upgrade` waits for
    /// it to move.
    #[serde(default)]
    pub image_started: u64,
    /// Who attached the device: the targets.d name `up` brought it up for; `None` for a manual `add`.
    #[serde(default)]
    pub owner: Option<String>,
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
    /// The CPUs `--cpus` pinned the queue threads to (empty: the default placement), for the
    /// daemon's next image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpus: Vec<usize>,
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
    /// The largest I/O the device was made with (its ublk buffer size per tag), for the record and
    /// for older versions' takeovers; a recovery takes the size from the kernel's device.
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
    /// What the daemon has registered with its RDMA devices (protection domains, data buffer
    /// registrations, pinned bytes); absent in files of older versions.
    #[serde(default)]
    pub memory: Option<crate::rdma::mem::MemCounts>,
    /// The serving daemon's version and commit (`srp-ublk -V`); absent in files of older
    /// versions.
    #[serde(default)]
    pub version: Option<String>,
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

    /// Writes the state file atomically, 0600, through a new file: never through a link someone
    /// left at the path.
    pub fn write(&self) -> std::io::Result<()> {
        write_json(&Self::path(self.dev_id), self)
    }

    /// Reads one state file.
    pub fn read(path: &Path) -> std::io::Result<DeviceState> {
        read_json(path)
    }

    /// Every device with a state file, sorted by id.
    pub fn all() -> Vec<DeviceState> {
        let mut v: Vec<DeviceState> = read_all(&run_dir());
        v.sort_by_key(|d| d.dev_id);
        v
    }

    /// Every device whose target a login to `target` would share the I_T nexus with (its other
    /// LUNs included), sorted by id.
    pub fn of_nexus(target: &TargetSpec) -> Vec<DeviceState> {
        Self::all()
            .into_iter()
            .filter(|d| on_nexus(&d.target, target))
            .collect()
    }

    /// Whether a live daemon other than this process serves a device, or an export (NBD,
    /// vhost-user-blk), whose target a login to `target` would share the I_T nexus with: a login
    /// that ends the nexus's other channels (SINGLE) would end that daemon's.
    pub fn nexus_shared(target: &TargetSpec) -> bool {
        let me = std::process::id();
        Self::of_nexus(target)
            .iter()
            .any(|d| d.pid != me && d.daemon_alive())
            || super::exports::ExportState::all()
                .iter()
                .any(|e| e.pid != me && on_nexus(&e.target, target) && e.alive())
    }

    /// Whether the process `pid` names is this device's srp-ublk daemon, by what `/proc` says of it
    /// (the kernel's own record of the ublk server is the caller's to check).
    pub fn daemon(&self) -> Daemon {
        process(self.pid, self.pid_start)
    }

    /// The LUN this device serves.
    pub fn identity(&self) -> LunIdentity {
        LunIdentity {
            wwid: self.wwid.clone(),
            serial: self.serial.clone(),
            size: self.size,
            block_size: self.block_size,
        }
    }

    /// Checks that `now` (a fresh login's view) is the LUN this device served
    /// ([`LunIdentity::check`]).
    pub fn same_lun(&self, now: &DeviceState) -> Result<(), LunChanged> {
        self.identity().check(&now.identity())
    }

    /// Whether the serving daemon is alive ([`DeviceState::daemon`]).
    pub fn daemon_alive(&self) -> bool {
        self.daemon() == Daemon::Alive
    }

    /// Removes the state file.
    pub fn remove(dev_id: u32) {
        let _ = std::fs::remove_file(Self::path(dev_id));
    }
}

/// Reads a JSON state file.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> std::io::Result<T> {
    let b = std::fs::read(path)?;
    serde_json::from_slice(&b).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Every `*.json` file in `dir` that reads as a `T` (others are passed over).
pub fn read_all<T: serde::de::DeserializeOwned>(dir: &Path) -> Vec<T> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| read_json(&e.path()).ok())
        .collect()
}

/// Writes `value` as JSON to `path` atomically, 0600, through a new file: never through a link
/// someone left at the path.
pub fn write_json(path: &Path, value: &impl Serialize) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = create_new(&tmp, 0o600)?;
    f.write_all(&serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?)?;
    drop(f);
    std::fs::rename(tmp, path)
}

/// Whether process `pid`, started at `pid_start` (clock ticks after boot; `None` in older state
/// files), is still the srp-ublk process a state file names, by what `/proc` says of it.
pub fn process(pid: u32, pid_start: Option<u64>) -> Daemon {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
    let Some(st) = stat.ok().and_then(|s| ProcStat::parse(&s)) else {
        return Daemon::Gone;
    };
    // a zombie (killed, not yet reaped by its parent: `up --supervise` is one) is dead too
    if st.state == 'Z' || st.state == 'X' {
        return Daemon::Gone;
    }
    match pid_start {
        Some(t) if t != st.start => {
            return Daemon::Other(format!(
                "pid {pid} started at tick {}, the daemon at {t}: the pid was reused",
                st.start
            ))
        }
        Some(_) => {}
        // an older file: the process name at least
        None if st.comm != "srp-ublk" => {
            return Daemon::Other(format!("pid {pid} is '{}', not srp-ublk", st.comm))
        }
        None => {}
    }
    match std::fs::read_link(format!("/proc/{pid}/exe")) {
        Ok(exe) if !is_srp_ublk(&exe) => {
            Daemon::Other(format!("pid {pid} runs {}, not srp-ublk", exe.display()))
        }
        _ => Daemon::Alive,
    }
}

/// Creates a file that did not exist, with `mode`, for appending: `O_EXCL` never follows a link at
/// the path.
pub fn create_new(path: &Path, mode: u32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// What tells one LUN from another, as a device's state file and a fresh login see it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LunIdentity {
    /// The scsi_id-style identifier (VPD 0x83).
    pub wwid: Option<String>,
    /// VPD 0x80.
    pub serial: Option<String>,
    /// Bytes.
    pub size: u64,
    /// Logical block size.
    pub block_size: u32,
}

impl LunIdentity {
    /// Checks that `now` is this LUN: the same WWID (or, without one, serial), size and logical
    /// block size.
    pub fn check(&self, now: &LunIdentity) -> Result<(), LunChanged> {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".into());
        let differ = |what, was: String, now: String| {
            if was == now {
                Ok(())
            } else {
                Err(LunChanged { what, was, now })
            }
        };
        if self.wwid.is_some() {
            differ("WWID", show(&self.wwid), show(&now.wwid))?;
        } else if self.serial.is_some() {
            differ("serial", show(&self.serial), show(&now.serial))?;
        }
        differ(
            "size",
            format!("{} bytes", self.size),
            format!("{} bytes", now.size),
        )?;
        differ(
            "logical block size",
            self.block_size.to_string(),
            now.block_size.to_string(),
        )
    }
}

/// The LUN a login found is not the one a device served.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("its {what} was {was}, the LUN's is now {now}")]
pub struct LunChanged {
    /// What differs: WWID, serial, size or logical block size.
    pub what: &'static str,
    /// The device's.
    pub was: String,
    /// The LUN's now.
    pub now: String,
}

/// What a state file's pid is now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Daemon {
    /// The device's daemon, running.
    Alive,
    /// No such process, or a zombie.
    Gone,
    /// Another process has the pid (the text says how it differs): never signalled, and the device
    /// counts as having lost its daemon.
    Other(String),
}

/// The fields of a `/proc/PID/stat` line that identify a process.
#[derive(Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// The command name (may hold spaces and ')').
    pub comm: String,
    /// The state letter.
    pub state: char,
    /// Start time in clock ticks after boot (field 22).
    pub start: u64,
}

impl ProcStat {
    /// Parses "123 (comm) S ppid ...": comm runs to the last ')'.
    pub fn parse(stat: &str) -> Option<ProcStat> {
        let (head, rest) = stat.rsplit_once(") ")?;
        let comm = head.split_once(" (")?.1.to_string();
        let mut f = rest.split_ascii_whitespace();
        let state = f.next()?.chars().next()?;
        // rest starts at field 3 (state); start time is field 22
        let start = f.nth(18)?.parse().ok()?;
        Some(ProcStat { comm, state, start })
    }

    /// This process's own.
    pub fn own() -> Option<ProcStat> {
        ProcStat::parse(&std::fs::read_to_string("/proc/self/stat").ok()?)
    }
}

/// Whether an executable's path is an srp-ublk binary (also once replaced on disk: " (deleted)").
fn is_srp_ublk(exe: &Path) -> bool {
    exe.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("srp-ublk"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAIL: &str = "1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 123456 2000000 300";

    #[test]
    fn proc_stat_after_the_last_paren() {
        let st = ProcStat::parse(&format!("42 (srp-ublk) S {TAIL}")).unwrap();
        assert_eq!(
            (st.comm.as_str(), st.state, st.start),
            ("srp-ublk", 'S', 123456)
        );
        let st = ProcStat::parse(&format!("42 (a) b) Z {TAIL}")).unwrap();
        assert_eq!((st.comm.as_str(), st.state), ("a) b", 'Z'));
        assert_eq!(ProcStat::parse("garbage"), None);
        assert_eq!(ProcStat::parse("42 (x) S 1 2"), None);
    }

    #[test]
    fn a_process_that_is_not_the_daemon_is_never_believed_alive() {
        let me = ProcStat::own().unwrap();
        let mut d = DeviceState {
            pid: std::process::id(),
            pid_start: Some(me.start + 1),
            ..Default::default()
        };
        // the pid was reused: another start time
        assert!(
            matches!(d.daemon(), Daemon::Other(ref w) if w.contains("reused")),
            "{:?}",
            d.daemon()
        );
        // the right start time, but this test binary is not srp-ublk
        d.pid_start = Some(me.start);
        assert!(
            matches!(d.daemon(), Daemon::Other(ref w) if w.contains("not srp-ublk")),
            "{:?}",
            d.daemon()
        );
        // an older file without a start time: the name decides
        d.pid_start = None;
        assert!(matches!(d.daemon(), Daemon::Other(_)));
        assert!(!d.daemon_alive());
        d.pid = u32::MAX >> 10; // no such process
        assert_eq!(d.daemon(), Daemon::Gone);
        assert!(is_srp_ublk(Path::new("/usr/sbin/srp-ublk (deleted)")));
        assert!(!is_srp_ublk(Path::new("/usr/bin/sleep")));
    }

    #[test]
    fn a_lun_with_another_identity_is_not_the_device_s() {
        let was = DeviceState {
            wwid: Some("naa.6001405abc".into()),
            serial: Some("s1".into()),
            size: 32 << 20,
            block_size: 512,
            ..Default::default()
        };
        assert_eq!(was.same_lun(&was.clone()), Ok(()));
        let e = was
            .same_lun(&DeviceState {
                wwid: Some("naa.6001405def".into()),
                ..was.clone()
            })
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "its WWID was naa.6001405abc, the LUN's is now naa.6001405def"
        );
        let e = was
            .same_lun(&DeviceState {
                size: 16 << 20,
                ..was.clone()
            })
            .unwrap_err();
        assert_eq!(e.what, "size");
        let e = was
            .same_lun(&DeviceState {
                block_size: 4096,
                ..was.clone()
            })
            .unwrap_err();
        assert_eq!(e.what, "logical block size");
        let no_wwid = DeviceState {
            wwid: None,
            ..was.clone()
        };
        let e = no_wwid
            .same_lun(&DeviceState {
                wwid: None,
                serial: Some("s2".into()),
                ..was.clone()
            })
            .unwrap_err();
        assert_eq!(e.what, "serial");
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
    fn a_queue_recorded_before_slot_stalls_reads_as_none() {
        // what a daemon from before the counter wrote for a queue
        let q: QueueState = serde_json::from_str(
            r#"{"qid": 1, "tid": 7, "req_lim_login": 128, "req_lim": 120, "cmds": 9,
                "credit_stalls": 3, "state": "running"}"#,
        )
        .unwrap();
        assert_eq!((q.qid, q.credit_stalls, q.slot_stalls), (1, 3, 0));
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
        // a link left at the temporary path is replaced, not followed
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("ublkb3.json.tmp")).unwrap();
        s.write().unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(DeviceState::path(3))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_file(&victim).unwrap();
        assert_eq!(DeviceState::all(), vec![s.clone()]);
        DeviceState::remove(3);
        assert!(DeviceState::all().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
        std::env::remove_var("SRP_UBLK_RUN_DIR");
    }
}
