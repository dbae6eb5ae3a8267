//! The ublk front end: `/dev/ublkbN` served by one thread per queue, each owning one SRP channel.
//!
//! Per queue thread (libublk's, pinned): the ublk io_uring delivers I/O commands; each becomes a SCSI
//! command (channel::block) sent on this queue's channel with a direct descriptor pointing at the
//! tag's buffer (registered once, at queue start) or as immediate data; completions are polled from
//! the channel's CQ on the same thread and committed back through the same ring. While commands are
//! in flight the loop busy-polls the CQ (the `adaptive` mode: for a bounded number of empty polls);
//! when idle it arms the CQ and sleeps in io_uring on a PollAdd of the completion channel fd.

use crate::backend::MemDisk;
use crate::channel::block::Geometry;
pub use crate::frontend::status::{LinkState, QueueStatus};
use crate::session::timers::Timers;
use crate::session::{Relogin, Session, SrpChannel};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::{sys, UblkFlags};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

mod capacity;
mod demo;
mod queue;
mod requests;
mod slots;
mod srp;
mod zeroing;

use demo::serve_demo;
use srp::{serve_srp, SrpParts};

pub use super::capacity::CapacityStatus;

/// How a queue thread waits for completions.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum PollMode {
    /// Busy-poll the CQ whenever commands are in flight.
    Busy,
    /// Busy-poll for a bounded number of empty polls, then arm the CQ and sleep (the default).
    /// With a core to spare for spinning (at least queues + 2 online CPUs: one for the
    /// application, one for the fabric) a queue spins whenever commands are out; with fewer, only
    /// while one command is out: at low depth the machine waits for that command anyway and the
    /// spin saves the wake-up, at high depth spinning takes the cycles the completions need; with
    /// one CPU never, as `interrupt` (measured in the lab: `just bench`, docs/bench/performance-record.md).
    Adaptive,
    /// Always arm the CQ and sleep until its completion channel fires.
    Interrupt,
}

/// Options of the ublk device.
#[derive(Clone, Debug)]
pub struct UblkOptions {
    /// Completion mode.
    pub poll: PollMode,
    /// CPUs to pin queue threads to (queue q gets `cpus[q % len]`); empty: the next queue's
    /// CPUs (queue q on queue q+1's affinity).
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
    /// A handover was asked for without recovery.
    #[error("a handover takes an existing device over: it needs recovery (-n N --recover)")]
    HandoverNeedsRecovery,
    /// The device is not waiting for recovery.
    #[error(
        "/dev/ublkb{id} is not waiting for recovery (its daemon is alive, or it was not created \
         with recovery): nothing to recover"
    )]
    NotQuiesced {
        /// The device id.
        id: i32,
    },
    /// The device has more queues or a deeper queue than this session can serve.
    #[error(
        "/dev/ublkb{id} has {queues} queue(s) x depth {depth}, but the target now gives \
         {have_queues} channel(s) x depth {have_depth}; recovery needs at least as much (check the \
         target's credits and ch_count), or delete the device and add it again"
    )]
    RecoverShape {
        /// The device id.
        id: i32,
        /// The device's queues and depth.
        queues: u16,
        /// The device's queue depth.
        depth: u16,
        /// The channels this session has.
        have_queues: u16,
        /// Their depth.
        have_depth: u16,
    },
    /// Setting up the queues' shared state failed.
    #[error("{what}")]
    Setup {
        /// The step.
        what: &'static str,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// libublk or the driver refused.
    #[error("{what}")]
    Ublk {
        /// The step.
        what: &'static str,
        /// libublk's error.
        #[source]
        source: libublk::UblkError,
    },
}

/// Devices taken over, without a login, from a daemon whose RDMA device went away (one, or every
/// device of a target port's daemon): the channels start down (on detached endpoints,
/// [`crate::session::detached_channels`]) and log in with their first reconnect; the timers count
/// from `down_since`, when the previous daemon's channel went down.
pub struct Handover {
    /// One channel per queue, each down.
    pub channels: Vec<SrpChannel>,
    /// How they log in.
    pub relogin: Relogin,
    /// Queue depth (each device's).
    pub depth: u16,
    /// The devices: the first is [`UblkOptions::dev_id`]'s, the others [`serve_port`]'s `more`
    /// in order.
    pub devices: Vec<HandedDevice>,
    /// When the channels went down.
    pub down_since: Instant,
}

