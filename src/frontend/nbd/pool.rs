//! The SRP channels of an NBD export: one serves each connection. A channel that a connection
//! leaves down or stuck is set aside, and a connection that finds no free channel logs a new one in
//! (up to as many as the session started with): after the target comes back from an outage that
//! cost every channel, new connections are served again. A channel set aside is closed only once a
//! new login has worked: closing sends a CM disconnect, and CM messages sent while the fabric is
//! down can leave soft-RoCE unable to log anyone in (the lab saw every later login time out), which
//! is why a down queue keeps its old endpoint until the new one is up, as ib_srp does.

use crate::session::SrpChannel;
use crate::session::{Relogin, SessionError, RELOGIN_STEP};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Why a connection gets no channel.
#[derive(Debug, thiserror::Error)]
pub(super) enum PoolError {
    /// Every channel serves another connection.
    #[error(
        "every SRP channel is in use by another connection; start `srp-ublk serve` with more --queues"
    )]
    AllInUse,
    /// No channel was free and a new one did not log in.
    #[error("no SRP channel is free and a new login failed: {0}")]
    Login(#[source] SessionError),
    /// The connection's buffers could not be registered.
    #[error("cannot register the connection's buffers: {0}")]
    Register(#[source] crate::path::PathError),
    /// A thread panicked holding the pool.
    #[error("internal error: the channel pool is poisoned")]
    Poisoned,
}

/// The export's channels.
pub struct Pool {
    free: Mutex<Vec<SrpChannel>>,
    /// Channels lost with their connections, closed after the next login that works.
    dead: Mutex<Vec<SrpChannel>>,
    /// Channels that exist: free, or serving a connection.
    live: AtomicUsize,
    max: usize,
    relogin: Relogin,
}

impl Pool {
    /// The channels a session logged in; `relogin` logs replacements in.
    pub fn new(channels: Vec<SrpChannel>, relogin: Relogin) -> Pool {
        Pool {
            live: AtomicUsize::new(channels.len()),
            max: channels.len(),
            free: Mutex::new(channels),
            dead: Mutex::new(Vec::new()),
            relogin,
        }
    }

    /// A free channel, or a new login when fewer than the session's channels are left.
    pub(super) fn take(&self) -> Result<SrpChannel, PoolError> {
        if let Some(ch) = self.free.lock().map_err(|_| PoolError::Poisoned)?.pop() {
            return Ok(ch);
        }
        // reserve a place for a new channel, or there is none
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .map_err(|_| PoolError::AllInUse)?;
        match self.relogin.channel(RELOGIN_STEP) {
            Ok(ch) => {
                tracing::info!("NBD: a new SRP channel logged in for a connection (one was lost)");
                // the fabric works: the lost channels' disconnects can go now
                if let Ok(mut d) = self.dead.lock() {
                    d.clear();
                }
                Ok(ch)
            }
            Err(e) => {
                self.live.fetch_sub(1, Ordering::AcqRel);
                Err(PoolError::Login(e))
            }
        }
    }

    /// A channel back from its connection, idle and up.
    pub(super) fn give_back(&self, ch: SrpChannel) {
        match self.free.lock() {
            Ok(mut p) => p.push(ch),
            Err(_) => self.lost(ch),
        }
    }

    /// A channel that was dropped (its buffers could not be registered): a later connection logs
    /// a new one in.
    pub(super) fn gone(&self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
    }

    /// A channel given up (down, or still busy after its connection ended): a later connection
    /// logs a new one in, and this one is closed after that.
    pub(super) fn lost(&self, ch: SrpChannel) {
        self.live.fetch_sub(1, Ordering::AcqRel);
        if let Ok(mut d) = self.dead.lock() {
            d.push(ch);
        }
    }
}
