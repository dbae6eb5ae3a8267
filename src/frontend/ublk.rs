//! The ublk front end: `/dev/ublkbN` served by one thread per queue, each owning one SRP channel.
//!
//! Per queue thread (libublk's, pinned): the ublk io_uring delivers I/O commands; each becomes a SCSI
//! command (channel::block) sent on this queue's channel with a direct descriptor pointing at the
//! tag's buffer (registered once, at queue start) or as immediate data; completions are polled from
//! the channel's CQ on the same thread and committed back through the same ring. While commands are
//! in flight the loop busy-polls the CQ (the `adaptive` mode: for a bounded number of empty polls);
//! when idle it arms the CQ and sleeps in io_uring on a PollAdd of the completion channel fd.

use crate::backend::MemDisk;
use crate::channel::block::{BlockOp, FuaWrite, Geometry};
use crate::channel::{clock_ms, Channel, Done};
use crate::path::{Event, Path, PathError, SessionLink, DOWN_TICK};
use crate::rdma::{Endpoint, TagBufs};
pub use crate::session::rport::LinkState;
use crate::session::rport::Rport;
use crate::session::timers::Timers;
use crate::session::{LunInfo, Relogin, Session, RELOGIN_STEP};
use crate::stats::{IoCounters, IoKind, SharedIo};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::{UblkDev, UblkIOCtx, UblkQueue};
use libublk::{sys, BufDesc, BufDescList, UblkFlags, UblkIORes, UblkUringData};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// One queue's live counters, published by its thread only when it is about to sleep or every
/// 1024 loops (relaxed stores to its own cache line: nothing on the I/O path is shared) and read by
/// the daemon's state writer.
#[repr(align(64))]
#[derive(Debug, Default)]
pub struct QueueStatus {
    /// The queue thread's tid (0 until it runs).
    pub tid: AtomicI32,
    /// Credits now.
    pub req_lim: AtomicI32,
    /// SRP_CMDs sent.
    pub cmds: AtomicU64,
    /// Credit stalls.
    pub credit_stalls: AtomicU64,
    /// The channel's [`LinkState`].
    pub state: AtomicU8,
    /// Reconnects that succeeded.
    pub reconnects: AtomicU64,
    /// REPORTED LUNS DATA HAS CHANGED unit attentions seen (`up --supervise` then looks for new LUNs).
    pub luns_changed: AtomicU64,
    /// CAPACITY DATA HAS CHANGED unit attentions seen (the daemon then re-reads the capacity).
    pub capacity_changed: AtomicU64,
    /// Commands that timed out and were aborted (ABORT TASK).
    pub aborts: AtomicU64,
    /// Operations, bytes, errors and latencies (`srp-ublk stats`).
    pub io: SharedIo,
}

impl QueueStatus {
    fn publish(&self, path: &Path<Relogin>, io: &IoCounters) {
        let ch = path.channel();
        let st = ch.stats();
        self.reconnects.store(path.reconnects(), Relaxed);
        self.aborts.store(st.timeouts, Relaxed);
        self.io.publish(io);
        self.req_lim.store(ch.req_lim(), Relaxed);
        self.cmds.store(st.cmds, Relaxed);
        self.credit_stalls.store(st.credit_stalls, Relaxed);
        self.luns_changed.store(st.luns_changed, Relaxed);
        self.capacity_changed.store(st.capacity_changed, Relaxed);
        self.state.store(path.state() as u8, Relaxed);
    }
}

/// The device's size, kept by its capacity checks (the `capacity` thread): a check runs when a
/// queue meets CAPACITY DATA HAS CHANGED and when asked (`check`: SIGHUP, `srp-ublk resize`).
#[derive(Debug, Default)]
pub struct CapacityStatus {
    /// Ask for a check now.
    pub check: AtomicBool,
    /// Checks done (`srp-ublk resize` waits for it or `failures` to move).
    pub checks: AtomicU64,
    /// Checks that could not read the capacity or apply it (the log says why).
    pub failures: AtomicU64,
    /// The device's size in bytes.
    pub bytes: AtomicU64,
    /// A size the LUN has that the device could not take (no UPDATE_SIZE in this kernel's ublk);
    /// 0: none.
    pub pending: AtomicU64,
}

/// How a queue thread waits for completions.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum PollMode {
    /// Busy-poll the CQ whenever commands are in flight.
    Busy,
    /// Busy-poll for a bounded number of empty polls, then arm the CQ and sleep (the default) --
    /// when the machine has a core to spare for spinning (at least queues + 2 online CPUs: one for
    /// the application, one for the fabric); with fewer, spinning takes the cycles the completions
    /// need (measured in the lab: `just bench`), so the queue waits for interrupts instead.
    Adaptive,
    /// Always arm the CQ and sleep until its completion channel fires.
    Interrupt,
}

/// Empty polls before an adaptive queue sleeps.
const ADAPTIVE_SPINS: u32 = 2000;
const OP_POLL_CQ: u32 = 1;
const OP_POLL_CM: u32 = 2;
const OP_CANCEL: u32 = 3;
/// A Timeout SQE that wakes a sleeping queue for its channel's timed work (command timeouts,
/// delayed retries) while commands are outstanding.
const OP_TICK: u32 = 4;
/// A PollAdd on the queue's [`SessionLink`] eventfd: another queue's channel failed.
const OP_POLL_WAKE: u32 = 5;

