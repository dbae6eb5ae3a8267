//! The fake target's fds, for tests that drive a front end's real loop: a completion channel that
//! is readable while armed with a completion waiting, and a connection manager channel that
//! carries the target's DISCONNECT. Each is one end of a socket pair; the other end signals.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

/// One readable-or-not fd: the read end, and the end that makes it readable.
struct Signal {
    read: UnixStream,
    write: UnixStream,
    up: bool,
}

impl Signal {
    fn new() -> Signal {
        let (read, write) = UnixStream::pair().expect("a socket pair for the fake target");
        read.set_nonblocking(true).expect("non-blocking");
        Signal {
            read,
            write,
            up: false,
        }
    }

    fn raise(&mut self) {
        if !self.up {
            self.up = self.write.write_all(&[1]).is_ok();
        }
    }

    fn clear(&mut self) {
        let mut b = [0u8; 8];
        while matches!(self.read.read(&mut b), Ok(n) if n > 0) {}
        self.up = false;
    }
}

/// A login's fds and the connection manager's events not yet read.
pub(super) struct Fds {
    cq: Signal,
    cm: Signal,
    events: VecDeque<&'static str>,
}

impl Fds {
    pub(super) fn new() -> Box<Fds> {
        Box::new(Fds {
            cq: Signal::new(),
            cm: Signal::new(),
            events: VecDeque::new(),
        })
    }

    pub(super) fn cq_fd(&self) -> RawFd {
        self.cq.read.as_raw_fd()
    }

    pub(super) fn cm_fd(&self) -> RawFd {
        self.cm.read.as_raw_fd()
    }

    /// A completion is waiting on an armed completion channel.
    pub(super) fn notify(&mut self) {
        self.cq.raise();
    }

    /// The notification was consumed.
    pub(super) fn ack(&mut self) {
        self.cq.clear();
    }

    /// The target sent a connection manager event.
    pub(super) fn cm_event(&mut self, name: &'static str) {
        self.events.push_back(name);
        self.cm.raise();
    }

    /// The next connection manager event.
    pub(super) fn next_event(&mut self) -> Option<&'static str> {
        let ev = self.events.pop_front();
        if self.events.is_empty() {
            self.cm.clear();
        }
        ev
    }
}
