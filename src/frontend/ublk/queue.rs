//! A ublk queue's thread: its io_uring loop over the queue's [`Path`].

use super::zeroing::Zeroing;
use super::{OnRemoved, QueueStatus, Waiting};
use crate::channel::block::{BlockOp, Geometry};
use crate::channel::{clock_ms, Done};
use crate::path::{Event, Path, PathError, SessionLink, Woken, DOWN_TICK};
use crate::rdma::TagBufs;
use crate::session::rport::Rport;
use crate::session::Relogin;
use crate::session::SrpChannel;
use crate::stats::{IoCounters, IoKind};
use libublk::io::{UblkDev, UblkIOCtx, UblkQueue};
use libublk::{sys, BufDesc, BufDescList, UblkIORes, UblkUringData};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

const OP_POLL_CQ: u32 = 1;
const OP_POLL_CM: u32 = 2;
const OP_CANCEL: u32 = 3;
/// A Timeout SQE that wakes a sleeping queue for its channel's timed work (command timeouts,
/// delayed retries) while commands are outstanding.
const OP_TICK: u32 = 4;
/// A PollAdd on the queue's [`SessionLink`] eventfd: another queue's channel failed.
const OP_POLL_WAKE: u32 = 5;
/// A NEED_GET_DATA command (its tag in the tag field): the kernel copies a write's data into the
/// span named and hands the command over with this user data.
const OP_GET_DATA: u32 = 6;

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
/// [`init_ring`]). The odd enter is a backstop, rare enough to cost nothing per I/O: a QD1 I/O
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
}

impl QueueError {
    /// The `map_err` of a libublk call: `what` the queue was doing when libublk refused.
    pub(super) fn ublk(what: &'static str) -> impl FnOnce(libublk::UblkError) -> QueueError {
        move |source| QueueError::Ublk { what, source }
    }
}

/// What each tag's command is, and the queue's counters (kept here, published by
/// [`QueueStatus::publish`]).
struct Pending {
    tags: Vec<TagIo>,
    io: IoCounters,
    /// Tags whose WRITE_ZEROES has another command to send ([`Queue::resubmit`]).
    again: Vec<u16>,
    /// The device's largest I/O: a zero write's most.
    max_io: u32,
}

impl Pending {
    fn new(depth: u16, max_io: u32) -> Pending {
        let idle = TagIo {
            len: 0,
            rw: false,
            kind: IoKind::Other,
            started: Instant::now(),
            zero: None,
        };
        Pending {
            tags: vec![idle; usize::from(depth)],
            io: IoCounters::default(),
            again: Vec::new(),
            max_io,
        }
    }
}

/// A tag's command: its length, whether its result is a byte count, its kind and when it came,
/// and for a WRITE_ZEROES, how far it got.
#[derive(Clone, Copy)]
struct TagIo {
    len: u32,
    rw: bool,
    kind: IoKind,
    started: Instant,
    zero: Option<Zeroing>,
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
    /// The device's NEED_GET_DATA opcode as its queues encode it, when writes need one (the
    /// buffers are a pool).
    get_data_op: Option<u32>,
    /// Since when the queue has had nothing out on the fabric, once it went to sleep so.
    idle_since: Option<Instant>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run_queue(
    qid: u16,
    dev: &UblkDev,
    ch: SrpChannel,
    geo: Geometry,
    waiting: Waiting,
    relogin: Relogin,
    rport: Rport,
    on_removed: Option<OnRemoved>,
    status: &QueueStatus,
    shared: &Arc<SessionLink>,
) -> Result<(), QueueError> {
    init_ring(dev).map_err(QueueError::ublk("setting up the queue's io_uring"))?;
    let q = UblkQueue::new(qid, dev).map_err(QueueError::ublk("creating the queue"))?;
    let depth = q.get_depth() as u16;
    let flags = dev.dev_info.flags;
    let pool = flags & u64::from(sys::UBLK_F_NEED_GET_DATA) != 0;
    let max_io = dev.dev_info.max_io_buf_bytes;
    let bufs = if pool {
        TagBufs::pooled(depth, max_io)
    } else {
        TagBufs::budgeted(depth, max_io)
    };
    // a channel that starts down (a handover) holds I/O before the first command can arrive; it
    // logs in from the loop, once the ring has taken the FETCH commands
    let mut path = Path::new(ch, relogin, bufs, rport, format!("queue {qid}"))?;
    path.join(shared.clone(), qid);
    let mut pending = Pending::new(depth, max_io);
    let q = q
        .submit_fetch_commands_unified(BufDescList::Slices(Some(path.bufs().fetch_bufs())))
        .map_err(QueueError::ublk("submitting FETCH commands"))?;
    let get_data_op = pool.then(|| need_get_data_op(flags));
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
        get_data_op,
        idle_since: None,
    };
    qu.serve(&mut path, &mut pending, waiting);
    path.close(&mut |d, b| commit(&q, b, &mut pending, d));
    status.publish(&path, &pending.io);
    Ok(())
}

