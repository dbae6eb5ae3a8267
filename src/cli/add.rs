//! `srp-ublk add`: log in to a target and create `/dev/ublkbN`.
//!
//! Without `--foreground`, `add` starts itself again as the daemon (its own process group, stderr to a
//! log file under /run/srp-ublk/logs/) and returns only when the daemon reports the device live (it
//! prints the device path) or with the daemon's error. The daemon keeps serving until `del`.

use anyhow::{bail, Context};
use clap::Args;
use srp_ublk::backend::{parse_spec, DemoKind, MemDisk};
use srp_ublk::frontend::ublk::{
    self as front, CapacityStatus, LiveInfo, OnRemoved, PollMode, QueueStatus, UblkOptions,
    UblkSource,
};
use srp_ublk::session::state::{DeviceState, QueueState};
use srp_ublk::session::timers::{TimerError, Timers};
use srp_ublk::session::{LunInfo, Session};
use srp_ublk::wire::target::TargetSpec;

use super::LunSel;
use std::io::Write;
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::spawn::{spawn_daemon, Announce, DAEMON_ENV, JOURNAL_LOG, LOG_ENV};

/// `srp-ublk add ...`
#[derive(Debug, Args, Clone)]
pub struct AddArgs {
    /// The target: an ib_srp add_target string (or srp_daemon -o line), e.g.
    /// "id_ext=000000fffe770001,ioc_guid=000000fffe770001,dest=10.77.0.1:5555".
    #[arg(
        long,
        short = 't',
        required_unless_present = "backend",
        conflicts_with = "backend"
    )]
    pub target: Option<String>,
    /// A demo/benchmark backend instead of SRP (not storage): null:SIZE (zeros, writes discarded)
    /// or mem:SIZE (RAM), to measure the ublk front end alone.
    #[arg(long)]
    pub backend: Option<String>,
    /// With --backend: serve it with ublk's batch I/O commands (UBLK_F_BATCH_IO: not in 6.12's
    /// ublk; `srp-ublk features` says whether this kernel has them), to measure what they save in
    /// the front end.
    #[arg(long, requires = "backend")]
    pub ublk_batch: bool,
    /// Session options.
    #[command(flatten)]
    pub session: super::SessionArgs,
    /// CPUs to pin queue threads to, e.g. "0,1" (queue q gets the q-th, cycling);
    /// default: each queue's thread on the next queue's CPUs (off the CPUs it serves).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// How queue threads wait for completions.
    #[arg(long, value_enum, default_value_t = PollMode::Adaptive)]
    pub poll: PollMode,
    /// The SRP transport-class timers.
    #[command(flatten)]
    pub timer_args: super::TimerArgs,
    /// The device to create: N or /dev/ublkbN (default: the driver picks the lowest free number).
    #[arg(short = 'n', long = "number", alias = "id", value_name = "DEVICE",
          value_parser = super::device::parse)]
    pub id: Option<u32>,
    /// Stay in the foreground, logging to stderr (for systemd and debugging).
    #[arg(long)]
    pub foreground: bool,
    /// Print what `add` would log in with (normalized target, port ids) and exit.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Take over device -n N, left quiesced by a daemon that died (what `srp-ublk recover` runs).
    #[arg(long, hide = true)]
    pub recover: bool,
    /// With --recover and several LUNs: each LUN's device id, in the order of --lun (the devices
    /// a target port's daemon served together).
    #[arg(
        long,
        hide = true,
        value_delimiter = ',',
        requires = "recover",
        conflicts_with = "id"
    )]
    pub ids: Vec<u32>,
    /// With --recover: the previous image of this daemon left because its RDMA device was being
    /// removed, its channels down since this time (ms since the epoch). The device is taken over
    /// from its state file, without a login; the channels log in as they reconnect.
    #[arg(long, hide = true, requires = "recover")]
    pub handover_since: Option<u64>,
    /// The targets.d name that attaches this device (what `up NAME` passes; `down NAME` removes
    /// only NAME's devices).
    #[arg(long, hide = true)]
    pub owner: Option<String>,
}

impl AddArgs {
    /// The timers, checked with ib_srp's rules.
    pub fn timers(&self) -> Result<Timers, TimerError> {
        self.timer_args.timers()
    }
}

