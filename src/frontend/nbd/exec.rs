//! What a connection's requests run on: its SRP path, or a demo backend.

use super::pool::{self, Pool};
use super::{Export, Source};
use crate::backend::MemDisk;
use crate::channel::block::{BlockOp, Geometry};
use crate::channel::clock_ms;
use crate::frontend::status::{Base, ExportStatus};
use crate::path::{Connect, Event, Path, Returned, Sleep, Spare, Woken};
use crate::rdma::TagBufs;
use crate::session::rport::Rport;
use crate::session::Relogin;
use crate::stats::{IoCounters, IoKind};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Executes block operations for one connection: on its SRP path, or on a demo backend. `C` is
/// how the path logs in again (tests drive a connection over the fake target).
// one per connection, created once and never moved on the I/O path: its size does not matter
#[allow(clippy::large_enum_variant)]
pub(super) enum Exec<C: Connect = Relogin> {
    Srp {
        path: Option<Path<C>>,
        geo: Geometry,
        pool: Arc<Pool<Spare<C::T>>>,
        /// The connection's slot in the export's counters.
        counted: Option<Counted>,
    },
    Demo {
        disk: Option<Arc<MemDisk>>,
        bufs: Vec<Vec<u8>>,
        done: Vec<(u16, Result<u32, i32>)>,
    },
}

/// A connection's share of the export's counters: the slot it holds while it lives (what its
/// channel's commands did, carried on from the slot's earlier connections).
pub(super) struct Counted {
    status: Arc<ExportStatus>,
    slot: usize,
    base: Base,
    io: IoCounters,
    /// Each tag's command out: what it is, its bytes and when it went.
    tags: Vec<(IoKind, u32, Instant)>,
    /// Polls since the counters were last published.
    polls: u32,
}

impl Counted {
    pub(super) fn claim(status: &Arc<ExportStatus>, depth: u16) -> Option<Counted> {
        let (slot, io, base) = status.claim()?;
        Some(Counted {
            status: status.clone(),
            slot,
            base,
            io,
            tags: vec![(IoKind::Other, 0, Instant::now()); usize::from(depth)],
            polls: 0,
        })
    }

    fn started(&mut self, tag: u16, op: BlockOp, len: u32) {
        let kind = match op {
            BlockOp::Read => IoKind::Read,
            BlockOp::Write { .. } => IoKind::Write,
            _ => IoKind::Other,
        };
        if let Some(t) = self.tags.get_mut(usize::from(tag)) {
            *t = (kind, len, Instant::now());
        }
    }

    fn done(&mut self, tag: u16, ok: bool, now: Instant) {
        if let Some(&(kind, len, at)) = self.tags.get(usize::from(tag)) {
            let us = now.saturating_duration_since(at).as_micros() as u64;
            self.io.record(kind, len, ok, us);
        }
    }

    fn publish<C: Connect>(&mut self, path: &Path<C>) {
        self.polls = 0;
        if let Some(q) = self.status.queues.get(self.slot) {
            q.publish_over(path, &self.io, &self.base);
        }
    }
}

/// How long a connection that ended waits for its commands in flight before its channel is
/// dropped rather than given back.
pub(super) const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// A busy connection publishes its counters every this many polls (and whenever it sleeps).
const PUBLISH_POLLS: u32 = 1024;

