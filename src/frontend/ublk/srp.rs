//! Serving SRP devices: one, or every LUN device of a target port over the same channels (queue
//! q of every device on the thread that owns channel q).

use super::capacity::CapacityWatch;
use super::queue::{run_queue, DeviceQueue};
use super::{
    build_ctrl, pin_queues, recover_ctrl, waiting, CapacityStatus, Handover, LiveInfo, OnRemoved,
    PortDevice, QueueStatus, UblkFrontError, UblkOptions, Waiting, POOL,
};
use crate::channel::block::{FuaWrite, Geometry};
use crate::path::SessionLink;
use crate::session::rport::Rport;
use crate::session::timers::Timers;
use crate::session::{LunInfo, Relogin, Session, SrpChannel};
use crate::wire::srp::ScsiLun;
use libublk::ctrl::UblkCtrl;
use libublk::io::UblkDev;
use libublk::sys;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

fn ublk_params(lun: &LunInfo, max_io: u32) -> sys::ublk_params {
    let bs_shift = lun.block_shift() as u8;
    let phys = lun
        .capacity
        .physical_block_len()
        .unwrap_or(lun.capacity.block_len);
    let phys_shift = (phys.trailing_zeros() as u8).clamp(bs_shift, 16);
    let mut attrs = 0;
    // the kernel sends FLUSH only to a volatile cache, and FUA only where the LUN takes the FUA bit;
    // elsewhere it makes a FUA write durable with a flush after it (the rule NBD follows itself)
    let cache = lun.write_cache();
    if cache.flushes() {
        attrs |= sys::UBLK_ATTR_VOLATILE_CACHE;
    }
    if cache.fua_write() == FuaWrite::FuaBit {
        attrs |= sys::UBLK_ATTR_FUA;
    }
    if lun.read_only {
        attrs |= sys::UBLK_ATTR_READ_ONLY;
    }
    let opt = lun
        .limits
        .map(|l| l.opt_xfer_len.saturating_mul(lun.capacity.block_len))
        .filter(|&b| b.is_power_of_two() && b <= max_io)
        .map_or(phys_shift, |b| b.trailing_zeros() as u8);
    let mut p = sys::ublk_params {
        types: sys::UBLK_PARAM_TYPE_BASIC,
        basic: sys::ublk_param_basic {
            attrs,
            logical_bs_shift: bs_shift,
            physical_bs_shift: phys_shift,
            io_opt_shift: opt.max(phys_shift),
            io_min_shift: phys_shift,
            max_sectors: max_io >> 9,
            dev_sectors: lun.size() >> 9,
            ..Default::default()
        },
        ..Default::default()
    };
    let unmap = lun.max_unmap_blocks();
    if unmap > 0 {
        let sectors_per_block = lun.capacity.block_len >> 9;
        let gran = lun
            .limits
            .map_or(1, |l| l.unmap_granularity.max(1))
            .saturating_mul(lun.capacity.block_len);
        p.types |= sys::UBLK_PARAM_TYPE_DISCARD;
        p.discard = sys::ublk_param_discard {
            discard_alignment: 0,
            discard_granularity: gran,
            max_discard_sectors: unmap.saturating_mul(sectors_per_block).min(u32::MAX >> 1),
            // without WRITE SAME, zeros are written one buffer at a time (see `zeroing`)
            max_write_zeroes_sectors: if lun.write_same {
                lun.max_write_same_blocks(max_io)
                    .saturating_mul(sectors_per_block)
            } else {
                max_io >> 9
            },
            max_discard_segments: 1,
            reserved0: 0,
        };
    }
    p
}

/// One device of an SRP daemon: what a new one is made with (or a device taken over keeps), the
/// LUN its commands name, and what it publishes and is asked.
struct SrpDevice {
    /// A new device's largest I/O and parameters, from the session; `None` for a device taken
    /// over, which keeps its own (`recover_ctrl`).
    new: Option<(u32, sys::ublk_params)>,
    lun: ScsiLun,
    geo: Geometry,
    /// The LUN's number, for its capacity checks.
    lun_num: u64,
    /// The device id asked for (-1: any).
    dev_id: i32,
    /// Taken over (ublk user recovery), not made.
    recover: bool,
    status: Arc<Vec<QueueStatus>>,
    capacity: Arc<CapacityStatus>,
}

impl SrpDevice {
    fn new(lun: &LunInfo, max_io: u32, slot: PortDevice, recover: bool) -> SrpDevice {
        SrpDevice {
            new: Some((max_io, ublk_params(lun, max_io))),
            recover: recover && !slot.joining,
            lun: ScsiLun::from_int(lun.lun),
            geo: lun.geometry(),
            lun_num: lun.lun,
            dev_id: slot.dev_id,
            status: slot.status,
            capacity: slot.capacity,
        }
    }