/// Options of the ublk device.
#[derive(Clone, Debug)]
pub struct UblkOptions {
    /// Completion mode.
    pub poll: PollMode,
    /// CPUs to pin queue threads to (queue q gets `cpus[q % len]`); empty: the kernel's affinity.
    pub cpus: Vec<usize>,
    /// Device id to ask for (-1: any).
    pub dev_id: i32,
    /// The transport-class timers (reconnect_delay, fast_io_fail_tmo, dev_loss_tmo).
    pub timers: Timers,
    /// Take over device `dev_id`, left quiesced by a daemon that died (ublk user recovery), instead
    /// of creating one.
    pub recover: bool,
    /// What to do when the RDMA device under the channels is being removed (see [`Handover`]).
    pub on_removed: Option<OnRemoved>,
    /// The device's size and its capacity checks.
    pub capacity: Arc<CapacityStatus>,
}

/// Called by the first queue thread that finds its RDMA device being removed, with the ublk device
/// id and when the channel went down. librdmacm keeps a handle on every device it has used until
/// the process image ends, and the kernel finishes the removal only then; so the daemon replaces
/// its image (execve: same pid, every descriptor closed) with one that takes the device over by
/// ublk user recovery ([`UblkSource::Handover`]). Returns only if that failed; the queues then
/// hold I/O under their timers as for any outage.
#[derive(Clone)]
pub struct OnRemoved(pub Arc<dyn Fn(u32, SystemTime) + Send + Sync>);

impl std::fmt::Debug for OnRemoved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnRemoved(..)")
    }
}

/// What the device looked like once it was live.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LiveInfo {
    /// ublk device id.
    pub dev_id: u32,
    /// `/dev/ublkbN`.
    pub bdev: String,
}

/// A front end failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UblkFrontError {
    /// The device cannot be recovered by this session.
    #[error("{0}")]
    Recover(String),
    /// Setting up the queues' shared state failed.
    #[error("{0}")]
    Setup(String),
    /// libublk or the driver refused.
    #[error("{what}: {source}")]
    Ublk {
        /// The step.
        what: &'static str,
        /// libublk's error.
        #[source]
        source: libublk::UblkError,
    },
}

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
            max_write_zeroes_sectors: lun
                .max_write_same_blocks(max_io)
                .saturating_mul(sectors_per_block),
            max_discard_segments: 1,
            reserved0: 0,
        };
    }
    p
}

/// A device taken over, without a login, from a daemon whose RDMA device went away: its channels
/// start down (on detached endpoints, [`crate::session::detached_channels`]) and log in with their
/// first reconnect; the timers count from `down_since`, when the previous daemon's channel went
/// down.
pub struct Handover {
    /// One channel per queue, each down.
    pub channels: Vec<Channel<Endpoint>>,
    /// How they log in.
    pub relogin: Relogin,
    /// Queue depth (the device's).
    pub depth: u16,
    /// The LUN's block mapping, as the previous daemon had it.
    pub geometry: Geometry,
    /// The ublk buffer size per tag.
    pub max_io: u32,
    /// When the channels went down.
    pub down_since: Instant,
}

/// What a ublk device is served from.
pub enum UblkSource {
    /// An SRP session: one channel per queue.
    Srp(Box<Session>),
    /// A device taken over after an RDMA device removal (user recovery only).
    Handover(Box<Handover>),
    /// A demo/benchmark backend (not storage): RAM (`Some`) or zeros with writes discarded (`None`).
    Demo {
        /// Size in bytes.
        size: u64,
        /// The RAM disk, for `mem:`.
        disk: Option<Arc<MemDisk>>,
        /// Queues.
        queues: u16,
        /// Depth.
        depth: u16,
    },
}

