//! What the paths of one target port's channels share, touched only when a channel fails.

use nix::sys::eventfd::{EfdFlags, EventFd};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// A failure epoch and one eventfd per queue: the queue whose channel fails bumps the epoch and
/// wakes the others, which take their channels down and reconnect too (ib_srp reconnects every
/// channel of an rport together, so a queue idle through a fault does not find a dead channel
/// later).
#[derive(Debug)]
pub struct SessionLink {
    epoch: AtomicU32,
    wake: Vec<EventFd>,
}

impl SessionLink {
    /// The link of `queues` queues (channels).
    pub fn new(queues: u16) -> nix::Result<SessionLink> {
        let wake = (0..queues)
            .map(|_| EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SessionLink {
            epoch: AtomicU32::new(0),
            wake,
        })
    }

    /// The failure epoch now.
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Relaxed)
    }

    /// Queue `qid`'s channel failed on its own: tell the others. Returns the new epoch.
    pub fn fail(&self, qid: u16) -> u32 {
        let e = self.epoch.fetch_add(1, Relaxed).wrapping_add(1);
        for (q, fd) in self.wake.iter().enumerate() {
            if q != usize::from(qid) {
                let _ = fd.write(1);
            }
        }
        e
    }

    /// Queue `qid`'s eventfd: readable after a sibling failed.
    pub fn wake_fd(&self, qid: u16) -> RawFd {
        self.wake[usize::from(qid)].as_raw_fd()
    }

    /// Consumes queue `qid`'s wake-up.
    pub fn ack_wake(&self, qid: u16) {
        let _ = self.wake[usize::from(qid)].read();
    }
}
