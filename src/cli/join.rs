//! A LUN added to a target port that a running daemon already serves joins that daemon: `add` (or
//! `up`, for a LUN mapped at run time) leaves the LUN in the daemon's join requests and signals it
//! as `upgrade` does; the daemon re-executes with its devices and the new LUNs ([`requested`]),
//! its new image logs the port's channels in again, takes its devices over and makes one for each
//! new LUN, so the LUNs keep sharing the port's channels and registered pools. The port's other
//! devices pause for that re-execution (about what `upgrade` takes), no error.

use super::spawn::Announce;
use anyhow::{bail, Context};
use nix::sys::signal::Signal::SIGUSR2;
use srp_ublk::frontend::ublk::LiveInfo;
use srp_ublk::session::state::{run_dir, DeviceState};
use srp_ublk::wire::target::TargetSpec;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The devices `owner` attached of `target`'s port, when a running daemon serves them (a targets.d
/// file's unit and manual `add`s, `owner` `None`, keep daemons of their own).
pub(super) fn port_daemon(target: &TargetSpec, owner: Option<&str>) -> Option<Vec<DeviceState>> {
    let devs: Vec<DeviceState> = DeviceState::of_nexus(target)
        .into_iter()
        .filter(|d| d.owner.as_deref() == owner && super::daemon::alive(d))
        .collect();
    super::recover::by_daemon(devs).into_iter().next()
}

/// The file holding the LUNs asked to join daemon `pid`, a line each.
fn requests(pid: u32) -> PathBuf {
    run_dir().join(format!("join-{pid}"))
}

/// Where daemon `pid` says why LUN `lun` could not join it.
fn refusal(pid: u32, lun: u64) -> PathBuf {
    run_dir().join(format!("join-{pid}-lun{lun}.error"))
}

/// Has the daemon serving `devs` (one port's) serve `luns` too, each with a device of its own,
/// and waits for them as long as `add` waits for a new daemon (`login_timeout` s a login);
/// announces each new device as `add` does. A LUN one of `devs` serves already is refused.
pub(super) fn join(
    devs: &[DeviceState],
    luns: &[u64],
    login_timeout: u64,
    out: Announce,
) -> anyhow::Result<()> {
    let Some(d) = devs.first() else {
        bail!("no daemon to join");
    };
    if let Some(o) = devs.iter().find(|o| luns.contains(&o.lun)) {
        bail!(
            "LUN {} of this target port is {} already (daemon pid {}): `srp-ublk list` shows it",
            o.lun,
            o.bdev,
            o.pid
        );
    }
    if let Some(o) = devs
        .iter()
        .find(|o| o.queues.iter().any(|q| q.state != "running"))
    {
        bail!(
            "the port's channels are not all running ({} is reconnecting or failed): add the \
             LUN once `srp-ublk list` shows the daemon's queues running",
            o.bdev
        );
    }
    eprintln!(
        "srp-ublk: LUN {} joins the port's daemon (pid {}, serving {}) with its queues ({}), \
         depth ({}) and timers; its devices pause while it re-executes",
        lun_list(luns),
        d.pid,
        super::handover::names(devs),
        d.queues.len(),
        d.depth
    );
    for &lun in luns {
        let _ = std::fs::remove_file(refusal(d.pid, lun));
    }
    ask(d.pid, luns)?;
    super::daemon::signal(d, SIGUSR2)?;
    await_joined(d, luns, super::spawn::setup_limit(login_timeout), out)
}

fn lun_list(luns: &[u64]) -> String {
    let v: Vec<String> = luns.iter().map(u64::to_string).collect();
    v.join(", ")
}

/// Appends `luns` to daemon `pid`'s join requests (a line each: several `add`s may ask at once).
fn ask(pid: u32, luns: &[u64]) -> anyhow::Result<()> {
    let path = requests(pid);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    let text: String = luns.iter().map(|l| format!("{l}\n")).collect();
    f.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Waits until daemon `d` serves a device for each of `luns`, or says why one could not join.
fn await_joined(
    d: &DeviceState,
    luns: &[u64],
    timeout: Duration,
    out: Announce,
) -> anyhow::Result<()> {
    let target = TargetSpec::parse(&d.target)?;
    let mut left = luns.to_vec();
    let t = Instant::now();
    while !left.is_empty() {
        std::thread::sleep(Duration::from_millis(50));
        let mut still = Vec::with_capacity(left.len());
        let now = DeviceState::of_nexus(&target);
        for lun in left {
            if let Ok(why) = std::fs::read_to_string(refusal(d.pid, lun)) {
                let _ = std::fs::remove_file(refusal(d.pid, lun));
                bail!("LUN {lun} could not join the port's daemon: {}", why.trim());
            }
            let served = now
                .iter()
                .find(|o| o.lun == lun && o.pid == d.pid && super::daemon::alive(o));
            match served {
                Some(o) => announce(o, out),
                None => still.push(lun),
            }
        }
        left = still;
        if !left.is_empty() && !super::daemon::alive(d) {
            bail!(
                "the port's daemon (pid {}) exited while taking LUN {} on; see its log {} \
                 (`srp-ublk recover --all` takes its devices over)",
                d.pid,
                lun_list(&left),
                d.log
            );
        }
        if !left.is_empty() && t.elapsed() > timeout {
            bail!(
                "the port's daemon (pid {}) serves no device for LUN {} after {timeout:?}; see \
                 its log {}",
                d.pid,
                lun_list(&left),
                d.log
            );
        }
    }
    Ok(())
}

fn announce(d: &DeviceState, out: Announce) {
    let info = LiveInfo {
        dev_id: d.dev_id,
        bdev: d.bdev.clone(),
    };
    super::spawn::announce_live(&info, out);
}

/// In the daemon, as it re-executes: the LUNs asked to join it, taken (later requests wait for
/// the next signal, which the new image receives once it serves).
pub(super) fn requested() -> Vec<u64> {
    let pid = std::process::id();
    let path = requests(pid);
    let taken = run_dir().join(format!("join-{pid}.taken"));
    if std::fs::rename(&path, &taken).is_err() {
        return Vec::new();
    }
    let text = std::fs::read_to_string(&taken).unwrap_or_default();
    let _ = std::fs::remove_file(&taken);
    parse_requests(&text, &path)
}

/// The LUNs of a join request file's text (`path`), each once, in the order asked.
fn parse_requests(text: &str, path: &std::path::Path) -> Vec<u64> {
    let mut luns: Vec<u64> = Vec::new();
    for line in text.lines() {
        match line.trim().parse::<u64>() {
            Ok(l) if !luns.contains(&l) => luns.push(l),
            Ok(_) => {}
            Err(_) => tracing::warn!("{}: not a LUN: {line:?}", path.display()),
        }
    }
    luns
}

/// In the daemon's new image: the LUNs `luns` could not join (`why`); the port's other devices
/// go on. The `add` that asked reads it.
pub(super) fn refuse(luns: &[u64], why: &anyhow::Error) {
    tracing::error!(
        "LUN {} cannot join this port's daemon: {why:#}; its other devices go on",
        lun_list(luns)
    );
    for &lun in luns {
        let path = refusal(std::process::id(), lun);
        if let Err(e) = std::fs::write(&path, format!("{why:#}\n")) {
            tracing::warn!("cannot write {}: {e}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_requests_name_each_lun_once_in_the_order_asked() {
        // two `add`s asked for LUN 8, a third for 9; a line that is no LUN is skipped
        let luns = parse_requests("8\n9\n8\nnine\n\n", std::path::Path::new("join-1"));
        assert_eq!(luns, [8, 9]);
    }
}
