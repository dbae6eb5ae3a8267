//! A queue's requests: what each slot's command is, and how it starts on the path and is
//! committed back through the ring (the slots map to each device's ublk tags).

use super::slots::SlotMap;
use super::zeroing::Zeroing;
use crate::channel::block::{BlockOp, Geometry};
use crate::channel::Done;
use crate::path::Path;
use crate::rdma::TagBufs;
use crate::session::Relogin;
use crate::stats::{IoCounters, IoKind};
use crate::ublk::{Iod, Ring};
use crate::wire::srp::ScsiLun;
use libublk::sys;
use std::time::Instant;

/// What each slot's command is, and each device's counters (kept here, published by
/// [`QueueStatus::publish`]).
pub(super) struct Pending {
    pub(super) slots: Vec<SlotIo>,
    /// By the ring's device index.
    pub(super) io: Vec<IoCounters>,
    /// Slots whose WRITE_ZEROES has another command to send ([`Queue::resubmit`]).
    pub(super) again: Vec<u16>,
    /// The device's largest I/O: a zero write's most.
    pub(super) max_io: u32,
}

impl Pending {
    pub(super) fn new(depth: u16, devices: usize, max_io: u32) -> Pending {
        let idle = SlotIo {
            dev: 0,
            busy: false,
            awaiting_data: false,
            len: 0,
            rw: false,
            kind: IoKind::Other,
            started: Instant::now(),
            zero: None,
        };
        Pending {
            slots: vec![idle; usize::from(depth)],
            io: vec![IoCounters::default(); devices],
            again: Vec::new(),
            max_io,
        }
    }

    /// Counts slot `slot`'s command as done (`ok`) after `us` microseconds: the request is
    /// committed.
    pub(super) fn record(&mut self, slot: u16, ok: bool, us: u64) {
        self.slots[usize::from(slot)].busy = false;
        let t = self.slots[usize::from(slot)];
        if let Some(io) = self.io.get_mut(usize::from(t.dev)) {
            io.record(t.kind, t.len, ok, us);
        }
    }
}

/// A slot's command: its device (the ring's index), its length, whether its result is a byte
/// count, its kind and when it came, and for a WRITE_ZEROES, how far it got.
#[derive(Clone, Copy)]
pub(super) struct SlotIo {
    pub(super) dev: u16,
    /// The request is the queue's: from its arrival (a pool write's NEED_GET_DATA) to its commit.
    pub(super) busy: bool,
    /// A pool write holding (or waiting for) a span for the data the kernel is to copy in.
    pub(super) awaiting_data: bool,
    len: u32,
    rw: bool,
    kind: IoKind,
    started: Instant,
    pub(super) zero: Option<Zeroing>,
}

/// The queue's ublk ring and the device queues it serves on it, each with its range of the
/// path's tags (slots): the loop speaks slots, this maps them to each device's ublk tags.
pub(super) struct UblkIo {
    pub(super) ring: Ring,
    pub(super) slots: SlotMap,
}

impl UblkIo {
    /// The request slot `slot` serves, as its device's driver described it.
    pub(super) fn iod(&self, slot: u16) -> Option<Iod> {
        let (dev, tag) = self.slots.tag(slot)?;
        self.ring.iod(dev, tag)
    }

    /// NEED_GET_DATA for the pool write in slot `slot`, whose span starts at `addr`.
    pub(super) fn get_data(&mut self, slot: u16, addr: u64) {
        let Some((dev, tag)) = self.slots.tag(slot) else {
            return tracing::error!("NEED_GET_DATA for slot {slot}, which serves no device");
        };
        let len = self.ring.iod(dev, tag).map_or(0, |iod| iod.len());
        if let Err(e) = self.ring.get_data(dev, tag, (addr, len)) {
            tracing::error!("{}", crate::Chain(&e));
        }
    }

    /// Completes the request in slot `slot` with `res`; a read's data is at `data`.
    pub(super) fn commit(&mut self, slot: u16, res: i32, data: Option<(u64, u32)>) {
        let Some((dev, tag)) = self.slots.tag(slot) else {
            return tracing::error!("a commit for slot {slot}, which serves no device");
        };
        if let Err(e) = self.ring.commit(dev, tag, res, data) {
            tracing::error!("{}", crate::Chain(&e));
        }
    }

