//! What a front end's queues publish for `srp-ublk list`, `stats` and the Prometheus file: each
//! queue's thread keeps its counters as plain integers and now and then copies them into its
//! [`QueueStatus`] (relaxed stores to its own cache line: nothing on the I/O path is shared or
//! locked); the daemon's state writer reads them into the state file every 2 s.
//!
//! A device's queues are its ublk queues. An export's are its channels (NBD: one per connection
//! served at once, a connection taking a free slot and carrying its counters on from the last
//! connection's) or its virtqueues (vhost-user-blk), in an [`ExportStatus`].

use crate::path::{Connect, Path};
pub use crate::session::rport::LinkState;
use crate::session::state::QueueState;
use crate::stats::{IoCounters, SharedIo};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, Ordering::Relaxed};

/// One queue's live counters (see the module documentation).
#[repr(align(64))]
#[derive(Debug, Default)]
pub struct QueueStatus {
    /// The queue thread's tid (0 until it runs).
    pub tid: AtomicI32,
    /// Credits now.
    pub req_lim: AtomicI32,
    /// SRP_CMDs sent.
    pub cmds: AtomicU64,
    /// Credit stalls.
    pub credit_stalls: AtomicU64,
    /// Waits for a free send slot.
    pub slot_stalls: AtomicU64,
    /// Waits for room in the queue's buffers.
    pub buffer_stalls: AtomicU64,
    /// The channel's [`LinkState`].
    pub state: AtomicU8,
    /// Reconnects that succeeded.
    pub reconnects: AtomicU64,
    /// REPORTED LUNS DATA HAS CHANGED unit attentions seen (`up --supervise` then looks for new LUNs).
    pub luns_changed: AtomicU64,
    /// CAPACITY DATA HAS CHANGED unit attentions seen (the daemon then re-reads the capacity).
    pub capacity_changed: AtomicU64,
    /// Commands that timed out and were aborted (ABORT TASK).
    pub aborts: AtomicU64,
    /// Operations, bytes, errors and latencies (`srp-ublk stats`).
    pub io: SharedIo,
    /// vhost-user-blk: data bytes the target moved straight to or from guest memory.
    pub zero_copy_bytes: AtomicU64,
    /// vhost-user-blk: data bytes copied through the queue's buffers.
    pub copied_bytes: AtomicU64,
    /// An export's slot: a connection holds it ([`ExportStatus::claim`]).
    busy: AtomicBool,
}

impl QueueStatus {
    /// Publishes what `path` and the queue's `io` counted (a queue that lives as long as its
    /// path).
    pub fn publish<C: Connect>(&self, path: &Path<C>, io: &IoCounters) {
        self.publish_over(path, io, &Base::ZERO);
    }

    /// Publishes what `path` and `io` counted, added to `base`: what the slot's earlier
    /// connections counted on their own paths.
    pub fn publish_over<C: Connect>(&self, path: &Path<C>, io: &IoCounters, base: &Base) {
        let ch = path.channel();
        let st = ch.stats();
        let set = |a: &AtomicU64, b: u64, v: u64| a.store(b + v, Relaxed);
        set(&self.reconnects, base.reconnects, path.reconnects());
        set(&self.aborts, base.aborts, st.timeouts);
        set(&self.cmds, base.cmds, st.cmds);
        set(&self.credit_stalls, base.credit_stalls, st.credit_stalls);
        set(&self.slot_stalls, base.slot_stalls, st.slot_stalls);
        set(
            &self.buffer_stalls,
            base.buffer_stalls,
            path.buffer_stalls(),
        );
        set(&self.luns_changed, base.luns_changed, st.luns_changed);
        set(
            &self.capacity_changed,
            base.capacity_changed,
            st.capacity_changed,
        );
        self.io.publish(io);
        self.req_lim.store(ch.req_lim(), Relaxed);
        self.state.store(path.state() as u8, Relaxed);
    }

