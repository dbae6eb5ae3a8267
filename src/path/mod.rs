//! One queue's path to its LUN: the SRP channel and everything that keeps it serving, for both
//! front ends.
//!
//! A [`Path`] owns the channel, its data buffers (registered again on every login), its link state
//! ([`Rport`]: ib_srp's transport-class timers) and how it logs in again ([`Connect`]). When the
//! channel goes down it holds I/O, logs in again every reconnect_delay, re-issues what it held in
//! the order it was first sent on the re-keyed buffers, fails I/O after fast_io_fail_tmo and gives
//! the path up after dev_loss_tmo; when the RDMA device goes away it lets go of it at once; with a
//! [`SessionLink`], a failure of one queue's channel takes its siblings' channels down too, so that
//! every channel of the device reconnects together (ib_srp's `srp_reconnect_rport`).
//!
//! A front end hands the path block operations and takes completions from [`Path::service`], asks
//! it what to wait on ([`Path::sleep`], the contract of `drive`) and tells it the time; it never
//! sees the transport.

mod drive;
#[cfg(any(test, feature = "test-utils"))]
pub mod fake;
mod loan;
mod session;
mod spare;
mod staging;
#[cfg(test)]
mod tests;

pub use drive::{Sleep, Woken};
pub use session::SessionLink;
pub use spare::{Returned, Spare};

use crate::channel::block::{to_scsi, BlockOp, Geometry};
use crate::channel::{
    clock_ms, Channel, DataBuf, Done, DownReason, Login, Memory, Post, Transport, TransportError,
};
use crate::rdma::{Endpoint, TagBufs};
use crate::session::rport::{LinkState, Rport};
use crate::session::{Relogin, SessionError, RELOGIN_STEP};
use crate::wire::srp::ScsiLun;
use staging::{Plan, Request, Staging, Waiter};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How a path logs its channel in again after it went down.
pub trait Connect {
    /// The transport a login gives (it registers the memory layer's [`crate::rdma::Lent`]).
    type T: Transport + Memory<Lent = crate::rdma::Lent>;
    /// Why a login failed.
    type Error: std::error::Error + 'static;
    /// A new login to the target `old` was logged in to.
    fn connect(&self, old: &mut Self::T) -> Result<Fresh<Self::T>, Self::Error>;
}

/// A new login.
pub struct Fresh<T> {
    /// The logged-in transport.
    pub t: T,
    /// Its initial credits.
    pub req_lim: i32,
    /// Its immediate-data limit.
    pub max_imm: u32,
}

impl Connect for Relogin {
    type T = Endpoint;
    type Error = SessionError;

    fn connect(&self, _old: &mut Endpoint) -> Result<Fresh<Endpoint>, SessionError> {
        let f = Relogin::connect(self, RELOGIN_STEP)?;
        Ok(Fresh {
            t: f.ep,
            req_lim: f.req_lim,
            max_imm: f.max_imm,
        })
    }
}

/// Why a reconnect attempt failed.
#[derive(Debug, thiserror::Error)]
enum ReconnectError<E: std::error::Error + 'static> {
    /// The login.
    #[error(transparent)]
    Login(E),
    /// Registering the buffers on the new login's device.
    #[error("registering the tag buffers")]
    Register(#[source] TransportError),
}

/// What went wrong setting a path up.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The tag buffers could not be registered on the channel's login.
    #[error("registering the tag buffers")]
    Register(#[source] TransportError),
}

/// What a path tells its front end besides completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The RDMA device under the channel is going away and the path let go of it; the channel went
    /// down at `since`. A ublk device is handed over to a new image of the daemon.
    Removed {
        /// When the channel went down.
        since: SystemTime,
    },
    /// dev_loss_tmo expired: every command failed and the path is given up for good.
    Lost,
}

/// A sibling queue in a [`SessionLink`].
struct Member {
    link: Arc<SessionLink>,
    qid: u16,
    /// The failure epoch this path has acted on.
    epoch: u32,
}

