//! The NBD front end: the same per-queue SRP channels served over NBD (nbd `doc/proto.md`), for VM hosts
//! (QEMU/libvirt attach an NBD export directly) and hosts without ublk.
//!
//! One connection owns one SRP channel, taken from the session's pool for as long as it lives, so a
//! multi-conn client gets one channel per connection, as ublk gets one per queue. Each connection runs
//! on its own thread: fixed-newstyle handshake (EXPORT_NAME, INFO, GO, LIST, ABORT), then a non-blocking
//! transmission loop that reads pipelined requests, sends them on the channel, and writes simple
//! replies as commands complete (out of order). A malformed request gets the protocol's error reply,
//! or, where the stream cannot be resynchronised (bad magic), a disconnect of that connection only.

use crate::backend::MemDisk;
use crate::channel::block::{BlockOp, FuaWrite, Geometry, WriteCache, LBA_STATUS_BYTES};
use crate::frontend::status::ExportStatus;
use crate::path::{Connect, Event, Woken};
use crate::session::timers::Timers;
use crate::session::Relogin;
mod exec;
mod extents;
mod handshake;
mod listen;
mod pool;
mod reply;
mod split;
mod tls;

use crate::wire::nbd::{self, cmd, cmdflag, err, tflag, Request};
use exec::Exec;
use handshake::{bad, handshake, Negotiated};
pub use listen::{Limits, Listen, ListenError};
use listen::{Stream, Timed};
pub use pool::Pool;
use reply::{error_reply, read_reply_header};
pub use split::MAX_REQUEST;
use split::{too_large, Splits};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
pub use tls::{server_config, TlsError};

/// What an export is served from.
// one per export, created once: its size does not matter
#[allow(clippy::large_enum_variant)]
pub enum Source {
    /// SRP channels (the real thing); each connection takes one.
    Srp {
        /// Free channels.
        pool: Arc<Pool>,
        /// The LUN's geometry.
        geo: Geometry,
        /// Commands in flight per connection.
        depth: u16,
        /// How a connection's channel logs in again after it went down.
        relogin: Relogin,
        /// The transport-class timers each connection's channel keeps.
        timers: Timers,
    },
    /// RAM (demo/benchmark).
    Mem(Arc<MemDisk>),
    /// Zeros in, writes discarded (demo/benchmark).
    Null,
}

/// One export.
pub struct Export {
    /// Its name (clients may also ask for the default, "").
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Minimum (logical) block size.
    pub min_block: u32,
    /// Largest command (the channel's buffers): a larger READ or WRITE, up to [`MAX_REQUEST`], is
    /// carried out in parts of this size.
    pub max_io: u32,
    /// Read-only.
    pub read_only: bool,
    /// Whether WRITE_ZEROES may deallocate fast (FAST_ZERO is honoured only then).
    pub fast_zero: bool,
    /// TRIM supported.
    pub trim: bool,
    /// The write cache: whether FLUSH and FUA mean anything, and how FUA is carried out.
    pub cache: WriteCache,
    /// Largest TRIM / WRITE_ZEROES sent as one command, in bytes: a larger request is carried out
    /// as several, one after another on its tag, and answered once.
    pub max_trim: u32,
    /// The same for WRITE_ZEROES.
    pub max_zero: u32,
    /// Where the data lives.
    pub source: Source,
    /// NBD_CMD_BLOCK_STATUS asks the LUN (GET LBA STATUS): a thin LUN (LBPME) that has not
    /// refused the command. Otherwise every block is reported as data.
    pub lba_status: AtomicBool,
    /// WRITE_ZEROES is WRITE SAME: the LUN has it ([`Geometry::write_same`]) and has not refused
    /// it. Otherwise zeros are written, `max_io` at a time, and FAST_ZERO is refused.
    pub write_same: AtomicBool,
    /// The connections and each channel's counters, for `srp-ublk list` and `stats`.
    pub status: Arc<ExportStatus>,
}