    /// The device's size in bytes.
    fn size(&self) -> u64 {
        self.geo.blocks << self.geo.block_shift
    }

    /// What libublk runs on the device before its queues start: the size and a new device's
    /// parameters (the queues' rings are srp-ublk's own, sized by the queue threads).
    fn device_init(&self) -> impl FnOnce(&mut UblkDev) -> Result<(), libublk::UblkError> {
        let (size, new) = (self.size(), self.new);
        move |dev: &mut UblkDev| {
            dev.set_default_params(size);
            if let Some((_, p)) = new {
                dev.tgt.params = p;
            }
            Ok(())
        }
    }
}

/// An SRP daemon's channels and login, and its devices: one, or every LUN of the target port
/// the session was opened for (each queue's channel carries that queue of every device).
pub(super) struct SrpParts {
    /// One channel per queue.
    channels: Vec<SrpChannel>,
    relogin: Relogin,
    depth: u16,
    /// When the channels went down, for a handover's timers.
    down_since: Option<Instant>,
    devices: Vec<SrpDevice>,
}

impl SrpParts {
    /// A new device for the session's LUN (its id and capacity from `opts`, its status
    /// `status`) and one for each of its other LUNs (`more`, in the session's order).
    pub(super) fn new(
        s: Session,
        opts: &UblkOptions,
        status: Arc<Vec<QueueStatus>>,
        more: Vec<PortDevice>,
    ) -> SrpParts {
        let max_io = s.ublk_max_io();
        let first = PortDevice {
            dev_id: opts.dev_id,
            status,
            capacity: opts.capacity.clone(),
            joining: false,
        };
        let mut devices = vec![SrpDevice::new(&s.lun, max_io, first, opts.recover)];
        for (lun, slot) in s.more_luns.iter().zip(more) {
            let max_io = s.lun_max_io(lun);
            devices.push(SrpDevice::new(lun, max_io, slot, opts.recover));
        }
        SrpParts {
            channels: s.channels,
            relogin: s.relogin,
            depth: s.depth,
            down_since: None,
            devices,
        }
    }

    /// The devices a handover takes over: its first with `opts`' id and capacity and `status`,
    /// each other with the `more` device of the same position.
    pub(super) fn handover(
        h: Handover,
        opts: &UblkOptions,
        status: Arc<Vec<QueueStatus>>,
        more: Vec<PortDevice>,
    ) -> SrpParts {
        let first = PortDevice {
            dev_id: opts.dev_id,
            status,
            capacity: opts.capacity.clone(),
            joining: false,
        };
        let devices = h
            .devices
            .iter()
            .zip(std::iter::once(first).chain(more))
            .map(|(d, slot)| SrpDevice {
                new: None,
                lun: ScsiLun::from_int(d.lun),
                geo: d.geometry,
                lun_num: d.lun,
                dev_id: slot.dev_id,
                recover: true,
                status: slot.status,
                capacity: slot.capacity,
            })
            .collect();
        SrpParts {
            channels: h.channels,
            relogin: h.relogin,
            depth: h.depth,
            down_since: Some(h.down_since),
            devices,
        }
    }
}

