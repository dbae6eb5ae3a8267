//! Who a state file's pid is: checked against `/proc` ([`DeviceState::daemon`]) and against the
//! kernel's record of the device's ublk server, before any command believes it alive or signals it.

use anyhow::bail;
use nix::sys::signal::Signal;
use srp_ublk::session::state::{Daemon, DeviceState};

/// `d`'s daemon: [`DeviceState::daemon`], and the kernel's `ublksrv_pid` of the device (where the
/// device exists) must be the same pid.
pub(crate) fn daemon_of(d: &DeviceState) -> Daemon {
    let proc = d.daemon();
    if proc != Daemon::Alive {
        return proc;
    }
    if let Some(c) = ctrl(d.dev_id) {
        let k = c.dev_info().ublksrv_pid;
        if k > 0 && k as u32 != d.pid {
            return Daemon::Other(format!(
                "the kernel's ublk server of /dev/ublkb{} is pid {k}, not {}",
                d.dev_id, d.pid
            ));
        }
    }
    Daemon::Alive
}

/// The kernel's control handle of device `id`, if it exists. libublk prints "device reload json
/// failed" on stderr for a device it did not start in this process (its JSON lives with the daemon);
/// the CLI's stderr is the administrator's, so it is pointed at /dev/null for the call. The CLI is
/// single-threaded here: nothing else writes to stderr meanwhile.
pub(crate) fn ctrl(id: u32) -> Option<libublk::ctrl::UblkCtrl> {
    use nix::unistd::{close, dup, dup2};
    use std::os::fd::AsRawFd;
    let null = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .ok();
    let saved = null
        .as_ref()
        .and_then(|n| dup(2).ok().map(|s| (s, dup2(n.as_raw_fd(), 2))));
    let c = libublk::ctrl::UblkCtrl::new_simple(id as i32).ok();
    if let Some((s, _)) = saved {
        let _ = dup2(s, 2);
        let _ = close(s);
    }
    c
}

/// Whether `d`'s daemon runs ([`daemon_of`]).
pub(crate) fn alive(d: &DeviceState) -> bool {
    daemon_of(d) == Daemon::Alive
}

/// What `list` says of the daemon.
pub(crate) fn describe(d: &DeviceState) -> String {
    match daemon_of(d) {
        Daemon::Alive => "running".into(),
        Daemon::Gone => "DAEMON GONE".into(),
        Daemon::Other(why) => format!("DAEMON GONE ({why})"),
    }
}

/// Signals `d`'s daemon, only once it is proven to be that daemon.
pub(crate) fn signal(d: &DeviceState, sig: Signal) -> anyhow::Result<()> {
    match daemon_of(d) {
        Daemon::Alive => {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(d.pid as i32), sig)?;
            Ok(())
        }
        Daemon::Gone => bail!("{}'s daemon (pid {}) is gone", d.bdev, d.pid),
        Daemon::Other(why) => bail!(
            "{}'s daemon is gone and its pid now names another process ({why}): not signalled",
            d.bdev
        ),
    }
}

/// Makes a daemon started by `add`, `up` or `recover` the leader of a session of its own, as
/// daemons are: no controlling terminal, no signal from the terminal that ran `add`, and a
/// scheduler autogroup of its own. In the shell's autogroup its queue threads would share one
/// CPU share with the applications they serve, so the scheduler runs them sooner after each
/// wake-up and each wake-up finds fewer commands (measured in docs/bench/performance-record.md). EPERM means
/// it already leads one: the image an `upgrade` exec'd in place of such a daemon.
pub(crate) fn own_session() {
    match nix::unistd::setsid() {
        Ok(_) | Err(nix::errno::Errno::EPERM) => {}
        Err(e) => tracing::warn!("setsid: {e}: the daemon stays in the session that started it"),
    }
}

/// What a process serving a block device must be to make progress when the kernel writes back
/// through that device under memory pressure (as ublk servers for swap or file systems are told):
/// PR_SET_IO_FLUSHER (its own allocations do not wait for I/O it serves) and out of the OOM
/// killer's reach. Both need CAP_SYS_RESOURCE; without it a warning says what is missing.
pub(crate) fn protect_from_reclaim() {
    if let Err(e) = rustix::process::configure_io_flusher_behavior(true) {
        tracing::warn!("PR_SET_IO_FLUSHER: {e} (needs CAP_SYS_RESOURCE): writeback through this device may deadlock under memory pressure");
    }
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-1000") {
        tracing::warn!("oom_score_adj -1000: {e} (needs CAP_SYS_RESOURCE; the unit sets OOMScoreAdjust=): the OOM killer may pick this daemon");
    }
}
