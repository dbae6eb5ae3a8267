//! An export's state file (`/run/srp-ublk/exports/PID.json`, see [`ExportState`]): written once
//! the server listens, refreshed every 2 s with its connections and its queues' counters, removed
//! when SIGTERM or SIGINT stops the server. And SIGHUP: a capacity check where the export has them
//! (vhost-user-blk; `srp-ublk resize --export`); SIGUSR2: the installed binary re-executed in this
//! process where the export's clients come back to it (vhost-user-blk; `srp-ublk upgrade`).

use anyhow::Context;
use nix::sys::signal::{SigSet, SIGHUP, SIGINT, SIGTERM, SIGUSR2};
use srp_ublk::frontend::capacity::CapacityStatus;
use srp_ublk::frontend::status::ExportStatus;
use srp_ublk::session::exports::ExportState;
use srp_ublk::session::state::{own_unit, ProcStat, QueueState};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

/// The export's capacity checks, which SIGHUP asks for (vhost-user-blk's; none for NBD, whose
/// clients read the size when they connect).
static CAPACITY: OnceLock<Arc<CapacityStatus>> = OnceLock::new();

/// Whether SIGUSR2 re-executes the server ([`upgrade_on_usr2`]).
static UPGRADES: AtomicBool = AtomicBool::new(false);

/// Whether a stop signal is removing the state file: the refresh then writes no more (held while
/// the file is written or removed, so that a write cannot put it back after the removal).
static STOPPING: Mutex<bool> = Mutex::new(false);

fn stopping() -> std::sync::MutexGuard<'static, bool> {
    STOPPING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes SIGTERM and SIGINT remove the export's state file before they end the process as they
/// would have, SIGHUP ask for a capacity check ([`check_capacity_on_hup`]) and SIGUSR2 re-execute
/// the server ([`upgrade_on_usr2`]): blocks them in this thread and every thread it starts
/// afterwards (call it before the server starts any) and waits for them on a thread of its own,
/// from now on (a stop during the login is not held up by it).
pub fn stop_removes_state() -> anyhow::Result<()> {
    let mut stop = SigSet::empty();
    stop.add(SIGTERM);
    stop.add(SIGINT);
    stop.add(SIGHUP);
    stop.add(SIGUSR2);
    stop.thread_block()
        .context("blocking SIGTERM, SIGINT, SIGHUP and SIGUSR2")?;
    let pid = std::process::id();
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            while let Ok(sig) = stop.wait() {
                if sig == SIGHUP {
                    hup();
                    continue;
                }
                if sig == SIGUSR2 {
                    usr2();
                    continue;
                }
                tracing::info!("{sig}: stopping");
                let mut gone = stopping();
                *gone = true;
                ExportState::remove(pid);
                // die of the signal, as a server that never blocked it does
                let mut one = SigSet::empty();
                one.add(sig);
                let _ = one.thread_unblock();
                let _ = nix::sys::signal::raise(sig);
                // still here: the signal is ignored (SIGINT in a shell's background job); the
                // state file comes back with the next refresh
                let _ = one.thread_block();
                *gone = false;
                tracing::info!("{sig} is ignored by this process: serving on");
            }
        });
    if let Err(e) = spawned {
        let _ = stop.thread_unblock();
        tracing::warn!("no thread for SIGTERM: {e}; a stopped server leaves its state file");
    }
    Ok(())
}

/// SIGHUP: a capacity check, where the export has them.
fn hup() {
    match CAPACITY.get() {
        Some(c) => {
            tracing::info!("SIGHUP: checking the LUN's capacity");
            c.check.store(true, Relaxed);
        }
        None => tracing::warn!(
            "SIGHUP: no capacity check: an NBD export has none (a client reads the size when it \
             connects: restart the export for a LUN's new size), a vhost-user-blk one only once \
             it serves"
        ),
    }
}

/// SIGUSR2 (`srp-ublk upgrade`): the installed binary, with this server's arguments, in place of
/// this image (same pid; every descriptor but the standard ones closed with the old image, see
/// [`close_on_exec`]). A vhost-user-blk VMM reconnects to the new image and gives it the inflight
/// region: the requests the old image took and did not answer are taken again. Returns only if
/// that failed.
fn usr2() {
    if !UPGRADES.load(Relaxed) {
        return tracing::warn!(
            "SIGUSR2: not re-executed: an NBD export's kernel clients cannot reconnect (restart \
             it, `systemctl restart`, when its clients can), a vhost-user-blk export is re-executed \
             only once it serves"
        );
    }
    let exe = match super::add::installed_binary() {
        Ok(e) => e,
        Err(e) => return tracing::error!("upgrade refused: {e:#}; this image goes on serving"),
    };
    tracing::warn!(
        "upgrade: the export goes over to the binary at {} (same pid {}); its VMM reconnects",
        exe.display(),
        std::process::id()
    );
    close_on_exec();
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .exec();
    tracing::error!(
        "upgrade refused: exec {}: {err}; this image goes on serving",
        exe.display()
    );
}