/// A device a [`Handover`] takes over: its LUN and block mapping, as the previous daemon had them.
#[derive(Clone, Copy, Debug)]
pub struct HandedDevice {
    /// The LUN its commands name.
    pub lun: u64,
    /// Its block mapping.
    pub geometry: Geometry,
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
        /// Serve it with ublk's batch I/O commands (UBLK_F_BATCH_IO).
        batch: bool,
    },
}

/// Creates `/dev/ublkbN` over the source (one SRP channel per queue) and serves it until the device is
/// stopped (`srp-ublk del`, or the signal handler calling `kill_dev`). `on_live` runs once it is live.
pub fn serve(
    source: UblkSource,
    opts: UblkOptions,
    status: Arc<Vec<QueueStatus>>,
    on_live: impl FnOnce(LiveInfo) + Send + Sync + 'static,
) -> Result<(), UblkFrontError> {
    let parts = match source {
        UblkSource::Srp(s) => SrpParts::new(*s, &opts, status, Vec::new()),
        UblkSource::Handover(h) if opts.recover => {
            SrpParts::handover(*h, &opts, status, Vec::new())
        }
        UblkSource::Handover(_) => return Err(UblkFrontError::HandoverNeedsRecovery),
        UblkSource::Demo {
            size,
            disk,
            queues,
            depth,
            batch,
        } => {
            let shape = demo::DemoShape {
                size,
                queues,
                depth,
                batch,
            };
            return serve_demo(shape, disk, opts, status, on_live);
        }
    };
    let mut on_live = Some(on_live);
    let on_live = move |_, info| {
        if let Some(f) = on_live.take() {
            f(info);
        }
    };
    serve_srp(parts, opts, on_live, |_, _| {})
}

/// Another LUN's device of a port daemon ([`serve_port`]): what its queues publish and its
/// capacity checks.
#[derive(Debug)]
pub struct PortDevice {
    /// The device id to ask for (-1: any; with [`UblkOptions::recover`], the device to take
    /// over).
    pub dev_id: i32,
    /// Its queues' status, one per channel.
    pub status: Arc<Vec<QueueStatus>>,
    /// Its size and capacity checks.
    pub capacity: Arc<CapacityStatus>,
    /// A LUN that joins a daemon taking its devices over ([`UblkOptions::recover`]): its device
    /// is made, not taken over.
    pub joining: bool,
}

/// Creates a device for each LUN of the session (its first LUN's with `opts`' id, capacity and
/// `status`; each of [`Session::more_luns`] with the `more` device of the same position), or with
/// [`UblkOptions::recover`] takes them over (a handover's devices in the same way), and serves them
/// all over the same channels, channel q carrying queue q of every device, until each has
/// stopped. `on_live` runs for each device once it is live, with its position (0: the first
/// LUN's); `on_gone` for each device deleted while others serve (with its id: `srp-ublk del` of
/// that device stopped it).
pub fn serve_port(
    source: PortSource,
    opts: UblkOptions,
    status: Arc<Vec<QueueStatus>>,
    more: Vec<PortDevice>,
    on_live: impl FnMut(usize, LiveInfo),
    on_gone: impl FnMut(usize, u32),
) -> Result<(), UblkFrontError> {
    let parts = match source {
        PortSource::Srp(s) => SrpParts::new(*s, &opts, status, more),
        PortSource::Handover(h) if opts.recover => SrpParts::handover(*h, &opts, status, more),
        PortSource::Handover(_) => return Err(UblkFrontError::HandoverNeedsRecovery),
    };
    serve_srp(parts, opts, on_live, on_gone)
}

/// What a port daemon's devices are served from ([`serve_port`]).
pub enum PortSource {
    /// A session logged in to the port, with every LUN interrogated.
    Srp(Box<Session>),
    /// Devices taken over after an RDMA device removal (user recovery only).
    Handover(Box<Handover>),
}

/// How a queue waits for completions, decided once for the machine from the `--poll` mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Waiting {
    pub mode: PollMode,
    /// `adaptive` spins only while at most this many commands are in flight.
    pub spin_depth: u16,
}

