//! What the paths of one target port's channels share, touched only when a channel fails.

use nix::sys::eventfd::{EfdFlags, EventFd};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{
    AtomicU32,
    Ordering::{Acquire, Relaxed, Release},
};

/// A failure epoch and one eventfd per queue: the queue whose channel fails bumps the epoch and
/// wakes the others, which take their channels down and reconnect too (ib_srp reconnects every
/// channel of an rport together, so a queue idle through a fault does not find a dead channel
/// later). With a leader ([`SessionLink::with_leader`]), queue 0 logs in first in each epoch
/// (SINGLE, ending whatever the target kept of the nexus's old channels) and the others after it
/// (MULTI, joining its session), as ib_srp reconnects an rport's channels.
#[derive(Debug)]
pub struct SessionLink {
    epoch: AtomicU32,
    wake: Vec<EventFd>,
    /// Whether the other queues wait for queue 0's login in each epoch.
    leader: bool,
    /// 1 + the epoch in which queue 0 last logged in (0: never).
    leader_in: AtomicU32,
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
            leader: false,
            leader_in: AtomicU32::new(0),
        })
    }

    /// Queue 0 leads each epoch's logins: the others log in again only once it has (its login
    /// ends the target's stale channels of the nexus, and would end theirs if they came first).
    /// The link starts with queue 0 logged in (the session's first login) unless `down`.
    pub fn with_leader(mut self, down: bool) -> SessionLink {
        self.leader = true;
        self.leader_in = AtomicU32::new(u32::from(!down));
        self
    }

    /// Whether queue `qid`, down in epoch `epoch`, may log in now: always without a leader, and
    /// for the others than queue 0 once queue 0 has logged in in that epoch.
    pub fn may_log_in(&self, qid: u16, epoch: u32) -> bool {
        !self.leader || qid == 0 || self.leader_in.load(Acquire) == epoch.wrapping_add(1)
    }

    /// Queue `qid` logged in again in epoch `epoch`: queue 0's login lets the others log in,
    /// woken now rather than at their next look.
    pub fn logged_in(&self, qid: u16, epoch: u32) {
        if !self.leader || qid != 0 {
            return;
        }
        self.leader_in.store(epoch.wrapping_add(1), Release);
        for fd in self.wake.iter().skip(1) {
            let _ = fd.write(1);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_that_starts_down_holds_the_others_until_it_logged_in_in_their_epoch() {
        let link = SessionLink::new(3).expect("eventfds").with_leader(true);
        assert!(link.may_log_in(0, 0));
        assert!(!link.may_log_in(1, 0) && !link.may_log_in(2, 0));
        // a sibling's login lets nobody in
        link.logged_in(2, 0);
        assert!(!link.may_log_in(1, 0));
        link.logged_in(0, 0);
        assert!(link.may_log_in(1, 0) && link.may_log_in(2, 0));
        // a new failure: queue 0 leads again
        let e = link.fail(1);
        assert!(!link.may_log_in(1, e) && link.may_log_in(0, e));
        link.logged_in(0, e);
        assert!(link.may_log_in(2, e));
    }

    #[test]
    fn without_a_leader_every_queue_logs_in_on_its_own() {
        let link = SessionLink::new(2).expect("eventfds");
        assert!(link.may_log_in(1, 0) && link.may_log_in(1, 7));
        // nothing waits for queue 0's login
        link.logged_in(0, 3);
        assert!(link.may_log_in(1, 4));
    }
}