impl Export {
    /// The transmission flags, telling the truth: FLUSH and FUA where the LUN has a volatile write
    /// cache (SYNCHRONIZE CACHE and FUA reach the LUN's cache, which every channel shares, so
    /// CAN_MULTI_CONN holds; without a cache a completed write is durable and neither is needed),
    /// TRIM and WRITE_ZEROES as the source supports them.
    pub fn flags(&self) -> u16 {
        let mut f = tflag::HAS_FLAGS | tflag::CAN_MULTI_CONN;
        f |= tflag::SEND_WRITE_ZEROES | tflag::SEND_FAST_ZERO;
        if self.cache.flushes() {
            f |= tflag::SEND_FLUSH | tflag::SEND_FUA;
        }
        if self.trim {
            f |= tflag::SEND_TRIM;
        }
        if self.read_only {
            f |= tflag::READ_ONLY;
        }
        f
    }

    fn depth(&self) -> u16 {
        match &self.source {
            Source::Srp { depth, .. } => *depth,
            _ => 64,
        }
    }
}

/// Listens and serves `export` until the process ends; `ready` runs once the socket accepts. With
/// `tls`, a client must start TLS (NBD_OPT_STARTTLS) before anything else is served.
pub fn serve(
    listen: &Listen,
    export: Arc<Export>,
    limits: Limits,
    tls: Option<Arc<rustls::ServerConfig>>,
    ready: impl FnOnce(),
) -> io::Result<()> {
    listen::serve(listen, limits, ready, move |s| {
        let _counted = export.status.connected();
        if let Err(e) = connection(s, &export, limits.handshake_timeout, tls.clone()) {
            tracing::info!("NBD connection ended: {e}");
        }
    })
}

fn connection(
    mut s: Stream,
    ex: &Export,
    handshake_timeout: Duration,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> io::Result<()> {
    let deadline = Instant::now() + handshake_timeout;
    let mut timed = Timed {
        s: &mut s,
        deadline,
    };
    let Some((exec, neg)) = handshake(&mut timed, ex, tls)? else {
        return Ok(());
    };
    s.set_timeouts(None)?;
    transmission(s, ex, exec, neg)
}

#[derive(Clone, Copy, Default)]
struct TagReq {
    cookie: u64,
    read: bool,
    off: u64,
    len: u32,
    /// The request's flags (FUA, NO_HOLE, FAST_ZERO, REQ_ONE).
    flags: u16,
    /// The command out now and its offset.
    op: Option<BlockOp>,
    cur: u64,
    /// What the tag does after its current command, before the client hears back.
    next: Next,
    /// A part of a split request: its slot and the part's offset in it ([`split`]).
    split: Option<(u16, u32)>,
}

/// What a tag does once its command finished.
#[derive(Debug, PartialEq, Eq)]
enum After {
    /// Send this command for the same request (offset, length), then `Next`.
    Submit(BlockOp, u64, u32, Next),
    /// The request is done: reply.
    Reply,
    /// The request failed with this errno.
    Fail(i32),
}

/// The rest of a request after the command its tag has out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Next {
    /// Reply.
    #[default]
    Reply,
    /// SYNCHRONIZE CACHE, then reply (FUA on a cached LUN without DPOFUA, or on TRIM/WRITE_ZEROES).
    Sync,
    /// `left` more bytes of a split TRIM or WRITE_ZEROES from `off`, then a SYNCHRONIZE CACHE if
    /// `sync`.
    More {
        op: BlockOp,
        off: u64,
        left: u64,
        sync: bool,
    },
    /// The GET LBA STATUS answer becomes a block status reply (only the first extent if `one`).
    Extents { one: bool },
}

/// One command of a request: what to send now, and what follows it.
fn step(ex: &Export, op: BlockOp, off: u64, len: u64, fua: bool) -> (BlockOp, u32, Next) {
    let chunk = match op {
        BlockOp::Discard => ex.max_trim,
        BlockOp::WriteZeroes { .. } => ex.max_zero,
        BlockOp::ZeroWrite => ex.max_io,
        _ => u32::MAX,
    };
    let now = len.min(u64::from(chunk.max(1))) as u32;
    let sync = fua
        && match op {
            BlockOp::Write { .. } => ex.cache.fua_write() == FuaWrite::ThenSync,
            BlockOp::Discard | BlockOp::WriteZeroes { .. } | BlockOp::ZeroWrite => {
                ex.cache.flushes()
            }
            BlockOp::Read | BlockOp::Flush | BlockOp::LbaStatus => false,
        };
    let next = if u64::from(now) < len {
        Next::More {
            op,
            off: off + u64::from(now),
            left: len - u64::from(now),
            sync,
        }
    } else if sync {
        Next::Sync
    } else {
        Next::Reply
    };
    (op, now, next)
}