/// One queue's path: see the module documentation.
pub struct Path<C: Connect> {
    /// The buffers' registration, kept from one login to the next on the same device (none while
    /// the channel starts down, or after its device went away). The registrations are dropped
    /// before the channel (field order): the login still holds the device then, so the last
    /// holder of a registration lets go of it while the device's context is open.
    reg: Option<<C::T as Memory>::Registered>,
    /// Memory the front end lent ([`Path::lend`]).
    loan: Option<loan::Loan<<C::T as Memory>::Registered>>,
    /// Registrations of replaced loans, until no command is outstanding.
    retired: Vec<<C::T as Memory>::Registered>,
    ch: Channel<C::T>,
    bufs: TagBufs,
    /// The descriptor of each registered region: tag `t`'s head at `t`, then the area
    /// ([`TagBufs::area_region`]).
    data: Vec<DataBuf>,
    loan_gen: u32,
    /// Which tag holds which span of the area, and the commands waiting for room.
    stage: Staging,
    rport: Rport,
    connect: C,
    /// How the log names this path ("queue 0", "NBD connection").
    name: String,
    session: Option<Member>,
    /// Bumped with every new login: what a front end armed on an old login's fds means nothing.
    gen: u16,
    reconnects: u64,
    /// [`clock_ms`] at `base`: the channel's millisecond clock for an `Instant` the front end gives.
    base: Instant,
    base_ms: u64,
}

impl<C: Connect> Path<C> {
    /// A path over `ch`, whose buffers are `bufs` (one per tag). A channel that is up gets them
    /// registered now; one that starts down (a handover) holds I/O at once and registers them
    /// with its first login.
    pub fn new(
        mut ch: Channel<C::T>,
        connect: C,
        bufs: TagBufs,
        rport: Rport,
        name: String,
    ) -> Result<Path<C>, PathError> {
        let (reg, data) = if ch.transport().is_stopped() {
            (None, unregistered(&bufs))
        } else {
            let (reg, data) = ch
                .transport()
                .register(&bufs.lent())
                .map_err(PathError::Register)?;
            (Some(reg), data)
        };
        Ok(Path::assemble(ch, connect, (bufs, reg, data), rport, name))
    }

    /// A path over `ch` with buffers `bufs`, registered as `reg` and described by `data`.
    fn assemble(
        ch: Channel<C::T>,
        connect: C,
        (bufs, reg, data): (TagBufs, Option<<C::T as Memory>::Registered>, Vec<DataBuf>),
        rport: Rport,
        name: String,
    ) -> Path<C> {
        let mut p = Path {
            ch,
            stage: Staging::new(&bufs),
            bufs,
            reg,
            data,
            loan: None,
            loan_gen: 0,
            retired: Vec::new(),
            rport,
            connect,
            name,
            session: None,
            gen: 0,
            reconnects: 0,
            base: Instant::now(),
            base_ms: clock_ms(),
        };
        if p.ch.down().is_some() {
            p.went_down(p.base);
        }
        p
    }

    /// Makes this path queue `qid` of `link`'s device: its failures take the siblings down.
    pub fn join(&mut self, link: Arc<SessionLink>, qid: u16) {
        let epoch = link.epoch();
        self.session = Some(Member { link, qid, epoch });
    }

    /// The data buffers.
    pub fn bufs(&self) -> &TagBufs {
        &self.bufs
    }

    /// Tag `tag`'s buffer (fill it before a write, read it after a read completed).
    pub fn buf(&mut self, tag: u16) -> &mut [u8] {
        self.bufs.slot(tag)
    }

    /// The channel (its counters and credits).
    pub fn channel(&self) -> &Channel<C::T> {
        &self.ch
    }

    /// The transport under the channel (tests reach the fake target through it).
    #[cfg(test)]
    pub(crate) fn transport_mut(&mut self) -> &mut C::T {
        self.ch.transport()
    }

    /// The link's state.
    pub fn state(&self) -> LinkState {
        self.rport.state()
    }

    /// Whether the channel is up.
    pub fn is_up(&self) -> bool {
        self.rport.is_up()
    }

