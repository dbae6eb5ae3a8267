//! The state of a channel's link as ib_srp's SRP transport class keeps it for an rport: running, or
//! down since some time -- holding I/O and reconnecting every `reconnect_delay`, failing I/O fast
//! after `fast_io_fail_tmo`, lost after `dev_loss_tmo`. Plain bookkeeping on a clock the caller
//! passes in; each front end (a ublk queue thread, an NBD connection) owns one per channel and acts
//! on what [`Rport::down_step`] says.

use super::timers::Timers;
use std::time::{Duration, Instant};

/// Where a channel stands (ib_srp's rport states).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkState {
    /// Carrying I/O.
    Running = 0,
    /// Down: I/O is held while the channel reconnects.
    Blocked = 1,
    /// Down past fast_io_fail_tmo: I/O fails at once while the channel reconnects.
    FailFast = 2,
    /// Down past dev_loss_tmo: given up.
    Lost = 3,
}

impl LinkState {
    /// From its `repr(u8)` value.
    pub fn from_u8(v: u8) -> LinkState {
        match v {
            0 => LinkState::Running,
            1 => LinkState::Blocked,
            2 => LinkState::FailFast,
            _ => LinkState::Lost,
        }
    }
    /// The name `list` shows.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Running => "running",
            LinkState::Blocked => "blocked",
            LinkState::FailFast => "fail-fast",
            LinkState::Lost => "lost",
        }
    }
}

/// What to do now about a channel that is down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DownStep {
    /// It has just been found down: stop it (quiesce) and hold its I/O.
    pub went_down: bool,
    /// fast_io_fail_tmo has just expired: fail what is held (and, from now, what comes).
    pub fail_held: bool,
    /// dev_loss_tmo has just expired: give the channel up.
    pub lost: bool,
    /// Time for a reconnect attempt.
    pub try_now: bool,
    /// How long it has been down.
    pub down_for: Duration,
}

/// One channel's link.
#[derive(Clone, Debug)]
pub struct Rport {
    /// The transport-class timers.
    pub timers: Timers,
    since: Option<Instant>,
    /// For a link that starts down: when it really went down (see [`Rport::down_since`]).
    carried: Option<Instant>,
    next_try: Option<Instant>,
    fail_fast: bool,
    lost: bool,
}

impl Rport {
    /// A running link.
    pub fn new(timers: Timers) -> Rport {
        Rport {
            timers,
            since: None,
            carried: None,
            next_try: None,
            fail_fast: false,
            lost: false,
        }
    }

    /// A link that went down at `at`, before this process had it (the daemon whose RDMA device
    /// went away handed the device over): its first [`Rport::down_step`] counts every timer from
    /// `at`, so a handover neither restarts fast_io_fail_tmo nor dev_loss_tmo.
    pub fn down_since(timers: Timers, at: Instant) -> Rport {
        Rport {
            carried: Some(at),
            ..Rport::new(timers)
        }
    }

    /// Its state.
    pub fn state(&self) -> LinkState {
        match (self.since, self.fail_fast, self.lost) {
            (None, ..) => LinkState::Running,
            (Some(_), _, true) => LinkState::Lost,
            (Some(_), true, false) => LinkState::FailFast,
            (Some(_), false, false) => LinkState::Blocked,
        }
    }

    /// Whether the link is up.
    pub fn is_up(&self) -> bool {
        self.since.is_none()
    }

    /// The channel is down at `now`: what to do (each of `went_down`, `fail_held` and `lost` is
    /// said once).
    pub fn down_step(&mut self, now: Instant) -> DownStep {
        let mut step = DownStep::default();
        let since = match self.since {
            Some(s) => s,
            None => {
                step.went_down = true;
                let at = self.carried.take().map_or(now, |at| at.min(now));
                self.since = Some(at);
                self.next_try = self.timers.reconnect_delay().map(|d| at + d);
                at
            }
        };
        step.down_for = now.saturating_duration_since(since);
        if !self.fail_fast
            && self
                .timers
                .fast_io_fail()
                .is_some_and(|t| step.down_for >= t)
        {
            self.fail_fast = true;
            step.fail_held = true;
        }
        if !self.lost && self.timers.dev_loss().is_some_and(|t| step.down_for >= t) {
            self.lost = true;
            step.lost = true;
        }
        step.try_now = !self.lost && self.next_try.is_some_and(|at| now >= at);
        step
    }

    /// A reconnect attempt failed at `now`: the next one after reconnect_delay.
    pub fn retry_later(&mut self, now: Instant) {
        self.next_try = self.timers.reconnect_delay().map(|d| now + d);
    }

    /// The channel is up again; returns how long it was down.
    pub fn reconnected(&mut self, now: Instant) -> Duration {
        let down = self
            .since
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
        *self = Rport::new(self.timers);
        down
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timers_in_order() {
        let t = Timers {
            reconnect_delay: Some(2),
            fast_io_fail_tmo: Some(5),
            dev_loss_tmo: Some(10),
        };
        let mut r = Rport::new(t);
        let t0 = Instant::now();
        assert_eq!(r.state(), LinkState::Running);
        let s = r.down_step(t0);
        assert!(s.went_down && !s.fail_held && !s.try_now);
        assert_eq!(r.state(), LinkState::Blocked);
        let s = r.down_step(t0 + Duration::from_secs(2));
        assert!(!s.went_down && s.try_now);
        r.retry_later(t0 + Duration::from_secs(2));
        assert!(!r.down_step(t0 + Duration::from_secs(3)).try_now);
        let s = r.down_step(t0 + Duration::from_secs(5));
        assert!(s.fail_held && !s.lost);
        assert_eq!(r.state(), LinkState::FailFast);
        assert!(
            !r.down_step(t0 + Duration::from_secs(6)).fail_held,
            "said once"
        );
        let s = r.down_step(t0 + Duration::from_secs(10));
        assert!(s.lost && !s.try_now);
        assert_eq!(r.state(), LinkState::Lost);
    }

    #[test]
    fn a_link_handed_over_down_keeps_its_clock() {
        let t = Timers {
            reconnect_delay: Some(2),
            fast_io_fail_tmo: Some(5),
            dev_loss_tmo: Some(10),
        };
        let t0 = Instant::now();
        let mut r = Rport::down_since(t, t0);
        assert!(r.is_up(), "up until its first step, like any link");
        let s = r.down_step(t0 + Duration::from_secs(3));
        assert!(s.went_down && s.try_now, "reconnect_delay counted from t0");
        assert_eq!(s.down_for, Duration::from_secs(3));
        r.retry_later(t0 + Duration::from_secs(3));
        let s = r.down_step(t0 + Duration::from_secs(5));
        assert!(s.fail_held, "fast_io_fail_tmo counted from t0");
        assert!(r.down_step(t0 + Duration::from_secs(10)).lost);
        r.reconnected(t0 + Duration::from_secs(4));
        assert!(
            r.down_step(t0 + Duration::from_secs(20)).down_for.is_zero(),
            "the next outage starts its own clock"
        );
    }

    #[test]
    fn a_reconnect_resets_everything() {
        let t = Timers {
            reconnect_delay: Some(1),
            fast_io_fail_tmo: None,
            dev_loss_tmo: Some(60),
        };
        let mut r = Rport::new(t);
        let t0 = Instant::now();
        r.down_step(t0);
        assert!(r.down_step(t0 + Duration::from_secs(1)).try_now);
        assert_eq!(
            r.reconnected(t0 + Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        assert!(r.is_up());
        assert!(
            r.down_step(t0 + Duration::from_secs(100)).went_down,
            "a new outage"
        );
    }
}
