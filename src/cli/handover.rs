//! A daemon whose RDMA device is being removed hands its devices to a new image of itself
//! ([`hand_over`]), which takes them over from their state files without a login
//! ([`take_over`]): librdmacm lets go of a removed RDMA device only when the image that used it
//! ends.

use anyhow::{bail, Context};
use srp_ublk::frontend::ublk::{HandedDevice, Handover};
use srp_ublk::session::state::DeviceState;
use srp_ublk::session::{detached_channels, Relogin};
use srp_ublk::wire::target::TargetSpec;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime};

/// Replaces this daemon's image with one that takes its devices over (see
/// [`srp_ublk::frontend::ublk::OnRemoved`]; `dev_id` is the device whose queue found the removal):
/// `add --recover --handover-since`, built from the devices' state files as `recover` builds it
/// (one device, or every device of a target port's daemon). execve keeps the pid (the state
/// files, `up --supervise` and systemd keep seeing a live daemon) and stderr (the log file), and
/// closes every other descriptor: the uverbs and rdma_cm handles, so the kernel can finish
/// removing the device, and the ublk ones, so ublk quiesces the devices with their I/O queued for
/// the new image. Returns only if the exec failed.
pub(super) fn hand_over(dev_id: u32, since: SystemTime) {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.swap(true, Relaxed) {
        return; // another queue thread is doing it
    }
    let devs = own_devices().and_then(|devs| match devs.iter().find(|d| d.geometry.is_none()) {
        Some(d) => bail!("the state file of {} has no block mapping", d.bdev),
        None => Ok(devs),
    });
    let devs = match devs {
        Ok(d) => d,
        Err(e) => {
            tracing::error!("cannot hand /dev/ublkb{dev_id} over: {e:#}");
            return;
        }
    };
    let names = names(&devs);
    let mut argv = super::recover::port_argv(&devs);
    argv.extend([
        "--handover-since".into(),
        super::add::epoch_ms(since).to_string().into(),
    ]);
    tracing::warn!(
        "handing {names} over to a new image of this daemon (pid {}): librdmacm lets go of a \
         removed RDMA device only when the image ends",
        std::process::id()
    );
    use std::os::unix::process::CommandExt;
    // /proc/self/exe: the running binary even if a package upgrade replaced the file
    let err = Command::new("/proc/self/exe").args(&argv).exec();
    tracing::error!(
        "handing {names} over failed ({err}); I/O stays held under the timers, and the RDMA \
         device removal completes when this daemon exits (`srp-ublk del`, or dev_loss_tmo)"
    );
}

/// The devices' names, for a log line: "/dev/ublkb1, /dev/ublkb2".
pub(super) fn names(devs: &[DeviceState]) -> String {
    let v: Vec<&str> = devs.iter().map(|d| d.bdev.as_str()).collect();
    v.join(", ")
}

/// The state files of the devices this daemon serves.
pub(super) fn own_devices() -> anyhow::Result<Vec<DeviceState>> {
    let me = std::process::id();
    let devs: Vec<DeviceState> = DeviceState::all()
        .into_iter()
        .filter(|d| d.pid == me)
        .collect();
    if devs.is_empty() {
        bail!("no state file names this daemon (pid {me})");
    }
    Ok(devs)
}

/// The devices `ids` a previous image of this daemon handed over (see [`hand_over`]), from their
/// state files: the same LUNs, queues, depth and block mappings, the channels down since
/// `since_ms`, each login checking that every LUN is still the one its device served. Returns
/// the handover and the state files, in the order of `ids`.
pub(super) fn take_over(
    ids: &[u32],
    since_ms: u64,
    timeout: Duration,
) -> anyhow::Result<(Handover, Vec<DeviceState>)> {
    let mut states = Vec::with_capacity(ids.len());
    let mut devices = Vec::with_capacity(ids.len());
    for &id in ids {
        let path = DeviceState::path(id);
        let state = DeviceState::read(&path)
            .with_context(|| format!("taking /dev/ublkb{id} over: reading {}", path.display()))?;
        let Some(geometry) = state.geometry else {
            bail!(
                "{} has no block mapping (written by an older srp-ublk): `srp-ublk recover -n \
                 {id}` takes the device over once the target can be logged in to",
                path.display()
            );
        };
        devices.push(HandedDevice {
            lun: state.lun,
            geometry,
        });
        states.push(state);
    }
    let Some(first) = states.first() else {
        bail!("--handover-since needs the device ids: -n N, or --ids N1,N2 with --lun L1,L2");
    };
    let target = TargetSpec::parse(&first.target)?;
    let (queues, depth) = (first.queues.len() as u16, first.depth);
    // every device's tags on each channel, as the port daemon's login had them
    let tags = u16::try_from(usize::from(depth) * states.len()).unwrap_or(u16::MAX);
    let channels = detached_channels(&first.rdma_device, queues, depth, first.lun, tags);
    // the channels log in once the RDMA device is back: to these LUNs only
    let mut relogin = Relogin::new(&target, first.lun, depth, timeout).with_tags(tags);
    for s in &states {
        relogin = relogin.expecting(s.lun, s.identity());
    }
    let since = SystemTime::UNIX_EPOCH + Duration::from_millis(since_ms);
    let ago = SystemTime::now().duration_since(since).unwrap_or_default();
    let down_since = Instant::now().checked_sub(ago).unwrap_or_else(Instant::now);
    let names = names(&states);
    tracing::warn!(
        "taking {names} over: {queues} queue(s) x depth {depth}, channels down for {ago:.1?} \
         (RDMA device {} removed); they log in as the device comes back",
        first.rdma_device
    );
    let h = Handover {
        channels,
        relogin,
        depth,
        devices,
        down_since,
    };
    Ok((h, states))
}
