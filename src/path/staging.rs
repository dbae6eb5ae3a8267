//! Where each command's data lives while the target moves it.
//!
//! With tag buffers ([`TagBufs::budgeted`]), a command up to a tag's registered head goes from the
//! tag's own buffer; a larger one goes through a staging buffer of the shared area, a write's data
//! copied in before the command is sent, a read's out of it when the command completes.
//!
//! With a pool ([`TagBufs::pooled`]: ublk's NEED_GET_DATA, where the kernel copies a write's data
//! to an address the daemon names for each command, and a read's from the address its commit
//! names), every command with data takes a span of the pool and nothing is copied here: a write's
//! span is reserved before its data arrives ([`Staging::reserve`]); a read's span goes back only
//! once its commit was submitted ([`Staging::committed`]), since the target may write a span as
//! soon as a new command holds it.
//!
//! When the area has no room a command waits, in arrival order, until a finished one gives its
//! span back.

use crate::channel::block::{BlockOp, Geometry};
use crate::channel::Done;
use crate::rdma::TagBufs;
use crate::wire::srp::ScsiLun;
use std::collections::VecDeque;

/// A block operation as the front end submitted it (kept as it is while it waits).
#[derive(Clone, Copy, Debug)]
pub(super) struct Request {
    pub tag: u16,
    pub lun: ScsiLun,
    pub op: BlockOp,
    pub off: u64,
    pub len: u32,
    pub geo: Geometry,
}

/// The span of the area a tag's command holds.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    /// First unit.
    first: u32,
    units: u32,
    /// The command's data length (what a read copies back).
    len: u32,
    read: bool,
}

/// Where a command's data goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// The tag's own registered head, or no data at all.
    Direct,
    /// The span the tag holds (taken until its command completes).
    Stage,
    /// The area has no room: the command waits.
    Wait,
}

/// Who waits for room in the area.
#[derive(Clone, Copy, Debug)]
pub(super) enum Waiter {
    /// A command to send once it holds a span of `bytes`.
    Start { r: Request, bytes: u32 },
    /// A pool write whose data the kernel copies in once it holds a span of `len` bytes.
    Reserve { tag: u16, len: u32 },
}

impl Waiter {
    fn tag(&self) -> u16 {
        match *self {
            Waiter::Start { r, .. } => r.tag,
            Waiter::Reserve { tag, .. } => tag,
        }
    }

    /// The bytes of the area it waits for, and whether it is a read.
    fn wants(&self) -> (u32, bool) {
        match *self {
            Waiter::Start { r, bytes } => (bytes, r.op == BlockOp::Read),
            Waiter::Reserve { len, .. } => (len, false),
        }
    }
}

/// A free-unit bitmap over the area: first fit of a contiguous run.
struct Units {
    /// One bit per unit, set while taken; the bits past the last unit are set.
    used: Vec<u64>,
    count: u32,
}

impl Units {
    fn new(count: u32) -> Units {
        let mut used = vec![0u64; count.div_ceil(64) as usize];
        if count % 64 != 0 {
            if let Some(last) = used.last_mut() {
                *last = !0u64 << (count % 64);
            }
        }
        Units { used, count }
    }

    /// The first of `n` free contiguous units, now taken.
    fn take(&mut self, n: u32) -> Option<u32> {
        if n == 0 || n > self.count {
            return None;
        }
        let first = self.find(n)?;
        for u in first..first + n {
            self.used[(u / 64) as usize] |= 1 << (u % 64);
        }
        Some(first)
    }

    fn find(&self, n: u32) -> Option<u32> {
        let (mut start, mut run) = (0u32, 0u32);
        for (w, &word) in self.used.iter().enumerate() {
            let base = w as u32 * 64;
            if word == !0 {
                run = 0;
                continue;
            }
            if n == 1 {
                return Some(base + word.trailing_ones());
            }
            for b in 0..64 {
                if word & (1 << b) != 0 {
                    run = 0;
                    continue;
                }
                if run == 0 {
                    start = base + b;
                }
                run += 1;
                if run == n {
                    return Some(start);
                }
            }
        }
        None
    }

    fn give(&mut self, first: u32, n: u32) {
        for u in first..first + n {
            self.used[(u / 64) as usize] &= !(1 << (u % 64));
        }
    }
}

/// A path's data area: which spans are free, which tag holds which, who waits.
pub(super) struct Staging {
    /// Reads and writes up to this size go from their tag's head (0: every command with data
    /// takes a span).
    head: u32,
    unit: u32,
    /// Spans are the kernel's to copy from and to: nothing is copied here.
    pool: bool,
    units: Units,
    held: Vec<Option<Held>>,
    waiting: VecDeque<Waiter>,
    /// Pool reads completed whose commit has not been submitted yet.
    committing: Vec<Held>,
    /// Reservations granted since the front end last looked.
    granted: Vec<u16>,
    /// Commands (and reservations) that waited for room, since the path was made.
    stalls: u64,
}