/// Creates (or takes over) every device of `parts` and serves them until each has stopped;
/// `on_live` runs for each (its index in `parts`) once it is live.
pub(super) fn serve_srp(
    parts: SrpParts,
    opts: UblkOptions,
    mut on_live: impl FnMut(usize, LiveInfo),
    on_gone: impl FnMut(usize, u32),
) -> Result<(), UblkFrontError> {
    let nr_queues = parts.channels.len() as u16;
    let mut ctrls = Vec::with_capacity(parts.devices.len());
    for d in &parts.devices {
        let ctrl = match (d.recover, &d.new) {
            (false, Some((max_io, _))) => {
                build_ctrl("srp-ublk", d.dev_id, nr_queues, parts.depth, *max_io, POOL)
            }
            // a handover is always a recovery (refused by `serve` otherwise)
            _ => recover_ctrl(d.dev_id, nr_queues, parts.depth),
        };
        // the new devices made before a failure go with it
        match ctrl {
            Ok(c) => ctrls.push(c),
            Err(e) => {
                delete_all(&ctrls);
                return Err(e);
            }
        }
    }
    let link = SessionLink::new(nr_queues).map_err(|e| {
        delete_all(&ctrls);
        UblkFrontError::Setup {
            what: "creating the queues' eventfds",
            source: e.into(),
        }
    })?;
    // a session that owns its nexus reconnects as ib_srp does: queue 0 first with SINGLE
    let shared = Arc::new(if parts.relogin.owns_nexus() {
        link.with_leader(parts.down_since.is_some())
    } else {
        link
    });
    let mut stops = Vec::new();
    let mut devices = Vec::with_capacity(parts.devices.len());
    let mut inits = Vec::with_capacity(parts.devices.len());
    for (d, ctrl) in parts.devices.iter().zip(&ctrls) {
        d.capacity.bytes.store(d.size(), Relaxed);
        let blocks = Arc::new(AtomicU64::new(d.geo.blocks));
        let watch = CapacityWatch {
            dev_id: ctrl.dev_info().dev_id,
            relogin: parts.relogin.for_lun(d.lun_num),
            blocks: blocks.clone(),
            queues: d.status.clone(),
            capacity: d.capacity.clone(),
            block_shift: d.geo.block_shift,
        };
        stops.push(watch.spawn()?);
        inits.push(d.device_init());
        devices.push(DeviceParts {
            lun: d.lun,
            geo: d.geo,
            blocks,
            status: d.status.clone(),
            released: AtomicU16::new(0),
        });
    }
    let cpus = opts.cpus.clone();
    let start = Arc::new(QueueStart {
        channels: Mutex::new(parts.channels.into_iter().map(Some).collect()),
        devices,
        timers: opts.timers,
        down_since: parts.down_since,
        on_removed: opts.on_removed.clone(),
        relogin: parts.relogin,
        waiting: waiting(opts.poll, nr_queues),
        shared,
    });
    let start2 = start.clone();
    let on_live = move |i: usize, c: &UblkCtrl| {
        // once every queue thread runs and before anyone sees the device
        if let Some(d) = start2.devices.get(i) {
            pin_queues(c, &d.status, &cpus);
        }
        let info = LiveInfo {
            dev_id: c.dev_info().dev_id,
            bdev: c.get_bdev_path(),
        };
        on_live(i, info);
    };
    let res = run_devices(&ctrls, inits, &start, on_live, on_gone);
    for stop in stops {
        stop.store(true, Relaxed);
    }
    delete_all(&ctrls);
    res
}

/// Deletes every device of `ctrls` (each may have been deleted from elsewhere already).
fn delete_all(ctrls: &[UblkCtrl]) {
    for c in ctrls {
        let _ = c.del_dev();
    }
}

/// Runs the devices `ctrls` made on queue threads of srp-ublk's own, each thread serving its
/// queue of every device (what libublk's `run_target` does for one device with threads of its
/// own): starts each device once every queue has its FETCH commands out and calls `on_live` for
/// it; deletes each device that stops while others serve (`srp-ublk del` of one LUN's device)
/// once every queue thread has let go of it, calling `on_gone`; returns when every queue thread
/// has ended (every device stopped).
fn run_devices<F>(
    ctrls: &[UblkCtrl],
    inits: Vec<F>,
    start: &Arc<QueueStart>,
    mut on_live: impl FnMut(usize, &UblkCtrl),
    mut on_gone: impl FnMut(usize, u32),
) -> Result<(), UblkFrontError>
where
    F: FnOnce(&mut UblkDev) -> Result<(), libublk::UblkError>,
{
    let ublk = |what| move |source| UblkFrontError::Ublk { what, source };
    let mut devs = Vec::with_capacity(ctrls.len());
    for (ctrl, init) in ctrls.iter().zip(inits) {
        let dev = UblkDev::new(ctrl.get_name(), init, ctrl)
            .map_err(ublk("setting up the ublk device"))?;
        devs.push(Arc::new(dev));
    }
    let threads = spawn_queues(ctrls, &devs, start)?;
    // on a failed start the threads stay out, waiting for requests: the daemon exits on the
    // error, and its exit ends them
    for (i, (ctrl, dev)) in ctrls.iter().zip(&devs).enumerate() {
        ctrl.start_dev(dev)
            .map_err(ublk("starting the ublk device"))?;
        on_live(i, ctrl);
    }
    let nr = threads.len() as u16;
    let mut held: Vec<Option<Arc<UblkDev>>> = devs.into_iter().map(Some).collect();
    while !threads.iter().all(|t| t.is_finished()) {
        std::thread::sleep(RELEASE_POLL);
        for (i, d) in start.devices.iter().enumerate() {
            if d.released.load(Relaxed) < nr || held[i].is_none() {
                continue;
            }
            // the last handle on the char device: the driver can free the device now
            held[i] = None;
            let _ = ctrls[i].del_dev();
            on_gone(i, ctrls[i].dev_info().dev_id);
        }
    }
    for (qid, t) in threads.into_iter().enumerate() {
        if t.join().is_err() {
            tracing::error!("queue {qid}: its thread panicked");
        }
    }
    for ctrl in ctrls {
        // the device may have been deleted from elsewhere already
        let _ = ctrl.stop_dev();
    }
    Ok(())
}