    /// Whether every device the ring serves has stopped and has nothing left in flight (true
    /// once every device was let go).
    pub(super) fn is_done(&self) -> bool {
        self.slots
            .devices()
            .all(|(dev, _, _)| self.ring.is_done(dev))
    }
}

/// Completes a finished command to ublk: a read's or write's byte count, or its errno. A
/// WRITE_ZEROES with more to do goes to [`Pending::again`] instead.
pub(super) fn commit(io: &mut UblkIo, bufs: &TagBufs, pending: &mut Pending, mut d: Done) {
    let slot = d.tag;
    if let Some(z) = pending.slots[usize::from(slot)].zero.as_mut() {
        match z.finished(&d.outcome) {
            None => return pending.again.push(slot),
            Some(0) => {}
            Some(errno) => d = Done::failed(slot, errno),
        }
    }
    let t = pending.slots[usize::from(slot)];
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
    pending.record(slot, res >= 0, t.started.elapsed().as_micros() as u64);
    io.commit(slot, res, commit_span(bufs, slot, t.kind, res));
}

/// What a COMMIT names as slot `slot`'s data: the slot's buffer (the next request's data goes there
/// too); with a pool, a read's span (the kernel copies the `res` bytes read out of it as it takes
/// the COMMIT, and none of a failed read's) and nothing for the others.
fn commit_span(bufs: &TagBufs, slot: u16, kind: IoKind, res: i32) -> Option<(u64, u32)> {
    if !bufs.is_pool() {
        return bufs.tag_span(slot);
    }
    match kind {
        IoKind::Read => Some((bufs.commit_addr(slot), res.max(0) as u32)),
        _ => None,
    }
}

/// A pool write arrived without its data (NEED_GET_DATA): reserves its span and asks the kernel
/// to copy the data there, or leaves it waiting for room. Returns whether it asked.
pub(super) fn need_get_data(
    io: &mut UblkIo,
    path: &mut Path<Relogin>,
    pending: &mut Pending,
    slot: u16,
) -> bool {
    let len = io.iod(slot).map_or(0, |iod| iod.len());
    let t = &mut pending.slots[usize::from(slot)];
    (t.busy, t.awaiting_data) = (true, true);
    match path.reserve(slot, len) {
        Ok(Some(addr)) => {
            io.get_data(slot, addr);
            true
        }
        Ok(None) => false,
        // larger than the pool, which holds the device's largest I/O: not from this kernel
        Err(errno) => {
            let dev = io.slots.tag(slot).map_or(0, |(d, _)| d.index() as u16);
            pending.slots[usize::from(slot)] = SlotIo {
                dev,
                busy: true,
                awaiting_data: false,
                len,
                rw: true,
                kind: IoKind::Write,
                started: Instant::now(),
                zero: None,
            };
            pending.record(slot, false, 0);
            io.commit(slot, -errno, None);
            false
        }
    }
}

/// Starts the ublk command in slot `slot` on the path for LUN `lun` of geometry `geo`, or
/// completes it at once with its error.
pub(super) fn start_io(
    io: &mut UblkIo,
    path: &mut Path<Relogin>,
    pending: &mut Pending,
    (lun, geo): (ScsiLun, Geometry),
    slot: u16,
) {
    let (Some(iod), Some((dev, _))) = (io.iod(slot), io.slots.tag(slot)) else {
        return;
    };
    let (op, flags) = (iod.op(), iod.op_flags);
    let (off, len) = (iod.offset(), iod.len());
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
    let idx = usize::from(slot);
    pending.slots[idx] = SlotIo {
        dev: dev.index() as u16,
        busy: true,
        awaiting_data: false,
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
            let (op, off, len) = match pending.slots[idx].zero.as_mut() {
                Some(z) => z.command(pending.max_io),
                None => (bop, off, len),
            };
            path.submit(slot, lun, op, off, len, &geo)
        }
    };
    if let Err(errno) = result {
        fail_now(io, path, pending, slot, errno);
    }
}

/// Completes the ublk command in slot `slot` at once with `errno` (nothing of it is out on the path).
pub(super) fn fail_now(
    io: &mut UblkIo,
    path: &Path<Relogin>,
    pending: &mut Pending,
    slot: u16,
    errno: i32,
) {
    let kind = pending.slots[usize::from(slot)].kind;
    pending.record(slot, false, 0);
    io.commit(slot, -errno, commit_span(path.bufs(), slot, kind, -errno));
}
