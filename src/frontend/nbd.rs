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
use crate::channel::block::{BlockOp, FuaWrite, Geometry, WriteCache};
use crate::channel::clock_ms;
use crate::path::{Path, Returned};
use crate::rdma::TagBufs;
use crate::session::rport::Rport;
use crate::session::timers::Timers;
use crate::session::Relogin;
mod listen;
mod pool;
mod tls;

use crate::wire::nbd::{
    self, cmd, cmdflag, err, opt, rep, tflag, InfoRequest, MetaContextRequest, OptionHeader,
    Request,
};
pub use listen::{bind_unix, Limits, Listen, ListenError, SocketError};
use listen::{Stream, Timed};
pub use pool::Pool;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
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
    /// Largest request.
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

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Option data above this closes the connection (no option of ours needs more).
const MAX_OPTION_LEN: u32 = 64 * 1024;

/// What the handshake agreed beyond the export: structured replies, and the base:allocation
/// context for NBD_CMD_BLOCK_STATUS.
#[derive(Clone, Copy, Debug, Default)]
struct Negotiated {
    structured: bool,
    allocation: bool,
}

/// NBD_OPT_STRUCTURED_REPLY, LIST_META_CONTEXT and SET_META_CONTEXT.
fn negotiate(
    s: &mut Timed,
    ex: &Export,
    option: u32,
    data: &[u8],
    neg: &mut Negotiated,
) -> io::Result<()> {
    let refuse = |s: &mut Timed, kind, msg: &str| {
        s.write_all(&nbd::option_reply(option, kind, msg.as_bytes()))
    };
    if option == opt::STRUCTURED_REPLY {
        if !data.is_empty() {
            return refuse(s, rep::ERR_INVALID, "STRUCTURED_REPLY takes no data");
        }
        neg.structured = true;
        return s.write_all(&nbd::option_reply(option, rep::ACK, &[]));
    }
    let list = option == opt::LIST_META_CONTEXT;
    let req = match MetaContextRequest::parse(data) {
        Ok(r) => r,
        Err(e) => return refuse(s, rep::ERR_INVALID, &e.to_string()),
    };
    if !list && !neg.structured {
        return refuse(
            s,
            rep::ERR_INVALID,
            "SET_META_CONTEXT needs structured replies first",
        );
    }
    if !(req.name.is_empty() || req.name == ex.name) {
        return refuse(s, rep::ERR_UNKNOWN, &format!("no export '{}'", req.name));
    }
    // LIST without queries lists every context; otherwise each query selects, or not
    let chosen = (list && req.queries.is_empty())
        || req
            .queries
            .iter()
            .any(|q| MetaContextRequest::selects_allocation(q, list));
    if !list {
        neg.allocation = chosen;
    }
    let mut out = Vec::new();
    if chosen {
        let mut d = nbd::BASE_ALLOCATION_ID.to_be_bytes().to_vec();
        d.extend_from_slice(nbd::BASE_ALLOCATION.as_bytes());
        out.extend(nbd::option_reply(option, rep::META_CONTEXT, &d));
    }
    out.extend(nbd::option_reply(option, rep::ACK, &[]));
    s.write_all(&out)
}

