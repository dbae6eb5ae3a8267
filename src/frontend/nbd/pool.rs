//! The SRP channels of an NBD export: one serves each connection. A channel that a connection
//! leaves down or stuck is set aside, and a connection that finds no free channel logs a new one in
//! (up to as many as the session started with): after the target comes back from an outage that
//! cost every channel, new connections are served again. A channel set aside is closed only once a
//! new login has worked: closing sends a CM disconnect, and CM messages sent while the fabric is
//! down can leave soft-RoCE unable to log anyone in (the lab saw every later login time out), which
//! is why a down queue keeps its old endpoint until the new one is up, as ib_srp does.
//!
//! A client that connects while every channel serves a connection waits for one to come back:
//! [`GRACE`] at least (a client that reconnects at once, as `qemu-io` then `nbdinfo` do, arrives
//! before the ended connection's thread has given its channel back), and for as long as a
//! connection that ended is still draining its commands.

use super::exec::DRAIN_WAIT;
use crate::path::Spare;
use crate::rdma::Endpoint;
use crate::session::SrpChannel;
use crate::session::{Relogin, SessionError, RELOGIN_STEP};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a client waits for a channel when every one serves a connection and none is ending.
pub(super) const GRACE: Duration = Duration::from_secs(2);

/// Why a connection gets no channel.
#[derive(Debug, thiserror::Error)]
pub(super) enum PoolError {
    /// Every channel serves another connection.
    #[error(
        "every SRP channel is in use by another connection; start `srp-ublk serve` with more --queues"
    )]
    AllInUse,
    /// No channel was free and a new one did not log in.
    #[error("no SRP channel is free and a new login failed")]
    Login(#[source] SessionError),
    /// The connection's buffers could not be registered.
    #[error("cannot register the connection's buffers")]
    Register(#[source] crate::path::PathError),
    /// A thread panicked holding the pool.
    #[error("internal error: the channel pool is poisoned")]
    Poisoned,
}

/// Logs a replacement channel in.
pub(super) type Login<C> = Box<dyn Fn() -> Result<C, SessionError> + Send + Sync>;

/// The export's channels (`C` is a channel with the buffers its last connection registered;
/// tests use a stand-in).
pub struct Pool<C = Spare<Endpoint>> {
    state: Mutex<State<C>>,
    /// Signalled when a channel comes back, is lost, or a connection stops ending.
    changed: Condvar,
    max: usize,
    login: Login<C>,
    /// How long [`Pool::take`] waits when no connection is ending.
    grace: Duration,
    /// How long it waits at most while one is.
    drain: Duration,
}

struct State<C> {
    free: Vec<C>,
    /// Channels lost with their connections, closed after the next login that works.
    dead: Vec<C>,
    /// Channels that exist: free, or serving a connection.
    live: usize,
    /// Connections that ended and have not given their channel back yet.
    ending: usize,
}

impl Pool {
    /// The channels a session logged in; `relogin` logs replacements in.
    pub fn new(channels: Vec<SrpChannel>, relogin: Relogin) -> Pool {
        let login = Box::new(move || relogin.channel(RELOGIN_STEP).map(Spare::new));
        let channels = channels.into_iter().map(Spare::new).collect();
        Pool::with_login(channels, login, GRACE, DRAIN_WAIT)
    }
}

impl<C> Pool<C> {
    pub(super) fn with_login(
        channels: Vec<C>,
        login: Login<C>,
        grace: Duration,
        drain: Duration,
    ) -> Self {
        Pool {
            max: channels.len(),
            state: Mutex::new(State {
                live: channels.len(),
                free: channels,
                dead: Vec::new(),
                ending: 0,
            }),
            changed: Condvar::new(),
            login,
            grace,
            drain,
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, State<C>>, PoolError> {
        self.state.lock().map_err(|_| PoolError::Poisoned)
    }

    /// A free channel, or a new login when fewer than the session's channels are left; when
    /// every channel serves a connection, waits for one (see the module's note).
    pub(super) fn take(&self) -> Result<C, PoolError> {
        let start = Instant::now();
        let mut st = self.lock()?;
        loop {
            if let Some(ch) = st.free.pop() {
                return Ok(ch);
            }
            if st.live < self.max {
                // a place for a new channel: log it in without holding the pool
                st.live += 1;
                drop(st);
                return self.log_in();
            }
            let limit = if st.ending > 0 {
                self.drain + self.grace
            } else {
                self.grace
            };
            let Some(left) = limit.checked_sub(start.elapsed()).filter(|d| !d.is_zero()) else {
                return Err(PoolError::AllInUse);
            };
            st = self
                .changed
                .wait_timeout(st, left)
                .map_err(|_| PoolError::Poisoned)?
                .0;
        }
    }

    fn log_in(&self) -> Result<C, PoolError> {
        match (self.login)() {
            Ok(ch) => {
                tracing::info!("NBD: a new SRP channel logged in for a connection (one was lost)");
                // the fabric works: the lost channels' disconnects can go now (outside the lock;
                // a poisoned pool keeps them rather than lose the channel just logged in)
                let dead = self.lock().map(|mut st| std::mem::take(&mut st.dead));
                drop(dead);
                Ok(ch)
            }
            Err(e) => {
                self.update(|st| st.live -= 1);
                Err(PoolError::Login(e))
            }
        }
    }

    fn update(&self, f: impl FnOnce(&mut State<C>)) {
        if let Ok(mut st) = self.state.lock() {
            f(&mut st);
        }
        self.changed.notify_all();
    }

    /// A connection ended: its channel comes back through [`Pool::give_back`] or
    /// [`Pool::lost`], each of which ends this, once its commands in flight are done.
    pub(super) fn ending(&self) {
        self.update(|st| st.ending += 1);
    }

    /// A channel back from its connection (which [`Pool::ending`] announced), idle and up.
    pub(super) fn give_back(&self, ch: C) {
        self.update(|st| {
            st.ending = st.ending.saturating_sub(1);
            st.free.push(ch);
        });
    }

    /// A channel that was dropped (its buffers could not be registered): a later connection logs
    /// a new one in.
    pub(super) fn gone(&self) {
        self.update(|st| st.live -= 1);
    }

    /// A channel given up (down, or still busy after its connection ended, which
    /// [`Pool::ending`] announced): a later connection logs a new one in, and this one is closed
    /// after that.
    pub(super) fn lost(&self, ch: C) {
        self.update(|st| {
            st.ending = st.ending.saturating_sub(1);
            st.live -= 1;
            st.dead.push(ch);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    const MS: Duration = Duration::from_millis(1);

    fn pool(n: u32, logins: Arc<AtomicUsize>, grace: Duration) -> Arc<Pool<u32>> {
        let login: Login<u32> =
            Box::new(move || Ok(100 + logins.fetch_add(1, Ordering::SeqCst) as u32));
        Arc::new(Pool::with_login((0..n).collect(), login, grace, 2000 * MS))
    }

    #[test]
    fn a_client_arriving_as_another_leaves_gets_its_channel() {
        let p = pool(1, Arc::default(), 2000 * MS);
        let ch = p.take().unwrap();
        let q = p.clone();
        let back = std::thread::spawn(move || {
            std::thread::sleep(50 * MS);
            q.ending();
            q.give_back(ch);
        });
        let t = Instant::now();
        assert_eq!(p.take().unwrap(), 0);
        assert!(t.elapsed() < 1000 * MS, "waited {:?}", t.elapsed());
        back.join().unwrap();
    }

    #[test]
    fn a_client_past_the_grace_is_told_every_channel_is_in_use() {
        let p = pool(1, Arc::default(), 30 * MS);
        let _held = p.take().unwrap();
        let err = p.take().unwrap_err();
        assert!(
            err.to_string().contains("every SRP channel is in use"),
            "{err}"
        );
    }

    #[test]
    fn a_draining_connection_is_waited_for_past_the_grace() {
        let p = pool(1, Arc::default(), 30 * MS);
        let ch = p.take().unwrap();
        p.ending();
        let q = p.clone();
        let back = std::thread::spawn(move || {
            std::thread::sleep(200 * MS);
            q.give_back(ch);
        });
        assert_eq!(p.take().unwrap(), 0);
        back.join().unwrap();
    }

    #[test]
    fn a_lost_channel_is_replaced_by_a_new_login_and_closed_after_it() {
        let logins = Arc::new(AtomicUsize::new(0));
        let p = pool(1, logins.clone(), 30 * MS);
        let ch = p.take().unwrap();
        p.ending();
        p.lost(ch);
        assert_eq!(p.lock().unwrap().dead, vec![0]);
        assert_eq!(p.take().unwrap(), 100);
        assert_eq!(logins.load(Ordering::SeqCst), 1);
        assert!(p.lock().unwrap().dead.is_empty());
        // the replacement counts: a third client waits, then is refused
        assert!(matches!(p.take(), Err(PoolError::AllInUse)));
    }
}