const SPINS: u32 = 200;
/// How long a connection keeps reading its socket after it last made progress before it sleeps.
const SOCKET_SPIN: Duration = Duration::from_micros(50);
/// The longest sleep of a connection whose path has no timed work: a backstop, as everything
/// that needs the connection (the socket, a completion, the target's disconnect) wakes it.
const IDLE_WAIT: Duration = Duration::from_secs(1);

fn transmission(s: Stream, ex: &Export, exec: Exec, neg: Negotiated) -> io::Result<()> {
    let depth = ex.depth();
    Conn::new(s, ex, exec, neg, depth)?.run()
}

/// Replies waiting to be written past this stop the reading of requests.
const OUT_MAX: usize = 8 << 20;

/// One connection in transmission: requests read from the socket into `rbuf`, sent on `exec`
/// under a free tag, and answered in `out` as they complete (out of order).
struct Conn<'a, C: Connect = Relogin> {
    s: Stream,
    ex: &'a Export,
    exec: Exec<C>,
    neg: Negotiated,
    free: Vec<u16>,
    tags: Vec<TagReq>,
    rbuf: Vec<u8>,
    rpos: usize,
    rlen: usize,
    /// Payload bytes of a refused write still to skip.
    skip: u64,
    out: Vec<u8>,
    opos: usize,
    done: Vec<(u16, Result<u32, i32>)>,
    /// Requests carried out in parts.
    splits: Splits,
    /// The client sent NBD_CMD_DISC.
    disc: bool,
    /// The client closed its side.
    eof: bool,
    /// The path ended the connection ([`Conn::on_event`]).
    ended: Option<Event>,
}

/// How long a connection has had nothing to do: it spins, then sleeps.
struct Spin {
    spins: u32,
    last: Instant,
}

/// What a request gets before any command is sent for it.
enum Admit {
    /// NBD_CMD_DISC.
    Disconnect,
    /// Answered at once with this error (0: success), its payload skipped.
    Reply(u32),
    /// NBD_CMD_BLOCK_STATUS answered with one extent.
    BlockStatus,
    /// Sent on the channel.
    Run,
    /// A READ or WRITE longer than one command: sent in parts ([`split`]).
    Split,
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// What tag `t` does now that its command finished with `r` (`Ok(resid)`): the request's
/// next command, its reply, or its failure. A LUN that refuses WRITE SAME gets the rest of the
/// WRITE_ZEROES as zeros written (from the refused command on), unless the client asked for
/// FAST_ZERO, which may then answer ENOTSUP.
fn after(ex: &Export, t: &TagReq, r: Result<u32, i32>) -> After {
    let fast = t.flags & cmdflag::FAST_ZERO != 0;
    if let (Err(libc::EOPNOTSUPP), Some(BlockOp::WriteZeroes { .. }), false) = (r, t.op, fast) {
        if ex.write_same.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                "NBD: the LUN refuses WRITE SAME: WRITE_ZEROES is carried out by writing zeros"
            );
        }
        let left = t.off + u64::from(t.len) - t.cur;
        let fua = t.flags & cmdflag::FUA != 0;
        let (op, len, next) = step(ex, BlockOp::ZeroWrite, t.cur, left, fua);
        return After::Submit(op, t.cur, len, next);
    }
    // NBD cannot report a short transfer
    match (r, t.next) {
        (Err(e), _) => After::Fail(e),
        (Ok(resid), _) if resid != 0 => {
            tracing::warn!(
                "NBD: the target left {resid} byte(s) of the request at {} untransferred: EIO",
                t.off
            );
            After::Fail(libc::EIO)
        }
        (Ok(_), Next::Sync) => After::Submit(BlockOp::Flush, 0, 0, Next::Reply),
        (
            Ok(_),
            Next::More {
                op,
                off,
                left,
                sync,
            },
        ) => {
            let (op, len, next) = step(ex, op, off, left, sync);
            After::Submit(op, off, len, next)
        }
        (Ok(_), Next::Reply | Next::Extents { .. }) => After::Reply,
    }
}