    /// Commands not yet finished (those waiting for room in the area too).
    pub fn busy(&self) -> u16 {
        self.ch.busy() + self.stage.waiting()
    }

    /// Reconnects that succeeded.
    pub fn reconnects(&self) -> u64 {
        self.reconnects
    }

    /// The login generation: a front end tags what it arms on [`Path::arm`]'s and
    /// [`Path::cm_fd`]'s fds with it and ignores what an older generation reports.
    pub fn gen(&self) -> u16 {
        self.gen
    }

    /// Stamps commands submitted from now on (`now_ms` from [`clock_ms`]).
    pub fn set_clock(&mut self, now_ms: u64) {
        self.ch.set_clock(now_ms);
    }

    /// Runs the channel's timed work when due (command timeouts, delayed retries, link checks).
    pub fn tick(&mut self, now_ms: u64) {
        if self.rport.is_up() {
            self.ch.tick(now_ms);
        }
    }

    /// How long until [`Path::tick`] or [`Path::service`] has timed work: the channel's next tick
    /// while commands are outstanding, and [`DOWN_TICK`] while the channel is down.
    pub fn next_tick_in(&self) -> Option<Duration> {
        if !self.rport.is_up() {
            return Some(DOWN_TICK);
        }
        self.ch.next_tick_in().map(Duration::from_millis)
    }

    /// The LUN the path's channel was set up for (`ChannelConfig::lun`): the one its logins'
    /// probes address, and the LUN of a front end that serves one.
    pub fn lun(&self) -> ScsiLun {
        self.ch.config().lun
    }

    /// Queues block operation `op` on tag `tag` for LUN `lun` of geometry `geo` (its buffer, or
    /// with a pool the span reserved for it, holds a write's data; it is posted with the others of
    /// this pass by the next [`Path::service`]); an error is the errno to complete it with. A path
    /// serves any LUN of its target port: the LUN is the command's, as in each SRP_CMD.
    pub fn submit(
        &mut self,
        tag: u16,
        lun: ScsiLun,
        op: BlockOp,
        off: u64,
        len: u32,
        geo: &Geometry,
    ) -> Result<(), i32> {
        if tag >= self.bufs.depth() {
            return Err(libc::EINVAL);
        }
        let r = Request {
            tag,
            lun,
            op,
            off,
            len,
            geo: *geo,
        };
        match self.stage.plan(tag, op, len) {
            Plan::Wait => {
                self.stage.wait(r);
                Ok(())
            }
            Plan::Stage | Plan::Direct => self.start(r),
        }
    }

    /// Queues `cdb` for LUN `lun` on tag `tag` with its data in `segs`, registered memory the
    /// front end lent ([`Path::lend`]); data-out with `out`. Posted by the next
    /// [`Path::service`]; an error is the errno to complete it with.
    pub fn submit_segments(
        &mut self,
        tag: u16,
        lun: ScsiLun,
        cdb: crate::wire::scsi::Cdb,
        out: bool,
        segs: &[DataBuf],
    ) -> Result<(), i32> {
        if tag >= self.bufs.depth() {
            return Err(libc::EINVAL);
        }
        self.ch
            .submit_segments(tag, lun, cdb, out, segs)
            .map_err(|e| match e {
                crate::channel::SubmitError::Segments { .. } => libc::EINVAL,
                _ => libc::EIO,
            })
    }

    /// The most segments [`Path::submit_segments`] takes for one command.
    pub fn max_segments(&self) -> u16 {
        self.ch.max_segments()
    }

    /// Reserves the span a pool write's data is to be copied into: its address, or None when the
    /// write waits for room (it comes back from [`Path::granted`]). EINVAL when these are not a
    /// pool or the write is larger than it.
    pub fn reserve(&mut self, tag: u16, len: u32) -> Result<Option<u64>, i32> {
        let room = u64::from(self.bufs.units()) * u64::from(self.bufs.unit());
        if !self.bufs.is_pool() || tag >= self.bufs.depth() || u64::from(len) > room {
            return Err(libc::EINVAL);
        }
        if !self.stage.reserve(tag, len) {
            return Ok(None);
        }
        Ok(self.span_addr(tag))
    }

