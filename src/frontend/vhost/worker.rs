//! One virtqueue's worker: the queue's SRP path, and what the queue's thread does each time it is
//! woken (a kick, a completion, the connection manager, a deadline). A request's data goes to the
//! target straight from the guest's memory, lent to the path once per memory table: one segment
//! per guest buffer (split where it crosses a memory region), as a direct descriptor or an inline
//! indirect one. A request with more segments than one command carries is copied through the
//! queue's registered buffers instead (counted in [`Counters::copied_bytes`]).

use super::inflight::Inflight;
use super::request::{self, kind, status, ChainError, Range, Request};
use super::translate;
use super::Device;
use crate::channel::block::BlockOp;
use crate::channel::{clock_ms, DataBuf};
use crate::frontend::status::ExportStatus;
use crate::path::{Connect, Event, Path, Sleep, Woken};
use crate::rdma::{Lent, TagBufs};
use crate::session::Relogin;
use crate::stats::{IoCounters, IoKind};
use crate::wire::scsi::Cdb;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;

/// What a request counts as in `srp-ublk stats`.
fn io_kind(r: &Request) -> IoKind {
    match r.kind {
        kind::IN => IoKind::Read,
        kind::OUT => IoKind::Write,
        _ => IoKind::Other,
    }
}

/// The vring type the workers serve.
pub(super) type Vring = VringRwLock<GuestMemoryAtomic<GuestMemoryMmap<()>>>;

/// What a queue did, for the log at the end of a connection and for `stats`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// Requests completed.
    pub requests: u64,
    /// Data bytes the target moved straight to or from guest memory.
    pub zero_copy_bytes: u64,
    /// Data bytes copied through the queue's buffers.
    pub copied_bytes: u64,
    /// Requests that completed with an error status.
    pub errors: u64,
    /// Zero-copy requests whose data went as several segments (an indirect descriptor).
    pub indirect: u64,
}

/// A request the target has.
struct InFlight {
    head: u16,
    status: GuestAddress,
    /// The used length to report (data written into the guest's buffers, and the status byte).
    used: u32,
    /// A copied read: where its data goes in guest memory.
    copy_out: Vec<Range>,
    /// The guest memory the request refers to, kept while it is out.
    mem: Arc<GuestMemoryMmap<()>>,
    /// The VMM connection it came on.
    epoch: u64,
    /// For the counters: what it is, its bytes, when it came.
    kind: IoKind,
    bytes: u32,
    started: Instant,
}

/// The fds of one login in the worker's epoll.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Watched {
    gen: u16,
    cq: Option<RawFd>,
    cm: Option<RawFd>,
}

const ID_CQ: u64 = 1;
const ID_CM: u64 = 2;
const ID_TIMER: u64 = 3;

/// One virtqueue's worker (see the module documentation). `C` is how its path logs in again
/// (tests drive a worker over the fake target).
pub(super) struct Worker<C: Connect = Relogin> {
    qid: u16,
    path: Path<C>,
    dev: Arc<Device>,
    epoll: Epoll,
    timer: TimerFd,
    watched: Option<Watched>,
    inflight: Vec<Option<InFlight>>,
    free: Vec<u16>,
    /// The memory table generation lent to the path.
    lent_gen: u64,
    /// The VMM connection: requests of an earlier one are not answered on this one's rings.
    epoch: u64,
    mem: Option<Arc<GuestMemoryMmap<()>>>,
    segs: Vec<DataBuf>,
    lost: bool,
    /// Requests out, for `stop_vring`.
    pub(super) outstanding: Arc<AtomicU16>,
    pub(super) counters: Counters,
    /// Operations, bytes, errors and latencies, published with the path's counters.
    io: IoCounters,
    status: Arc<ExportStatus>,
    /// The thread that last ran the worker (its tid published once per thread).
    thread: Option<std::thread::ThreadId>,
    /// The VMM's inflight region, where the requests taken from the ring are marked until used.
    tracking: Option<Tracking>,
    /// Requests an earlier backend took and never used: taken again before the ring's.
    again: VecDeque<u16>,
}

/// The inflight region and the order number of the last request taken.
struct Tracking {
    region: Arc<Inflight>,
    counter: u64,
}