impl<'a, C: Connect> Conn<'a, C> {
    /// A connection in transmission on `s` with `depth` tags.
    fn new(
        s: Stream,
        ex: &'a Export,
        exec: Exec<C>,
        neg: Negotiated,
        depth: u16,
    ) -> io::Result<Self> {
        s.set_nonblocking(true)?;
        let cap = 2 * (nbd::REQUEST_LEN + ex.max_io as usize);
        Ok(Conn {
            s,
            ex,
            exec,
            neg,
            free: (0..depth).rev().collect(),
            tags: vec![TagReq::default(); usize::from(depth)],
            rbuf: vec![0u8; cap],
            rpos: 0,
            rlen: 0,
            skip: 0,
            out: Vec::with_capacity(1 << 20),
            opos: 0,
            done: Vec::with_capacity(usize::from(depth)),
            splits: Splits::default(),
            disc: false,
            eof: false,
            ended: None,
        })
    }

    fn run(mut self) -> io::Result<()> {
        let mut spin = Spin {
            spins: 0,
            last: Instant::now(),
        };
        while !self.pass(&mut spin)? {}
        Ok(())
    }

    /// One pass of the loop: read, dispatch, complete, reply, and sleep when there is nothing to
    /// do. True once the connection is over.
    fn pass(&mut self, spin: &mut Spin) -> io::Result<bool> {
        let mut progress = self.fill()?;
        progress |= self.dispatch()?;
        progress |= self.complete();
        progress |= self.send()?;
        // TLS records of what was written, as far as the socket takes them
        let tls_left = self.s.flush_pending()?;
        let idle = self.free.len() == self.tags.len();
        let over = (self.disc || self.eof) && idle || self.ended.is_some();
        if over && self.out.is_empty() && !tls_left {
            return Ok(true);
        }
        if progress {
            (spin.spins, spin.last) = (0, Instant::now());
            return Ok(false);
        }
        // nothing to do right now: spin a little while commands are in flight, then sleep
        if self.exec.busy() && spin.spins < SPINS {
            spin.spins += 1;
            return Ok(false);
        }
        // and on the socket for a moment after the last request or reply: a client working at
        // QD1 sends its next request within microseconds, and sleeping in poll(2) for it costs a
        // wake-up on each side per request
        if spin.last.elapsed() >= SOCKET_SPIN {
            self.wait(tls_left);
        }
        Ok(false)
    }

    /// Whether requests are still read: not after the client's DISC or EOF, nor once the path
    /// ended the connection.
    fn reading(&self) -> bool {
        !self.disc && !self.eof && self.ended.is_none()
    }

    /// Reads what the socket has, while there is room to act on it.
    fn fill(&mut self) -> io::Result<bool> {
        if !self.reading() || self.free.is_empty() || self.out.len() - self.opos >= OUT_MAX {
            return Ok(false);
        }
        let cap = self.rbuf.len();
        if self.rpos > 0 && self.rlen > cap / 2 {
            self.rbuf.copy_within(self.rpos..self.rlen, 0);
            self.rlen -= self.rpos;
            self.rpos = 0;
        }
        if self.rlen == cap {
            return Ok(false);
        }
        match self.s.read(&mut self.rbuf[self.rlen..]) {
            Ok(0) => self.eof = true,
            Ok(n) => {
                self.rlen += n;
                return Ok(true);
            }
            Err(e) if would_block(&e) => {}
            Err(e) => return Err(e),
        }
        Ok(false)
    }