impl Waiting {
    /// `adaptive` on `cpus` online CPUs serving `queues` queues: it spins whenever commands are
    /// out with a core to spare (queues + 2 CPUs); with fewer, only while a single command is out;
    /// with one CPU never, since the spin would wait on the CPU that must run the answer (measured
    /// on a one-vCPU lab guest: the same QD1 IOPS as `interrupt` at 1.6-1.8x the daemon's CPU
    /// per I/O, docs/bench/performance-record.md).
    fn for_machine(mode: PollMode, queues: u16, cpus: usize) -> Waiting {
        let spin_depth = match mode {
            PollMode::Adaptive if cpus <= 1 => 0,
            PollMode::Adaptive if cpus < usize::from(queues) + 2 => 1,
            _ => u16::MAX,
        };
        Waiting { mode, spin_depth }
    }

    /// Empty polls before an adaptive queue sleeps.
    const ADAPTIVE_SPINS: u32 = 2000;
    /// Empty polls between two yields of a spinning queue.
    const YIELD_EVERY: u32 = 64;

    /// Whether a queue with `in_flight` commands out, after `spins` empty polls in a row, polls
    /// its CQ again rather than sleeping.
    pub fn spins(&self, in_flight: u16, spins: u32) -> bool {
        in_flight > 0
            && match self.mode {
                PollMode::Busy => true,
                PollMode::Adaptive => spins < Self::ADAPTIVE_SPINS && in_flight <= self.spin_depth,
                PollMode::Interrupt => false,
            }
    }

    /// Whether a spinning queue, after `spins` empty polls in a row, lets whatever else is
    /// runnable on its CPU go first: the work that answers its command may be waiting for it.
    pub fn yields(spins: u32) -> bool {
        spins % Self::YIELD_EVERY == Self::YIELD_EVERY - 1
    }
}

/// How `adaptive` waits on this machine (see [`Waiting::for_machine`]).
fn waiting(mode: PollMode, queues: u16) -> Waiting {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let w = Waiting::for_machine(mode, queues, cpus);
    if mode == PollMode::Adaptive && w.spin_depth == 0 {
        tracing::info!(
            "adaptive polling: one CPU; queues wait for interrupts (a spin would hold the CPU the \
             fabric's answer and the application need)"
        );
    } else if mode == PollMode::Adaptive && w.spin_depth == 1 {
        tracing::info!(
            "adaptive polling: {cpus} CPUs for {queues} queue(s) leave no core to spare; a queue \
             spins only while a single command is out, and otherwise waits for interrupts \
             (--poll busy always spins, --poll interrupt never does)"
        );
    }
    w
}

/// The device flag an SRP device's queues take their data buffers from: with NEED_GET_DATA each
/// write names its buffer after it arrives (and each read at its commit), so a queue pins a pool
/// sized by a budget instead of one buffer of the largest I/O per tag ([`crate::rdma::TagBufs`]).
const POOL: u64 = sys::UBLK_F_NEED_GET_DATA as u64;

/// Whether this kernel's ublk driver has feature `flag` (a `UBLK_F_*`); no when the driver does
/// not say.
pub fn driver_has(flag: u32) -> bool {
    UblkCtrl::get_features().is_some_and(|f| f & u64::from(flag) != 0)
}

fn build_ctrl(
    name: &str,
    id: i32,
    queues: u16,
    depth: u16,
    max_io: u32,
    flags: u64,
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
        .ctrl_flags(
            u64::from(sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE) | flags,
        )
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
/// The data buffers are sized by the device's own `max_io_buf_bytes` and flags, not by this
/// session's: the kernel copies a request of up to that size, into its tag's buffer unless the
/// device was made with NEED_GET_DATA (a pool), and the device may have been made by an older
/// binary, with another depth or `max_sect`.
fn recover_ctrl(id: i32, queues: u16, depth: u16) -> Result<UblkCtrl, UblkFrontError> {
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
        return Err(UblkFrontError::NotQuiesced { id });
    }
    if info.nr_hw_queues != queues || info.queue_depth > depth {
        return Err(UblkFrontError::RecoverShape {
            id,
            queues: info.nr_hw_queues,
            depth: info.queue_depth,
            have_queues: queues,
            have_depth: depth,
        });
    }
    old.start_user_recover()
        .map_err(|e| ublk("starting user recovery", e))?;
    // libublk sizes its per-queue bookkeeping from these, as for a new device
    UblkCtrlBuilder::default()
        .name("srp-ublk")
        .id(id)
        .nr_queues(info.nr_hw_queues)
        .depth(info.queue_depth)
        .io_buf_bytes(info.max_io_buf_bytes)
        .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV)
        .build()
        .map_err(|e| ublk("taking the device over", e))
}

