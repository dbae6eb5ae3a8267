//! One daemon per target port: `add --lun all` (or a list of LUNs) serves a device for each LUN
//! over one set of channels, channel q carrying queue q of every device, as ib_srp's LUNs share
//! their target port's channels. Each device keeps a state file of its own naming the daemon, so
//! `list`, `stats`, `resize` and `del` work per device; `upgrade` and `recover --all` take every
//! device of the daemon over together.

use super::add::{
    announce, block_signals, daemon_fields, forget, record_live, report_failure,
    same_lun_as_before, session_state, spawn_signal_thread, spawn_state_refresher, without_lun,
    AddArgs,
};
use super::spawn::{spawn_port_daemon, Announce};
use anyhow::bail;
use srp_ublk::frontend::ublk::{
    self as front, CapacityStatus, LiveInfo, OnRemoved, PortDevice, PortSource, QueueStatus,
    UblkOptions,
};
use srp_ublk::session::ids::port_path;
use srp_ublk::session::state::DeviceState;
use srp_ublk::session::{LunInfo, Session};
use srp_ublk::wire::target::TargetSpec;
use std::sync::Arc;
use std::time::Duration;

/// `add` of the LUNs `luns` of `target`'s port: one daemon serving a device for each (this
/// process in the foreground, or a daemon it starts and waits for, one READY line per device).
pub(super) fn add(
    a: &AddArgs,
    target: &TargetSpec,
    luns: &[u64],
    is_daemon: bool,
) -> anyhow::Result<()> {
    if a.id.is_some() {
        bail!("several LUNs make several devices, numbered by the driver: drop -n");
    }
    // with --recover, the LUNs past the devices --ids names join the port's daemon (`join`)
    if !a.ids.is_empty() && a.ids.len() != luns.len() && !(a.recover && a.ids.len() < luns.len()) {
        bail!(
            "--ids names {} device(s) for {} LUN(s): one id per LUN, in the same order",
            a.ids.len(),
            luns.len()
        );
    }
    if is_daemon || a.foreground {
        let notify = is_daemon;
        let r = serve(a, target, luns, notify);
        if let (Err(e), true) = (&r, notify) {
            report_failure(e);
        }
        return r;
    }
    // the daemon serves the LUNs found now (`--lun all` asked the target once, here)
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let mut argv = without_lun(&argv);
    argv.extend(["--lun".into(), list(luns).into()]);
    spawn_port_daemon(
        &argv,
        a.session.timeout,
        Announce::json_if(a.json),
        luns.len(),
    )
}

