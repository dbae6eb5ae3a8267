//! The runtime state of a served export (`srp-ublk serve`: NBD or vhost-user-blk), as JSON under
//! `/run/srp-ublk/exports/PID.json`: what `list`, `stats` and the Prometheus file show of it.
//! Written by the server once it listens, refreshed with live counters every 2 s, removed when it
//! stops; a file whose server died is replaced by the next server on the same socket.

use super::state::{process, read_all, run_dir, write_json, Daemon, QueueState};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A served export.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ExportState {
    /// The export's name (`--name`, or its export file's).
    pub name: String,
    /// `nbd` or `vhost-user-blk`.
    pub kind: String,
    /// Where it listens: `unix:PATH` or `tcp:ADDRESS:PORT` (NBD), the socket's path (vhost-user-blk).
    pub listen: String,
    /// The server's pid.
    pub pid: u32,
    /// The server's start time (clock ticks after boot): a process that got the pid later has
    /// another.
    pub pid_start: Option<u64>,
    /// When the server last wrote the counters (ms since the epoch).
    pub updated_ms: u64,
    /// The normalized target string (or the demo backend).
    pub target: String,
    /// The LUN served.
    pub lun: u64,
    /// Bytes.
    pub size: u64,
    /// Logical block size.
    pub block_size: u32,
    /// Served read-only.
    pub read_only: bool,
    /// INQUIRY vendor.
    pub vendor: String,
    /// INQUIRY product.
    pub product: String,
    /// The LUN's WWID, when it has one.
    pub wwid: Option<String>,
    /// The RDMA device the channels use.
    pub rdma_device: String,
    /// Commands each channel keeps out at most.
    pub depth: u16,
    /// The srp-ublk version that serves it.
    pub version: String,
    /// The systemd service it runs in, if any.
    pub unit: Option<String>,
    /// Clients connected now.
    pub connections: u64,
    /// Clients that connected since the server started.
    pub connections_total: u64,
    /// Clients served at once, at most.
    pub max_connections: u32,
    /// Its channels (NBD: one per connection served at once) or virtqueues (vhost-user-blk).
    pub queues: Vec<QueueState>,
    /// What the server registered with its RDMA devices.
    pub memory: Option<crate::rdma::mem::MemCounts>,
    /// When this image of the server started (ms since the epoch): `srp-ublk upgrade` waits for
    /// a later one.
    #[serde(default)]
    pub image_started: u64,
    /// Capacity checks done (vhost-user-blk; `srp-ublk resize --export` waits for this or the
    /// failures to move).
    #[serde(default)]
    pub capacity_checks: u64,
    /// Capacity checks that failed (the server's log says why).
    #[serde(default)]
    pub capacity_check_failures: u64,
}

impl ExportState {
    /// Where exports' state files live.
    pub fn dir() -> PathBuf {
        run_dir().join("exports")
    }

    /// The state file of the export server `pid`.
    pub fn path(pid: u32) -> PathBuf {
        Self::dir().join(format!("{pid}.json"))
    }

    /// Writes the state file atomically (see [`write_json`]).
    pub fn write(&self) -> std::io::Result<()> {
        write_json(&Self::path(self.pid), self)
    }

    /// Reads a state file.
    pub fn read(path: &Path) -> std::io::Result<ExportState> {
        super::state::read_json(path)
    }

    /// Every export with a state file, by name.
    pub fn all() -> Vec<ExportState> {
        Self::all_in(&Self::dir())
    }

    fn all_in(dir: &Path) -> Vec<ExportState> {
        let mut v: Vec<ExportState> = read_all(dir);
        v.sort_by(|a, b| (&a.name, a.pid).cmp(&(&b.name, b.pid)));
        v
    }

    /// Whether its server still runs.
    pub fn alive(&self) -> bool {
        process(self.pid, self.pid_start) == Daemon::Alive
    }

    /// Removes the state files of servers that died listening where `listen` is (this server
    /// replaces them).
    pub fn forget_dead(listen: &str) {
        Self::forget_dead_in(&Self::dir(), listen);
    }

    fn forget_dead_in(dir: &Path, listen: &str) {
        for e in Self::all_in(dir) {
            if e.listen == listen && !e.alive() {
                let _ = std::fs::remove_file(dir.join(format!("{}.json", e.pid)));
            }
        }
    }

    /// Removes this server's state file.
    pub fn remove(pid: u32) {
        let _ = std::fs::remove_file(Self::path(pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_servers_file_is_forgotten_by_the_next_on_its_socket_only() {
        let dir = std::env::temp_dir().join(format!("srp-ublk-exports-{}", std::process::id()));
        // pid 1 with another start time than init's: not the server any more
        let dead = |listen: &str, name: &str| ExportState {
            name: name.into(),
            listen: listen.into(),
            pid: 1,
            pid_start: Some(u64::MAX),
            ..Default::default()
        };
        let (a, b) = (dead("unix:/a", "a"), dead("unix:/b", "b"));
        assert!(!a.alive());
        write_json(&dir.join("1.json"), &a).unwrap();
        write_json(&dir.join("2.json"), &ExportState { pid: 2, ..b }).unwrap();
        ExportState::forget_dead_in(&dir, "unix:/a");
        let left: Vec<String> = ExportState::all_in(&dir)
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(left, vec!["b"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