    /// Parses and dispatches every complete request.
    fn dispatch(&mut self) -> io::Result<bool> {
        let mut progress = false;
        while self.reading() {
            if self.skip > 0 {
                let n = self.skip.min((self.rlen - self.rpos) as u64) as usize;
                self.rpos += n;
                self.skip -= n as u64;
                if self.skip > 0 {
                    break;
                }
            }
            if self.splits.receiving() {
                let at = self.rpos;
                let more = self.receive();
                progress |= self.rpos > at;
                if more {
                    break; // more of the write's payload is to come
                }
            }
            if self.rlen - self.rpos < nbd::REQUEST_LEN {
                break;
            }
            let req =
                Request::parse(&self.rbuf[self.rpos..self.rlen]).map_err(|e| bad(e.to_string()))?;
            let body = if req.kind == cmd::WRITE {
                req.length as usize
            } else {
                0
            };
            match self.admit(&req) {
                Admit::Disconnect => {
                    self.rpos += nbd::REQUEST_LEN;
                    self.disc = true;
                }
                Admit::Reply(e) => {
                    self.rpos += nbd::REQUEST_LEN;
                    self.skip = body as u64;
                    error_reply(
                        &mut self.out,
                        self.neg,
                        req.kind == cmd::READ,
                        e,
                        req.cookie,
                    );
                }
                Admit::BlockStatus => {
                    self.rpos += nbd::REQUEST_LEN;
                    let id = nbd::BASE_ALLOCATION_ID;
                    nbd::block_status_chunk(&mut self.out, req.cookie, id, &[(req.length, 0)]);
                }
                Admit::Run => {
                    if self.rlen - self.rpos < nbd::REQUEST_LEN + body {
                        break; // the write's payload is not all here yet
                    }
                    let Some(tag) = self.free.pop() else { break };
                    self.start(tag, &req, body);
                    progress = true;
                }
                Admit::Split => {
                    if !self.open_split(&req) {
                        break; // other split requests hold the connection's budget
                    }
                    self.rpos += nbd::REQUEST_LEN;
                    progress = true;
                }
            }
        }
        progress |= self.issue_parts();
        Ok(progress)
    }

    /// What `req` gets: an answer of its own, a refusal, or a command.
    fn admit(&self, req: &Request) -> Admit {
        let (ex, neg) = (self.ex, self.neg);
        let end = req.offset.checked_add(u64::from(req.length));
        let in_range = end.is_some_and(|e| e <= ex.size);
        match req.kind {
            cmd::DISC => return Admit::Disconnect,
            cmd::CACHE => return Admit::Reply(if in_range { 0 } else { err::EINVAL }),
            // base:allocation: a thin LUN is asked (GET LBA STATUS, see `extents`); any other
            // answers that every block is data, as a hole reported wrongly would make a client
            // skip data
            cmd::BLOCK_STATUS if neg.allocation && in_range && req.length > 0 => {
                let bs = u64::from(ex.min_block);
                let aligned = req.offset % bs == 0 && u64::from(req.length) % bs == 0;
                return if aligned && ex.lba_status.load(Ordering::Relaxed) {
                    Admit::Run
                } else {
                    Admit::BlockStatus
                };
            }
            cmd::READ | cmd::WRITE | cmd::FLUSH | cmd::TRIM | cmd::WRITE_ZEROES => {}
            _ => return Admit::Reply(err::EINVAL),
        }
        let fast_zero = req.flags & cmdflag::FAST_ZERO != 0;
        let write_same = ex.write_same.load(Ordering::Relaxed);
        let refused = match req.kind {
            _ if !in_range && req.kind != cmd::FLUSH => {
                if req.kind == cmd::READ {
                    err::EINVAL
                } else {
                    err::ENOSPC
                }
            }
            cmd::READ | cmd::WRITE if req.length > MAX_REQUEST => too_large(neg.structured),
            cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES if ex.read_only => err::EPERM,
            cmd::TRIM if !ex.trim => err::EINVAL,
            cmd::WRITE_ZEROES
                if fast_zero
                    && (!ex.fast_zero || !write_same || req.flags & cmdflag::NO_HOLE != 0) =>
            {
                err::ENOTSUP
            }
            // no volatile cache: every write already completed is durable
            cmd::FLUSH if !ex.cache.flushes() => 0,
            cmd::READ | cmd::WRITE if req.length > ex.max_io => return Admit::Split,
            _ => return Admit::Run,
        };
        Admit::Reply(refused)
    }