/// `luns` as `--lun` takes them: "0,2".
pub(super) fn list(luns: &[u64]) -> String {
    luns.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// What each device of the port publishes and is asked, in the order of its LUNs.
struct Devices {
    states: Vec<Option<DeviceState>>,
    status: Vec<Arc<Vec<QueueStatus>>>,
    caps: Vec<Arc<CapacityStatus>>,
}

/// The daemon: logs in once, interrogates every LUN, creates (or with --recover takes over) a
/// device for each and serves them until each is deleted. With --handover-since it takes over,
/// without a login, the devices a previous image handed over.
fn serve(a: &AddArgs, target: &TargetSpec, luns: &[u64], notify: bool) -> anyhow::Result<()> {
    // the lines about one device name it (`lines_about`); the port's others name the port
    super::logging::name_lines(&format!("port {}", port_path(target)));
    let sigs = block_signals()?;
    let (source, states) = match a.handover_since {
        Some(ms) => {
            let timeout = Duration::from_secs(a.session.timeout);
            let (h, states) = super::handover::take_over(&a.ids, ms, timeout)?;
            (PortSource::Handover(Box::new(h)), states)
        }
        None => login(a, target, luns)?,
    };
    let mut devs = Devices {
        states: Vec::new(),
        status: Vec::new(),
        caps: Vec::new(),
    };
    for mut st in states {
        daemon_fields(a, &mut st)?;
        let queues = (0..st.queues.len().max(1)).map(|_| QueueStatus::default());
        devs.states.push(Some(st));
        devs.status.push(Arc::new(queues.collect()));
        devs.caps.push(Arc::new(CapacityStatus::default()));
    }
    super::daemon::protect_from_reclaim();
    let id = |i: usize| a.ids.get(i).map_or(-1, |&n| n as i32);
    let uopts = UblkOptions {
        poll: a.poll,
        cpus: a.cpus.clone(),
        dev_id: id(0),
        timers: a.timers()?,
        recover: a.recover,
        // every device goes to a new image together
        on_removed: Some(OnRemoved(Arc::new(super::handover::hand_over))),
        capacity: devs.caps[0].clone(),
    };
    let more = (1..devs.states.len())
        .map(|i| PortDevice {
            dev_id: id(i),
            status: devs.status[i].clone(),
            capacity: devs.caps[i].clone(),
            // the LUNs past the devices taken over join the daemon
            joining: a.recover && i >= a.ids.len(),
        })
        .collect();
    let first = devs.status[0].clone();
    let n = devs.states.len();
    let mut live: Vec<(u32, Arc<CapacityStatus>)> = Vec::with_capacity(n);
    let mut sigs = Some(sigs);
    let on_live = |i: usize, info: LiveInfo| {
        let Some(mut st) = devs.states.get_mut(i).and_then(Option::take) else {
            return;
        };
        let (status, cap) = (devs.status[i].clone(), devs.caps[i].clone());
        let _about = super::logging::lines_about(&format!("ublkb{}", info.dev_id));
        record_live(&mut st, &info, &status, &cap);
        live.push((info.dev_id, cap.clone()));
        announce(&info, notify, live.len() == n);
        spawn_state_refresher(st, status, cap, info.dev_id);
        // once every device is live (SIGTERM stops them all)
        if live.len() == n {
            if let Some(sigs) = sigs.take() {
                spawn_signal_thread(sigs, live.clone());
            }
        }
    };
    let on_gone = |_, dev_id: u32| {
        let _about = super::logging::lines_about(&format!("ublkb{dev_id}"));
        forget(dev_id);
        tracing::info!("/dev/ublkb{dev_id} deleted; the port's other devices go on");
    };
    let r = front::serve_port(source, uopts, first, more, on_live, on_gone);
    for d in DeviceState::all() {
        if d.pid == std::process::id() {
            DeviceState::remove(d.dev_id);
        }
    }
    r?;
    Ok(())
}

/// Logs in to the port and interrogates the LUNs `luns`: the session and a state for each LUN's
/// device (with --recover, each checked against the device's state file).
fn login(
    a: &AddArgs,
    target: &TargetSpec,
    luns: &[u64],
) -> anyhow::Result<(PortSource, Vec<DeviceState>)> {
    let mut opts = a.session.port_options(luns);
    opts.share_nexus = DeviceState::nexus_shared(target);
    let session = match Session::open(target, &opts) {
        // LUNs joining a recovered daemon that cannot be served do not take its devices down
        Err(e) if a.recover && !a.ids.is_empty() && a.ids.len() < luns.len() => {
            let (ours, joining) = luns.split_at(a.ids.len());
            super::join::refuse(joining, &anyhow::Error::new(e));
            return login(a, target, ours);
        }
        r => r?,
    };
    let all = std::iter::once(&session.lun).chain(&session.more_luns);
    let mut states = Vec::with_capacity(luns.len());
    for (i, lun) in all.enumerate() {
        log_lun(lun, &session);
        let st = session_state(target, &session, lun);
        if let (true, Some(&id)) = (a.recover, a.ids.get(i)) {
            same_lun_as_before(id, target, &st)?;
        }
        states.push(st);
    }
    Ok((PortSource::Srp(Box::new(session)), states))
}

fn log_lun(lun: &LunInfo, session: &Session) {
    tracing::info!(
        "LUN {}: {} {} {} bytes, block {} bytes, {} queues x depth {} (shared by the port's {} \
         LUNs), wce {} fua {} ro {}",
        lun.lun,
        lun.inquiry.vendor,
        lun.inquiry.product,
        lun.size(),
        lun.capacity.block_len,
        session.channels.len(),
        session.depth,
        1 + session.more_luns.len(),
        lun.write_cache,
        lun.fua,
        lun.read_only
    );
}