fn demo_params(size: u64, max_io: u32) -> sys::ublk_params {
    sys::ublk_params {
        types: sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD,
        basic: sys::ublk_param_basic {
            logical_bs_shift: 9,
            physical_bs_shift: 12,
            io_opt_shift: 12,
            io_min_shift: 12,
            max_sectors: max_io >> 9,
            dev_sectors: size >> 9,
            ..Default::default()
        },
        discard: sys::ublk_param_discard {
            discard_granularity: 4096,
            max_discard_sectors: u32::MAX >> 9,
            max_write_zeroes_sectors: u32::MAX >> 9,
            max_discard_segments: 1,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Creates `/dev/ublkbN` over the source (one SRP channel per queue) and serves it until the device is
/// stopped (`srp-ublk del`, or the signal handler calling `kill_dev`). `on_live` runs once it is live.
pub fn serve(
    source: UblkSource,
    opts: UblkOptions,
    status: Arc<Vec<QueueStatus>>,
    on_live: impl FnOnce(LiveInfo) + Send + Sync + 'static,
) -> Result<(), UblkFrontError> {
    // a new device gets its parameters from the LUN; one taken over keeps the ones it has
    let (channels, relogin, depth, max_io, params, geo, down_since) = match source {
        UblkSource::Srp(s) => {
            let max_io = s.lun.max_io_bytes(s.target.opts.max_sect);
            let params = Some(ublk_params(&s.lun, max_io));
            let geo = s.lun.geometry();
            (s.channels, s.relogin, s.depth, max_io, params, geo, None)
        }
        UblkSource::Handover(h) if opts.recover => {
            let h = *h;
            let at = Some(h.down_since);
            let (geo, max_io) = (h.geometry, h.max_io);
            (h.channels, h.relogin, h.depth, max_io, None, geo, at)
        }
        UblkSource::Handover(_) => {
            return Err(UblkFrontError::Recover(
                "a handover takes an existing device over: it needs recovery (-n N --recover)"
                    .into(),
            ))
        }
        UblkSource::Demo {
            size,
            disk,
            queues,
            depth,
        } => return serve_demo(size, disk, queues, depth, opts, status, on_live),
    };
    let nr_queues = channels.len() as u16;
    let size = geo.blocks << geo.block_shift;
    let channels: Arc<Mutex<Vec<Option<Channel<Endpoint>>>>> =
        Arc::new(Mutex::new(channels.into_iter().map(Some).collect()));
    let ctrl = if opts.recover {
        recover_ctrl(opts.dev_id, nr_queues, depth, max_io)?
    } else {
        build_ctrl("srp-ublk", opts.dev_id, nr_queues, depth, max_io)?
    };
    let tgt_init = move |dev: &mut UblkDev| {
        dev.set_default_params(size);
        if let Some(p) = params {
            dev.tgt.params = p;
        }
        // room for the two PollAdds next to the depth's ublk commands
        dev.tgt.sq_depth = depth + 8;
        dev.tgt.cq_depth = depth + 8;
        Ok(())
    };
    let mode = effective_mode(opts.poll, nr_queues);
    let timers = opts.timers;
    let on_removed = opts.on_removed.clone();
    let cpus = opts.cpus.clone();
    let status2 = status.clone();
    let shared = Arc::new(
        SessionLink::new(nr_queues, geo.blocks)
            .map_err(|e| UblkFrontError::Setup(format!("creating the queues' eventfds: {e}")))?,
    );
    opts.capacity.bytes.store(size, Relaxed);
    let watch = CapacityWatch {
        dev_id: ctrl.dev_info().dev_id,
        relogin: relogin.clone(),
        shared: shared.clone(),
        queues: status.clone(),
        capacity: opts.capacity.clone(),
        block_shift: geo.block_shift,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    std::thread::Builder::new()
        .name("capacity".into())
        .spawn(move || watch.run(&stop2))
        .map_err(|e| UblkFrontError::Setup(format!("starting the capacity watch: {e}")))?;
    let q_fn = move |qid: u16, dev: &UblkDev| {
        let ch = channels
            .lock()
            .ok()
            .and_then(|mut v| v.get_mut(usize::from(qid)).and_then(Option::take));
        let Some(ch) = ch else {
            tracing::error!("queue {qid}: no SRP channel for this queue");
            return;
        };
        let Some(st) = status.get(usize::from(qid)) else {
            return;
        };
        st.tid.store(nix::unistd::gettid().as_raw(), Relaxed);
        let rport = match down_since {
            Some(at) => Rport::down_since(timers, at),
            None => Rport::new(timers),
        };
        let removed = on_removed.clone();
        let r = run_queue(
            qid,
            dev,
            ch,
            geo,
            mode,
            relogin.clone(),
            rport,
            removed,
            st,
            &shared,
        );
        if let Err(e) = r {
            tracing::error!("queue {qid}: {e}");
        }
    };
    let res = ctrl.run_target(tgt_init, q_fn, move |c| {
        // libublk pins each queue thread to the kernel's queue affinity as it starts; --cpus
        // overrides that here, once every queue thread runs and before anyone sees the device
        if !cpus.is_empty() {
            for (qid, st) in status2.iter().enumerate() {
                pin(st.tid.load(Relaxed), cpus[qid % cpus.len()], qid);
            }
        }
        let info = LiveInfo {
            dev_id: c.dev_info().dev_id,
            bdev: c.get_bdev_path(),
        };
        on_live(info);
    });
    stop.store(true, Relaxed);
    let _ = ctrl.del_dev();
    res.map(|_| ()).map_err(|source| UblkFrontError::Ublk {
        what: "running the ublk device",
        source,
    })
}

/// How often the capacity watch looks at the queues' unit attention counts and for a request.
const CAPACITY_POLL: Duration = Duration::from_millis(500);

/// The daemon's capacity checks: off the I/O path, on a thread of their own, each on a channel of
/// its own ([`Relogin::read_capacity`]).
struct CapacityWatch {
    dev_id: u32,
    relogin: Relogin,
    shared: Arc<SessionLink>,
    queues: Arc<Vec<QueueStatus>>,
    capacity: Arc<CapacityStatus>,
    block_shift: u32,
}

impl CapacityWatch {
    fn unit_attentions(&self) -> u64 {
        self.queues
            .iter()
            .map(|q| q.capacity_changed.load(Relaxed))
            .sum()
    }

    fn run(&self, stop: &AtomicBool) {
        let mut seen = self.unit_attentions();
        while !stop.load(Relaxed) {
            std::thread::sleep(CAPACITY_POLL);
            let n = self.unit_attentions();
            let asked = self.capacity.check.swap(false, Relaxed);
            if n == seen && !asked {
                continue;
            }
            seen = n;
            let why = if asked {
                "asked for"
            } else {
                "the target reported CAPACITY DATA HAS CHANGED"
            };
            let counter = match self.check(why) {
                Ok(()) => &self.capacity.checks,
                Err(()) => &self.capacity.failures,
            };
            counter.fetch_add(1, Relaxed);
        }
    }

    /// Re-reads the LUN's capacity and resizes the device to it where the kernel's ublk can
    /// (UPDATE_SIZE, Linux 6.16); elsewhere says so and records the size as pending. Err: the
    /// capacity could not be read or applied (logged).
    fn check(&self, why: &str) -> Result<(), ()> {
        let dev = format!("/dev/ublkb{}", self.dev_id);
        let cap = match self.relogin.read_capacity(RELOGIN_STEP) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("{dev}: capacity check ({why}) failed: {e}");
                return Err(());
            }
        };
        let old = self.capacity.bytes.load(Relaxed);
        let new = cap.bytes().unwrap_or(0);
        if cap.block_len != 1 << self.block_shift {
            tracing::error!(
                "{dev}: the LUN's logical block size is now {} bytes (was {}): a device cannot \
                 change it; `srp-ublk del` and `add` it again",
                cap.block_len,
                1u32 << self.block_shift
            );
            return Err(());
        }
        if new == old {
            tracing::info!("{dev}: capacity check ({why}): unchanged, {new} bytes");
            self.capacity.pending.store(0, Relaxed);
            return Ok(());
        }
        let can =
            UblkCtrl::get_features().is_some_and(|f| f & u64::from(sys::UBLK_F_UPDATE_SIZE) != 0);
        if !can {
            tracing::warn!(
                "{dev}: the LUN's capacity changed from {old} to {new} bytes ({why}), but this \
                 kernel's ublk cannot resize a live device (UPDATE_SIZE, Linux 6.16): the device \
                 stays at {old} bytes; `srp-ublk del` and `add` it again for the new size"
            );
            self.capacity.pending.store(new, Relaxed);
            return Ok(());
        }
        let blocks = cap.blocks();
        // growing, the queues take the new blocks before the kernel can send them; shrinking,
        // only once the kernel has stopped sending the old ones
        let before = self.shared.blocks.load(Relaxed);
        self.shared.blocks.store(blocks.max(before), Relaxed);
        let r = UblkCtrl::new_simple(self.dev_id as i32).and_then(|c| c.update_size(new));
        if let Err(e) = r {
            self.shared.blocks.store(before, Relaxed);
            tracing::warn!("{dev}: resizing from {old} to {new} bytes ({why}) failed: {e}");
            self.capacity.pending.store(new, Relaxed);
            return Err(());
        }
        self.shared.blocks.store(blocks, Relaxed);
        self.capacity.bytes.store(new, Relaxed);
        self.capacity.pending.store(0, Relaxed);
        tracing::warn!("{dev}: resized from {old} to {new} bytes ({why})");
        Ok(())
    }
}

/// `adaptive` spins only with a core to spare (see [`PollMode::Adaptive`]).
fn effective_mode(mode: PollMode, queues: u16) -> PollMode {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if mode == PollMode::Adaptive && cpus < usize::from(queues) + 2 {
        tracing::info!(
            "adaptive polling: {cpus} CPUs for {queues} queue(s) leave no core to spin on; \
             completions wait for interrupts (--poll busy forces spinning)"
        );
        return PollMode::Interrupt;
    }
    mode
}

fn build_ctrl(
    name: &str,
    id: i32,
    queues: u16,
    depth: u16,
    max_io: u32,
) -> Result<UblkCtrl, UblkFrontError> {
    UblkCtrlBuilder::default()
        .name(name)
        .id(id)
        .nr_queues(queues)
        .depth(depth)
        .io_buf_bytes(max_io)
        .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
        // if the daemon dies the device waits, quiesced, for `srp-ublk recover`; what was in flight
        // is issued again to the new daemon, so applications see no error
        .ctrl_flags(u64::from(
            sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE,
        ))
        .build()
        .map_err(|source| UblkFrontError::Ublk {
            what: "creating the ublk device (is ublk_drv loaded?)",
            source,
        })
}

/// How long a device whose daemon is gone may stay live before ublk quiesces it.
const QUIESCE_WAIT: Duration = Duration::from_secs(30);

/// Takes over device `id`, which a dead daemon left quiesced: checks it is waiting for recovery
/// with the queues and depth this session serves, then starts user recovery.
fn recover_ctrl(id: i32, queues: u16, depth: u16, max_io: u32) -> Result<UblkCtrl, UblkFrontError> {
    let ublk = |what, source| UblkFrontError::Ublk { what, source };
    // ublk quiesces a device shortly after its daemon's queues are gone (an exec'd daemon image
    // comes here at once): give it that time
    let deadline = Instant::now() + QUIESCE_WAIT;
    let old = loop {
        let c = UblkCtrl::new_simple(id).map_err(|e| ublk("opening the device to recover", e))?;
        if u32::from(c.dev_info().state) != sys::UBLK_S_DEV_LIVE || Instant::now() >= deadline {
            break c;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let info = old.dev_info();
    if u32::from(info.state) != sys::UBLK_S_DEV_QUIESCED {
        return Err(UblkFrontError::Recover(format!(
            "/dev/ublkb{id} is not waiting for recovery (its daemon is alive, or it was not \
             created with recovery): nothing to recover"
        )));
    }
    if info.nr_hw_queues != queues || info.queue_depth > depth {
        return Err(UblkFrontError::Recover(format!(
            "/dev/ublkb{id} has {} queue(s) x depth {}, but the target now gives {queues} channel(s) \
             x depth {depth}; recovery needs at least as much (check the target's credits and \
             ch_count), or delete the device and add it again",
            info.nr_hw_queues, info.queue_depth
        )));
    }
    old.start_user_recover()
        .map_err(|e| ublk("starting user recovery", e))?;
    // libublk sizes its per-queue bookkeeping from these, as for a new device
    UblkCtrlBuilder::default()
        .name("srp-ublk")
        .id(id)
        .nr_queues(info.nr_hw_queues)
        .depth(info.queue_depth)
        .io_buf_bytes(max_io)
        .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV)
        .build()
        .map_err(|e| ublk("taking the device over", e))
}

fn serve_demo(
    size: u64,
    disk: Option<Arc<MemDisk>>,
    queues: u16,
    depth: u16,
    opts: UblkOptions,
    status: Arc<Vec<QueueStatus>>,
    on_live: impl FnOnce(LiveInfo) + Send + Sync + 'static,
) -> Result<(), UblkFrontError> {
    const MAX_IO: u32 = 512 * 1024;
    let ctrl = build_ctrl("srp-ublk-demo", opts.dev_id, queues, depth, MAX_IO)?;
    let tgt_init = move |dev: &mut UblkDev| {
        dev.set_default_params(size);
        dev.tgt.params = demo_params(size, MAX_IO);
        Ok(())
    };
    let q_fn = move |qid: u16, dev: &UblkDev| {
        if let Some(st) = status.get(usize::from(qid)) {
            st.tid.store(nix::unistd::gettid().as_raw(), Relaxed);
        }
        if let Err(e) = run_demo_queue(qid, dev, disk.as_deref(), size) {
            tracing::error!("queue {qid}: {e}");
        }
    };
    let res = ctrl.run_target(tgt_init, q_fn, move |c| {
        on_live(LiveInfo {
            dev_id: c.dev_info().dev_id,
            bdev: c.get_bdev_path(),
        });
    });
    let _ = ctrl.del_dev();
    res.map(|_| ()).map_err(|source| UblkFrontError::Ublk {
        what: "running the ublk device",
        source,
    })
}

/// A demo queue: every command completes at once, from RAM or zeros.
fn run_demo_queue(
    qid: u16,
    dev: &UblkDev,
    disk: Option<&MemDisk>,
    size: u64,
) -> Result<(), QueueError> {
    let ublk = |what: &'static str| move |source| QueueError::Ublk { what, source };
    let q = UblkQueue::new(qid, dev).map_err(ublk("creating the queue"))?;
    let mut bufs = dev.alloc_queue_io_bufs();
    let q = q
        .submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs)))
        .map_err(ublk("submitting FETCH commands"))?;
    loop {
        let r = q.flush_and_wake_io_tasks(
            |data, cqe, _last| {
                if data & UblkUringData::Target as u64 != 0
                    || cqe.result() != sys::UBLK_IO_RES_OK as i32
                {
                    return;
                }
                let tag = UblkIOCtx::user_data_to_tag(data) as u16;
                let iod = q.get_iod(tag);
                let (off, len) = (iod.start_sector << 9, (iod.nr_sectors << 9) as usize);
                let buf = bufs[usize::from(tag)].as_mut_slice();
                let res = if off + len as u64 > size || len > buf.len() {
                    -libc::EIO
                } else {
                    match iod.op_flags & 0xff {
                        sys::UBLK_IO_OP_READ => {
                            match disk {
                                Some(d) => d.read(off, &mut buf[..len]),
                                None => buf[..len].fill(0),
                            }
                            len as i32
                        }
                        sys::UBLK_IO_OP_WRITE => {
                            if let Some(d) = disk {
                                d.write(off, &buf[..len]);
                            }
                            len as i32
                        }
                        sys::UBLK_IO_OP_FLUSH => 0,
                        sys::UBLK_IO_OP_DISCARD | sys::UBLK_IO_OP_WRITE_ZEROES => {
                            if let Some(d) = disk {
                                d.zero(off, len);
                            }
                            0
                        }
                        _ => -libc::EOPNOTSUPP,
                    }
                };
                let _ =
                    q.complete_io_cmd_unified(tag, BufDesc::Slice(buf), Ok(UblkIORes::Result(res)));
            },
            1,
        );
        if r.is_err() {
            return Ok(());
        }
    }
}