fn handshake(
    s: &mut Timed,
    ex: &Export,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> io::Result<Option<(Exec, Negotiated)>> {
    let mut neg = Negotiated::default();
    s.write_all(&nbd::server_greeting())?;
    let mut f = [0u8; 4];
    s.read_exact(&mut f)?;
    let cflags = u32::from_be_bytes(f);
    if cflags & nbd::cflag::FIXED_NEWSTYLE == 0 {
        return Err(bad("client does not speak fixed newstyle"));
    }
    let no_zeroes = cflags & nbd::cflag::NO_ZEROES != 0;
    loop {
        let mut h = [0u8; 16];
        s.read_exact(&mut h)?;
        let h = OptionHeader::parse(&h).map_err(|e| bad(e.to_string()))?;
        if h.length > MAX_OPTION_LEN {
            return Err(bad(format!(
                "option {} with {} bytes of data",
                h.option, h.length
            )));
        }
        let mut data = vec![0u8; h.length as usize];
        s.read_exact(&mut data)?;
        let name_ok = |n: &str| n.is_empty() || n == ex.name;
        let tls_required = tls.is_some() && !s.is_tls();
        match h.option {
            opt::STARTTLS => match &tls {
                Some(cfg) if !s.is_tls() && data.is_empty() => {
                    s.write_all(&nbd::option_reply(h.option, rep::ACK, &[]))?;
                    s.start_tls(cfg.clone())?;
                }
                Some(_) => s.write_all(&nbd::option_reply(
                    h.option,
                    rep::ERR_INVALID,
                    if s.is_tls() {
                        b"TLS is already on".as_slice()
                    } else {
                        b"STARTTLS takes no data".as_slice()
                    },
                ))?,
                None => s.write_all(&nbd::option_reply(
                    h.option,
                    rep::ERR_UNSUP,
                    b"this export is served without TLS",
                ))?,
            },
            opt::EXPORT_NAME if tls_required => {
                // no reply exists for EXPORT_NAME but the export itself: close
                return Err(bad("client asked for the export before starting TLS"));
            }
            o if tls_required && o != opt::ABORT => s.write_all(&nbd::option_reply(
                o,
                rep::ERR_TLS_REQD,
                b"this server requires TLS: start it with NBD_OPT_STARTTLS",
            ))?,
            opt::EXPORT_NAME => {
                let name = String::from_utf8_lossy(&data).into_owned();
                if !name_ok(&name) {
                    return Err(bad(format!("unknown export '{name}'")));
                }
                let exec = Exec::open(ex).map_err(|e| bad(e.to_string()))?;
                let mut reply = Vec::with_capacity(134);
                reply.extend_from_slice(&ex.size.to_be_bytes());
                reply.extend_from_slice(&ex.flags().to_be_bytes());
                if !no_zeroes {
                    reply.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&reply)?;
                return Ok(Some((exec, neg)));
            }
            opt::INFO | opt::GO => {
                let req = match InfoRequest::parse(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        s.write_all(&nbd::option_reply(
                            h.option,
                            rep::ERR_INVALID,
                            e.to_string().as_bytes(),
                        ))?;
                        continue;
                    }
                };
                if !name_ok(&req.name) {
                    let msg = format!(
                        "no export '{}'; this server exports '{}'",
                        req.name, ex.name
                    );
                    s.write_all(&nbd::option_reply(
                        h.option,
                        rep::ERR_UNKNOWN,
                        msg.as_bytes(),
                    ))?;
                    continue;
                }
                let exec = if h.option == opt::GO {
                    match Exec::open(ex) {
                        Ok(e) => Some(e),
                        Err(msg) => {
                            tracing::info!("NBD: a client's GO refused: {msg}");
                            s.write_all(&nbd::option_reply(
                                h.option,
                                rep::ERR_POLICY,
                                msg.to_string().as_bytes(),
                            ))?;
                            continue;
                        }
                    }
                } else {
                    None
                };
                let mut out =
                    nbd::option_reply(h.option, rep::INFO, &nbd::info_export(ex.size, ex.flags()));
                let pref = 4096u32.max(ex.min_block).min(ex.max_io);
                out.extend(nbd::option_reply(
                    h.option,
                    rep::INFO,
                    &nbd::info_block_size(ex.min_block, pref, ex.max_io),
                ));
                if req.requests.contains(&nbd::info::NAME) {
                    let mut d = nbd::info::NAME.to_be_bytes().to_vec();
                    d.extend_from_slice(ex.name.as_bytes());
                    out.extend(nbd::option_reply(h.option, rep::INFO, &d));
                }
                out.extend(nbd::option_reply(h.option, rep::ACK, &[]));
                s.write_all(&out)?;
                if let Some(exec) = exec {
                    return Ok(Some((exec, neg)));
                }
            }
            opt::LIST => {
                if !data.is_empty() {
                    s.write_all(&nbd::option_reply(
                        h.option,
                        rep::ERR_INVALID,
                        b"LIST takes no data",
                    ))?;
                    continue;
                }
                let mut d = (ex.name.len() as u32).to_be_bytes().to_vec();
                d.extend_from_slice(ex.name.as_bytes());
                let mut out = nbd::option_reply(h.option, rep::SERVER, &d);
                out.extend(nbd::option_reply(h.option, rep::ACK, &[]));
                s.write_all(&out)?;
            }
            opt::STRUCTURED_REPLY | opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
                negotiate(s, ex, h.option, &data, &mut neg)?
            }
            opt::ABORT => {
                let _ = s.write_all(&nbd::option_reply(h.option, rep::ACK, &[]));
                return Ok(None);
            }
            o => s.write_all(&nbd::option_reply(o, rep::ERR_UNSUP, &[]))?,
        }
    }
}