/// A target string, or a bare GUID (an IO controller's or a target port's id_ext) that InfiniBand
/// discovery resolves to the full string, as srp_daemon would print it.
fn resolve_target(t: &str) -> anyhow::Result<TargetSpec> {
    let hex = t.trim().trim_start_matches("0x");
    let guid = (!hex.is_empty() && hex.len() <= 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten();
    let Some(guid) = guid else {
        return Ok(TargetSpec::parse(t)?);
    };
    let mut u = super::discover::open_ib("").with_context(|| {
        format!("--target {t} is a bare GUID, which only InfiniBand discovery can resolve")
    })?;
    match srp_ublk::session::ib_discover::find_guid(&mut u, guid)? {
        Ok(found) => {
            eprintln!("srp-ublk: --target {t}: {}", found.line);
            Ok(TargetSpec::parse(&found.line)?)
        }
        Err(all) => bail!(
            "no SRP target with ioc_guid or id_ext {guid:016x} on the fabric of {} port {}              ({} other target(s) found: `srp-ublk discover --ib` lists them)",
            u.local.device,
            u.local.port,
            all.targets.len()
        ),
    }
}

/// Runs `add`.
pub fn run(a: AddArgs) -> anyhow::Result<()> {
    // started by `add`, `up` or `recover` (spawn_daemon) to serve the device
    let is_daemon = std::env::var_os(DAEMON_ENV).is_some();
    if is_daemon {
        super::daemon::own_session();
    }
    a.timers()?;
    let target = match (&a.target, &a.backend) {
        (Some(t), _) => Some(a.session.apply(resolve_target(t)?)),
        (None, Some(b)) => {
            parse_spec(b)?;
            None
        }
        (None, None) => {
            bail!("give --target STRING (an SRP target) or --backend null:SIZE|mem:SIZE")
        }
    };
    if a.dry_run {
        match &target {
            Some(t) => print!("{}", super::target::describe(t)),
            None => println!(
                "demo backend {} (not storage)",
                a.backend.as_deref().unwrap_or_default()
            ),
        }
        return Ok(());
    }
    check_ublk()?;
    if a.recover && a.id.is_none() && a.ids.is_empty() {
        bail!("--recover needs the device id: -n N");
    }
    if let Some(t) = &target {
        let luns = match &a.session.lun {
            Some(LunSel::All) => Some(all_luns(t, a.session.timeout)?),
            Some(LunSel::List(l)) if l.len() > 1 => Some(l.clone()),
            _ => None,
        };
        let joining = !(is_daemon || a.foreground || a.recover);
        if let (true, Some(devs)) = (joining, super::join::port_daemon(t, a.owner.as_deref())) {
            return join(&a, t, luns, &devs);
        }
        if let Some(luns) = luns {
            return super::port::add(&a, t, &luns, is_daemon);
        }
        a.session.single_lun(Some(t))?;
    }
    if is_daemon {
        return daemon(a, target, true);
    }
    if a.foreground {
        return daemon(a, target, false);
    }
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    spawn_daemon(&argv, a.session.timeout, Announce::json_if(a.json))
}

/// `add` of LUNs of a target port whose daemon runs (`devs`, its devices): they join it (with
/// `--lun all`, those it does not serve yet).
fn join(
    a: &AddArgs,
    t: &TargetSpec,
    luns: Option<Vec<u64>>,
    devs: &[DeviceState],
) -> anyhow::Result<()> {
    if a.id.is_some() {
        bail!(
            "the port's daemon (pid {}) numbers a joining LUN's device itself: drop -n",
            devs[0].pid
        );
    }
    let mut luns = match luns {
        Some(l) => l,
        None => vec![a.session.single_lun(Some(t))?],
    };
    if a.session.lun == Some(LunSel::All) {
        luns.retain(|l| !devs.iter().any(|d| d.lun == *l));
        if luns.is_empty() {
            eprintln!(
                "srp-ublk: the port's daemon (pid {}) serves every LUN the target reports \
                 already: `srp-ublk list`",
                devs[0].pid
            );
            return Ok(());
        }
    }
    super::join::join(devs, &luns, a.session.timeout, Announce::json_if(a.json))
}

/// Every LUN the target reports that can be a block device (the others are named, then skipped).
fn all_luns(t: &TargetSpec, timeout: u64) -> anyhow::Result<Vec<u64>> {
    let found = srp_ublk::session::discover::discover_luns(t, Duration::from_secs(timeout))
        .context("listing the target's LUNs")?;
    let mut luns = Vec::new();
    for f in found {
        match f.info {
            Ok(_) => luns.push(f.lun),
            Err(e) => eprintln!("skipping LUN {}: {e}", f.lun),
        }
    }
    if luns.is_empty() {
        bail!(
            "the target reports no LUN that can be a block device (check its LUN mapping and ACL)"
        );
    }
    Ok(luns)
}

/// `argv` without its `--lun X` / `--lun=X`.
pub(crate) fn without_lun(argv: &[std::ffi::OsString]) -> Vec<std::ffi::OsString> {
    let mut out = Vec::with_capacity(argv.len());
    let mut skip = false;
    for a in argv {
        if std::mem::take(&mut skip) {
            continue;
        }
        match a.to_str() {
            Some("--lun") => skip = true,
            Some(s) if s.starts_with("--lun=") => {}
            _ => out.push(a.clone()),
        }
    }
    out
}

/// The ublk driver must be there before anything else happens.
pub fn check_ublk() -> anyhow::Result<()> {
    if !std::path::Path::new("/dev/ublk-control").exists() {
        bail!(
            "no /dev/ublk-control: the ublk driver is not loaded; run `modprobe ublk_drv` \
             (needs Linux 6.0 or later built with CONFIG_BLK_DEV_UBLK)"
        );
    }
    Ok(())
}

/// The daemon: log in, create the device, serve until stopped. With `notify`, report READY/ERROR on
/// stdout for the parent `add`, then detach stdout.
fn daemon(a: AddArgs, target: Option<TargetSpec>, notify: bool) -> anyhow::Result<()> {
    let r = serve(&a, target.as_ref(), notify);
    if let (Err(e), true) = (&r, notify) {
        report_failure(e);
    }
    r
}

/// The daemon's ERROR line for the `add` waiting on its pipe.
pub(super) fn report_failure(e: &anyhow::Error) {
    // `add` may be gone (interrupted): a closed pipe is not this daemon's error
    let status = super::status::exit_of(e) as u8;
    let _ = writeln!(std::io::stdout(), "ERROR {status} {e:#}");
    let _ = std::io::stdout().flush();
}

fn serve(a: &AddArgs, target: Option<&TargetSpec>, notify: bool) -> anyhow::Result<()> {
    if let Some(id) = a.id {
        super::logging::name_lines(&format!("ublkb{id}"));
    }
    let sigs = block_signals()?;
    let (source, mut state) = match (target, a.handover_since) {
        (Some(_), Some(ms)) => handover_source(a, ms)?,
        (Some(t), None) => srp_source(a, t)?,
        (None, _) => demo_source(a)?,
    };
    super::daemon::protect_from_reclaim();
    daemon_fields(a, &mut state)?;
    let status: Arc<Vec<QueueStatus>> = Arc::new(
        (0..state.queues.len())
            .map(|_| QueueStatus::default())
            .collect(),
    );
    let uopts = UblkOptions {
        poll: a.poll,
        cpus: a.cpus.clone(),
        // ublk_drv's "any free number" is -1; device::parse keeps numbers below 2^20
        dev_id: a.id.map_or(-1, |n| n as i32),
        timers: a.timers()?,
        recover: a.recover,
        on_removed: target.map(|_| OnRemoved(Arc::new(super::handover::hand_over))),
        capacity: Arc::new(CapacityStatus::default()),
    };
    let st2 = status.clone();
    let cap = uopts.capacity.clone();
    let on_live = move |info: LiveInfo| {
        super::logging::name_lines(&format!("ublkb{}", info.dev_id));
        record_live(&mut state, &info, &st2, &cap);
        announce(&info, notify, true);
        spawn_signal_thread(sigs, vec![(info.dev_id, cap.clone())]);
        spawn_state_refresher(state, st2, cap, info.dev_id);
    };
    let r = front::serve(source, uopts, status, on_live);
    for d in DeviceState::all() {
        if d.pid == std::process::id() {
            DeviceState::remove(d.dev_id);
        }
    }
    r?;
    Ok(())
}

/// A device went live: its state file written (its id, node and first counters), and udev asked
/// to look at it again.
pub(super) fn record_live(
    state: &mut DeviceState,
    info: &LiveInfo,
    status: &[QueueStatus],
    cap: &CapacityStatus,
) {
    state.dev_id = info.dev_id;
    state.bdev = info.bdev.clone();
    refresh(state, status, cap);
    if let Err(e) = state.write() {
        tracing::warn!(
            "cannot write {}: {e}",
            DeviceState::path(info.dev_id).display()
        );
    }
    // udev saw the disk appear before this state file existed: let it look again, so
    // udev/60-srp-ublk.rules can name it (`srp-ublk udev-id`)
    let uevent = format!("/sys/class/block/ublkb{}/uevent", info.dev_id);
    if let Err(e) = std::fs::write(&uevent, "change") {
        tracing::debug!("cannot write {uevent}: {e}");
    }
    tracing::info!("{} is live (ublk device {})", info.bdev, info.dev_id);
}

/// What a daemon writes into each of its devices' state files about itself: its process, how it
/// was started, its timers and log.
pub(super) fn daemon_fields(a: &AddArgs, state: &mut DeviceState) -> anyhow::Result<()> {
    state.pid = std::process::id();
    state.pid_start = srp_ublk::session::state::ProcStat::own().map(|s| s.start);
    state.owner = a.owner.clone();
    state.image_started = epoch_ms(SystemTime::now());
    state.poll = format!("{:?}", a.poll).to_lowercase();
    state.cpus = a.cpus.clone();
    state.timers = Some(a.timers()?);
    state.log = std::env::var(LOG_ENV).unwrap_or_else(|_| {
        if super::logging::stderr_is_journal() {
            JOURNAL_LOG.into()
        } else {
            String::new()
        }
    });
    state.unit = srp_ublk::session::state::own_unit();
    Ok(())
}

/// Blocks the signals the device's signal thread waits for (every thread inherits the mask):
/// SIGTERM/SIGINT stop the device, SIGHUP re-reads the capacity, SIGUSR2 upgrades.
pub(super) fn block_signals() -> anyhow::Result<nix::sys::signal::SigSet> {
    let mut sigs = nix::sys::signal::SigSet::empty();
    for s in [
        nix::sys::signal::SIGTERM,
        nix::sys::signal::SIGINT,
        nix::sys::signal::SIGHUP,
        nix::sys::signal::SIGUSR2,
    ] {
        sigs.add(s);
    }
    sigs.thread_block().context("blocking signals")?;
    Ok(sigs)
}

/// Tells whoever started the device that it is live: `add`'s READY line on the daemon's pipe
/// (then the pipe is let go), or the device's name on stdout when run in the foreground.
/// With `last` false, more devices of this daemon are to come and the pipe stays.
pub(super) fn announce(info: &LiveInfo, notify: bool, last: bool) {
    if notify {
        let ready = serde_json::to_string(info).unwrap_or_default();
        let _ = writeln!(std::io::stdout(), "READY {ready}");
        let _ = std::io::stdout().flush();
        if last {
            detach_stdout();
        }
    } else {
        println!("{}", info.bdev);
        let _ = std::io::stdout().flush();
    }
}

/// The daemon's signal thread, for its devices (each id with its capacity checks): SIGHUP
/// (`srp-ublk resize`) re-reads the capacities, SIGUSR2 (`srp-ublk upgrade`) re-executes the
/// daemon, SIGTERM/SIGINT stop the devices.
pub(super) fn spawn_signal_thread(
    sigs: nix::sys::signal::SigSet,
    devices: Vec<(u32, Arc<CapacityStatus>)>,
) {
    std::thread::spawn(move || loop {
        match sigs.wait() {
            Ok(nix::sys::signal::SIGHUP) => {
                // `srp-ublk resize`: re-read the LUNs' capacities
                tracing::info!("SIGHUP: checking the capacity of each LUN");
                for (_, cap) in &devices {
                    cap.check.store(true, Relaxed);
                }
            }
            // `srp-ublk upgrade`: returns only if the new image could not be started
            Ok(nix::sys::signal::SIGUSR2) => re_exec(),
            Ok(sig) => {
                for (dev_id, _) in &devices {
                    let _about = super::logging::lines_about(&format!("ublkb{dev_id}"));
                    tracing::info!("{sig:?}: stopping ublk device {dev_id}");
                    if let Ok(c) = libublk::ctrl::UblkCtrl::new_simple(*dev_id as i32) {
                        let _ = c.kill_dev();
                    }
                }
                return;
            }
            Err(_) => return,
        }
    });
}

/// Rewrites the state file every 2 s (queue states and counters for `list` and `stats`) until
/// it is removed.
pub(super) fn spawn_state_refresher(
    mut state: DeviceState,
    status: Arc<Vec<QueueStatus>>,
    cap: Arc<CapacityStatus>,
    dev_id: u32,
) {
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_secs(2));
        // a device deleted meanwhile (`forget`) is not written back
        let gone = DELETED.lock().unwrap_or_else(|e| e.into_inner());
        if gone.contains(&dev_id) || !DeviceState::path(dev_id).exists() {
            return;
        }
        refresh(&mut state, &status, &cap);
        let _ = state.write();
    });
}