    /// Drops pool write `tag`'s reservation, whose data will never come (the front end's device
    /// stopped before the kernel copied it in): its span goes back, and what waited for room
    /// starts.
    pub fn abandon(&mut self, tag: u16, done: &mut dyn FnMut(Done, &TagBufs)) {
        self.stage.abandon(tag);
        self.start_waiting(done);
    }

    /// The reservations that got their span since the last call, with its address.
    pub fn granted(&mut self) -> Vec<(u16, u64)> {
        let tags = self.stage.take_granted();
        tags.into_iter()
            .filter_map(|t| Some((t, self.span_addr(t)?)))
            .collect()
    }

    /// The address of the span tag `tag` holds (noted for its commit).
    fn span_addr(&mut self, tag: u16) -> Option<u64> {
        let (at, _) = self.stage.span(tag)?;
        self.bufs.set_span(tag, at);
        Some(self.bufs.area_addr(at))
    }

    /// The commits of the pool reads finished so far went to the kernel (it copied their data
    /// out): their spans go back, and what waited for room starts.
    pub fn committed(&mut self, done: &mut dyn FnMut(Done, &TagBufs)) {
        if self.stage.committed() {
            self.start_waiting(done);
        }
    }

    /// Whether commands wait for room that the pool reads' COMMITs not yet submitted hold: the
    /// front end submits them before it sleeps ([`Path::committed`] after), since what it sleeps
    /// on may never fire otherwise (the reads completed; the waiting command is not out).
    pub fn commits_hold_waiters(&self) -> bool {
        self.stage.commits_hold_waiters()
    }

    /// Commands that waited for room in the buffers (the pool, or a staging buffer) so far.
    pub fn buffer_stalls(&self) -> u64 {
        self.stage.stalls()
    }

    /// Whether pool reads finished whose spans wait for their COMMITs to reach the kernel.
    pub fn commits_pending(&self) -> bool {
        self.stage.commits_pending()
    }

    /// Sends a command from the tag's head or from the span it holds (a staged write's data
    /// copied there first); one that cannot be sent gives its span back.
    fn start(&mut self, r: Request) -> Result<(), i32> {
        let Request {
            tag,
            lun,
            op,
            off,
            len,
            geo,
        } = r;
        let sent = match self.stage.span(tag) {
            Some((at, n)) => {
                if self.bufs.is_pool() {
                    self.bufs.set_span(tag, at);
                } else if let BlockOp::Write { .. } = op {
                    let (slot, area) = self.bufs.slot_and_area(tag, at, len as usize);
                    area.copy_from_slice(slot);
                }
                let b = self.data.get(self.bufs.area_region()).map(|a| DataBuf {
                    addr: a.addr + at as u64,
                    len: n as u32,
                    ..*a
                });
                send(
                    &mut self.ch,
                    tag,
                    (lun, op, off, len, &geo),
                    b,
                    self.bufs.area(at, n),
                )
            }
            None => {
                let region = self.stage.region(tag, self.bufs.area_region());
                let b = region.and_then(|i| self.data.get(i)).copied();
                send(
                    &mut self.ch,
                    tag,
                    (lun, op, off, len, &geo),
                    b,
                    self.bufs.slot(tag),
                )
            }
        };
        if sent.is_err() {
            self.stage.cancel(tag);
        }
        sent
    }

    /// Sends the commands that waited for room in the area, as far as there is room (posted now:
    /// the front end may sleep next); one that cannot be sent completes with its errno. A
    /// reservation that gets its span goes to [`Path::granted`].
    fn start_waiting(&mut self, done: &mut dyn FnMut(Done, &TagBufs)) {
        let mut started = false;
        while let Some(w) = self.stage.next_waiter() {
            if let Waiter::Start { r, .. } = w {
                match self.start(r) {
                    Ok(()) => started = true,
                    Err(errno) => done(Done::failed(r.tag, errno), &self.bufs),
                }
            }
        }
        if started {
            self.ch.flush();
        }
    }