    /// Sends request `req` (its `body` bytes of payload in `rbuf`) on tag `tag`.
    fn start(&mut self, tag: u16, req: &Request, body: usize) {
        self.rpos += nbd::REQUEST_LEN;
        if body > 0 {
            let payload = &self.rbuf[self.rpos..self.rpos + body];
            self.exec.buf(tag)[..body].copy_from_slice(payload);
            self.rpos += body;
        }
        let fua = req.flags & cmdflag::FUA != 0;
        let op = match req.kind {
            cmd::READ => BlockOp::Read,
            cmd::WRITE => BlockOp::Write { fua },
            cmd::FLUSH => BlockOp::Flush,
            cmd::TRIM => BlockOp::Discard,
            cmd::BLOCK_STATUS => BlockOp::LbaStatus,
            _ if self.ex.write_same.load(Ordering::Relaxed) => BlockOp::WriteZeroes {
                may_unmap: req.flags & cmdflag::NO_HOLE == 0,
            },
            _ => BlockOp::ZeroWrite,
        };
        let (op, len, mut next) = step(self.ex, op, req.offset, u64::from(req.length), fua);
        if op == BlockOp::LbaStatus {
            let one = req.flags & cmdflag::REQ_ONE != 0;
            next = Next::Extents { one };
        }
        self.tags[usize::from(tag)] = TagReq {
            cookie: req.cookie,
            read: req.kind == cmd::READ,
            off: req.offset,
            len: req.length,
            flags: req.flags,
            op: Some(op),
            cur: req.offset,
            next,
            split: None,
        };
        if let Err(e) = self.exec.submit(tag, op, req.offset, len) {
            self.free.push(tag);
            let t = self.tags[usize::from(tag)];
            if let Next::Extents { one } = t.next {
                self.status_reply(tag, t, Err(e), one);
            } else {
                let e = err::from_errno(e);
                error_reply(&mut self.out, self.neg, t.read, e, t.cookie);
            }
        }
    }

    /// Collects what the path finished into `done` and acts on what else it reports; returns how
    /// many commands finished.
    fn poll_exec(&mut self) -> usize {
        let (n, event) = self.exec.poll(&mut self.done);
        if let Some(e) = event {
            self.on_event(e);
        }
        n
    }

    /// A path given up (dev_loss_tmo) or whose RDMA device is going away ends the connection once
    /// the replies it has are sent: the client's next connection gets a channel that works (a new
    /// login) or a clear refusal, where this one would answer every request with an error.
    fn on_event(&mut self, e: Event) {
        match e {
            Event::Lost => tracing::warn!(
                "NBD connection: its SRP channel is given up (dev_loss_tmo): closing the \
                 connection; the client's next connection logs a new channel in"
            ),
            Event::Removed { .. } => tracing::warn!(
                "NBD connection: the RDMA device under its SRP channel is going away: closing the \
                 connection"
            ),
        }
        self.ended = Some(e);
    }

    /// Turns completions into replies, or into a request's next command.
    fn complete(&mut self) -> bool {
        let progress = self.poll_exec() > 0;
        let mut done = std::mem::take(&mut self.done);
        for (tag, r) in done.drain(..) {
            let t = self.tags[usize::from(tag)];
            if let Next::Extents { one } = t.next {
                self.status_reply(tag, t, r, one);
                self.free.push(tag);
                continue;
            }
            let r = match after(self.ex, &t, r) {
                After::Submit(op, off, len, next) => {
                    let tr = &mut self.tags[usize::from(tag)];
                    (tr.op, tr.cur, tr.next) = (Some(op), off, next);
                    match self.exec.submit(tag, op, off, len) {
                        Ok(()) => continue, // the request's next command is out
                        Err(e) => Err(e),
                    }
                }
                After::Reply => Ok(()),
                After::Fail(e) => Err(e),
            };
            match (r, t.split) {
                (r, Some(_)) => self.part_done(tag, r),
                (Ok(()), None) => self.reply(tag, t),
                (Err(e), None) => {
                    let e = err::from_errno(e);
                    error_reply(&mut self.out, self.neg, t.read, e, t.cookie)
                }
            }
            self.free.push(tag);
        }
        self.done = done;
        progress
    }