/// The devices this daemon deleted while it serves others, whose state files stay removed.
static DELETED: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Removes the state file of device `dev_id`, which this daemon deleted while it goes on serving
/// others, so that its state refresher does not write it again.
pub(super) fn forget(dev_id: u32) {
    let mut gone = DELETED.lock().unwrap_or_else(|e| e.into_inner());
    gone.push(dev_id);
    DeviceState::remove(dev_id);
}

/// `srp-ublk upgrade`: replaces this daemon's image with the binary installed where it was started
/// from, running `add --recover` of the devices it serves (built from their state files as `recover`
/// builds it: one device, or every LUN's of a target port). Every descriptor closes with the old
/// image, so ublk quiesces the devices with their I/O queued and the target sees the channels go;
/// the new image logs in and recovers the devices, and ublk issues the I/O again. Returns
/// (logging why) only if the new image could not be started.
fn re_exec() {
    // LUNs `add` asked this daemon to serve too go with it, or are refused with its reason
    let joining = super::join::requested();
    if let Err(e) = exec_image(&joining) {
        tracing::error!("upgrade refused: {e:#}; this image goes on serving");
        if !joining.is_empty() {
            super::join::refuse(&joining, &e);
        }
    }
}

/// The file this image was started from, as it is now: the installed binary once a package
/// replaced the file (`/proc/self/exe` then names the old one, " (deleted)").
pub(super) fn installed_binary() -> anyhow::Result<std::path::PathBuf> {
    let p = std::fs::read_link("/proc/self/exe").context("/proc/self/exe")?;
    let s = p.to_string_lossy();
    let exe = std::path::PathBuf::from(s.strip_suffix(" (deleted)").unwrap_or(&s));
    if !exe.is_file() {
        bail!("no binary at {} to run", exe.display());
    }
    Ok(exe)
}

