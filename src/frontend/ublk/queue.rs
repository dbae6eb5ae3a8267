//! A ublk queue's thread: its io_uring loop over the queue's [`Path`], serving queue q of every
//! device it is given (one or more LUNs of the path's target port), each device's tags a range of
//! the path's ([`SlotMap`]).

use super::requests::{commit, fail_now, need_get_data, start_io, Pending, UblkIo};
use super::slots::{self, SlotMap, SlotsFull};
use super::{OnRemoved, QueueStatus, Waiting};
use crate::channel::block::Geometry;
use crate::channel::clock_ms;
use crate::path::{Event, Path, PathError, SessionLink, Woken, DOWN_TICK};
use crate::rdma::TagBufs;
use crate::session::rport::Rport;
use crate::session::Relogin;
use crate::session::SrpChannel;
use crate::ublk::{Cqe, QueueSpec, Ring, UblkIoError};
use crate::wire::srp::ScsiLun;
use libublk::io::UblkDev;
use libublk::sys;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

const OP_POLL_CQ: u8 = 1;
const OP_POLL_CM: u8 = 2;
const OP_CANCEL: u8 = 3;
/// A Timeout SQE that wakes a sleeping queue for its channel's timed work (command timeouts,
/// delayed retries) while commands are outstanding.
const OP_TICK: u8 = 4;
/// A PollAdd on the queue's [`SessionLink`] eventfd: another queue's channel failed.
const OP_POLL_WAKE: u8 = 5;

/// How long a queue with nothing out on the fabric sleeps before it arms its CQs. A low-depth
/// queue's next command usually comes sooner, and the spin then reaps its response with no
/// completion event to wake for, read and arm again (two system calls and a wake-up per I/O).
/// Past it (or at the timer the queue already has pending, a second at most) the CQs are armed,
/// so an unsolicited IU on an idle queue (a credit request, an asynchronous event) waits about as
/// long as on an idle NBD connection, which polls its CQ every 100 ms.
const IDLE_ARM: Duration = Duration::from_millis(100);

/// Passes of a spin between two io_uring_enter calls made whatever the ring says. A spinning
/// queue enters the kernel only when the ring has work for it: the kernel raises the task-run
/// flag for every ublk command and poll completion it queues (IORING_SETUP_TASKRUN_FLAG, see
/// [`Ring::new`]). The odd enter is a backstop, rare enough to cost nothing per I/O: a QD1 I/O
/// spins for a few hundred passes.
const ENTER_EVERY: u32 = 1024;

/// What a queue thread can fail on before it serves.
#[derive(Debug, thiserror::Error)]
pub(super) enum QueueError {
    /// libublk refused a step.
    #[error("{what}")]
    Ublk {
        what: &'static str,
        #[source]
        source: libublk::UblkError,
    },
    /// The path could not be set up.
    #[error(transparent)]
    Path(#[from] PathError),
    /// The queue's ublk ring could not be set up.
    #[error("setting up the queue's ublk I/O")]
    Io(#[from] UblkIoError),
    /// The queue's path has no tags left for the device's.
    #[error("giving the device's tags their place on the queue's path")]
    Slots(#[from] SlotsFull),
    /// The devices given to one queue thread take their data differently (some from a pool with
    /// NEED_GET_DATA, some in per-tag buffers): one path's buffers cannot serve both.
    #[error(
        "the devices of one queue take their data differently (NEED_GET_DATA or not): serve \
         devices made by different versions of srp-ublk from daemons of their own"
    )]
    MixedBuffers,
}

impl QueueError {
    /// The `map_err` of a libublk call: `what` the queue was doing when libublk refused.
    pub(super) fn ublk(what: &'static str) -> impl FnOnce(libublk::UblkError) -> QueueError {
        move |source| QueueError::Ublk { what, source }
    }
}

/// Queue `qid` of one device, as the thread that serves it (and queue `qid` of the other devices
/// of the same target port) is given it.
pub(super) struct DeviceQueue<'a> {
    pub dev: Arc<UblkDev>,
    /// Counts the queue threads that have let go of the device once it stopped.
    pub released: &'a AtomicU16,
    /// The device's LUN: each of its commands names it.
    pub lun: ScsiLun,
    pub geo: Geometry,
    /// The device's size now in logical blocks: the bound its I/O is checked against, moved by
    /// a resize (written only then; a relaxed load per I/O of a line nobody else writes).
    pub blocks: &'a AtomicU64,
    /// What this queue of the device publishes.
    pub status: &'a QueueStatus,
}