impl Queue<'_> {
    /// The queue's loop, until the device stops.
    fn serve(&mut self, path: &mut Path<Relogin>, pending: &mut Pending, waiting: Waiting) {
        let (mut spins, mut loops) = (0u32, 0u32);
        self.status.publish(path, &pending.io);
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
                self.status.publish(path, &pending.io);
            }
            if to_wait == 1 && (self.prepare_sleep(path, pending) || path.commits_hold_waiters()) {
                to_wait = 0;
            }
            let (cq, cm, r) = self.reap(path, pending, to_wait, up, loops);
            // a poll that fired is spent; what it reports goes to the path
            self.cq_poll &= !cq;
            self.cm_poll &= !cm;
            let gen = self.armed_gen;
            path.woke(Woken { gen, cq, cm });
            if !self.wake_poll {
                self.shared.ack_wake(self.qid);
            }
            let (n, event) =
                path.service(Instant::now(), &mut |d, b| commit(self.q, b, pending, d));
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
                self.status.publish(path, &pending.io);
            }
            if let Some(event) = event {
                self.on_event(event);
            }
            if !path.is_up() && r.is_ok() {
                std::thread::sleep(DOWN_TICK);
            }
            if r.is_err() {
                return;
            }
        }
    }

    /// Sends the next command of each WRITE_ZEROES that has one. The first refused WRITE SAME
    /// turns the queue's later ones into zero writes from the start.
    fn resubmit(&mut self, path: &mut Path<Relogin>, pending: &mut Pending) {
        while let Some(tag) = pending.again.pop() {
            let Some(z) = pending.tags[usize::from(tag)].zero.as_mut() else {
                continue;
            };
            if z.by_write() && self.geo.write_same {
                self.geo.write_same = false;
                tracing::warn!(
                    "queue {}: the LUN refuses WRITE SAME: WRITE_ZEROES is carried out by writing \
                     zeros",
                    self.qid
                );
            }
            let (op, off, len) = z.command(pending.max_io);
            let geo = Geometry {
                blocks: self.shared.blocks.load(Relaxed),
                ..self.geo
            };
            if let Err(errno) = path.submit(tag, op, off, len, &geo) {
                fail_now(self.q, path, pending, tag, errno);
            }
        }
    }

    /// Keeps a poll out on the session's wake-up eventfd and on the login's CM channel.
    fn keep_polls(&mut self, path: &mut Path<Relogin>) {
        if !self.wake_poll {
            let fd = self.shared.wake_fd(self.qid);
            self.wake_poll = submit_poll(self.q, fd, OP_POLL_WAKE, 0);
        }
        if let (false, Some(fd)) = (self.cm_poll, path.cm_fd()) {
            self.cm_poll = submit_poll(self.q, fd, OP_POLL_CM, path.gen());
        }
    }

    /// Acts on what the path reported: its RDMA device going away (the device is handed over to a
    /// new image of the daemon) or the path given up (the device is removed).
    fn on_event(&self, event: Event) {
        match event {
            Event::Removed { since } => {
                if let Some(OnRemoved(f)) = &self.on_removed {
                    f(self.dev_id, since);
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
        let Some(op) = self.get_data_op else {
            return;
        };
        for (tag, addr) in path.granted() {
            submit_get_data(self.q, op, tag, addr);
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
                self.cq_poll = submit_poll(self.q, fd, OP_POLL_CQ, sleep.gen);
            }
        }
        // a completion may have landed before the arm took effect (what else `service` reports
        // the loop sees on its next pass)
        let (n, _) = path.service(Instant::now(), &mut |d, b| commit(self.q, b, pending, d));
        self.resubmit(path, pending);
        self.follow_login(path);
        self.get_granted(path);
        if let (false, Some(t)) = (self.tick_poll, path.next_tick_in().or(idle_left)) {
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
        // a spin with nothing to submit, reap or run in the kernel skips io_uring_enter
        if to_wait == 0 && up && loops % ENTER_EVERY != 0 && !ring_needs_enter() {
            return (false, false, Ok(0));
        }
        let q = self.q;
        let gen = self.armed_gen;
        let (shared, geo, get_data_op) = (self.shared, self.geo, self.get_data_op);
        let (tick_poll, wake_poll) = (&mut self.tick_poll, &mut self.wake_poll);
        let mut to_wait = to_wait;
        loop {
            // writes whose data the kernel copies in on this enter, when this pass asked for it
            let mut get_data = false;
            let r = q.flush_and_wake_io_tasks(
                |data, cqe, _last| {
                    let tag = UblkIOCtx::user_data_to_tag(data) as u16;
                    match Cqe::of(data, cqe.result()) {
                        Cqe::Command => {
                            if !clock_set {
                                path.set_clock(clock_ms());
                                clock_set = true;
                            }
                            // the bound as it is now: a resize may have moved it while the
                            // queue slept
                            let geo = Geometry {
                                blocks: shared.blocks.load(Relaxed),
                                ..geo
                            };
                            start_io(q, path, pending, geo, tag);
                        }
                        Cqe::NeedsData => {
                            if let Some(op) = get_data_op {
                                get_data |= need_get_data(q, path, pending, op, tag);
                            }
                        }
                        // a poll armed on an earlier login's fds means nothing now
                        Cqe::Target(op) => match op {
                            OP_POLL_CQ if tag == gen => cq_fired = true,
                            OP_POLL_CM if tag == gen => cm_fired = true,
                            OP_TICK => *tick_poll = false,
                            OP_POLL_WAKE => *wake_poll = false,
                            _ => {}
                        },
                        Cqe::Other => {}
                    }
                },
                to_wait,
            );
            // what was committed before this enter went to the kernel with it (and the kernel
            // copied the reads' data out as it took each COMMIT)
            if r.is_ok() && path.commits_pending() && sq_drained() {
                path.committed(&mut |d, b| commit(q, b, pending, d));
            }
            if !get_data || r.is_err() {
                return (cq_fired, cm_fired, r);
            }
            to_wait = 0;
        }
    }
}

/// What a CQE of the queue's ring says.
enum Cqe {
    /// A ublk command to start (with a pool, a write's comes back from NEED_GET_DATA with its
    /// data in its span).
    Command,
    /// A pool write without its data: it needs a span and a NEED_GET_DATA.
    NeedsData,
    /// One of the loop's own operations (`OP_*`).
    Target(u32),
    /// Nothing to act on (an abort: the device stops).
    Other,
}

impl Cqe {
    fn of(data: u64, res: i32) -> Cqe {
        let ok = res == sys::UBLK_IO_RES_OK as i32;
        if data & UblkUringData::Target as u64 == 0 {
            return match res {
                _ if ok => Cqe::Command,
                r if r == sys::UBLK_IO_RES_NEED_GET_DATA as i32 => Cqe::NeedsData,
                _ => Cqe::Other,
            };
        }
        match UblkIOCtx::user_data_to_op(data) {
            OP_GET_DATA if ok => Cqe::Command,
            OP_GET_DATA => Cqe::Other,
            op => Cqe::Target(op),
        }
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

/// Whether the kernel took every SQE pushed so far.
fn sq_drained() -> bool {
    libublk::io::with_task_io_ring_mut(|r| {
        let mut sq = r.submission();
        sq.sync();
        sq.is_empty()
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

/// Completes a finished command to ublk: a read's or write's byte count, or its errno. A
/// WRITE_ZEROES with more to do goes to [`Pending::again`] instead.
fn commit(q: &UblkQueue, bufs: &TagBufs, pending: &mut Pending, mut d: Done) {
    let tag = d.tag;
    if let Some(z) = pending.tags[usize::from(tag)].zero.as_mut() {
        match z.finished(&d.outcome) {
            None => return pending.again.push(tag),
            Some(0) => {}
            Some(errno) => d = Done::failed(tag, errno),
        }
    }
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
        commit_buf(bufs, tag, t.kind),
        Ok(UblkIORes::Result(res)),
    );
}

/// What a COMMIT names as tag `tag`'s data: the tag's buffer; with a pool, a read's span (the
/// kernel copies the data out of it as the COMMIT is submitted) and nothing for the others.
fn commit_buf(bufs: &TagBufs, tag: u16, kind: IoKind) -> BufDesc<'_> {
    if !bufs.is_pool() {
        let b = bufs.ios().get(usize::from(tag));
        return BufDesc::Slice(b.map_or(&[], |b| b.as_slice()));
    }
    match kind {
        IoKind::Read => BufDesc::RawAddress(bufs.commit_addr(tag) as *const u8),
        _ => BufDesc::Slice(&[]),
    }
}

/// A pool write arrived without its data (NEED_GET_DATA): reserves its span and asks the kernel
/// to copy the data there, or leaves it waiting for room. Returns whether it asked.
fn need_get_data(
    q: &UblkQueue,
    path: &mut Path<Relogin>,
    pending: &mut Pending,
    op: u32,
    tag: u16,
) -> bool {
    let len = q.get_iod(tag).nr_sectors << 9;
    match path.reserve(tag, len) {
        Ok(Some(addr)) => {
            submit_get_data(q, op, tag, addr);
            true
        }
        Ok(None) => false,
        // larger than the pool, which holds the device's largest I/O: not from this kernel
        Err(errno) => {
            pending.io.record(IoKind::Write, len, false, 0);
            let _ =
                q.complete_io_cmd_unified(tag, BufDesc::Slice(&[]), Ok(UblkIORes::Result(-errno)));
            false
        }
    }
}

/// NEED_GET_DATA's opcode as the device's queues encode their commands (as an ioctl number, or
/// the legacy plain number).
fn need_get_data_op(flags: u64) -> u32 {
    if flags & u64::from(sys::UBLK_F_CMD_IOCTL_ENCODE) != 0 {
        sys::UBLK_U_IO_NEED_GET_DATA
    } else {
        sys::UBLK_U_IO_NEED_GET_DATA & 0xff
    }
}

/// A NEED_GET_DATA command for tag `tag`: the kernel copies the write's data to `addr` and hands
/// the command over (user data [`OP_GET_DATA`]).
fn submit_get_data(q: &UblkQueue, op: u32, tag: u16, addr: u64) {
    // struct ublksrv_io_cmd: q_id, tag, result, addr
    let mut cmd = [0u8; 16];
    cmd[0..2].copy_from_slice(&q.get_qid().to_ne_bytes());
    cmd[2..4].copy_from_slice(&tag.to_ne_bytes());
    cmd[8..16].copy_from_slice(&addr.to_ne_bytes());
    let sqe = io_uring::opcode::UringCmd16::new(io_uring::types::Fixed(0), op)
        .cmd(cmd)
        .build()
        .user_data(UblkIOCtx::build_user_data(tag, OP_GET_DATA, 0, true));
    let _ = q.ublk_submit_sqe_sync(sqe);
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
    let zero = match block_op {
        Some(BlockOp::WriteZeroes { may_unmap }) => {
            Some(Zeroing::new(off, len, may_unmap, geo.write_same))
        }
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
        zero,
    };
    let result = match block_op {
        None => Err(libc::EOPNOTSUPP),
        Some(bop) => {
            let (op, off, len) = match pending.tags[idx].zero.as_mut() {
                Some(z) => z.command(pending.max_io),
                None => (bop, off, len),
            };
            path.submit(tag, op, off, len, &geo)
        }
    };
    if let Err(errno) = result {
        fail_now(q, path, pending, tag, errno);
    }
}

/// Completes ublk command `tag` at once with `errno` (nothing of it is out on the path).
fn fail_now(q: &UblkQueue, path: &Path<Relogin>, pending: &mut Pending, tag: u16, errno: i32) {
    let t = pending.tags[usize::from(tag)];
    pending.io.record(t.kind, t.len, false, 0);
    let _ = q.complete_io_cmd_unified(
        tag,
        commit_buf(path.bufs(), tag, t.kind),
        Ok(UblkIORes::Result(-errno)),
    );
}