/// Marks every descriptor but the standard ones close-on-exec. The vhost crate receives the VMM's
/// descriptors (the guest's memory, the inflight region, the rings' eventfds, the backend channel)
/// without MSG_CMSG_CLOEXEC: a new image would keep them open, the guest's memory with them (still
/// held after the VM is gone) and the old backend channel, which QEMU would not see close.
fn close_on_exec() {
    use nix::fcntl::{fcntl, FcntlArg::F_SETFD, FdFlag};
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return tracing::warn!("/proc/self/fd unreadable: the new image may inherit descriptors");
    };
    let fds = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok());
    for fd in fds.filter(|&fd| fd > 2) {
        // the list's own descriptor among them: marked too, harmless
        let _ = fcntl(fd, F_SETFD(FdFlag::FD_CLOEXEC));
    }
}

/// Has SIGUSR2 re-execute the server: for an export whose clients reconnect and lose nothing
/// (vhost-user-blk with QEMU's inflight region).
pub fn upgrade_on_usr2() {
    UPGRADES.store(true, Relaxed);
}

/// Has SIGHUP ask `capacity` for a check, and the state file show its size and counters.
pub fn check_capacity_on_hup(capacity: Arc<CapacityStatus>) {
    let _ = CAPACITY.set(capacity);
}

/// The running exports named `name` (several servers may run one name on other sockets); none is
/// a not-found error.
pub fn running_named(name: &str) -> anyhow::Result<Vec<ExportState>> {
    let found: Vec<ExportState> = ExportState::all()
        .into_iter()
        .filter(|e| e.name == name && e.alive())
        .collect();
    if found.is_empty() {
        return Err(super::status::not_found(format!(
            "no running srp-ublk export named '{name}' (see `srp-ublk list`)"
        ))
        .into());
    }
    Ok(found)
}

/// What every export's state file starts with: the server, its version and unit, where it
/// listens, and a queue entry per slot of `status`.
pub fn base(name: &str, kind: &str, listen: String, status: &ExportStatus) -> ExportState {
    ExportState {
        name: name.to_string(),
        kind: kind.to_string(),
        listen,
        pid: std::process::id(),
        pid_start: ProcStat::own().map(|p| p.start),
        version: super::VERSION.to_string(),
        unit: own_unit(),
        image_started: now_ms(),
        queues: (0..status.queues.len())
            .map(|q| QueueState {
                qid: q as u16,
                state: "idle".into(),
                ..QueueState::default()
            })
            .collect(),
        ..ExportState::default()
    }
}

/// Writes the export's state file (replacing the files of servers that died on the same socket)
/// and keeps it current ([`stop_removes_state`] removes it).
pub fn publish(mut state: ExportState, status: Arc<ExportStatus>) {
    ExportState::forget_dead(&state.listen);
    refresh(&mut state, &status);
    if let Err(e) = write(&state) {
        tracing::warn!(
            "cannot write {}: {e}; `srp-ublk list` and `stats` will not show this export",
            ExportState::path(state.pid).display()
        );
    }
    let spawned = std::thread::Builder::new()
        .name("state".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_secs(2));
            refresh(&mut state, &status);
            let _ = write(&state);
        });
    if let Err(e) = spawned {
        tracing::warn!("no thread to refresh the export's state file: {e}");
    }
}

/// Writes the state file unless the server is stopping.
fn write(state: &ExportState) -> std::io::Result<()> {
    let gone = stopping();
    if *gone {
        return Ok(());
    }
    state.write()
}

/// The live part of the state: connections, queues, registrations, the time.
fn refresh(state: &mut ExportState, status: &ExportStatus) {
    state.connections = status.connections.load(Relaxed);
    state.connections_total = status.connections_total.load(Relaxed);
    for (q, s) in state.queues.iter_mut().zip(&status.queues) {
        let was = std::mem::take(&mut q.state);
        s.load_into(q);
        // a slot no connection has used yet has no channel state of its own
        if q.tid == 0 {
            q.state = was;
        }
    }
    state.memory = Some(srp_ublk::rdma::mem::counts());
    if let Some(c) = CAPACITY.get() {
        state.size = c.bytes.load(Relaxed);
        state.capacity_checks = c.checks.load(Relaxed);
        state.capacity_check_failures = c.failures.load(Relaxed);
    }
    state.updated_ms = now_ms();
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