fn pin(tid: i32, cpu: usize, qid: usize) {
    let mut set = nix::sched::CpuSet::new();
    let r = set
        .set(cpu)
        .and_then(|_| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set));
    if let Err(e) = r {
        tracing::warn!("queue {qid}: cannot pin thread {tid} to CPU {cpu}: {e}");
    }
}

/// What a queue thread can fail on before it serves.
#[derive(Debug, thiserror::Error)]
enum QueueError {
    /// libublk refused a step.
    #[error("{what}: {source}")]
    Ublk {
        what: &'static str,
        #[source]
        source: libublk::UblkError,
    },
    /// The path could not be set up.
    #[error(transparent)]
    Path(#[from] PathError),
}

/// What each tag's command is, and the queue's counters (kept here, published by
/// [`QueueStatus::publish`]).
struct Pending {
    tags: Vec<TagIo>,
    io: IoCounters,
}

/// A tag's command: its length, whether its result is a byte count, its kind and when it came.
#[derive(Clone, Copy)]
struct TagIo {
    len: u32,
    rw: bool,
    kind: IoKind,
    started: Instant,
}

/// What a queue does besides its path: the device it belongs to and the polls it has armed on
/// the path's fds (each tagged with the path's login generation).
struct Queue<'a> {
    qid: u16,
    q: &'a UblkQueue<'a>,
    geo: Geometry,
    shared: &'a SessionLink,
    status: &'a QueueStatus,
    dev_id: u32,
    on_removed: Option<OnRemoved>,
    /// The login generation `cq_poll` and `cm_poll` were armed on.
    armed_gen: u16,
    cq_poll: bool,
    cm_poll: bool,
    wake_poll: bool,
    tick_poll: bool,
    /// The Timeout SQE's duration: read by the kernel when the SQE is submitted.
    tick_ts: io_uring::types::Timespec,
}