/// The CPUs queue `qid`'s thread runs on by default: those of the next queue (the last queue's
/// thread on queue 0's). ublk sends each CPU's I/O to one queue; a queue thread on the CPU that
/// submits to it is woken inside the application's `io_submit` and runs there, spinning for the
/// response, before the submission returns, and the application it completes is woken on a CPU the
/// thread still holds (docs/bench/performance-record.md, "The queue thread off its submitters' CPUs"). Empty
/// (libublk's pinning to the queue's own CPUs stays) with one queue or when the kernel does not say.
fn next_queue_cpus(c: &UblkCtrl, qid: usize, nr_queues: usize) -> Vec<usize> {
    let next = (qid + 1) % nr_queues.max(1);
    if next == qid {
        return Vec::new();
    }
    let mut affinity = libublk::ctrl::UblkQueueAffinity::new();
    match c.get_queue_affinity(next as u32, &mut affinity) {
        Ok(_) => affinity.to_bits_vec(),
        Err(e) => {
            tracing::warn!("queue {qid}: queue {next}'s CPUs unknown ({e}); keeping its own");
            Vec::new()
        }
    }
}

/// Pins every queue's thread: to `cpus` (one each, in turn) when given, else to the next queue's
/// CPUs ([`next_queue_cpus`]). libublk pinned each to the kernel's queue affinity as it started.
fn pin_queues(c: &UblkCtrl, status: &[QueueStatus], cpus: &[usize]) {
    for (qid, st) in status.iter().enumerate() {
        let set = if cpus.is_empty() {
            next_queue_cpus(c, qid, status.len())
        } else {
            vec![cpus[qid % cpus.len()]]
        };
        pin(st.tid.load(Relaxed), &set, qid);
    }
}

/// Pins thread `tid` of queue `qid` to `cpus` (nothing to do for an empty set).
fn pin(tid: i32, cpus: &[usize], qid: usize) {
    if cpus.is_empty() {
        return;
    }
    let mut set = nix::sched::CpuSet::new();
    let r = cpus
        .iter()
        .try_for_each(|&cpu| set.set(cpu))
        .and_then(|_| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set));
    if let Err(e) = r {
        tracing::warn!("queue {qid}: cannot pin thread {tid} to CPUs {cpus:?}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_spins() {
        let w = |mode, spin_depth| Waiting { mode, spin_depth };
        let small = w(PollMode::Adaptive, 1);
        let spare = w(PollMode::Adaptive, u16::MAX);
        for m in [
            small,
            spare,
            w(PollMode::Busy, 1),
            w(PollMode::Interrupt, 1),
        ] {
            assert!(
                !m.spins(0, 0),
                "{m:?}: nothing in flight, nothing to spin for"
            );
        }
        assert!(small.spins(1, 0) && small.spins(1, Waiting::ADAPTIVE_SPINS - 1));
        assert!(
            !small.spins(1, Waiting::ADAPTIVE_SPINS),
            "spins are bounded"
        );
        assert!(
            !small.spins(2, 0),
            "no core to spare: two commands out sleep"
        );
        assert!(spare.spins(64, 0) && !spare.spins(64, Waiting::ADAPTIVE_SPINS));
        assert!(w(PollMode::Busy, 1).spins(64, u32::MAX));
        let yields: Vec<u32> = (0..200).filter(|&n| Waiting::yields(n)).collect();
        assert_eq!(yields, [63, 127, 191], "one yield in every 64 empty polls");
        assert!(!w(PollMode::Interrupt, u16::MAX).spins(1, 0));
    }

    #[test]
    fn how_adaptive_waits_follows_the_cpus() {
        let depth =
            |queues, cpus| Waiting::for_machine(PollMode::Adaptive, queues, cpus).spin_depth;
        assert_eq!(depth(1, 1), 0, "one CPU: never spin");
        assert!(!Waiting::for_machine(PollMode::Adaptive, 1, 1).spins(1, 0));
        assert_eq!(depth(2, 2), 1, "no core to spare: spin for a lone command");
        assert_eq!(depth(1, 2), 1);
        assert_eq!(
            depth(2, 4),
            u16::MAX,
            "a core to spare: spin whenever commands are out"
        );
        assert_eq!(depth(1, 3), u16::MAX);
        for mode in [PollMode::Busy, PollMode::Interrupt] {
            assert_eq!(Waiting::for_machine(mode, 1, 1).mode, mode);
        }
        assert!(
            Waiting::for_machine(PollMode::Busy, 1, 1).spins(1, 0),
            "busy spins even on one CPU"
        );
    }
}
