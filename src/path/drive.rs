//! The one contract by which a front end's loop drives its [`Path`]. Each pass: [`Path::submit`]
//! what arrived, [`Path::service`] (completions, and the down steps while the channel is down),
//! then act on the [`super::Event`] it returns. Before the loop sleeps it asks [`Path::sleep`]
//! what may wake it (the completion channel, the connection manager, the next deadline); once
//! woken it hands what was ready to [`Path::woke`]. An fd belongs to one login ([`Sleep::gen`]):
//! what an older login's fd reports means nothing.

use super::{Connect, Path};
use std::os::fd::RawFd;
use std::time::Duration;

/// What may wake a front end that sleeps on its path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sleep {
    /// The completion channel, armed: readable at the next completion.
    pub cq: Option<RawFd>,
    /// The connection manager's channel, while the channel is up: readable when the target
    /// disconnects or the RDMA device goes away.
    pub cm: Option<RawFd>,
    /// The login both belong to.
    pub gen: u16,
    /// How long until the path has timed work (command timeouts, retries, the down steps); none
    /// while it has none.
    pub deadline: Option<Duration>,
}

/// What was ready when a front end woke from a [`Sleep`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Woken {
    /// The login the fds belonged to ([`Sleep::gen`]).
    pub gen: u16,
    /// The completion channel was readable.
    pub cq: bool,
    /// The connection manager's channel was readable.
    pub cm: bool,
}

impl<C: Connect> Path<C> {
    /// Arms the completion channel when `arm_cq` (a front end with commands out must; an idle one
    /// may, to hear an unsolicited IU or the target's disconnect at once) and says what may wake
    /// the front end. A completion may have landed before the arm: service once more before
    /// sleeping.
    pub fn sleep(&mut self, arm_cq: bool) -> Sleep {
        let cq = if arm_cq { self.arm() } else { None };
        Sleep {
            cq,
            cm: self.cm_fd(),
            gen: self.gen,
            deadline: self.next_tick_in(),
        }
    }

    /// Acts on what woke the front end: the completion notification consumed, the connection
    /// manager's events read (the target's DISCONNECT stops the channel, and the next
    /// [`Path::service`] takes it down and reconnects).
    pub fn woke(&mut self, w: Woken) {
        if w.gen != self.gen {
            return;
        }
        if w.cq {
            self.ack();
        }
        if w.cm {
            self.drain_cm();
        }
    }
}