#[allow(clippy::too_many_arguments)]
fn run_queue(
    qid: u16,
    dev: &UblkDev,
    ch: Channel<Endpoint>,
    geo: Geometry,
    mode: PollMode,
    relogin: Relogin,
    rport: Rport,
    on_removed: Option<OnRemoved>,
    status: &QueueStatus,
    shared: &Arc<SessionLink>,
) -> Result<(), QueueError> {
    let ublk = |what: &'static str| move |source| QueueError::Ublk { what, source };
    init_ring(dev).map_err(ublk("setting up the queue's io_uring"))?;
    let q = UblkQueue::new(qid, dev).map_err(ublk("creating the queue"))?;
    let depth = q.get_depth() as u16;
    let bufs = TagBufs::new(depth, dev.dev_info.max_io_buf_bytes);
    // a channel that starts down (a handover) holds I/O before the first command can arrive; it
    // logs in from the loop, once the ring has taken the FETCH commands
    let mut path = Path::new(ch, relogin, bufs, rport, format!("queue {qid}"))?;
    path.join(shared.clone(), qid);
    let mut pending = Pending {
        tags: vec![
            TagIo {
                len: 0,
                rw: false,
                kind: IoKind::Other,
                started: Instant::now(),
            };
            usize::from(depth)
        ],
        io: IoCounters::default(),
    };
    let q = q
        .submit_fetch_commands_unified(BufDescList::Slices(Some(path.bufs().ios())))
        .map_err(ublk("submitting FETCH commands"))?;
    let mut qu = Queue {
        qid,
        q: &q,
        geo,
        shared,
        status,
        dev_id: dev.dev_info.dev_id,
        on_removed,
        armed_gen: path.gen(),
        cq_poll: false,
        cm_poll: false,
        wake_poll: false,
        tick_poll: false,
        tick_ts: Duration::ZERO.into(),
    };
    qu.serve(&mut path, &mut pending, mode);
    path.close(&mut |d, b| commit(&q, b, &mut pending, d));
    status.publish(&path, &pending.io);
    Ok(())
}