impl Staging {
    pub fn new(bufs: &TagBufs) -> Staging {
        Staging {
            head: bufs.head(),
            unit: bufs.unit(),
            pool: bufs.is_pool(),
            units: Units::new(bufs.units()),
            held: vec![None; usize::from(bufs.depth())],
            waiting: VecDeque::new(),
            committing: Vec::new(),
            granted: Vec::new(),
            stalls: 0,
        }
    }

    /// Commands (and pool writes' reservations) that had to wait for room so far.
    pub fn stalls(&self) -> u64 {
        self.stalls
    }

    /// Where tag `tag`'s command `op` of `len` bytes takes its data from; a span it is given (or
    /// reserved earlier) stays the tag's until [`Staging::finish`] or [`Staging::cancel`].
    /// Commands wait in arrival order: none takes a span while another waits.
    pub fn plan(&mut self, tag: u16, op: BlockOp, len: u32) -> Plan {
        if self.held(tag).is_some() {
            return Plan::Stage;
        }
        let Some(bytes) = self.needs(op, len) else {
            return Plan::Direct;
        };
        if !self.waiting.is_empty() {
            return Plan::Wait;
        }
        if self.take(tag, bytes, op == BlockOp::Read) {
            Plan::Stage
        } else {
            Plan::Wait
        }
    }

    /// How many bytes of the area `op` takes, if it takes a span.
    fn needs(&self, op: BlockOp, len: u32) -> Option<u32> {
        match op {
            BlockOp::Read | BlockOp::Write { .. } | BlockOp::ZeroWrite
                if len > self.head && self.units.count > 0 =>
            {
                // a pool command takes a span of any size up to the pool; a staged one, one staging
                // buffer. Longer, it is sent from the tag as it is, and refused (EINVAL)
                let most = if self.pool {
                    self.units.count * self.unit
                } else {
                    self.unit
                };
                (len <= most).then_some(len)
            }
            // a pool has no tag buffers: the scratch data of an UNMAP, WRITE SAME or GET LBA
            // STATUS takes a span too
            BlockOp::Discard | BlockOp::WriteZeroes { .. } | BlockOp::LbaStatus if self.pool => {
                Some(self.unit)
            }
            _ => None,
        }
    }

    /// Reserves a span of `len` bytes for tag `tag`'s pool write, or queues the reservation:
    /// false when it waits (it shows up in [`Staging::take_granted`] once it holds one).
    pub fn reserve(&mut self, tag: u16, len: u32) -> bool {
        if self.held(tag).is_some() {
            return true;
        }
        if self.waiting.is_empty() && self.take(tag, len, false) {
            return true;
        }
        self.waiting.push_back(Waiter::Reserve { tag, len });
        self.stalls += 1;
        false
    }

    /// Takes a span for tag `tag` if there is room.
    fn take(&mut self, tag: u16, len: u32, read: bool) -> bool {
        let units = len.div_ceil(self.unit).max(1);
        let Some(first) = self.units.take(units) else {
            return false;
        };
        self.held[usize::from(tag)] = Some(Held {
            first,
            units,
            len,
            read,
        });
        true
    }

    /// The span tag `tag` holds: its offset in the area and its length.
    pub fn span(&self, tag: u16) -> Option<(usize, usize)> {
        let h = self.held(tag)?;
        let unit = self.unit as usize;
        Some((h.first as usize * unit, h.units as usize * unit))
    }

    fn held(&self, tag: u16) -> Option<Held> {
        self.held.get(usize::from(tag)).copied().flatten()
    }

    /// Queues a command [`Staging::plan`] told to wait, for the room it needs (an UNMAP's
    /// parameters, not the range it unmaps).
    pub fn wait(&mut self, r: Request) {
        let bytes = self.needs(r.op, r.len).unwrap_or(r.len);
        self.waiting.push_back(Waiter::Start { r, bytes });
        self.stalls += 1;
    }

    /// The first waiter, now holding its span, once there is room for it.
    pub fn next_waiter(&mut self) -> Option<Waiter> {
        let w = *self.waiting.front()?;
        let (len, read) = w.wants();
        if !self.take(w.tag(), len, read) {
            return None;
        }
        self.waiting.pop_front();
        if let Waiter::Reserve { tag, .. } = w {
            self.granted.push(tag);
        }
        Some(w)
    }

    /// The registered region a tag's command takes its data from: the area's (`area`) while it
    /// holds a span, else its own head's (`tag`: the heads are the regions before the area), and
    /// none for a pool command without a span (a FLUSH: a pool has no heads).
    pub fn region(&self, tag: u16, area: usize) -> Option<usize> {
        match self.held(tag) {
            Some(_) => Some(area),
            None => (usize::from(tag) < area).then_some(usize::from(tag)),
        }
    }