    /// Fails every command waiting for room with `errno` (reservations wait on: see
    /// [`Staging::take_waiting`]).
    fn fail_waiting(&mut self, errno: i32, done: &mut dyn FnMut(Done, &TagBufs)) {
        for w in self.stage.take_waiting() {
            done(Done::failed(w.tag, errno), &self.bufs);
        }
    }

    /// Asks for a notification at the next completion; returns the fd that becomes readable.
    pub fn arm(&mut self) -> Option<RawFd> {
        let _ = self.ch.arm();
        self.ch.transport().notify_fd()
    }

    /// Whether a SEND completion should wake the front end too ([`Channel::wants_send_completions`]):
    /// one whose CQ poll is still out arms again.
    pub fn wants_send_completions(&self) -> bool {
        self.ch.wants_send_completions()
    }

    /// Consumes the completion notification (after [`Path::arm`]'s fd became readable).
    pub fn ack(&mut self) {
        let _ = self.ch.transport().ack_notify();
    }

    /// The connection manager's fd while the channel is up (readable: a disconnect or a device
    /// removal to read with [`Path::drain_cm`]).
    pub fn cm_fd(&mut self) -> Option<RawFd> {
        if !self.rport.is_up() {
            return None;
        }
        self.ch.transport().cm_fd()
    }

    /// Reads and logs the connection manager's events.
    pub fn drain_cm(&mut self) {
        while let Some(ev) = self.ch.transport().poll_cm() {
            tracing::warn!("{}: connection event {ev}", self.name);
        }
    }

    /// Handles what completed (each finished command goes to `done` with the buffers) and, while
    /// the channel is down, the down steps: hold, reconnect, re-issue, fast_io_fail, dev_loss,
    /// device removal. Returns how many completions it handled and what the front end must act on.
    pub fn service(
        &mut self,
        now: Instant,
        done: &mut dyn FnMut(Done, &TagBufs),
    ) -> (usize, Option<Event>) {
        // what the front end submitted since the last pass goes as one chain
        self.ch.flush();
        let n = self.complete(done);
        self.drop_retired();
        if let Some(m) = &mut self.session {
            let epoch = m.link.epoch();
            if epoch != m.epoch {
                m.epoch = epoch;
                if self.ch.down().is_none() {
                    self.ch.declare_down(DownReason::Session);
                }
            }
        }
        if self.ch.down().is_none() {
            return (n, None);
        }
        if self.rport.is_up() {
            // what was armed on this login's fds belongs to the old login from now on
            self.gen = self.gen.wrapping_add(1);
            if self.ch.down() != Some(&DownReason::Session) {
                if let Some(m) = &mut self.session {
                    m.epoch = m.link.fail(m.qid);
                }
            }
        }
        let event = self.on_down(now, done);
        // what a new login answered at once
        let n = n + if self.rport.is_up() {
            self.complete(done)
        } else {
            0
        };
        (n, event)
    }

    /// Polls the channel until nothing more completes.
    fn complete(&mut self, done: &mut dyn FnMut(Done, &TagBufs)) -> usize {
        let mut total = 0;
        let mut finish = finishing(&mut self.stage, &mut self.bufs, &mut *done);
        loop {
            let n = self.ch.process(&mut finish);
            if n == 0 {
                break;
            }
            total += n;
        }
        drop(finish);
        if total > 0 {
            self.start_waiting(done);
        }
        total
    }

    /// The first step after the channel went down: stop it (nothing it does may reach the
    /// buffers once commands are re-issued or failed) and hold I/O.
    fn went_down(&mut self, now: Instant) -> crate::session::rport::DownStep {
        let step = self.rport.down_step(now);
        if step.went_down {
            let why = self
                .ch
                .down()
                .map_or(String::new(), |d| crate::Chain(d).to_string());
            self.ch.transport().stop();
            self.ch.set_hold(true);
            tracing::warn!(
                "{}: channel down ({why}); holding I/O, {}",
                self.name,
                self.rport.timers.down_plan()
            );
        }
        step
    }