impl Queue<'_> {
    /// The queue's loop, until the device stops.
    fn serve(&mut self, path: &mut Path<Relogin>, pending: &mut Pending, mode: PollMode) {
        let (mut spins, mut loops) = (0u32, 0u32);
        self.status.publish(path, &pending.io);
        loop {
            if !self.wake_poll {
                let fd = self.shared.wake_fd(self.qid);
                self.wake_poll = submit_poll(self.q, fd, OP_POLL_WAKE, 0);
            }
            loops = loops.wrapping_add(1);
            let up = path.is_up();
            path.tick(clock_ms());
            if let (false, Some(fd)) = (self.cm_poll, path.cm_fd()) {
                self.cm_poll = submit_poll(self.q, fd, OP_POLL_CM, path.gen());
            }
            let busy = path.busy() > 0;
            let spin = up
                && match mode {
                    PollMode::Busy => busy,
                    PollMode::Adaptive => busy && spins < ADAPTIVE_SPINS,
                    PollMode::Interrupt => false,
                };
            // while down, the loop ticks (DOWN_TICK) instead of sleeping on the ring
            let mut to_wait = if spin || !up { 0 } else { 1 };
            if to_wait == 1 || loops % 1024 == 0 {
                self.status.publish(path, &pending.io);
            }
            if to_wait == 1 && self.prepare_sleep(path, pending) {
                to_wait = 0;
            }
            let (cq_fired, cm_fired, r) = self.reap(path, pending, to_wait, up, loops);
            if cq_fired {
                self.cq_poll = false;
                path.ack();
            }
            if cm_fired {
                self.cm_poll = false;
                path.drain_cm();
            }
            if !self.wake_poll {
                self.shared.ack_wake(self.qid);
            }
            let (n, event) =
                path.service(Instant::now(), &mut |d, b| commit(self.q, b, pending, d));
            self.follow_login(path);
            spins = if n > 0 || !busy {
                0
            } else {
                spins.saturating_add(1)
            };
            if !path.is_up() {
                self.status.publish(path, &pending.io);
            }
            match event {
                Some(Event::Removed { since }) => {
                    if let Some(OnRemoved(f)) = &self.on_removed {
                        f(self.dev_id, since);
                    }
                }
                Some(Event::Lost) => {
                    tracing::error!("queue {}: removing the device", self.qid);
                    // the same path as `srp-ublk del`: the daemon's signal thread stops the device
                    let _ =
                        nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::SIGTERM);
                }
                None => {}
            }
            if !path.is_up() && r.is_ok() {
                std::thread::sleep(DOWN_TICK);
            }
            if r.is_err() {
                return;
            }
        }
    }

    /// The path's login changed (it went down): cancel the polls armed on the old login's fds,
    /// they would never fire again.
    fn follow_login(&mut self, path: &Path<Relogin>) {
        if path.gen() == self.armed_gen {
            return;
        }
        for (armed, op) in [(self.cq_poll, OP_POLL_CQ), (self.cm_poll, OP_POLL_CM)] {
            if armed {
                cancel_poll(self.q, op, self.armed_gen);
            }
        }
        (self.cq_poll, self.cm_poll) = (false, false);
        self.armed_gen = path.gen();
    }

    /// Arms what wakes a sleeping queue: the completion channel and, while commands are out, a
    /// timer for the channel's timed work. Returns whether something completed meanwhile.
    fn prepare_sleep(&mut self, path: &mut Path<Relogin>, pending: &mut Pending) -> bool {
        if !self.cq_poll {
            if let Some(fd) = path.arm() {
                self.cq_poll = submit_poll(self.q, fd, OP_POLL_CQ, path.gen());
            }
        }
        // a completion may have landed before the arm took effect (what else `service` reports
        // the loop sees on its next pass)
        let (n, _) = path.service(Instant::now(), &mut |d, b| commit(self.q, b, pending, d));
        self.follow_login(path);
        if let (false, Some(t)) = (self.tick_poll, path.next_tick_in()) {
            self.tick_ts = t
                .clamp(Duration::from_millis(1), Duration::from_secs(1))
                .into();
            let sqe = io_uring::opcode::Timeout::new(&self.tick_ts)
                .build()
                .user_data(UblkIOCtx::build_user_data(0, OP_TICK, 0, true));
            self.tick_poll = self.q.ublk_submit_sqe_sync(sqe).is_ok();
        }
        n > 0
    }

    /// Submits and reaps the ring (waiting for `to_wait` completions): starts every new ublk
    /// command, notes which polls fired. Returns (CQ poll fired, CM poll fired, the ring's result).
    fn reap(
        &mut self,
        path: &mut Path<Relogin>,
        pending: &mut Pending,
        to_wait: usize,
        up: bool,
        loops: u32,
    ) -> (bool, bool, Result<i32, libublk::UblkError>) {
        let (mut cq_fired, mut cm_fired) = (false, false);
        // commands arriving after a sleep are stamped with the time they arrive
        let mut clock_set = false;
        // A spin with nothing to submit, reap or run in the kernel skips io_uring_enter (one in 64
        // enters anyway, should a kernel not raise the task-run flag).
        if to_wait == 0 && up && loops % 64 != 0 && !ring_needs_enter() {
            return (false, false, Ok(0));
        }
        let q = self.q;
        let gen = self.armed_gen;
        let geo = Geometry {
            blocks: self.shared.blocks.load(Relaxed),
            ..self.geo
        };
        let (tick_poll, wake_poll) = (&mut self.tick_poll, &mut self.wake_poll);
        let r = q.flush_and_wake_io_tasks(
            |data, cqe, _last| {
                if data & UblkUringData::Target as u64 != 0 {
                    // a poll armed on an earlier login's fds means nothing now
                    let current = UblkIOCtx::user_data_to_tag(data) as u16 == gen;
                    match UblkIOCtx::user_data_to_op(data) {
                        OP_POLL_CQ if current => cq_fired = true,
                        OP_POLL_CM if current => cm_fired = true,
                        OP_TICK => *tick_poll = false,
                        OP_POLL_WAKE => *wake_poll = false,
                        _ => {}
                    }
                } else if cqe.result() == sys::UBLK_IO_RES_OK as i32 {
                    if !clock_set {
                        path.set_clock(clock_ms());
                        clock_set = true;
                    }
                    let tag = UblkIOCtx::user_data_to_tag(data) as u16;
                    start_io(q, path, pending, geo, tag);
                }
            },
            to_wait,
        );
        (cq_fired, cm_fired, r)
    }
}