    /// A completed command gives its span back: a staged read that succeeded has its data copied
    /// into the tag's buffer first; a pool read's span goes back once its commit is submitted.
    pub fn finish(&mut self, d: &Done, bufs: &mut TagBufs) {
        let Some(h) = self.held.get_mut(usize::from(d.tag)).and_then(Option::take) else {
            return;
        };
        if self.pool {
            if h.read {
                self.committing.push(h);
            } else {
                self.units.give(h.first, h.units);
            }
            return;
        }
        if h.read {
            if let Ok(n) = d.outcome.bytes(h.len) {
                let off = (h.first * self.unit) as usize;
                let (slot, area) = bufs.slot_and_area(d.tag, off, n as usize);
                slot.copy_from_slice(area);
            }
        }
        self.units.give(h.first, h.units);
    }

    /// The commits of the pool reads finished so far were submitted: their spans go back.
    pub fn committed(&mut self) -> bool {
        let any = !self.committing.is_empty();
        for h in self.committing.drain(..) {
            self.units.give(h.first, h.units);
        }
        any
    }

    /// Whether pool reads' spans wait for their commits to be submitted.
    pub fn commits_pending(&self) -> bool {
        !self.committing.is_empty()
    }

    /// Whether a command waits for room that only the pending commits give back: the front end
    /// must submit them before it sleeps, or nothing may wake it.
    pub fn commits_hold_waiters(&self) -> bool {
        self.commits_pending() && !self.waiting.is_empty()
    }

    /// A command that was never sent gives its span back.
    pub fn cancel(&mut self, tag: u16) {
        if let Some(h) = self.held.get_mut(usize::from(tag)).and_then(Option::take) {
            self.units.give(h.first, h.units);
        }
    }

    /// A pool write whose data will never come (its device stopped): its reservation, waiting or
    /// granted, is dropped and its span given back.
    pub fn abandon(&mut self, tag: u16) {
        self.waiting
            .retain(|w| !matches!(*w, Waiter::Reserve { tag: t, .. } if t == tag));
        self.granted.retain(|&t| t != tag);
        self.cancel(tag);
    }

    /// Every waiting command, taken out (to fail them); reservations stay: a pool write must get
    /// its data before it can complete, and gets its span once the failures give theirs back.
    pub fn take_waiting(&mut self) -> Vec<Request> {
        let mut out = Vec::new();
        self.waiting.retain(|w| match *w {
            Waiter::Start { r, .. } => {
                out.push(r);
                false
            }
            Waiter::Reserve { .. } => true,
        });
        out
    }

    /// Every waiting reservation, taken out (the device is going away).
    pub fn drop_reservations(&mut self) -> Vec<u16> {
        self.waiting.drain(..).map(|w| w.tag()).collect()
    }

    /// The reservations granted since the last call.
    pub fn take_granted(&mut self) -> Vec<u16> {
        std::mem::take(&mut self.granted)
    }

    /// How many commands wait (reservations too).
    pub fn waiting(&self) -> u16 {
        self.waiting.len() as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_first_fit() {
        let mut u = Units::new(130);
        assert_eq!(u.used.len(), 3);
        assert_eq!(u.take(1), Some(0));
        assert_eq!(u.take(64), Some(1));
        assert_eq!(u.take(2), Some(65));
        u.give(1, 64);
        assert_eq!(u.take(3), Some(1), "the freed run is reused");
        assert_eq!(u.take(62), Some(67), "first fit: 4..65 is one unit short");
        assert_eq!(u.take(61), Some(4));
        assert_eq!(u.take(1), Some(129));
        assert_eq!(u.take(1), None, "units past the count are never given");
        assert_eq!(u.take(0), None);
        u.give(0, 130);
        assert_eq!(u.take(130), Some(0));
        assert_eq!(Units::new(0).take(1), None);
    }

    #[test]
    fn a_command_takes_its_data_from_its_span_its_head_or_nowhere() {
        // heads: one per tag, regions 0..4, the staging area after them
        let tags = TagBufs::with_head(4, 64 << 10, 8 << 10, 1);
        let mut s = Staging::new(&tags);
        let area = tags.area_region();
        assert_eq!(s.region(0, area), Some(0), "from its head");
        assert_eq!(s.plan(3, BlockOp::Read, 64 << 10), Plan::Stage);
        assert_eq!(s.region(3, area), Some(area), "from its span");
        // a pool: the area is region 0 and no tag has a head
        let pool = TagBufs::pool_of(4, 64 << 10, 64 << 10);
        let mut s = Staging::new(&pool);
        let area = pool.area_region();
        assert_eq!(s.region(0, area), None, "a FLUSH has no data region");
        assert!(s.reserve(1, 4096));
        assert_eq!(s.region(1, area), Some(area));
    }
}