    /// The reply to a block status request from its GET LBA STATUS outcome (`Ok(resid)`): the
    /// extents the LUN described; every block data where the LUN refuses the command (and no
    /// later request asks it); an error chunk for any other failure.
    fn status_reply(&mut self, tag: u16, t: TagReq, r: Result<u32, i32>, one: bool) {
        let ext = match (r, self.exec.geometry()) {
            (Ok(resid), Some(geo)) => {
                let got = LBA_STATUS_BYTES.min(self.ex.max_io).saturating_sub(resid);
                let data = &self.exec.buf(tag)[..got as usize];
                extents::allocation(data, t.off, t.len, &geo, one)
            }
            // a demo backend never asks (its exports have lba_status off)
            (Ok(_), None) => vec![(t.len, 0)],
            (Err(libc::EOPNOTSUPP), _) => {
                if self.ex.lba_status.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        "NBD: the LUN refuses GET LBA STATUS: block status reports every block \
                         as data"
                    );
                }
                vec![(t.len, 0)]
            }
            (Err(e), _) => {
                self.out
                    .extend_from_slice(&nbd::error_chunk(err::from_errno(e), t.cookie));
                return;
            }
        };
        nbd::block_status_chunk(&mut self.out, t.cookie, nbd::BASE_ALLOCATION_ID, &ext);
    }

    /// The reply to a request that succeeded (with a read's data).
    fn reply(&mut self, tag: u16, t: TagReq) {
        if !t.read {
            self.out.extend_from_slice(&nbd::simple_reply(0, t.cookie));
            return;
        }
        read_reply_header(&mut self.out, self.neg, t.cookie, t.off, t.len);
        self.out
            .extend_from_slice(&self.exec.buf(tag)[..t.len as usize]);
    }

    /// Writes replies as far as the socket takes them.
    fn send(&mut self) -> io::Result<bool> {
        let mut progress = false;
        while self.opos < self.out.len() {
            match self.s.write(&self.out[self.opos..]) {
                Ok(0) => return Err(bad("client closed while receiving replies")),
                Ok(n) => {
                    self.opos += n;
                    progress = true;
                }
                Err(e) if would_block(&e) => break,
                Err(e) => return Err(e),
            }
        }
        if self.opos == self.out.len() {
            self.out.clear();
            self.opos = 0;
        }
        Ok(progress)
    }

    /// Sleeps until the socket, the path's completion channel or its connection manager has
    /// something, or until the path's next timed work ([`IDLE_WAIT`] at most).
    fn wait(&mut self, tls_left: bool) {
        let want_read = self.reading() && !self.free.is_empty();
        if want_read && self.s.buffered() {
            return; // TLS holds decrypted requests: the socket need not be readable
        }
        let mut ev = 0;
        if want_read {
            ev |= libc::POLLIN;
        }
        if !self.out.is_empty() || tls_left {
            ev |= libc::POLLOUT;
        }
        let sleep = self.exec.sleep();
        // a completion that landed before the arm is not slept through
        if self.poll_exec() > 0 || self.ended.is_some() {
            return;
        }
        let timeout = sleep.deadline.map_or(IDLE_WAIT, |d| d.min(IDLE_WAIT));
        let fds = [
            (Some(self.s.as_raw_fd()), ev),
            (sleep.cq, libc::POLLIN),
            (sleep.cm, libc::POLLIN),
        ];
        let [_, cq, cm] = crate::rdma::poll_fds(fds, Some(timeout));
        let gen = sleep.gen;
        self.exec.woke(Woken { gen, cq, cm });
    }
}

#[cfg(test)]
mod loop_tests;
#[cfg(test)]
mod tests {
    use super::*;

    fn export(cache: WriteCache) -> Export {
        Export {
            name: "x".into(),
            size: 1 << 30,
            min_block: 512,
            max_io: 1 << 20,
            read_only: false,
            fast_zero: false,
            trim: true,
            cache,
            max_trim: 64 << 20,
            max_zero: 1 << 20,
            lba_status: AtomicBool::new(false),
            write_same: AtomicBool::new(true),
            source: Source::Null,
            status: Arc::default(),
        }
    }

    #[test]
    fn flush_and_fua_are_advertised_only_with_a_write_cache() {
        let none = export(WriteCache {
            enabled: false,
            dpofua: false,
        });
        assert_eq!(none.flags() & (tflag::SEND_FLUSH | tflag::SEND_FUA), 0);
        for dpofua in [false, true] {
            let cached = export(WriteCache {
                enabled: true,
                dpofua,
            });
            let f = cached.flags();
            assert_eq!(f & tflag::SEND_FLUSH, tflag::SEND_FLUSH);
            assert_eq!(f & tflag::SEND_FUA, tflag::SEND_FUA);
        }
    }