/// Sets up this thread's io_uring before libublk would (same sizes, cooperative task running) and
/// adds IORING_SETUP_TASKRUN_FLAG. With cooperative task running, ublk's new I/O commands and the
/// PollAdd completions become visible only after the thread enters the kernel; the flag says when such
/// work is waiting, so a queue spinning on its RDMA CQ needs no syscall per spin.
fn init_ring(dev: &UblkDev) -> Result<(), libublk::UblkError> {
    let (sq, cq) = (u32::from(dev.tgt.sq_depth), u32::from(dev.tgt.cq_depth));
    libublk::io::ublk_init_task_ring(|cell| {
        if cell.get().is_none() {
            let ring = io_uring::IoUring::builder()
                .setup_cqsize(cq)
                .setup_coop_taskrun()
                .setup_taskrun_flag()
                .build(sq)
                .map_err(libublk::UblkError::IOError)?;
            cell.set(std::cell::RefCell::new(ring))
                .map_err(|_| libublk::UblkError::OtherError(-libc::EEXIST))?;
        }
        Ok(())
    })
}

/// Whether the ring has SQEs to submit, CQEs to reap or task work the kernel runs on the next enter.
fn ring_needs_enter() -> bool {
    libublk::io::with_task_io_ring_mut(|r| {
        let mut sq = r.submission();
        sq.sync();
        if !sq.is_empty() || sq.taskrun() || sq.cq_overflow() {
            return true;
        }
        drop(sq);
        !r.completion().is_empty()
    })
}