/// [`re_exec`]'s exec of the installed binary over the devices this daemon serves and the LUNs
/// `joining`; returns only with why it could not.
fn exec_image(joining: &[u64]) -> anyhow::Result<()> {
    let devs = super::handover::own_devices()?;
    let names = super::handover::names(&devs);
    let exe = installed_binary().with_context(|| format!("upgrading {names}"))?;
    tracing::warn!(
        "upgrade: {names} go over to the binary at {} (same pid {})",
        exe.display(),
        std::process::id()
    );
    if !joining.is_empty() {
        tracing::info!("LUN(s) {joining:?} join this port's daemon with the new image");
    }
    use std::os::unix::process::CommandExt;
    let err = Command::new(&exe)
        .args(super::recover::joining_argv(&devs, joining))
        .exec();
    Err(anyhow::Error::new(err).context(format!("exec {} for {names}", exe.display())))
}

/// The device a previous image of this daemon handed over (`-n N --handover-since`).
fn handover_source(a: &AddArgs, since_ms: u64) -> anyhow::Result<(UblkSource, DeviceState)> {
    let id = a.id.context("--handover-since needs the device id: -n N")?;
    let timeout = Duration::from_secs(a.session.timeout);
    let (h, mut states) = super::handover::take_over(&[id], since_ms, timeout)?;
    Ok((UblkSource::Handover(Box::new(h)), states.remove(0)))
}