/// A device as the loop serves it (by the ring's device index).
struct Served<'a> {
    /// The device, until this queue lets go of it ([`Queue::release_stopped`]).
    dev: Option<Arc<UblkDev>>,
    released: &'a AtomicU16,
    lun: ScsiLun,
    /// Its geometry, as this queue last learnt it (a refused WRITE SAME turns it off).
    geo: Geometry,
    blocks: &'a AtomicU64,
    status: &'a QueueStatus,
    dev_id: u32,
}

impl Served<'_> {
    /// The device's geometry with its bound as it is now: a resize may have moved it while the
    /// queue slept.
    fn geometry(&self) -> Geometry {
        Geometry {
            blocks: self.blocks.load(Relaxed),
            ..self.geo
        }
    }
}

/// What a queue does besides its path: the devices it serves and the polls it has armed on the
/// path's fds (each tagged with the path's login generation).
struct Queue<'a> {
    qid: u16,
    io: UblkIo,
    /// By the ring's device index.
    devs: Vec<Served<'a>>,
    shared: &'a SessionLink,
    on_removed: Option<OnRemoved>,
    /// The login generation `cq_poll` and `cm_poll` were armed on.
    armed_gen: u16,
    cq_poll: bool,
    cm_poll: bool,
    wake_poll: bool,
    tick_poll: bool,
    /// Writes need a NEED_GET_DATA (the buffers are a pool).
    pool: bool,
    /// Since when the queue has had nothing out on the fabric, once it went to sleep so.
    idle_since: Option<Instant>,
    /// The driver ended a device's commands: a device is stopping.
    stopping: bool,
}

/// Serves queue `qid` of every device in `devs` over channel `ch` until every one of them has
/// stopped. Each device's FETCH commands go out from this thread, as ublk requires of the task
/// that serves a queue, before the device may start.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_queue(
    qid: u16,
    devs: Vec<DeviceQueue<'_>>,
    ch: SrpChannel,
    waiting: Waiting,
    relogin: Relogin,
    rport: Rport,
    on_removed: Option<OnRemoved>,
    shared: &Arc<SessionLink>,
) -> Result<(), QueueError> {
    let started = start_queue(qid, &devs, ch, relogin, rport);
    // a device starts once every queue has its FETCH commands out; a queue that cannot start
    // says so too, or the start would wait for it forever (libublk's only public way to fail the
    // wait is its mlock flag: the start then fails with EPERM, after this queue's error)
    for d in &devs {
        d.dev.notify_buffer_registration_complete(started.is_err());
    }
    let (io, mut path, max_io) = started?;
    path.join(shared.clone(), qid);
    let mut pending = Pending::new(io.slots.len(), devs.len(), max_io);
    let pool = devs.first().is_some_and(|d| takes_pool(&d.dev));
    let served = devs
        .into_iter()
        .map(|d| Served {
            dev_id: d.dev.dev_info.dev_id,
            dev: Some(d.dev),
            released: d.released,
            lun: d.lun,
            geo: d.geo,
            blocks: d.blocks,
            status: d.status,
        })
        .collect();
    let mut qu = Queue {
        qid,
        io,
        devs: served,
        shared,
        on_removed,
        armed_gen: path.gen(),
        cq_poll: false,
        cm_poll: false,
        wake_poll: false,
        tick_poll: false,
        pool,
        idle_since: None,
        stopping: false,
    };
    qu.serve(&mut path, &mut pending, waiting);
    let io = &mut qu.io;
    path.close(&mut |d, b| commit(io, b, &mut pending, d));
    qu.publish(&path, &pending);
    Ok(())
}