/// A PollAdd on `fd`; its user data carries the endpoint generation in the tag field.
fn submit_poll(q: &UblkQueue, fd: i32, op: u32, gen: u16) -> bool {
    let sqe = io_uring::opcode::PollAdd::new(io_uring::types::Fd(fd), libc::POLLIN as u32)
        .build()
        .user_data(UblkIOCtx::build_user_data(gen, op, 0, true));
    q.ublk_submit_sqe_sync(sqe).is_ok()
}

/// Cancels the PollAdd `op` of generation `gen` (its fd is about to close).
fn cancel_poll(q: &UblkQueue, op: u32, gen: u16) {
    let sqe = io_uring::opcode::AsyncCancel::new(UblkIOCtx::build_user_data(gen, op, 0, true))
        .build()
        .user_data(UblkIOCtx::build_user_data(gen, OP_CANCEL, 0, true));
    let _ = q.ublk_submit_sqe_sync(sqe);
}

/// Completes a finished command to ublk: a read's or write's byte count, or its errno.
fn commit(q: &UblkQueue, bufs: &TagBufs, pending: &mut Pending, d: Done) {
    let tag = d.tag;
    let t = pending.tags[usize::from(tag)];
    let res = match d.outcome.bytes(t.len) {
        Ok(n) => {
            if t.rw {
                n as i32
            } else {
                0
            }
        }
        Err(errno) => -errno,
    };
    let us = t.started.elapsed().as_micros() as u64;
    pending.io.record(t.kind, t.len, res >= 0, us);
    let _ = q.complete_io_cmd_unified(
        tag,
        BufDesc::Slice(bufs.ios()[usize::from(tag)].as_slice()),
        Ok(UblkIORes::Result(res)),
    );
}

/// Starts ublk command `tag` on the path, or completes it at once with its error.
fn start_io(
    q: &UblkQueue,
    path: &mut Path<Relogin>,
    pending: &mut Pending,
    geo: Geometry,
    tag: u16,
) {
    let iod = q.get_iod(tag);
    let op = iod.op_flags & 0xff;
    let flags = iod.op_flags;
    let off = iod.start_sector << 9;
    let len = iod.nr_sectors << 9;
    let block_op = match op {
        sys::UBLK_IO_OP_READ => Some(BlockOp::Read),
        sys::UBLK_IO_OP_WRITE => Some(BlockOp::Write {
            fua: flags & sys::UBLK_IO_F_FUA != 0,
        }),
        sys::UBLK_IO_OP_FLUSH => Some(BlockOp::Flush),
        sys::UBLK_IO_OP_DISCARD => Some(BlockOp::Discard),
        sys::UBLK_IO_OP_WRITE_ZEROES => Some(BlockOp::WriteZeroes {
            may_unmap: flags & sys::UBLK_IO_F_NOUNMAP == 0,
        }),
        _ => None,
    };
    let idx = usize::from(tag);
    pending.tags[idx] = TagIo {
        len,
        rw: matches!(block_op, Some(BlockOp::Read | BlockOp::Write { .. })),
        kind: match block_op {
            Some(BlockOp::Read) => IoKind::Read,
            Some(BlockOp::Write { .. }) => IoKind::Write,
            _ => IoKind::Other,
        },
        started: Instant::now(),
    };
    let result = match block_op {
        None => Err(libc::EOPNOTSUPP),
        Some(bop) => path.submit(tag, bop, off, len, &geo),
    };
    if let Err(errno) = result {
        pending.io.record(pending.tags[idx].kind, len, false, 0);
        let _ = q.complete_io_cmd_unified(
            tag,
            BufDesc::Slice(path.bufs().ios()[idx].as_slice()),
            Ok(UblkIORes::Result(-errno)),
        );
    }
}