impl<C: Connect> Drop for Exec<C> {
    fn drop(&mut self) {
        let Exec::Srp {
            path,
            pool,
            counted,
            ..
        } = self
        else {
            return;
        };
        let Some(mut p) = path.take() else {
            return;
        };
        pool.ending();
        // a client that vanished may leave commands in flight: let them finish (bounded) so the
        // channel can serve the next connection
        let deadline = Instant::now() + DRAIN_WAIT;
        while p.busy() > 0 && p.is_up() && Instant::now() < deadline {
            if p.service(Instant::now(), &mut |_, _| {}).0 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // the slot is free again before the channel is: a connection that gets this channel
        // finds a slot
        if let Some(mut c) = counted.take() {
            c.publish(&p);
            c.status.release(c.slot);
        }
        match p.into_channel() {
            Returned::Idle(spare) => pool.give_back(spare),
            Returned::Lost(ch) => {
                // stopped (no RDMA into the buffers any more), closed after the next login
                pool.lost(Spare::new(ch));
                tracing::warn!(
                    "an NBD connection's SRP channel is dropped (down or stuck); the next \
                     connection that needs one logs a new one in"
                );
            }
        }
    }
}

impl Exec {
    pub(super) fn open(ex: &Export) -> Result<Exec, pool::PoolError> {
        let depth = ex.depth();
        match &ex.source {
            Source::Srp {
                pool,
                geo,
                relogin,
                timers,
                ..
            } => {
                let spare = pool.take()?;
                let name = "NBD connection".to_string();
                // the buffers the channel's last connection registered, or new ones
                let fresh = || TagBufs::budgeted(depth, ex.max_io);
                let path = Path::resume(spare, relogin.clone(), Rport::new(*timers), name, fresh)
                    .map_err(|e| {
                    pool.gone();
                    pool::PoolError::Register(e)
                })?;
                Ok(Exec::Srp {
                    path: Some(path),
                    geo: *geo,
                    pool: pool.clone(),
                    counted: Counted::claim(&ex.status, depth),
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
}

impl<C: Connect> Exec<C> {
    pub(super) fn buf(&mut self, tag: u16) -> &mut [u8] {
        match self {
            Exec::Srp { path: Some(p), .. } => p.buf(tag),
            Exec::Srp { path: None, .. } => &mut [],
            Exec::Demo { bufs, .. } => &mut bufs[usize::from(tag)],
        }
    }

    pub(super) fn submit(&mut self, tag: u16, op: BlockOp, off: u64, len: u32) -> Result<(), i32> {
        match self {
            Exec::Srp {
                path: Some(p),
                geo,
                counted,
                ..
            } => {
                p.set_clock(clock_ms());
                if let Some(c) = counted {
                    c.started(tag, op, len);
                }
                let lun = p.lun();
                p.submit(tag, lun, op, off, len, geo)
            }
            Exec::Srp { path: None, .. } => Err(libc::EIO),
            Exec::Demo { disk, bufs, done } => {
                let b = &mut bufs[usize::from(tag)];
                if let Some(d) = disk {
                    match op {
                        BlockOp::Read => d.read(off, &mut b[..len as usize]),
                        BlockOp::Write { .. } => d.write(off, &b[..len as usize]),
                        BlockOp::Discard | BlockOp::WriteZeroes { .. } | BlockOp::ZeroWrite => {
                            d.zero(off, len as usize)
                        }
                        BlockOp::Flush | BlockOp::LbaStatus => {}
                    }
                } else if op == BlockOp::Read {
                    b[..len as usize].fill(0);
                }
                done.push((tag, Ok(0)));
                Ok(())
            }
        }
    }

    /// Collects finished commands into `out`, each with its residual byte count on success;
    /// returns how many completions were processed, and what the path says besides.
    pub(super) fn poll(
        &mut self,
        out: &mut Vec<(u16, Result<u32, i32>)>,
    ) -> (usize, Option<Event>) {
        match self {
            Exec::Srp {
                path: Some(p),
                counted,
                ..
            } => {
                p.tick(clock_ms());
                let now = Instant::now();
                let polled = p.service(now, &mut |d, _| {
                    let r = match d.outcome.errno {
                        0 => Ok(d.outcome.resid),
                        e => Err(e),
                    };
                    if let Some(c) = counted.as_mut() {
                        c.done(d.tag, r.is_ok(), now);
                    }
                    out.push((d.tag, r));
                });
                if let Some(c) = counted {
                    c.polls += 1;
                    if c.polls >= PUBLISH_POLLS {
                        c.publish(p);
                    }
                }
                polled
            }
            Exec::Srp { path: None, .. } => (0, None),
            Exec::Demo { done, .. } => {
                let n = done.len();
                out.append(done);
                (n, None)
            }
        }
    }

    /// The LUN's geometry, on an SRP path.
    pub(super) fn geometry(&self) -> Option<Geometry> {
        match self {
            Exec::Srp { geo, .. } => Some(*geo),
            Exec::Demo { .. } => None,
        }
    }

    pub(super) fn busy(&self) -> bool {
        match self {
            Exec::Srp { path: Some(p), .. } => p.busy() > 0,
            Exec::Srp { path: None, .. } => false,
            Exec::Demo { done, .. } => !done.is_empty(),
        }
    }

    /// What may wake the connection: its path's [`Sleep`], the completion channel armed (an
    /// idle connection hears an unsolicited IU or a flush at once); nothing for a demo backend.
    pub(super) fn sleep(&mut self) -> Sleep {
        match self {
            Exec::Srp {
                path: Some(p),
                counted,
                ..
            } => {
                if let Some(c) = counted {
                    c.publish(p);
                }
                p.sleep(true)
            }
            _ => Sleep::default(),
        }
    }

    /// What was ready when the connection woke ([`Path::woke`]).
    pub(super) fn woke(&mut self, w: Woken) {
        if let Exec::Srp { path: Some(p), .. } = self {
            p.woke(w);
        }
    }
}