fn srp_source(a: &AddArgs, target: &TargetSpec) -> anyhow::Result<(UblkSource, DeviceState)> {
    let opts = a.session.options(Some(target))?;
    if opts.share_nexus {
        tracing::info!(
            "another srp-ublk device uses this target's I_T nexus: channel 0 logs in with MULTI"
        );
    }
    let session = Session::open(target, &opts)?;
    tracing::info!(
        "LUN {}: {} {} {} bytes, block {} bytes, {} queues x depth {}, wce {} fua {} ro {}",
        session.lun.lun,
        session.lun.inquiry.vendor,
        session.lun.inquiry.product,
        session.lun.size(),
        session.lun.capacity.block_len,
        session.channels.len(),
        session.depth,
        session.lun.write_cache,
        session.lun.fua,
        session.lun.read_only
    );
    let state = session_state(target, &session, &session.lun);
    if a.recover {
        let id = a.id.context("--recover needs the device id: -n N")?;
        same_lun_as_before(id, target, &state)?;
    }
    Ok((UblkSource::Srp(Box::new(session)), state))
}

/// The state file's view of the device of `lun` (one of `session`'s LUNs), before it goes
/// live.
pub(super) fn session_state(target: &TargetSpec, session: &Session, lun: &LunInfo) -> DeviceState {
    DeviceState {
        target: target.to_string(),
        lun: lun.lun,
        size: lun.size(),
        block_size: lun.capacity.block_len,
        read_only: lun.read_only,
        depth: session.depth,
        version: Some(super::VERSION.to_string()),
        vendor: lun.inquiry.vendor.clone(),
        product: lun.inquiry.product.clone(),
        serial: lun.serial.clone(),
        wwid: lun.wwid.clone(),
        rdma_device: session.rdma_device.clone(),
        geometry: Some(lun.geometry()),
        max_io: session.lun_max_io(lun),
        queues: session
            .channels
            .iter()
            .enumerate()
            .map(|(i, c)| QueueState {
                qid: i as u16,
                req_lim_login: c.config().req_lim,
                req_lim: c.req_lim(),
                state: "running".into(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// A recovery serves the LUN the device served before: its I/O must not move to another disk
/// because the target's LUN mapping changed.
pub(super) fn same_lun_as_before(
    id: u32,
    target: &TargetSpec,
    state: &DeviceState,
) -> anyhow::Result<()> {
    if let Ok(old) = DeviceState::read(&DeviceState::path(id)) {
        old.same_lun(state).with_context(|| {
            format!(
                "/dev/ublkb{id} not taken over: LUN {} of {target} is not the LUN it served; \
                 it stays quiesced with its I/O held. Map the LUN back on the target and run \
                 `srp-ublk recover -n {id}`, or give the device up with `srp-ublk del -n {id}`",
                state.lun
            )
        })?;
    }
    Ok(())
}

fn demo_source(a: &AddArgs) -> anyhow::Result<(UblkSource, DeviceState)> {
    let spec = a.backend.clone().unwrap_or_default();
    let (kind, size) = parse_spec(&spec)?;
    if a.ublk_batch && !front::driver_has(libublk::sys::UBLK_F_BATCH_IO) {
        bail!(
            "--ublk-batch: this kernel's ublk has no batch I/O commands (UBLK_F_BATCH_IO; \
             `srp-ublk features` shows what it has): leave --ublk-batch out"
        );
    }
    tracing::warn!("serving the {spec} demo backend: this is not storage");
    let queues = a.session.queues.unwrap_or(1).max(1);
    let depth = a.session.depth.clamp(1, 4096);
    let disk = (kind == DemoKind::Mem).then(|| Arc::new(MemDisk::new(size)));
    let state = DeviceState {
        target: format!("backend {spec} (demo, not storage)"),
        size,
        block_size: 512,
        depth,
        vendor: "srp-ublk".into(),
        product: format!("demo {spec}"),
        queues: (0..queues)
            .map(|q| QueueState {
                qid: q,
                state: "demo".into(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    Ok((
        UblkSource::Demo {
            size,
            disk,
            queues,
            depth,
            batch: a.ublk_batch,
        },
        state,
    ))
}

pub(super) fn refresh(state: &mut DeviceState, status: &[QueueStatus], cap: &CapacityStatus) {
    let bytes = cap.bytes.load(Relaxed);
    if bytes > 0 {
        state.size = bytes;
        // a daemon taking the device over (after an RDMA device removal) serves this mapping
        if let Some(g) = state.geometry.as_mut() {
            g.blocks = bytes >> g.block_shift;
        }
    }
    state.size_pending = cap.pending.load(Relaxed);
    state.updated_ms = epoch_ms(SystemTime::now());
    state.capacity_checks = cap.checks.load(Relaxed);
    state.capacity_check_failures = cap.failures.load(Relaxed);
    state.memory = Some(srp_ublk::rdma::mem::counts());
    state.version = Some(super::VERSION.to_string());
    for (q, s) in state.queues.iter_mut().zip(status) {
        s.load_into(q);
    }
}

/// Milliseconds since the epoch (what state files and the handover's command line carry).
pub(super) fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// After READY the parent exits: point stdout at /dev/null so later prints cannot fail.
fn detach_stdout() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
    }
}