    #[test]
    fn a_fua_write_is_followed_by_a_sync_only_without_dpofua() {
        let cases = [
            (false, false, Next::Reply),
            (true, true, Next::Reply),
            (true, false, Next::Sync),
        ];
        for (enabled, dpofua, next) in cases {
            let ex = export(WriteCache { enabled, dpofua });
            let w = BlockOp::Write { fua: true };
            assert_eq!(step(&ex, w, 0, 4096, true), (w, 4096, next));
            assert_eq!(step(&ex, w, 0, 4096, false).2, Next::Reply);
        }
    }

    #[test]
    fn large_trim_and_write_zeroes_go_in_chunks() {
        let ex = export(WriteCache::LEGACY);
        let (op, len, next) = step(&ex, BlockOp::Discard, 4096, 200 << 20, true);
        assert_eq!((op, len), (BlockOp::Discard, 64 << 20));
        let Next::More {
            off, left, sync, ..
        } = next
        else {
            panic!("{next:?}")
        };
        assert_eq!((off, left, sync), (4096 + (64 << 20), 136 << 20, true));
        let mut steps = 1;
        let (mut off, mut left) = (off, left);
        loop {
            let (_, len, next) = step(&ex, BlockOp::Discard, off, left, sync);
            steps += 1;
            match next {
                Next::More {
                    off: o, left: l, ..
                } => (off, left) = (o, l),
                Next::Sync => {
                    assert_eq!(off + u64::from(len), 4096 + (200 << 20));
                    break;
                }
                Next::Reply | Next::Extents { .. } => panic!("the FUA trim lost its sync"),
            }
        }
        assert_eq!(steps, 4);
        let z = BlockOp::WriteZeroes { may_unmap: true };
        assert_eq!(step(&ex, z, 0, 512, false), (z, 512, Next::Reply));
        assert_eq!(step(&ex, z, 0, 3 << 20, false).1, 1 << 20);
    }

    /// A tag partway through a FUA WRITE_ZEROES of 3 MiB at 1 MiB: its second command out.
    fn zeroing(flags: u16) -> TagReq {
        TagReq {
            off: 1 << 20,
            len: 3 << 20,
            flags,
            op: Some(BlockOp::WriteZeroes { may_unmap: true }),
            cur: 2 << 20,
            ..TagReq::default()
        }
    }

    #[test]
    fn a_refused_write_same_goes_on_as_zeros_written_from_the_refused_command() {
        let ex = export(WriteCache {
            enabled: true,
            dpofua: true,
        });
        let t = zeroing(cmdflag::FUA);
        let after = after(&ex, &t, Err(libc::EOPNOTSUPP));
        let rest = Next::More {
            op: BlockOp::ZeroWrite,
            off: 3 << 20,
            left: 1 << 20,
            sync: true,
        };
        assert_eq!(
            after,
            After::Submit(BlockOp::ZeroWrite, 2 << 20, 1 << 20, rest)
        );
        assert!(
            !ex.write_same.load(Ordering::Relaxed),
            "the export remembers"
        );
        // the last zero write is followed by the FUA's SYNCHRONIZE CACHE
        let (_, len, next) = step(&ex, BlockOp::ZeroWrite, 3 << 20, 1 << 20, true);
        assert_eq!((len, next), (1 << 20, Next::Sync));
    }

    #[test]
    fn fast_zero_and_other_errors_are_not_turned_into_zero_writes() {
        let ex = export(WriteCache::LEGACY);
        let fast = zeroing(cmdflag::FAST_ZERO);
        assert_eq!(
            after(&ex, &fast, Err(libc::EOPNOTSUPP)),
            After::Fail(libc::EOPNOTSUPP)
        );
        assert!(ex.write_same.load(Ordering::Relaxed));
        let t = zeroing(0);
        assert_eq!(after(&ex, &t, Err(libc::EIO)), After::Fail(libc::EIO));
        let write = TagReq {
            op: Some(BlockOp::Write { fua: false }),
            ..t
        };
        assert_eq!(
            after(&ex, &write, Err(libc::EOPNOTSUPP)),
            After::Fail(libc::EOPNOTSUPP)
        );
        assert_eq!(
            after(&ex, &write, Ok(512)),
            After::Fail(libc::EIO),
            "a short transfer"
        );
        assert_eq!(after(&ex, &write, Ok(0)), After::Reply);
    }
}