    fn on_down(&mut self, now: Instant, done: &mut dyn FnMut(Done, &TagBufs)) -> Option<Event> {
        let step = self.went_down(now);
        let mut event = None;
        // the device under the channel is going away: let go of what is ours on it at once, the
        // registrations first (the login's CM id may be what keeps the device's context open)
        if self.ch.transport().removing() {
            self.reg = None;
            self.loan_released();
        }
        if self.ch.transport().release_if_removed() {
            let since = SystemTime::now()
                .checked_sub(step.down_for)
                .unwrap_or_else(SystemTime::now);
            event = Some(Event::Removed { since });
        }
        if step.fail_held || step.lost {
            let how = if step.lost {
                "dev_loss_tmo expired: failing I/O for good"
            } else {
                "fast_io_fail_tmo expired: failing I/O"
            };
            tracing::warn!("{}: {how} (down for {:.1?})", self.name, step.down_for);
            self.fail_held(done);
        }
        if step.lost {
            return Some(Event::Lost);
        }
        if step.try_now {
            self.reconnect(now, done);
        }
        event
    }

    /// One reconnect attempt: log in again, register the buffers on the new login and re-issue
    /// what was held, or try again after reconnect_delay.
    fn reconnect(&mut self, now: Instant, done: &mut dyn FnMut(Done, &TagBufs)) {
        let t = self.rport.timers;
        if let Some(m) = &self.session {
            if !m.link.may_log_in(m.qid, m.epoch) {
                // queue 0 logs in first in this epoch; this queue looks again at its next tick,
                // or when queue 0 wakes it, without counting an attempt
                return;
            }
        }
        let fresh = match self.connect.connect(self.ch.transport()) {
            Ok(mut f) => {
                // the registration serves the new login when it is on the same device
                let bufs = if self.reg.as_ref().is_some_and(|r| f.t.adopt(r)) {
                    Ok(None)
                } else {
                    f.t.register(&self.bufs.lent()).map(Some)
                };
                match bufs.and_then(|b| Ok((b, self.loan_for(&mut f.t)?))) {
                    Ok((b, l)) => Ok((f, b, l)),
                    Err(e) => Err(ReconnectError::<C::Error>::Register(e)),
                }
            }
            Err(e) => Err(ReconnectError::Login(e)),
        };
        let (f, fresh_reg, fresh_loan) = match fresh {
            Ok(x) => x,
            Err(e) => {
                self.rport.retry_later(now);
                tracing::warn!(
                    "{}: reconnect failed ({}); {}",
                    self.name,
                    crate::Chain(&e),
                    t.next_attempt()
                );
                return;
            }
        };
        let (stage, area) = (&self.stage, self.bufs.area_region());
        let (own, data) = (
            &self.data,
            fresh_reg.as_ref().map_or(&self.data, |(_, d)| d),
        );
        let loan_keys = self.loan_rekeys(&fresh_loan);
        let old = self.ch.reconnect(f.t, f.req_lim, f.max_imm, &mut |tag, b| {
            if let Some(&(_, n)) = loan_keys.iter().find(|(old, _)| *old == b.lkey) {
                return DataBuf {
                    lkey: n.lkey,
                    rkey: n.rkey,
                    ..b
                };
            }
            // lent memory the new login adopted keeps its keys: only the path's own buffers
            // take their region's keys of the new login
            if !own.iter().any(|d| d.lkey == b.lkey) {
                return b;
            }
            match stage.region(tag, area).and_then(|i| data.get(i)) {
                Some(n) => DataBuf {
                    lkey: n.lkey,
                    rkey: n.rkey,
                    ..b
                },
                // a command without data (a pool's FLUSH)
                None => b,
            }
        });
        // the old login is stopped: nothing of it reaches the buffers any more
        drop(old);
        if let Some((reg, data)) = fresh_reg {
            // an old registration (another device's) goes after the login that used it
            self.reg = Some(reg);
            self.data = data;
        }
        self.loan_registered(fresh_loan);
        self.ch.set_hold(false);
        let held = usize::from(self.ch.busy());
        let now_ms = self.base_ms + now.saturating_duration_since(self.base).as_millis() as u64;
        let mut finish = finishing(&mut self.stage, &mut self.bufs, &mut *done);
        let failed = self.ch.resume(now_ms, t.reissue_limit(), &mut finish);
        drop(finish);
        let down = self.rport.reconnected(now);
        self.reconnects += 1;
        if let Some(m) = &self.session {
            m.link.logged_in(m.qid, m.epoch);
        }
        tracing::warn!(
            "{}: reconnected after {down:.1?}; {} command(s) re-issued",
            self.name,
            held - failed
        );
        self.start_waiting(done);
    }

