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
use crate::session::timers::Timers;
use crate::session::Relogin;
mod exec;
mod handshake;
mod listen;
mod pool;
mod tls;

use crate::wire::nbd::{self, cmd, cmdflag, err, tflag, Request};
use exec::Exec;
use handshake::{bad, handshake, Negotiated};
pub use listen::{bind_unix, Limits, Listen, ListenError, SocketError};
use listen::{Stream, Timed};
pub use pool::Pool;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
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