/// Whether device `dev`'s writes name their data with NEED_GET_DATA (its buffers are a pool).
fn takes_pool(dev: &UblkDev) -> bool {
    dev.dev_info.flags & u64::from(sys::UBLK_F_NEED_GET_DATA) != 0
}

/// The queue's ring and path over `devs` (their depths together), with every device's FETCH
/// commands out, and the largest I/O of any of them.
fn start_queue(
    qid: u16,
    devs: &[DeviceQueue<'_>],
    ch: SrpChannel,
    relogin: Relogin,
    rport: Rport,
) -> Result<(UblkIo, Path<Relogin>, u32), QueueError> {
    let pool = devs.first().is_some_and(|d| takes_pool(&d.dev));
    if devs.iter().any(|d| takes_pool(&d.dev) != pool) {
        return Err(QueueError::MixedBuffers);
    }
    let depth = slots::total(devs.iter().map(|d| d.dev.dev_info.queue_depth))?;
    let max_io = devs
        .iter()
        .map(|d| d.dev.dev_info.max_io_buf_bytes)
        .max()
        .unwrap_or(0);
    let bufs = if pool {
        TagBufs::pooled(depth, max_io)
    } else {
        TagBufs::budgeted(depth, max_io)
    };
    // room for the loop's own operations (its PollAdds and timer) next to the ublk commands
    let entries = u32::from(depth) + 8;
    let ring = Ring::new(entries, entries, devs.len() as u16)?;
    // a channel that starts down (a handover) holds I/O before the first command can arrive; it
    // logs in from the loop, once the ring has taken the FETCH commands
    let path = Path::new(ch, relogin, bufs, rport, format!("queue {qid}"))?;
    let io = fetch_all(ring, qid, devs, path.bufs())?;
    Ok((io, path, max_io))
}

/// Serves queue `qid` of each device on `ring` and sends a FETCH for each of its tags: with tag
/// buffers, each names its slot's buffer for the kernel to copy a write's data into; with a pool,
/// nothing (a write names its span with NEED_GET_DATA). The ring gives the devices its indices
/// in order, the index [`Queue::devs`] and [`Pending::io`] keep them by.
fn fetch_all(
    mut ring: Ring,
    qid: u16,
    devs: &[DeviceQueue<'_>],
    bufs: &TagBufs,
) -> Result<UblkIo, QueueError> {
    let mut slots = SlotMap::default();
    for (i, d) in devs.iter().enumerate() {
        let spec = QueueSpec {
            fd: d.dev.tgt.fds[0],
            qid,
            depth: d.dev.dev_info.queue_depth,
            flags: d.dev.dev_info.flags,
        };
        let dev = ring.add_queue(&spec, bufs.copies_lent())?;
        debug_assert_eq!(
            dev.index(),
            i,
            "a new ring gives its devices indices in order"
        );
        let base = slots.add(dev, spec.depth)?;
        for tag in 0..spec.depth {
            ring.fetch(dev, tag, bufs.tag_span(base + tag))?;
        }
    }
    Ok(UblkIo { ring, slots })
}

impl Queue<'_> {
    /// The queue's loop, until the device stops.
    fn serve(&mut self, path: &mut Path<Relogin>, pending: &mut Pending, waiting: Waiting) {
        let (mut spins, mut loops) = (0u32, 0u32);
        self.publish(path, pending);
        loop {
            loops = loops.wrapping_add(1);
            let up = path.is_up();
            path.tick(clock_ms());
            self.keep_polls(path);
            let busy = path.busy() > 0;
            if busy {
                self.idle_since = None;
            }
            let spin = up && waiting.spins(path.busy(), spins);
            // while down, the loop ticks (DOWN_TICK) instead of sleeping on the ring
            let mut to_wait = if spin || !up { 0 } else { 1 };
            if to_wait == 1 || loops % 1024 == 0 {
                self.publish(path, pending);
            }
            if to_wait == 1 && (self.prepare_sleep(path, pending) || path.commits_hold_waiters()) {
                to_wait = 0;
            }
            let (cq, cm, stop) = self.reap(path, pending, to_wait, up, loops);
            // a poll that fired is spent; what it reports goes to the path
            self.cq_poll &= !cq;
            self.cm_poll &= !cm;
            let gen = self.armed_gen;
            path.woke(Woken { gen, cq, cm });
            if !self.wake_poll {
                self.shared.ack_wake(self.qid);
            }
            let io = &mut self.io;
            let (n, event) = path.service(Instant::now(), &mut |d, b| commit(io, b, pending, d));
            self.resubmit(path, pending);
            self.follow_login(path);
            self.get_granted(path);
            spins = if n > 0 || !busy {
                0
            } else {
                spins.saturating_add(1)
            };
            if spin && Waiting::yields(spins) {
                std::thread::yield_now();
            }
            if !path.is_up() {
                self.publish(path, pending);
            }
            if let Some(event) = event {
                self.on_event(event);
            }
            if self.stopping {
                self.release_stopped(path, pending);
            }
            if stop {
                return;
            }
            if !path.is_up() {
                std::thread::sleep(DOWN_TICK);
            }
        }
    }

    /// Publishes the path's and each device's counters.
    fn publish(&self, path: &Path<Relogin>, pending: &Pending) {
        for (d, io) in self.devs.iter().zip(&pending.io) {
            d.status.publish(path, io);
        }
    }

    /// Sends the next command of each WRITE_ZEROES that has one. The first refused WRITE SAME
    /// turns the device's later ones on this queue into zero writes from the start.
    fn resubmit(&mut self, path: &mut Path<Relogin>, pending: &mut Pending) {
        while let Some(slot) = pending.again.pop() {
            let t = &mut pending.slots[usize::from(slot)];
            let (Some(z), Some(d)) = (t.zero.as_mut(), self.devs.get_mut(usize::from(t.dev)))
            else {
                continue;
            };
            if z.by_write() && d.geo.write_same {
                d.geo.write_same = false;
                tracing::warn!(
                    "queue {} of /dev/ublkb{}: the LUN refuses WRITE SAME: WRITE_ZEROES is \
                     carried out by writing zeros",
                    self.qid,
                    d.dev_id
                );
            }
            let (op, off, len) = z.command(pending.max_io);
            if let Err(errno) = path.submit(slot, d.lun, op, off, len, &d.geometry()) {
                fail_now(&mut self.io, path, pending, slot, errno);
            }
        }
    }

    /// Keeps a poll out on the session's wake-up eventfd and on the login's CM channel.
    fn keep_polls(&mut self, path: &mut Path<Relogin>) {
        if !self.wake_poll {
            let fd = self.shared.wake_fd(self.qid);
            self.io.ring.poll_add(fd, OP_POLL_WAKE, 0);
            self.wake_poll = true;
        }
        if let (false, Some(fd)) = (self.cm_poll, path.cm_fd()) {
            self.io.ring.poll_add(fd, OP_POLL_CM, path.gen());
            self.cm_poll = true;
        }
    }

    /// Acts on what the path reported: its RDMA device going away (the device is handed over to a
    /// new image of the daemon) or the path given up (the device is removed).
    fn on_event(&self, event: Event) {
        match event {
            // the daemon's image is replaced; its devices are taken over by the new one
            Event::Removed { since } => {
                if let (Some(OnRemoved(f)), Some(d)) = (&self.on_removed, self.devs.first()) {
                    f(d.dev_id, since);
                }
            }
            Event::Lost => {
                tracing::error!("queue {}: removing the device", self.qid);
                // the same path as `srp-ublk del`: the daemon's signal thread stops the device
                let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::SIGTERM);
            }
        }
    }

    /// Asks the kernel for the data of the pool writes that got their span since the last look.
    fn get_granted(&mut self, path: &mut Path<Relogin>) {
        if !self.pool {
            return;
        }
        for (slot, addr) in path.granted() {
            self.io.get_data(slot, addr);
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
                self.io.ring.cancel(op, self.armed_gen, OP_CANCEL);
            }
        }
        (self.cq_poll, self.cm_poll) = (false, false);
        self.armed_gen = path.gen();
    }

    /// Arms what wakes a sleeping queue: the completion channel (once the queue has been idle for
    /// [`IDLE_ARM`], or at once while commands are out) and a timer for the channel's timed work
    /// or for the idle arm. Returns whether something completed meanwhile.
    fn prepare_sleep(&mut self, path: &mut Path<Relogin>, pending: &mut Pending) -> bool {
        let idle_left = self.idle_left(path);
        // a poll still out means the CQs are still armed, unless the channel now wants SEND
        // completions too (a command waits for a slot, or a lone command's early wake-up): then
        // the send CQ is armed as well (same fd; a CQ still armed is not armed again)
        if idle_left.is_none() && (!self.cq_poll || path.wants_send_completions()) {
            let sleep = path.sleep(true);
            if let (false, Some(fd)) = (self.cq_poll, sleep.cq) {
                self.io.ring.poll_add(fd, OP_POLL_CQ, sleep.gen);
                self.cq_poll = true;
            }
        }
        // a completion may have landed before the arm took effect (what else `service` reports
        // the loop sees on its next pass)
        let io = &mut self.io;
        let (n, _) = path.service(Instant::now(), &mut |d, b| commit(io, b, pending, d));
        self.resubmit(path, pending);
        self.follow_login(path);
        self.get_granted(path);
        if let (false, Some(t)) = (self.tick_poll, path.next_tick_in().or(idle_left)) {
            let t = t.clamp(Duration::from_millis(1), Duration::from_secs(1));
            self.io.ring.timeout(t, OP_TICK);
            self.tick_poll = true;
        }
        n > 0
    }

    /// How much longer an idle queue sleeps with its CQs unarmed: none once it has been idle for
    /// [`IDLE_ARM`], or while anything is out on the fabric.
    fn idle_left(&mut self, path: &Path<Relogin>) -> Option<Duration> {
        if path.busy() > 0 || path.wants_send_completions() {
            self.idle_since = None;
            return None;
        }
        let since = *self.idle_since.get_or_insert_with(Instant::now);
        IDLE_ARM
            .checked_sub(since.elapsed())
            .filter(|d| !d.is_zero())
    }

    /// Submits and reaps the ring (waiting for `to_wait` completions): starts every new ublk
    /// command, notes which polls fired. Returns (CQ poll fired, CM poll fired, the queue stops:
    /// the device stopped, or its ring failed).
    fn reap(
        &mut self,
        path: &mut Path<Relogin>,
        pending: &mut Pending,
        to_wait: usize,
        up: bool,
        loops: u32,
    ) -> (bool, bool, bool) {
        let mut fired = (false, false);
        // a spin with nothing to submit, reap or run in the kernel skips io_uring_enter
        if to_wait == 0 && up && loops % ENTER_EVERY != 0 && !self.io.ring.needs_enter() {
            return (false, false, false);
        }
        let mut to_wait = to_wait;
        loop {
            if self.io.is_done() {
                return (fired.0, fired.1, true);
            }
            if let Err(e) = self.io.ring.enter(to_wait) {
                tracing::error!("queue {}: {}", self.qid, crate::Chain(&e));
                return (fired.0, fired.1, true);
            }
            // writes whose data the kernel copies in on the next enter
            let get_data = self.take_cqes(path, pending, &mut fired);
            // what was committed before this enter went to the kernel with it (and the kernel
            // copied the reads' data out as it took each COMMIT)
            if path.commits_pending() && self.io.ring.sq_drained() {
                let io = &mut self.io;
                path.committed(&mut |d, b| commit(io, b, pending, d));
            }
            if !get_data {
                return (fired.0, fired.1, false);
            }
            to_wait = 0;
        }
    }

    /// Acts on every completion the ring has: new ublk commands start, writes without their
    /// data ask for it, the polls that fired are noted in `fired` (CQ, CM). Returns whether a
    /// NEED_GET_DATA was queued.
    fn take_cqes(
        &mut self,
        path: &mut Path<Relogin>,
        pending: &mut Pending,
        fired: &mut (bool, bool),
    ) -> bool {
        // commands arriving after a sleep are stamped with the time they arrive
        let mut clock_set = false;
        let mut get_data = false;
        let gen = self.armed_gen;
        while let Some(cqe) = self.io.ring.reap() {
            match cqe {
                Cqe::Request { dev, tag } => {
                    let (Some(slot), Some(d)) =
                        (self.io.slots.slot(dev, tag), self.devs.get(dev.index()))
                    else {
                        self.unknown(dev, tag);
                        continue;
                    };
                    if !clock_set {
                        path.set_clock(clock_ms());
                        clock_set = true;
                    }
                    start_io(&mut self.io, path, pending, (d.lun, d.geometry()), slot);
                }
                Cqe::NeedsData { dev, tag } if self.pool => match self.io.slots.slot(dev, tag) {
                    Some(slot) => get_data |= need_get_data(&mut self.io, path, pending, slot),
                    None => self.unknown(dev, tag),
                },
                Cqe::NeedsData { .. } => {}
                Cqe::Ended { dev, tag, res } if res != sys::UBLK_IO_RES_ABORT => {
                    self.stopping = true;
                    let id = self.devs.get(dev.index()).map_or(u32::MAX, |d| d.dev_id);
                    tracing::warn!(
                        "queue {} of /dev/ublkb{id}: ublk refused tag {tag}'s command: {res}",
                        self.qid
                    );
                }
                // the device stops
                Cqe::Ended { .. } => self.stopping = true,
                // a poll armed on an earlier login's fds means nothing now
                Cqe::Own { op, arg, .. } => match op {
                    OP_POLL_CQ if arg == gen => fired.0 = true,
                    OP_POLL_CM if arg == gen => fired.1 = true,
                    OP_TICK => self.tick_poll = false,
                    OP_POLL_WAKE => self.wake_poll = false,
                    _ => {}
                },
            }
        }
        get_data
    }

    /// Lets go of every device that has stopped and has nothing of this queue's left on the
    /// path (each one's commands committed): out of the ring and the slot map, its handle
    /// dropped and counted in its `released`, so the daemon can delete it while the queue serves
    /// the others.
    fn release_stopped(&mut self, path: &mut Path<Relogin>, pending: &mut Pending) {
        self.stopping = false;
        let stopped: Vec<(crate::ublk::Dev, u16, u16)> = self
            .io
            .slots
            .devices()
            .filter(|&(dev, _, _)| self.io.ring.is_done(dev))
            .collect();
        for (dev, base, depth) in stopped {
            let (b, d) = (usize::from(base), usize::from(depth));
            // pool writes whose data the stopped device will never send: their spans go back
            for slot in base..base + depth {
                let t = &mut pending.slots[usize::from(slot)];
                if t.awaiting_data {
                    (t.busy, t.awaiting_data) = (false, false);
                    let io = &mut self.io;
                    path.abandon(slot, &mut |d, b| commit(io, b, pending, d));
                }
            }
            if pending.slots[b..b + d].iter().any(|t| t.busy) {
                // the last commit clears it; look again then
                self.stopping = true;
                continue;
            }
            if let Err(e) = self.io.ring.remove_queue(dev) {
                tracing::error!("queue {}: {}", self.qid, crate::Chain(&e));
                continue;
            }
            self.io.slots.remove(dev);
            if let Some(s) = self.devs.get_mut(dev.index()) {
                s.dev = None;
                s.released.fetch_add(1, Relaxed);
                tracing::debug!("queue {}: /dev/ublkb{} let go", self.qid, s.dev_id);
            }
        }
    }

    /// A request of a device or tag the queue does not serve: the ring checks both, so this is
    /// a defect, said loudly; the request is left alone (the driver ends it when the device
    /// stops).
    fn unknown(&self, dev: crate::ublk::Dev, tag: u16) {
        tracing::error!(
            "queue {}: a request for device index {} tag {tag}, which this queue does not serve: \
             ignored",
            self.qid,
            dev.index()
        );
    }
}