    /// Stops holding and fails every unfinished command with EIO, those waiting for a staging
    /// buffer too (taken out first, so that no buffer the failures give back starts one).
    fn fail_held(&mut self, done: &mut dyn FnMut(Done, &TagBufs)) {
        self.fail_waiting(libc::EIO, done);
        self.ch.set_hold(false);
        let mut finish = finishing(&mut self.stage, &mut self.bufs, &mut *done);
        self.ch.fail_all(libc::EIO, &mut finish);
        drop(finish);
        // pool writes still waiting for room get it from what just failed
        self.start_waiting(done);
    }

    /// Ends the path: a channel that is up logs out (what it had in flight finishes first, as far
    /// as `done` is concerned); one that is down fails what it holds.
    pub fn close(&mut self, done: &mut dyn FnMut(Done, &TagBufs)) {
        for tag in self.stage.drop_reservations() {
            done(Done::failed(tag, libc::EIO), &self.bufs);
        }
        if self.rport.is_up() && self.ch.down().is_none() {
            // nothing new goes out after the logout
            self.fail_waiting(libc::EIO, done);
            self.ch.send_i_logout();
            self.complete(done);
        } else {
            self.fail_held(done);
        }
    }
}

/// How long a path whose channel is down waits between looks at its timers.
pub const DOWN_TICK: Duration = Duration::from_millis(50);

/// `done` for what the channel finishes: each command gives its span back (a staged read's data
/// copied out of it first) before the front end sees it.
fn finishing<'a>(
    stage: &'a mut Staging,
    bufs: &'a mut TagBufs,
    done: &'a mut dyn FnMut(Done, &TagBufs),
) -> impl FnMut(Done) + 'a {
    move |d| {
        stage.finish(&d, bufs);
        done(d, bufs)
    }
}

/// Sends `op` from `buf` (with `scratch`, the memory `buf` describes, for what the CPU writes:
/// UNMAP parameters, WRITE SAME's block, a zero write's zeros); a FLUSH needs neither.
fn send<T: Transport>(
    ch: &mut Channel<T>,
    tag: u16,
    (lun, op, off, len, geo): (ScsiLun, BlockOp, u64, u32, &Geometry),
    buf: Option<DataBuf>,
    scratch: &mut [u8],
) -> Result<(), i32> {
    let buf = match (buf, op) {
        (Some(b), _) => b,
        (None, BlockOp::Flush) => DataBuf::default(),
        (None, _) => return Err(libc::EINVAL),
    };
    let cmd = to_scsi(lun, op, off, len, geo, buf, scratch)?;
    ch.submit(tag, cmd).map_err(|e| {
        tracing::warn!("tag {tag}: the channel refused the command ({e}): EIO");
        libc::EIO
    })
}

/// The buffers' descriptors before a login registered them (keys 0): a channel that starts down
/// holds commands on these, and its first login re-keys them.
fn unregistered(bufs: &TagBufs) -> Vec<DataBuf> {
    bufs.region_spans()
        .map(|(addr, len)| DataBuf {
            addr,
            len,
            lkey: 0,
            rkey: 0,
        })
        .collect()
}
