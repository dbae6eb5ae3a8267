//! Commands larger than a tag's registered head ([`TagBufs::head`]) go to the target through a
//! staging buffer: a write's data is copied into it before the command is sent, a read's out of
//! it when the command completes. With every staging buffer taken, such a command waits here, in
//! arrival order, until one is given back.

use crate::channel::block::{BlockOp, Geometry};
use crate::channel::Done;
use crate::rdma::TagBufs;
use std::collections::VecDeque;

/// A block operation as the front end submitted it (kept as it is while it waits).
#[derive(Clone, Copy, Debug)]
pub(super) struct Request {
    pub tag: u16,
    pub op: BlockOp,
    pub off: u64,
    pub len: u32,
    pub geo: Geometry,
}

/// The staging buffer a tag's command holds, and whether a read's data is to be copied back.
#[derive(Clone, Copy, Debug)]
struct Held {
    stage: u16,
    len: u32,
    read: bool,
}

/// Where a command's data goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// The tag's own registered head.
    Direct,
    /// Staging buffer `s` (taken for the tag until its command completes).
    Stage(u16),
    /// Every staging buffer is taken: the command waits.
    Wait,
}

/// A path's staging buffers: which are free, which tag holds which, who waits.
pub(super) struct Staging {
    head: u32,
    /// The number of staging buffers (none: every command goes from its tag's buffer).
    stages: u16,
    free: Vec<u16>,
    held: Vec<Option<Held>>,
    waiting: VecDeque<Request>,
}

impl Staging {
    pub fn new(bufs: &TagBufs) -> Staging {
        Staging {
            head: bufs.head(),
            stages: bufs.stages(),
            free: (0..bufs.stages()).rev().collect(),
            held: vec![None; usize::from(bufs.depth())],
            waiting: VecDeque::new(),
        }
    }

    /// Where tag `tag`'s command `op` of `len` bytes takes its data from; a staging buffer it is
    /// given stays the tag's until [`Staging::finish`] or [`Staging::cancel`]. Commands wait in
    /// arrival order: none is staged while another waits.
    pub fn plan(&mut self, tag: u16, op: BlockOp, len: u32) -> Plan {
        let read = match op {
            BlockOp::Read => true,
            BlockOp::Write { .. } => false,
            _ => return Plan::Direct,
        };
        // without staging buffers a command larger than the head is larger than its buffer:
        // sent as it is, it is refused (EINVAL), not left waiting
        if len <= self.head || self.stages == 0 {
            return Plan::Direct;
        }
        if !self.waiting.is_empty() {
            return Plan::Wait;
        }
        self.take(tag, read, len).map_or(Plan::Wait, Plan::Stage)
    }

    /// A free staging buffer for tag `tag`'s command, if there is one.
    fn take(&mut self, tag: u16, read: bool, len: u32) -> Option<u16> {
        let stage = self.free.pop()?;
        self.held[usize::from(tag)] = Some(Held { stage, len, read });
        Some(stage)
    }

    /// Queues a command for the next staging buffer given back.
    pub fn wait(&mut self, w: Request) {
        self.waiting.push_back(w);
    }

    /// The first waiting command with the staging buffer it now holds, once one is free.
    pub fn next_waiter(&mut self) -> Option<(Request, u16)> {
        if self.free.is_empty() {
            return None;
        }
        let w = self.waiting.pop_front()?;
        let stage = self.take(w.tag, w.op == BlockOp::Read, w.len)?;
        Some((w, stage))
    }

    /// The registered region tag `tag`'s command takes its data from: its staging buffer's
    /// (`depth + s`) while it holds one, its own head's (`tag`) otherwise.
    pub fn region(&self, tag: u16) -> usize {
        let depth = self.held.len();
        match self.held.get(usize::from(tag)).copied().flatten() {
            Some(h) => depth + usize::from(h.stage),
            None => usize::from(tag),
        }
    }

    /// A completed command gives its staging buffer back; a read that succeeded has its data
    /// copied into the tag's buffer first.
    pub fn finish(&mut self, d: &Done, bufs: &mut TagBufs) {
        let Some(h) = self.held.get_mut(usize::from(d.tag)).and_then(Option::take) else {
            return;
        };
        if h.read {
            if let Ok(n) = d.outcome.bytes(h.len) {
                let (slot, stage) = bufs.slot_and_stage(d.tag, h.stage, n as usize);
                slot.copy_from_slice(stage);
            }
        }
        self.free.push(h.stage);
    }

    /// A command that was never sent gives its staging buffer back.
    pub fn cancel(&mut self, tag: u16) {
        if let Some(h) = self.held.get_mut(usize::from(tag)).and_then(Option::take) {
            self.free.push(h.stage);
        }
    }

    /// Every waiting command, taken out (to fail them).
    pub fn take_waiting(&mut self) -> VecDeque<Request> {
        std::mem::take(&mut self.waiting)
    }

    /// How many commands wait.
    pub fn waiting(&self) -> u16 {
        self.waiting.len() as u16
    }
}