impl<C: Connect> Worker<C> {
    /// Queue `qid`'s worker over `path`, publishing into `status.queues[qid]`.
    pub(super) fn new(
        qid: u16,
        path: Path<C>,
        dev: Arc<Device>,
        status: Arc<ExportStatus>,
    ) -> std::io::Result<Worker<C>> {
        let depth = path.bufs().depth();
        let w = Worker {
            qid,
            path,
            dev,
            epoll: Epoll::new()?,
            timer: TimerFd::new()?,
            watched: None,
            inflight: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            lent_gen: 0,
            epoch: 0,
            mem: None,
            segs: Vec::new(),
            lost: false,
            outstanding: Arc::new(AtomicU16::new(0)),
            counters: Counters::default(),
            io: IoCounters::default(),
            status,
            thread: None,
            tracking: None,
            again: VecDeque::new(),
        };
        w.epoll.ctl(
            ControlOperation::Add,
            w.timer.as_raw_fd(),
            EpollEvent::new(EventSet::IN, ID_TIMER),
        )?;
        Ok(w)
    }

    /// The fd the daemon's event loop watches for this worker: readable when a completion, the
    /// connection manager or a deadline wants it.
    pub(super) fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Waits up to `ms` milliseconds for the worker to want a pass (its fd readable: a completion,
    /// the connection manager or a deadline), for a thread that has no ring to wait on.
    pub(super) fn wait(&self, ms: i32) -> bool {
        let mut evs = [EpollEvent::default(); 4];
        self.epoll.wait(ms, &mut evs).is_ok_and(|n| n > 0)
    }

    /// A new VMM connection: no memory table yet, and what the last one left out is answered to
    /// no one.
    pub(super) fn new_connection(&mut self) {
        self.epoch += 1;
        self.mem = None;
        self.lent_gen = 0;
        self.tracking = None;
        self.again.clear();
    }

    /// Marks the requests taken from now on in `region`; `again`: those an earlier backend took
    /// and never used (in the order it took them, `counter` the last one's number).
    pub(super) fn track(&mut self, region: Arc<Inflight>, again: Vec<u16>, counter: u64) {
        self.tracking = Some(Tracking { region, counter });
        self.again = again.into();
    }

    /// Puts `head` in the used ring, the inflight region told before and after.
    fn put_used(&self, vring: &Vring, head: u16, len: u32) {
        let Some(t) = &self.tracking else {
            let _ = vring.add_used(head, len);
            return;
        };
        let state = t.region.queue(usize::from(self.qid));
        if let Some(s) = &state {
            s.using(head);
        }
        let _ = vring.add_used(head, len);
        if let Some(s) = &state {
            s.used(head, vring.get_ref().get_queue().next_used());
        }
    }

    /// The next chain to serve: one taken again from the inflight region, or the ring's next
    /// (then marked there); its head and descriptors, or why it is no request.
    #[allow(clippy::type_complexity)]
    fn next_chain(
        &mut self,
        vring: &Vring,
        mem: &GuestMemoryMmap<()>,
    ) -> Option<(u16, Result<Vec<(GuestAddress, u32, bool)>, ChainError>)> {
        let mut state = vring.get_mut();
        if !state.is_enabled() || !state.get_queue().ready() {
            return None;
        }
        if let Some(head) = self.again.pop_front() {
            let q = state.get_queue();
            let table = GuestAddress(q.desc_table());
            return Some((head, request::chain_at(mem, table, q.size(), head)));
        }
        let chain = state.get_queue_mut().pop_descriptor_chain(mem)?;
        drop(state);
        let head = chain.head_index();
        if let Some(t) = &mut self.tracking {
            t.counter += 1;
            if let Some(s) = t.region.queue(usize::from(self.qid)) {
                s.taken(head, t.counter);
            }
        }
        // a chain whose last descriptor still says "next" was cut short by the iterator: it
        // loops, is longer than the queue, or points past it
        let mut open = false;
        let descs: Vec<(GuestAddress, u32, bool)> = chain
            .inspect(|d| open = d.has_next())
            .map(|d| (d.addr(), d.len(), d.is_write_only()))
            .collect();
        Some((
            head,
            if open {
                Err(ChainError::Unterminated)
            } else {
                Ok(descs)
            },
        ))
    }

    /// Whether memory table generation `gen` is news to this worker.
    pub(super) fn needs_memory(&self, gen: u64) -> bool {
        gen != self.lent_gen
    }

    /// One pass: what woke the worker, the guest's new requests, the path's completions; then
    /// what wakes it next. `mem`: a memory table to lend first (with its generation).
    pub(super) fn pass(
        &mut self,
        vring: &Vring,
        mem: Option<(u64, Option<Arc<GuestMemoryMmap<()>>>)>,
    ) {
        let woken = self.drain_epoll();
        self.path.woke(woken);
        if let Some(m) = mem {
            self.lend(m);
        }
        self.path.set_clock(clock_ms());
        self.path.tick(clock_ms());
        let mut used = false;
        loop {
            let mut progress = self.take_requests(vring, &mut used);
            progress |= self.complete(vring, &mut used);
            if !progress {
                // a completion may land between the last poll and the arm: poll once more. That
                // poll may also take the channel down (a flushed receive), and the arm was for
                // the login that was up: arm again, for the down steps' deadline
                let login = (self.path.gen(), self.path.is_up());
                self.arm();
                let finished = self.complete(vring, &mut used);
                if !finished && login == (self.path.gen(), self.path.is_up()) {
                    break;
                }
            }
        }
        if used && vring.needs_notification().unwrap_or(true) {
            let _ = vring.signal_used_queue();
        }
        self.outstanding.store(self.path.busy(), Relaxed);
        self.publish();
    }

    /// Publishes the queue's counters for `srp-ublk list` and `stats`.
    fn publish(&mut self) {
        let Some(q) = self.status.queues.get(usize::from(self.qid)) else {
            return;
        };
        let me = std::thread::current().id();
        if self.thread != Some(me) {
            self.thread = Some(me);
            q.tid.store(nix::unistd::gettid().as_raw(), Relaxed);
        }
        q.publish(&self.path, &self.io);
        q.zero_copy_bytes
            .store(self.counters.zero_copy_bytes, Relaxed);
        q.copied_bytes.store(self.counters.copied_bytes, Relaxed);
    }

    /// Lends the guest's current memory table to the path.
    fn lend(&mut self, (gen, mem): (u64, Option<Arc<GuestMemoryMmap<()>>>)) {
        self.lent_gen = gen;
        self.mem = mem;
        let Some(m) = &self.mem else { return };
        if let Err(e) = self.path.lend(Lent::guest(m.clone())) {
            tracing::warn!(
                "queue {}: registering the guest's memory: {}; requests are copied until a \
                 login registers it",
                self.qid,
                crate::Chain(&e)
            );
        }
    }

    /// What the worker's epoll has ready, drained; the timer disarmed.
    fn drain_epoll(&mut self) -> Woken {
        let mut evs = [EpollEvent::default(); 4];
        let n = self.epoll.wait(0, &mut evs).unwrap_or(0);
        let mut w = Woken {
            gen: self.watched.map_or(0, |s| s.gen),
            ..Woken::default()
        };
        for e in &evs[..n] {
            match e.data() {
                ID_CQ => w.cq = true,
                ID_CM => w.cm = true,
                _ => {}
            }
        }
        let _ = self.timer.clear();
        w
    }

    /// Arms the completion channel and watches what [`Path::sleep`] names.
    fn arm(&mut self) {
        let s = self.path.sleep(true);
        self.watch(s);
        if let Some(d) = s.deadline {
            let _ = self.timer.reset(d.max(Duration::from_millis(1)), None);
        }
    }

    /// Puts a login's fds in the epoll (those of an older login out).
    fn watch(&mut self, s: Sleep) {
        let now = Watched {
            gen: s.gen,
            cq: s.cq,
            cm: s.cm,
        };
        if self.watched == Some(now) {
            return;
        }
        if let Some(old) = self.watched {
            for fd in [old.cq, old.cm].into_iter().flatten() {
                // a closed fd left the epoll already
                let _ = self
                    .epoll
                    .ctl(ControlOperation::Delete, fd, EpollEvent::default());
            }
        }
        for (fd, id) in [(now.cq, ID_CQ), (now.cm, ID_CM)] {
            if let Some(fd) = fd {
                let _ =
                    self.epoll
                        .ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, id));
            }
        }
        self.watched = Some(now);
    }

    /// Starts the guest's new requests while tags are free; whether any started. Notifications
    /// are off while the ring is drained and back on (with EVENT_IDX: the avail event moved) once
    /// it is empty; with no tag free they stay off, and the completion that frees one comes back
    /// here.
    fn take_requests(&mut self, vring: &Vring, used: &mut bool) -> bool {
        let Some(mem) = self.mem.clone() else {
            return false;
        };
        let mut started = false;
        loop {
            {
                // a ring not started, or stopped (GET_VRING_BASE), is not read at all
                let s = vring.get_ref();
                if !s.is_enabled() || !s.get_queue().ready() {
                    return started;
                }
            }
            let _ = vring.disable_notification();
            while !self.free.is_empty() {
                let Some((head, descs)) = self.next_chain(vring, &mem) else {
                    break;
                };
                started = true;
                match descs.and_then(|d| request::parse(&*mem, head, &d)) {
                    Ok(r) => self.start(r, &mem, vring, used),
                    Err(e) => self.bad_chain(head, e, vring, used),
                }
            }
            if self.free.is_empty() || !vring.enable_notification().unwrap_or(false) {
                return started;
            }
        }
    }

    /// A chain that is no request: it goes back used, with a status where one could be written.
    fn bad_chain(&mut self, head: u16, e: ChainError, vring: &Vring, used: &mut bool) {
        tracing::warn!("queue {}: {e}; the request is answered unread", self.qid);
        self.counters.errors += 1;
        self.io.record(IoKind::Other, 0, false, 0);
        self.put_used(vring, head, 0);
        *used = true;
    }

    /// Executes a parsed request: at once (GET_ID, an error) or on a tag.
    fn start(
        &mut self,
        r: Request,
        mem: &Arc<GuestMemoryMmap<()>>,
        vring: &Vring,
        used: &mut bool,
    ) {
        let answer = match r.kind {
            kind::IN | kind::OUT => self.rw(&r, mem),
            kind::FLUSH => self.op(&r, BlockOp::Flush, 0, 0, mem),
            kind::GET_ID => Err(self.get_id(&r, mem)),
            kind::DISCARD | kind::WRITE_ZEROES => self.deallocate(&r, mem),
            _ => Err((status::UNSUPP, 0)),
        };
        if let Err((st, data)) = answer {
            self.finish_now(&r, st, data, mem, vring);
            *used = true;
        }
    }

    /// A request answered without the target: its status written and the chain used.
    fn finish_now(
        &mut self,
        r: &Request,
        st: u8,
        data: u32,
        mem: &GuestMemoryMmap<()>,
        vring: &Vring,
    ) {
        let _ = mem.write_obj(st, r.status);
        self.put_used(vring, r.head, data + 1);
        self.counters.requests += 1;
        if st != status::OK {
            self.counters.errors += 1;
        }
        self.io.record(io_kind(r), 0, st == status::OK, 0);
    }

    /// GET_ID: the serial, at most 20 bytes, into the request's buffers.
    fn get_id(&self, r: &Request, mem: &GuestMemoryMmap<()>) -> (u8, u32) {
        if !r.writable {
            return (status::IOERR, 0);
        }
        let mut left = &self.dev.serial[..];
        let mut n = 0;
        for d in &r.data {
            let k = (d.len as usize).min(left.len());
            if mem.write_slice(&left[..k], d.addr).is_err() {
                return (status::IOERR, 0);
            }
            left = &left[k..];
            n += k as u32;
        }
        (status::OK, n)
    }

    /// `op` on a free tag: FLUSH (what it becomes follows the LUN's write cache), DISCARD or
    /// WRITE_ZEROES of `len` bytes at `off`.
    fn op(
        &mut self,
        r: &Request,
        op: BlockOp,
        off: u64,
        len: u32,
        mem: &Arc<GuestMemoryMmap<()>>,
    ) -> Result<(), (u8, u32)> {
        let tag = self.free.pop().ok_or((status::IOERR, 0))?;
        let (lun, geo) = (self.path.lun(), self.dev.geo);
        match self.path.submit(tag, lun, op, off, len, &geo) {
            Ok(()) => {
                self.hold(tag, r, 0, Vec::new(), mem);
                Ok(())
            }
            Err(_) => {
                self.free.push(tag);
                Err((status::IOERR, 0))
            }
        }
    }

    /// DISCARD or WRITE_ZEROES: one range (`max_*_seg` is 1) of whole blocks, within what the
    /// device advertised; an unknown flag, or the unmap flag on a DISCARD, is UNSUPP.
    fn deallocate(&mut self, r: &Request, mem: &Arc<GuestMemoryMmap<()>>) -> Result<(), (u8, u32)> {
        let discard = r.kind == kind::DISCARD;
        let limit = if discard {
            self.dev.max_discard
        } else {
            self.dev.max_write_zeroes
        };
        let ([seg], false, 1..) = (&r.data[..], r.writable, limit) else {
            return Err((status::UNSUPP, 0));
        };
        let mut range = [0u8; 16];
        if seg.len != 16 || mem.read_slice(&mut range, seg.addr).is_err() {
            return Err((status::IOERR, 0));
        }
        let sector = u64::from_le_bytes(range[0..8].try_into().expect("8 bytes"));
        let sectors = u32::from_le_bytes(range[8..12].try_into().expect("4 bytes"));
        let flags = u32::from_le_bytes(range[12..16].try_into().expect("4 bytes"));
        let unmap = flags & request::UNMAP != 0;
        if flags & !request::UNMAP != 0 || (discard && unmap) {
            return Err((status::UNSUPP, 0));
        }
        let (off, len) = (sector.saturating_mul(512), u64::from(sectors) * 512);
        let fits = sectors > 0 && sectors <= limit && self.in_lun(off, len);
        if !fits || self.lost || self.dev.read_only {
            return Err((status::IOERR, 0));
        }
        let op = if discard {
            BlockOp::Discard
        } else {
            BlockOp::WriteZeroes { may_unmap: unmap }
        };
        self.op(r, op, off, len as u32, mem)
    }

    /// Whether `len` bytes at byte `off` are whole logical blocks of the LUN.
    fn in_lun(&self, off: u64, len: u64) -> bool {
        let bs = u64::from(self.dev.block_size);
        off % bs == 0
            && len % bs == 0
            && off
                .checked_add(len)
                .is_some_and(|e| e <= self.dev.size.load(Relaxed))
    }

    /// A READ or WRITE: checked against the LUN, then zero copy or copied.
    fn rw(&mut self, r: &Request, mem: &Arc<GuestMemoryMmap<()>>) -> Result<(), (u8, u32)> {
        let read = r.kind == kind::IN;
        let len = r.len();
        if len == 0 {
            return Err((status::OK, 0));
        }
        let bs = u64::from(self.dev.block_size);
        let off = r.sector.checked_mul(512).ok_or((status::IOERR, 0))?;
        let fits = self.in_lun(off, len) && len <= u64::from(u32::MAX);
        if !fits || self.lost || r.writable != read || (!read && self.dev.read_only) {
            return Err((status::IOERR, 0));
        }
        let tag = self.free.pop().ok_or((status::IOERR, 0))?;
        let lba = off / bs;
        let blocks = (len / bs) as u32;
        let zero_copy = self.segments(r, mem);
        let sent = if zero_copy {
            let cdb = if read {
                Cdb::read16(lba, blocks, false)
            } else {
                Cdb::write16(lba, blocks, false)
            };
            let segs = std::mem::take(&mut self.segs);
            let lun = self.path.lun();
            let s = self.path.submit_segments(tag, lun, cdb, !read, &segs);
            self.segs = segs;
            s
        } else {
            self.copied(tag, r, off, len as u32, mem)
        };
        if sent.is_err() {
            self.free.push(tag);
            return Err((status::IOERR, 0));
        }
        if zero_copy {
            self.counters.zero_copy_bytes += len;
            if self.segs.len() > 1 {
                self.counters.indirect += 1;
            }
        } else {
            self.counters.copied_bytes += len;
        }
        let copy_out = if read && !zero_copy {
            r.data.clone()
        } else {
            Vec::new()
        };
        let used = if read { len as u32 } else { 0 };
        self.hold(tag, r, used, copy_out, mem);
        Ok(())
    }

    /// The request's data as segments of the lent guest memory (in `self.segs`): false (and
    /// `self.segs` empty) when it must be copied instead.
    fn segments(&mut self, r: &Request, mem: &GuestMemoryMmap<()>) -> bool {
        let max = usize::from(self.path.max_segments());
        match self.path.loan() {
            Some((_, lent)) => translate::segments(mem, lent, &r.data, max, &mut self.segs),
            None => {
                self.segs.clear();
                false
            }
        }
    }

    /// Sends a request through the tag's own buffer, a write's data copied in first.
    fn copied(
        &mut self,
        tag: u16,
        r: &Request,
        off: u64,
        len: u32,
        mem: &GuestMemoryMmap<()>,
    ) -> Result<(), i32> {
        if len > self.dev.max_io {
            return Err(libc::EINVAL);
        }
        let read = r.kind == kind::IN;
        if !read {
            let buf = self.path.buf(tag);
            let mut at = 0usize;
            for d in &r.data {
                let n = d.len as usize;
                mem.read_slice(&mut buf[at..at + n], d.addr)
                    .map_err(|_| libc::EFAULT)?;
                at += n;
            }
        }
        let op = if read {
            BlockOp::Read
        } else {
            BlockOp::Write { fua: false }
        };
        let (lun, geo) = (self.path.lun(), self.dev.geo);
        self.path.submit(tag, lun, op, off, len, &geo)
    }

    fn hold(
        &mut self,
        tag: u16,
        r: &Request,
        used: u32,
        copy_out: Vec<Range>,
        mem: &Arc<GuestMemoryMmap<()>>,
    ) {
        let kind = io_kind(r);
        let bytes = if kind == IoKind::Other {
            0
        } else {
            r.len() as u32
        };
        self.inflight[usize::from(tag)] = Some(InFlight {
            head: r.head,
            status: r.status,
            used,
            copy_out,
            mem: mem.clone(),
            epoch: self.epoch,
            kind,
            bytes,
            started: Instant::now(),
        });
    }

    /// The path's completions (and its down steps); whether any request finished.
    fn complete(&mut self, vring: &Vring, used: &mut bool) -> bool {
        let now = Instant::now();
        let mut finished: Vec<(u16, i32)> = Vec::new();
        let inflight = &mut self.inflight;
        let (_, event) = self.path.service(Instant::now(), &mut |d, bufs: &TagBufs| {
            let Some(f) = inflight.get(usize::from(d.tag)).and_then(|f| f.as_ref()) else {
                return;
            };
            let mut errno = d.outcome.errno;
            if errno == 0 && !f.copy_out.is_empty() {
                let src = bufs.tag_data(d.tag);
                let mut at = 0usize;
                for r in &f.copy_out {
                    let n = r.len as usize;
                    let ok = src
                        .get(at..at + n)
                        .is_some_and(|s| f.mem.write_slice(s, r.addr).is_ok());
                    if !ok {
                        errno = libc::EFAULT;
                    }
                    at += n;
                }
            }
            finished.push((d.tag, errno));
        });
        match event {
            Some(Event::Lost) => {
                tracing::warn!(
                    "queue {}: the target is lost (dev_loss_tmo): I/O fails from now on",
                    self.qid
                );
                self.lost = true;
            }
            Some(Event::Removed { .. }) => tracing::warn!(
                "queue {}: the RDMA device went away: I/O is held until it is back or \
                 dev_loss_tmo expires",
                self.qid
            ),
            None => {}
        }
        for &(tag, errno) in &finished {
            let Some(f) = self.inflight[usize::from(tag)].take() else {
                continue;
            };
            self.free.push(tag);
            let us = now.saturating_duration_since(f.started).as_micros() as u64;
            self.io.record(f.kind, f.bytes, errno == 0, us);
            if f.epoch != self.epoch {
                // the VMM that sent it is gone
                continue;
            }
            let st = if errno == 0 {
                status::OK
            } else {
                status::IOERR
            };
            let _ = f.mem.write_obj(st, f.status);
            let used_len = if errno == 0 { f.used } else { 0 };
            self.put_used(vring, f.head, used_len + 1);
            self.counters.requests += 1;
            if st != status::OK {
                self.counters.errors += 1;
            }
        }
        if !finished.is_empty() {
            *used = true;
        }
        !finished.is_empty()
    }

    /// The queue's counters.
    pub(super) fn counters(&self) -> Counters {
        self.counters
    }

    /// The path's transport (the fake target, in tests).
    #[cfg(test)]
    pub(super) fn target(&mut self) -> &mut C::T {
        self.path.transport_mut()
    }
}