    /// What the queue published, into its state-file entry.
    pub fn load_into(&self, q: &mut QueueState) {
        q.tid = self.tid.load(Relaxed);
        q.req_lim = self.req_lim.load(Relaxed);
        q.cmds = self.cmds.load(Relaxed);
        q.credit_stalls = self.credit_stalls.load(Relaxed);
        q.slot_stalls = self.slot_stalls.load(Relaxed);
        q.buffer_stalls = self.buffer_stalls.load(Relaxed);
        q.state = LinkState::from_u8(self.state.load(Relaxed)).as_str().into();
        q.reconnects = self.reconnects.load(Relaxed);
        q.luns_changed = self.luns_changed.load(Relaxed);
        q.capacity_changed = self.capacity_changed.load(Relaxed);
        q.aborts = self.aborts.load(Relaxed);
        q.io = self.io.snapshot();
        q.zero_copy_bytes = self.zero_copy_bytes.load(Relaxed);
        q.copied_bytes = self.copied_bytes.load(Relaxed);
    }
}

/// The counters a slot's earlier connections left, that its next one counts on from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Base {
    cmds: u64,
    credit_stalls: u64,
    slot_stalls: u64,
    buffer_stalls: u64,
    reconnects: u64,
    luns_changed: u64,
    capacity_changed: u64,
    aborts: u64,
}

impl Base {
    /// Nothing counted yet.
    pub const ZERO: Base = Base {
        cmds: 0,
        credit_stalls: 0,
        slot_stalls: 0,
        buffer_stalls: 0,
        reconnects: 0,
        luns_changed: 0,
        capacity_changed: 0,
        aborts: 0,
    };

    fn of(q: &QueueState) -> Base {
        Base {
            cmds: q.cmds,
            credit_stalls: q.credit_stalls,
            slot_stalls: q.slot_stalls,
            buffer_stalls: q.buffer_stalls,
            reconnects: q.reconnects,
            luns_changed: q.luns_changed,
            capacity_changed: q.capacity_changed,
            aborts: q.aborts,
        }
    }
}

/// An export's live counters: its queues and its connections.
#[derive(Debug, Default)]
pub struct ExportStatus {
    /// One per channel (NBD) or virtqueue (vhost-user-blk).
    pub queues: Vec<QueueStatus>,
    /// Clients connected now.
    pub connections: AtomicU64,
    /// Clients that connected since the export started.
    pub connections_total: AtomicU64,
}

impl ExportStatus {
    /// An export with `queues` queues.
    pub fn new(queues: usize) -> ExportStatus {
        ExportStatus {
            queues: (0..queues).map(|_| QueueStatus::default()).collect(),
            ..ExportStatus::default()
        }
    }

    /// A free queue slot for a connection, with what the slot counted so far (its I/O counters
    /// and the rest); `None` if every slot is held (the pool hands out no more channels than
    /// there are slots).
    pub fn claim(&self) -> Option<(usize, IoCounters, Base)> {
        let i = self.queues.iter().position(|q| {
            q.busy
                .compare_exchange(false, true, Relaxed, Relaxed)
                .is_ok()
        })?;
        let q = &self.queues[i];
        q.tid.store(nix::unistd::gettid().as_raw(), Relaxed);
        let mut was = QueueState::default();
        q.load_into(&mut was);
        Some((i, was.io.clone(), Base::of(&was)))
    }

    /// Gives slot `i` back.
    pub fn release(&self, i: usize) {
        if let Some(q) = self.queues.get(i) {
            q.busy.store(false, Relaxed);
        }
    }

    /// A client connected; the guard counts it out when dropped.
    pub fn connected(&self) -> Connected<'_> {
        self.connections.fetch_add(1, Relaxed);
        self.connections_total.fetch_add(1, Relaxed);
        Connected(self)
    }
}

/// A connection counted in [`ExportStatus::connections`] while it lives.
pub struct Connected<'a>(&'a ExportStatus);

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Relaxed);
    }
}