/// How often the daemon looks for a device whose queues have all let go of it.
const RELEASE_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// One thread per queue index, each serving that queue of every device of `devs` with `start`:
/// the thread marks itself an I/O flusher (its writes are the ones that free memory) and reports
/// its tid, which libublk records in each device's JSON and pins by the device's queue affinity.
fn spawn_queues(
    ctrls: &[UblkCtrl],
    devs: &[Arc<UblkDev>],
    start: &Arc<QueueStart>,
) -> Result<Vec<std::thread::JoinHandle<()>>, UblkFrontError> {
    let nr = devs.first().map_or(0, |d| d.dev_info.nr_hw_queues);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut threads = Vec::with_capacity(usize::from(nr));
    for qid in 0..nr {
        let (devs, start, tx) = (devs.to_vec(), start.clone(), tx.clone());
        let thread = std::thread::Builder::new()
            .name(format!("srp-ublk-q{qid}"))
            .spawn(move || {
                let tid = UblkCtrl::init_queue_thread();
                if tx.send((qid, tid)).is_ok() {
                    start.run(qid, devs);
                }
            })
            .map_err(|source| UblkFrontError::Setup {
                what: "starting a queue thread",
                source,
            })?;
        threads.push(thread);
    }
    drop(tx);
    for (qid, tid) in rx.iter().take(usize::from(nr)) {
        for (ctrl, dev) in ctrls.iter().zip(devs) {
            ctrl.set_thread_affinity(qid, tid);
            if let Err(e) = ctrl.configure_queue(dev, qid, tid) {
                tracing::warn!("queue {qid}: recording its thread in the device's JSON: {e}");
            }
        }
    }
    Ok(threads)
}

/// What each queue thread starts from: its channel (taken once), the devices it serves a queue
/// of, and what every queue shares.
struct QueueStart {
    channels: Mutex<Vec<Option<SrpChannel>>>,
    /// Each device's own parts, in the order of the ublk devices a thread is given.
    devices: Vec<DeviceParts>,
    timers: Timers,
    /// For a handover: when the previous daemon's channels went down.
    down_since: Option<Instant>,
    on_removed: Option<OnRemoved>,
    relogin: Relogin,
    waiting: Waiting,
    shared: Arc<SessionLink>,
}

/// One device's parts that its queue threads share: its LUN and geometry, its bound (moved by
/// a resize) and its queues' status.
struct DeviceParts {
    lun: ScsiLun,
    geo: Geometry,
    blocks: Arc<AtomicU64>,
    status: Arc<Vec<QueueStatus>>,
    /// The queue threads that have let go of the device after it stopped.
    released: AtomicU16,
}

impl QueueStart {
    /// Queue `qid`'s thread: serves queue `qid` of the devices `devs` (those of
    /// [`QueueStart::devices`], in order) until they stop.
    fn run(&self, qid: u16, devs: Vec<Arc<UblkDev>>) {
        let ch = self
            .channels
            .lock()
            .ok()
            .and_then(|mut v| v.get_mut(usize::from(qid)).and_then(Option::take));
        let Some(ch) = ch else {
            tracing::error!("queue {qid}: no SRP channel for this queue");
            return;
        };
        let tid = nix::unistd::gettid().as_raw();
        let mut queues = Vec::with_capacity(devs.len());
        for (dev, d) in devs.into_iter().zip(&self.devices) {
            let Some(status) = d.status.get(usize::from(qid)) else {
                return tracing::error!("queue {qid}: the device has no status for this queue");
            };
            status.tid.store(tid, Relaxed);
            queues.push(DeviceQueue {
                dev,
                released: &d.released,
                lun: d.lun,
                geo: d.geo,
                blocks: &d.blocks,
                status,
            });
        }
        let rport = match self.down_since {
            Some(at) => Rport::down_since(self.timers, at),
            None => Rport::new(self.timers),
        };
        let r = run_queue(
            qid,
            queues,
            ch,
            self.waiting,
            if qid == 0 {
                self.relogin.lead()
            } else {
                self.relogin.clone()
            },
            rport,
            self.on_removed.clone(),
            &self.shared,
        );
        if let Err(e) = r {
            tracing::error!("queue {qid}: {}", crate::Chain(&e));
        }
    }
}