/// Executes block operations for one connection: on its SRP path, or on a demo backend.
// one per connection, created once and never moved on the I/O path: its size does not matter
#[allow(clippy::large_enum_variant)]
enum Exec {
    Srp {
        path: Option<Path<Relogin>>,
        geo: Geometry,
        pool: Arc<Pool>,
    },
    Demo {
        disk: Option<Arc<MemDisk>>,
        bufs: Vec<Vec<u8>>,
        done: Vec<(u16, Result<(), i32>)>,
    },
}

/// How long a connection that ended waits for its commands in flight before its channel is
/// dropped rather than given back.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

impl Drop for Exec {
    fn drop(&mut self) {
        let Exec::Srp { path, pool, .. } = self else {
            return;
        };
        let Some(mut p) = path.take() else {
            return;
        };
        // a client that vanished may leave commands in flight: let them finish (bounded) so the
        // channel can serve the next connection
        let deadline = Instant::now() + DRAIN_WAIT;
        while p.busy() > 0 && p.is_up() && Instant::now() < deadline {
            if p.service(Instant::now(), &mut |_, _| {}).0 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        match p.into_channel() {
            Returned::Idle(ch) => pool.give_back(ch),
            Returned::Lost(ch) => {
                // stopped (no RDMA into the buffers any more), closed after the next login
                pool.lost(ch);
                tracing::warn!(
                    "an NBD connection's SRP channel is dropped (down or stuck); the next \
                     connection that needs one logs a new one in"
                );
            }
        }
    }
}

impl Exec {
    fn open(ex: &Export) -> Result<Exec, pool::PoolError> {
        let depth = ex.depth();
        match &ex.source {
            Source::Srp {
                pool,
                geo,
                relogin,
                timers,
                ..
            } => {
                let ch = pool.take()?;
                let bufs = TagBufs::new(depth, ex.max_io);
                let name = "NBD connection".to_string();
                let path = Path::new(ch, relogin.clone(), bufs, Rport::new(*timers), name)
                    .map_err(|e| {
                        pool.gone();
                        pool::PoolError::Register(e)
                    })?;
                Ok(Exec::Srp {
                    path: Some(path),
                    geo: *geo,
                    pool: pool.clone(),
                })
            }
            Source::Mem(d) => Ok(Exec::Demo {
                disk: Some(d.clone()),
                bufs: vec![vec![0u8; ex.max_io as usize]; usize::from(depth)],
                done: Vec::new(),
            }),
            Source::Null => Ok(Exec::Demo {
                disk: None,
                bufs: vec![vec![0u8; ex.max_io as usize]; usize::from(depth)],
                done: Vec::new(),
            }),
        }
    }

    fn buf(&mut self, tag: u16) -> &mut [u8] {
        match self {
            Exec::Srp { path: Some(p), .. } => p.buf(tag),
            Exec::Srp { path: None, .. } => &mut [],
            Exec::Demo { bufs, .. } => &mut bufs[usize::from(tag)],
        }
    }

    fn submit(&mut self, tag: u16, op: BlockOp, off: u64, len: u32) -> Result<(), i32> {
        match self {
            Exec::Srp {
                path: Some(p), geo, ..
            } => {
                p.set_clock(clock_ms());
                p.submit(tag, op, off, len, geo)
            }
            Exec::Srp { path: None, .. } => Err(libc::EIO),
            Exec::Demo { disk, bufs, done } => {
                let b = &mut bufs[usize::from(tag)];
                if let Some(d) = disk {
                    match op {
                        BlockOp::Read => d.read(off, &mut b[..len as usize]),
                        BlockOp::Write { .. } => d.write(off, &b[..len as usize]),
                        BlockOp::Discard | BlockOp::WriteZeroes { .. } => d.zero(off, len as usize),
                        BlockOp::Flush => {}
                    }
                } else if op == BlockOp::Read {
                    b[..len as usize].fill(0);
                }
                done.push((tag, Ok(())));
                Ok(())
            }
        }
    }

    /// Collects finished commands into `out`; returns how many completions were processed. A
    /// short transfer is an error here: NBD has no way to report one.
    fn poll(&mut self, out: &mut Vec<(u16, Result<(), i32>)>) -> usize {
        match self {
            Exec::Srp { path: Some(p), .. } => {
                p.tick(clock_ms());
                let (n, _event) = p.service(Instant::now(), &mut |d, _| {
                    let r = match d.outcome.errno {
                        0 if d.outcome.resid != 0 => Err(libc::EIO),
                        0 => Ok(()),
                        e => Err(e),
                    };
                    out.push((d.tag, r));
                });
                n
            }
            Exec::Srp { path: None, .. } => 0,
            Exec::Demo { done, .. } => {
                let n = done.len();
                out.append(done);
                n
            }
        }
    }

    fn busy(&self) -> bool {
        match self {
            Exec::Srp { path: Some(p), .. } => p.busy() > 0,
            Exec::Srp { path: None, .. } => false,
            Exec::Demo { done, .. } => !done.is_empty(),
        }
    }

    fn arm(&mut self) -> Option<RawFd> {
        match self {
            Exec::Srp { path: Some(p), .. } => p.arm(),
            _ => None,
        }
    }

    fn ack(&mut self) {
        if let Exec::Srp { path: Some(p), .. } = self {
            p.ack();
        }
    }
}

#[derive(Clone, Copy, Default)]
struct TagReq {
    cookie: u64,
    read: bool,
    off: u64,
    len: u32,
    /// What the tag does after its current command, before the client hears back.
    next: Next,
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
}

/// One command of a request: what to send now, and what follows it.
fn step(ex: &Export, op: BlockOp, off: u64, len: u64, fua: bool) -> (BlockOp, u32, Next) {
    let chunk = match op {
        BlockOp::Discard => ex.max_trim,
        BlockOp::WriteZeroes { .. } => ex.max_zero,
        _ => u32::MAX,
    };
    let now = len.min(u64::from(chunk.max(1))) as u32;
    let sync = fua
        && match op {
            BlockOp::Write { .. } => ex.cache.fua_write() == FuaWrite::ThenSync,
            BlockOp::Discard | BlockOp::WriteZeroes { .. } => ex.cache.flushes(),
            BlockOp::Read | BlockOp::Flush => false,
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

/// An error reply: a structured error chunk for a READ once structured replies are on (its success
/// is a chunk too), a simple reply otherwise.
fn error_reply(out: &mut Vec<u8>, neg: Negotiated, read: bool, e: u32, cookie: u64) {
    if neg.structured && read && e != 0 {
        out.extend_from_slice(&nbd::error_chunk(e, cookie));
    } else {
        out.extend_from_slice(&nbd::simple_reply(e, cookie));
    }
}

fn transmission(mut s: Stream, ex: &Export, mut exec: Exec, neg: Negotiated) -> io::Result<()> {
    s.set_nonblocking(true)?;
    let depth = ex.depth();
    let mut free: Vec<u16> = (0..depth).rev().collect();
    let mut tags = vec![TagReq::default(); usize::from(depth)];
    let cap = 2 * (nbd::REQUEST_LEN + ex.max_io as usize);
    let mut rbuf = vec![0u8; cap];
    let (mut rpos, mut rlen) = (0usize, 0usize);
    let mut skip = 0u64;
    let mut out: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut opos = 0usize;
    let mut done = Vec::with_capacity(usize::from(depth));
    let (mut disc, mut eof) = (false, false);
    let mut spins = 0u32;
    loop {
        let mut progress = false;
        // read what the socket has, while there is room to act on it
        if !disc && !eof && !free.is_empty() && out.len() - opos < (8 << 20) {
            if rpos > 0 && rlen > cap / 2 {
                rbuf.copy_within(rpos..rlen, 0);
                rlen -= rpos;
                rpos = 0;
            }
            if rlen < cap {
                match s.read(&mut rbuf[rlen..]) {
                    Ok(0) => eof = true,
                    Ok(n) => {
                        rlen += n;
                        progress = true;
                    }
                    Err(e)
                        if e.kind() == io::ErrorKind::WouldBlock
                            || e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        // parse and dispatch complete requests
        while !disc {
            if skip > 0 {
                let n = skip.min((rlen - rpos) as u64) as usize;
                rpos += n;
                skip -= n as u64;
                if skip > 0 {
                    break;
                }
            }
            if rlen - rpos < nbd::REQUEST_LEN {
                break;
            }
            let req = Request::parse(&rbuf[rpos..rlen]).map_err(|e| bad(e.to_string()))?;
            let body = if req.kind == cmd::WRITE {
                req.length as usize
            } else {
                0
            };
            let reply_err = |out: &mut Vec<u8>, e: u32| {
                error_reply(out, neg, req.kind == cmd::READ, e, req.cookie)
            };
            let end = req.offset.checked_add(u64::from(req.length));
            let in_range = end.is_some_and(|e| e <= ex.size);
            let sized = req.length <= ex.max_io;
            match req.kind {
                cmd::DISC => {
                    rpos += nbd::REQUEST_LEN;
                    disc = true;
                    break;
                }
                cmd::CACHE => {
                    rpos += nbd::REQUEST_LEN;
                    reply_err(&mut out, if in_range { 0 } else { err::EINVAL });
                    continue;
                }
                cmd::BLOCK_STATUS => {
                    // base:allocation: every block is data. A LUN's provisioning is not asked
                    // (GET LBA STATUS), and a hole reported wrongly would make a client skip data
                    rpos += nbd::REQUEST_LEN;
                    if neg.allocation && in_range && req.length > 0 {
                        out.extend_from_slice(&nbd::block_status_chunk(
                            req.cookie,
                            nbd::BASE_ALLOCATION_ID,
                            req.length,
                            0,
                        ));
                    } else {
                        reply_err(&mut out, err::EINVAL);
                    }
                    continue;
                }
                cmd::READ | cmd::WRITE | cmd::FLUSH | cmd::TRIM | cmd::WRITE_ZEROES => {}
                _ => {
                    rpos += nbd::REQUEST_LEN;
                    reply_err(&mut out, err::EINVAL);
                    continue;
                }
            }
            let rejected = match req.kind {
                _ if !in_range && req.kind != cmd::FLUSH => Some(if req.kind == cmd::READ {
                    err::EINVAL
                } else {
                    err::ENOSPC
                }),
                cmd::READ | cmd::WRITE if !sized => Some(err::EINVAL),
                cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES if ex.read_only => Some(err::EPERM),
                cmd::TRIM if !ex.trim => Some(err::EINVAL),
                cmd::WRITE_ZEROES
                    if req.flags & cmdflag::FAST_ZERO != 0
                        && (!ex.fast_zero || req.flags & cmdflag::NO_HOLE != 0) =>
                {
                    Some(err::ENOTSUP)
                }
                _ => None,
            };
            if let Some(e) = rejected {
                rpos += nbd::REQUEST_LEN;
                skip = body as u64;
                reply_err(&mut out, e);
                continue;
            }
            if rlen - rpos < nbd::REQUEST_LEN + body {
                break; // the write's payload is not all here yet
            }
            let Some(tag) = free.pop() else { break };
            rpos += nbd::REQUEST_LEN;
            if body > 0 {
                exec.buf(tag)[..body].copy_from_slice(&rbuf[rpos..rpos + body]);
                rpos += body;
            }
            let fua = req.flags & cmdflag::FUA != 0;
            let op = match req.kind {
                cmd::READ => BlockOp::Read,
                cmd::WRITE => BlockOp::Write { fua },
                cmd::FLUSH => BlockOp::Flush,
                cmd::TRIM => BlockOp::Discard,
                _ => BlockOp::WriteZeroes {
                    may_unmap: req.flags & cmdflag::NO_HOLE == 0,
                },
            };
            progress = true;
            if op == BlockOp::Flush && !ex.cache.flushes() {
                // no volatile cache: every write already completed is durable
                free.push(tag);
                reply_err(&mut out, 0);
                continue;
            }
            let (op, len, next) = step(ex, op, req.offset, u64::from(req.length), fua);
            tags[usize::from(tag)] = TagReq {
                cookie: req.cookie,
                read: req.kind == cmd::READ,
                off: req.offset,
                len: req.length,
                next,
            };
            if let Err(e) = exec.submit(tag, op, req.offset, len) {
                free.push(tag);
                reply_err(&mut out, err::from_errno(e));
            }
        }
        // completions become replies
        if exec.poll(&mut done) > 0 {
            progress = true;
        }
        for (tag, r) in done.drain(..) {
            let t = tags[usize::from(tag)];
            let r = match (r, t.next) {
                (Ok(()), Next::Sync) => {
                    tags[usize::from(tag)].next = Next::Reply;
                    exec.submit(tag, BlockOp::Flush, 0, 0).map(|()| true)
                }
                (
                    Ok(()),
                    Next::More {
                        op,
                        off,
                        left,
                        sync,
                    },
                ) => {
                    let (op, len, next) = step(ex, op, off, left, sync);
                    tags[usize::from(tag)].next = next;
                    exec.submit(tag, op, off, len).map(|()| true)
                }
                (r, _) => r.map(|()| false),
            };
            let r = match r {
                Ok(true) => continue, // the request's next command is out
                Ok(false) => Ok(()),
                Err(e) => Err(e),
            };
            match r {
                Ok(()) if t.read && neg.structured => {
                    out.extend_from_slice(&nbd::chunk_header(
                        nbd::chunk::FLAG_DONE,
                        nbd::chunk::OFFSET_DATA,
                        t.cookie,
                        8 + t.len,
                    ));
                    out.extend_from_slice(&t.off.to_be_bytes());
                    out.extend_from_slice(&exec.buf(tag)[..t.len as usize]);
                }
                Ok(()) => {
                    out.extend_from_slice(&nbd::simple_reply(0, t.cookie));
                    if t.read {
                        out.extend_from_slice(&exec.buf(tag)[..t.len as usize]);
                    }
                }
                Err(e) => error_reply(&mut out, neg, t.read, err::from_errno(e), t.cookie),
            }
            free.push(tag);
        }
        // write replies
        while opos < out.len() {
            match s.write(&out[opos..]) {
                Ok(0) => return Err(bad("client closed while receiving replies")),
                Ok(n) => {
                    opos += n;
                    progress = true;
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted =>
                {
                    break
                }
                Err(e) => return Err(e),
            }
        }
        if opos == out.len() {
            out.clear();
            opos = 0;
        }
        // TLS records of what was written, as far as the socket takes them
        let tls_left = s.flush_pending()?;
        let idle = free.len() == usize::from(depth);
        if (disc || eof) && idle && out.is_empty() && !tls_left {
            return Ok(());
        }
        if progress {
            spins = 0;
            continue;
        }
        // nothing to do right now: spin a little while commands are in flight, then sleep
        if exec.busy() && spins < SPINS {
            spins += 1;
            continue;
        }
        let want_read = !disc && !eof && !free.is_empty();
        if want_read && s.buffered() {
            continue; // TLS holds decrypted requests: the socket need not be readable
        }
        let mut ev = 0;
        if want_read {
            ev |= libc::POLLIN;
        }
        if !out.is_empty() || tls_left {
            ev |= libc::POLLOUT;
        }
        let cq = if exec.busy() { exec.arm() } else { None };
        // re-poll after arming so a completion that raced the arm is not slept through
        if exec.busy() && exec.poll(&mut done) > 0 {
            continue;
        }
        let (_, cq_ready) = crate::rdma::poll_two(s.as_raw_fd(), ev, cq, 100);
        if cq_ready {
            exec.ack();
        }
    }
}

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
            source: Source::Null,
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
                Next::Reply => panic!("the FUA trim lost its sync"),
            }
        }
        assert_eq!(steps, 4);
        let z = BlockOp::WriteZeroes { may_unmap: true };
        assert_eq!(step(&ex, z, 0, 512, false), (z, 512, Next::Reply));
        assert_eq!(step(&ex, z, 0, 3 << 20, false).1, 1 << 20);
    }
}
