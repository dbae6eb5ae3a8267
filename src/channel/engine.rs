//! The channel engine: turns [`ScsiCmd`]s into SRP_CMDs, keeps the credit count (`req_lim`) exactly as
//! SRP r16a says, and turns SRP_RSPs back into [`Done`]s.
//!
//! - Tags: one per front-end tag (`0..depth`: a path's slots, possibly more than the login's
//!   `send_depth`). The SRP tag on the wire is `gen << 16 | tag`, where `gen` changes on every
//!   send, so a late response to an earlier use of a tag is recognised and dropped.
//! - Send slots: a command takes any free one of `2 x send_depth` slots and gives it back at its SEND
//!   completion; `extra_slots` more carry CRED_RSP / AER_RSP / I_LOGOUT (which cost no credit) and
//!   task management. A command completes at its SRP_RSP, as ib_srp's do: the target answered, so
//!   it had the whole SEND (and any immediate data), and the SEND's completion, which on rxe often
//!   comes after the response, only frees the slot. The spare `send_depth` slots let a tag go out again
//!   before its last SEND is reaped; the front end asks for a wake-up on send completions only when
//!   something waits for a slot ([`Channel::wants_send_completions`]).
//! - Selective signalling: one command SEND in [`ChannelConfig::signal_every`] asks for a
//!   completion, which gives back its slot and every slot posted before it (`slots.rs`). Extra
//!   slots are always signalled, and so is a command sent with nothing else outstanding, whose SEND
//!   completion is the queue's early wake-up (`send_cmd`).
//! - Credits: start from LOGIN_RSP; every SRP_RSP, CRED_REQ and AER_REQ adds its delta; every
//!   SRP_CMD takes one; one is always kept back for task management (as ib_srp does). A command with
//!   no credit waits in a FIFO (counted as a stall) and goes when credits return.
//! - Time: the front end hands the engine a millisecond clock ([`Channel::set_clock`] as a batch of
//!   commands starts, [`Channel::tick`] every loop). A command out for [`CMD_TIMEOUT_MS`] is aborted
//!   (SRP_TSK_MGMT ABORT TASK, on an extra slot with the credit kept back) and sent again with a new tag
//!   generation; a task management request failed or unanswered for [`TMF_TIMEOUT_MS`] escalates:
//!   ABORT TASK -> LOGICAL UNIT RESET of the command's LUN (nothing new is sent to that LUN
//!   meanwhile; each command names its own, [`ScsiCmd::lun`]) -> the channel goes down and the front
//!   end reconnects (ib_srp's eh_abort -> eh_device_reset -> eh_host_reset). Commands outstanding
//!   and no work completion of any kind for [`STALL_MS`]: down as well (a backstop).
//! - BUSY, TASK SET FULL and "becoming ready" are retried after 5, 10, 20 ... ms (at most 1 s apart)
//!   until [`CMD_TIMEOUT_MS`] after the command was first submitted; other retryable conditions
//!   (unit attentions) at once, at most `max_retries` times.
//! - Nothing here allocates after construction.

use super::{
    DataBuf, DataDir, RemoteAccess, ScsiCmd, Transport, TransportCause, TransportError, Wc, WcKind,
    WcStatus,
};
use crate::wire::scsi::sense::errno;
use crate::wire::scsi::{classify, Action, Refresh, ScsiStatus, Sense};
use crate::wire::srp::{
    parse_target_iu, DataDesc, DirectBuf, RspFlags, ScsiLun, SrpCmd, TLogoutReason, TagOnly,
    TargetIu, TskMgmt, TskMgmtFunc, TSK_MGMT_COMPLETE,
};
use crate::wire::WireError;
use std::collections::VecDeque;

pub use config::{send_slots, ChannelConfig, ReissueLimit};
pub use outcome::{
    ChannelStats, CmdOutcome, Done, DownReason, PortDown, SubmitError, Timeout, TmfAnswer,
};

#[derive(Clone, Copy, Debug)]
struct RspInfo {
    status: u8,
    sense: Option<Sense>,
    resid: u32,
    /// Task management response code (response data byte 3), when RSPVALID.
    tmf_code: Option<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum TagState {
    Idle,
    /// Waiting for a credit (or for a LOGICAL UNIT RESET to finish).
    Waiting,
    /// Waiting to be retried at `until` (ms; BUSY, TASK SET FULL, becoming ready).
    Delayed {
        until: u64,
    },
    /// Sent; completes (or is retried) when its response is in.
    InFlight,
}

#[derive(Clone, Copy, Debug)]
struct TagEntry {
    state: TagState,
    gen: u16,
    retries: u8,
    cmd: ScsiCmd,
    /// The send slot of its last SEND while that SEND's completion is not in.
    slot: Option<u16>,
    /// Whether that SEND was signalled (only then does a missing completion mean it never went).
    signalled: bool,
    /// When the command was submitted (ms), for the retry budget.
    submitted: u64,
    /// When it was last sent (ms), for its timeout.
    sent: u64,
    /// When the channel first went down under it (ms), for [`ReissueLimit::max_held_ms`].
    held_since: Option<u64>,
    /// Times it was carried to a new login.
    reissued: u8,
    /// Its place in the order commands were submitted: a new login re-issues in this order.
    seq: u64,
}

/// A command out this long is aborted (the SCSI layer's default command timeout).
pub const CMD_TIMEOUT_MS: u64 = 30_000;
/// A task management request failed or unanswered this long escalates.
pub const TMF_TIMEOUT_MS: u64 = 5_000;
/// Commands outstanding and no work completion at all for this long: the channel is taken down (a
/// backstop: SENDs that never complete leave commands waiting for a slot, or a task management
/// request stuck the same way).
pub const STALL_MS: u64 = CMD_TIMEOUT_MS + 2 * TMF_TIMEOUT_MS;
/// Commands outstanding and no work completion for this long: the local port's state is read,
/// and a port that is down takes the channel down (fast_io_fail then counts from the link loss,
/// not from a command timeout).
pub const LINK_CHECK_MS: u64 = 2_000;
/// How often the timeouts are checked.
const SCAN_MS: u64 = 1_000;
/// SRP tags of task management requests: above every command tag (`gen << 16 | tag` < 2^32).
const TMF_TAG: u64 = 1 << 40;

/// The one task management request a channel may have out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tmf {
    func: TskMgmtFunc,
    /// The logical unit it acts on.
    lun: ScsiLun,
    /// Its SRP tag.
    srp_tag: u64,
    /// For ABORT TASK: the command's tag and the generation it was sent with.
    target: Option<(u16, u16)>,
    sent: u64,
}

/// One SRP channel's engine over a transport `T`.
pub struct Channel<T: Transport> {
    t: T,
    cfg: ChannelConfig,
    req_lim: i32,
    tags: Vec<TagEntry>,
    waiting: VecDeque<u16>,
    /// The command send slots (`0..2 x send_depth`).
    slots: slots::SendSlots,
    /// The tag last sent with nothing else outstanding (its SEND completion is an early wake-up).
    lone: Option<u16>,
    extra_free: Vec<u16>,
    /// CRED_RSP / AER_RSP / I_LOGOUT waiting for an extra slot (a burst of target requests).
    small_pending: VecDeque<[u8; 16]>,
    busy: u16,
    /// Commands sent and not answered: at most `send_depth`, what the login's receive ring and
    /// send queue were sized for, however many tags the channel holds and credits it has.
    on_wire: u16,
    down: Option<DownReason>,
    /// While down, new commands wait (for a reconnect) instead of being refused.
    hold: bool,
    wcs: Vec<Wc>,
    stats: ChannelStats,
    /// The front end's clock (ms).
    now: u64,
    /// When [`Channel::tick`] next has work (a timeout scan or a delayed retry).
    next_due: u64,
    /// When a work completion last arrived (or the channel last went from idle to busy).
    last_wc: u64,
    /// The next command's [`TagEntry::seq`].
    next_seq: u64,
    /// The task management request out; a LOGICAL UNIT RESET holds its LUN (`paused`).
    tmf: Option<Tmf>,
    tmf_seq: u16,
    /// The log lines a target can trigger at will (AER_REQ, CRED/AER answers dropped).
    noisy: crate::ratelimit::RateLimit,
    /// Each tag's data segments ([`Channel::submit_segments`]).
    segs: segments::Segments,
}

/// The most credits (`req_lim`) the engine counts: far beyond any target's queue.
const MAX_REQ_LIM: i32 = 1 << 20;

const POLL_BATCH: usize = 32;
/// CRED_RSP / AER_RSP / I_LOGOUT that may wait for an extra send slot.
const SMALL_PENDING_MAX: usize = 64;

impl<T: Transport> Channel<T> {
    /// A channel over a connected transport whose receives are already posted.
    pub fn new(mut t: T, cfg: ChannelConfig) -> Self {
        let max_segs = segments::max_for(&mut t, &cfg);
        let idle = TagEntry {
            state: TagState::Idle,
            gen: 0,
            retries: 0,
            cmd: ScsiCmd {
                lun: ScsiLun::default(),
                cdb: crate::wire::scsi::Cdb::test_unit_ready(),
                data: DataDir::None,
            },
            slot: None,
            signalled: false,
            submitted: 0,
            sent: 0,
            held_since: None,
            reissued: 0,
            seq: 0,
        };
        Channel {
            t,
            req_lim: cfg.req_lim,
            tags: vec![idle; usize::from(cfg.depth)],
            waiting: VecDeque::with_capacity(usize::from(cfg.depth)),
            slots: slots::SendSlots::new(cfg.cmd_slots(), cfg.signal_every()),
            lone: None,
            extra_free: (cfg.cmd_slots()..cfg.send_slots()).rev().collect(),
            small_pending: VecDeque::with_capacity(SMALL_PENDING_MAX),
            busy: 0,
            on_wire: 0,
            down: None,
            hold: false,
            wcs: vec![
                Wc {
                    kind: WcKind::Send,
                    id: 0,
                    len: 0,
                    status: WcStatus::Ok
                };
                POLL_BATCH
            ],
            stats: ChannelStats {
                min_req_lim: cfg.req_lim,
                ..Default::default()
            },
            cfg,
            now: 0,
            next_due: 0,
            last_wc: 0,
            next_seq: 0,
            tmf: None,
            tmf_seq: 0,
            noisy: crate::ratelimit::RateLimit::new(std::time::Duration::from_secs(10)),
            segs: segments::Segments::new(cfg.depth, max_segs),
        }
    }

    /// The transport (to arm it, or reach its file descriptor).
    pub(crate) fn transport(&mut self) -> &mut T {
        &mut self.t
    }

    /// The transport, for tests and fuzzing outside the crate over the fake target (the
    /// `test-utils` feature; front ends use what `path` offers).
    #[cfg(feature = "test-utils")]
    pub fn test_transport(&mut self) -> &mut T {
        &mut self.t
    }

    /// Consumes the channel, returning the transport (for teardown).
    pub(crate) fn into_transport(self) -> T {
        self.t
    }

    /// Commands not yet completed (waiting for credit or in flight).
    pub fn busy(&self) -> u16 {
        self.busy
    }

    /// Current credits.
    pub fn req_lim(&self) -> i32 {
        self.req_lim
    }

    /// Counters.
    pub fn stats(&self) -> ChannelStats {
        self.stats
    }

    /// Why the channel is down, if it is.
    pub fn down(&self) -> Option<&DownReason> {
        self.down.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &ChannelConfig {
        &self.cfg
    }

    /// Queues `cmd` under `tag`; it is sent at once if a credit is free. While the channel is down
    /// it is refused, or, with [`Channel::set_hold`], kept for the reconnect.
    pub fn submit(&mut self, tag: u16, cmd: ScsiCmd) -> Result<(), SubmitError> {
        if let (Some(d), false) = (&self.down, self.hold) {
            return Err(SubmitError::Down(d.clone()));
        }
        let e = self
            .tags
            .get_mut(usize::from(tag))
            .ok_or(SubmitError::BadTag(tag))?;
        if e.state != TagState::Idle {
            return Err(SubmitError::Busy(tag));
        }
        e.cmd = cmd;
        e.retries = 0;
        e.submitted = self.now;
        e.reissued = 0;
        e.seq = self.next_seq;
        self.next_seq += 1;
        e.held_since = self.down.is_some().then_some(self.now);
        if self.busy == 0 {
            self.last_wc = self.now;
        }
        self.busy += 1;
        self.start(tag);
        Ok(())
    }

    /// Sends `tag` now if a credit allows, else puts it in the waiting FIFO.
    fn start(&mut self, tag: u16) {
        // keep one credit for task management, as ib_srp does
        if self.can_send()
            && self.waiting.is_empty()
            && self.down.is_none()
            && self.paused().is_none()
        {
            if let Err(e) = self.send_cmd(tag) {
                self.set_down(DownReason::Transport(e));
                self.set_state(tag, TagState::Waiting);
                self.waiting.push_back(tag);
            }
        } else {
            self.set_state(tag, TagState::Waiting);
            self.waiting.push_back(tag);
            if self.paused().is_some() && self.down.is_none() {
                // another LUN's command goes past the reset's held ones
                self.drain_waiting();
            }
            // a stall is a wait for the target (credit) or for our send slots; a command held while
            // the channel is down or its LUN is being reset is neither
            let e = &self.tags[usize::from(tag)];
            if self.down.is_none() && e.state == TagState::Waiting && !self.held(tag) {
                if self.req_lim > 1 && !self.sends_free() {
                    self.stats.slot_stalls += 1;
                } else {
                    self.stats.credit_stalls += 1;
                }
            }
        }
    }

    /// The logical unit a LOGICAL UNIT RESET is out for: nothing new is sent to it until the
    /// reset ends (the channel's other LUNs carry on).
    fn paused(&self) -> Option<ScsiLun> {
        self.tmf
            .filter(|t| t.func == TskMgmtFunc::LunReset)
            .map(|t| t.lun)
    }

    /// Whether `tag`'s command waits for a LOGICAL UNIT RESET of its LUN to end.
    fn held(&self, tag: u16) -> bool {
        self.paused()
            .is_some_and(|lun| self.tags[usize::from(tag)].cmd.lun == lun)
    }

    /// Whether the front end should be woken by a SEND completion ([`Post::arm`](super::Post::arm)): when
    /// something waits for a free slot, and while a lone command's SEND is out (the early wake-up,
    /// see `send_cmd`). Otherwise the next pass reaps them.
    pub fn wants_send_completions(&self) -> bool {
        (!self.slots.any_free() && !self.waiting.is_empty())
            || !self.small_pending.is_empty()
            || self.lone.is_some_and(|t| {
                let e = &self.tags[usize::from(t)];
                e.state == TagState::InFlight && e.slot.is_some()
            })
    }

    /// Asks the transport for a wake-up at the next response (and at the next SEND completion when
    /// [`Channel::wants_send_completions`]).
    pub fn arm(&mut self) -> Result<(), TransportError> {
        let sends = self.wants_send_completions();
        self.t.arm(sends)
    }

    /// Sends `tag`'s command on a free slot ([`Channel::can_send`] said there is one).
    ///
    /// A command sent alone (nothing else outstanding: QD1) is signalled and its SEND completion
    /// wakes the queue: measured in the lab, the thread woken early is running when the response
    /// lands, and QD1 IOPS were 10-15% lower without it (docs/bench/performance-record.md). With more in
    /// flight, completions keep the queue awake and SENDs neither signal nor wake it.
    fn send_cmd(&mut self, tag: u16) -> Result<(), TransportError> {
        let idx = usize::from(tag);
        let Some((slot, every)) = self.slots.next() else {
            return Err(TransportError {
                op: "send SRP_CMD",
                cause: TransportCause::NoSendSlot,
            });
        };
        let e = &mut self.tags[idx];
        e.gen = e.gen.wrapping_add(1);
        let srp_tag = (u64::from(e.gen) << 16) | u64::from(tag);
        let (lun, cdb, data) = (e.cmd.lun, e.cmd.cdb, e.cmd.data);
        // the target reaches the buffer through this command's window only (immediate data is
        // gathered locally: nothing to open)
        let mut direct = |b: DataBuf, access| {
            let w = self.t.open_window(tag, 0, b, access)?;
            Ok::<_, TransportError>(DataDesc::Direct(DirectBuf {
                va: w.addr,
                key: w.rkey,
                len: w.len,
            }))
        };
        let (data_out, data_in, imm) = match data {
            DataDir::None => (DataDesc::None, DataDesc::None, None),
            DataDir::In(b) => (DataDesc::None, direct(b, RemoteAccess::Write)?, None),
            DataDir::Out(b) if b.len > 0 && b.len <= self.cfg.max_imm => {
                (DataDesc::Immediate { len: b.len }, DataDesc::None, Some(b))
            }
            DataDir::Out(b) => (direct(b, RemoteAccess::Read)?, DataDesc::None, None),
            DataDir::InSegments(len) => {
                let d =
                    segments::describe(&mut self.segs, &mut self.t, tag, RemoteAccess::Write, len)?;
                (DataDesc::None, d, None)
            }
            DataDir::OutSegments(len) => {
                let d =
                    segments::describe(&mut self.segs, &mut self.t, tag, RemoteAccess::Read, len)?;
                (d, DataDesc::None, None)
            }
        };
        let cmd = SrpCmd::new(srp_tag, lun, cdb.as_slice())
            .data_out(data_out)
            .data_in(data_in);
        let n = cmd
            .encode(self.t.send_buf(slot), self.cfg.imm_data_offset)
            .map_err(|e| TransportError {
                op: "encode SRP_CMD",
                cause: TransportCause::Encode(e),
            })?;
        let lone = self.busy == 1;
        let signal = every || lone;
        self.t.post_send(slot, n, imm, signal)?;
        self.slots.posted(tag, signal);
        self.lone = lone.then_some(tag);
        self.take_credit();
        self.stats.cmds += 1;
        self.set_state(tag, TagState::InFlight);
        let e = &mut self.tags[idx];
        e.sent = self.now;
        (e.slot, e.signalled) = (Some(slot), signal);
        Ok(())
    }

    /// Sends a 16-byte credit-free IU (CRED_RSP, AER_RSP, I_LOGOUT) on an extra slot, or queues it
    /// until one frees (every CRED_REQ must be answered: an initiator that drops them stalls).
    fn send_small(&mut self, iu: [u8; 16]) {
        let Some(slot) = self.extra_free.pop() else {
            if self.small_pending.len() < SMALL_PENDING_MAX {
                self.small_pending.push_back(iu);
            } else {
                // the target keeps asking faster than any send completes: drop, as ib_srp does
                self.stats.dropped_small += 1;
                if let Some(n) = self.noisy.allow(std::time::Instant::now()) {
                    tracing::warn!(
                        "no send slot for a CRED/AER response; dropped ({n} more target requests \
                         left out of the log since the last line)"
                    );
                }
            }
            return;
        };
        self.post_extra(slot, &iu);
    }

    /// Posts `iu` on extra send slot `slot`; if that fails, gives the slot back and takes the
    /// channel down. Returns whether it went.
    fn post_extra(&mut self, slot: u16, iu: &[u8]) -> bool {
        self.t.send_buf(slot)[..iu.len()].copy_from_slice(iu);
        if let Err(e) = self.t.post_send(slot, iu.len(), None, true) {
            self.extra_free.push(slot);
            self.set_down(DownReason::Transport(e));
            return false;
        }
        true
    }

    /// Sends SRP_I_LOGOUT (the target may ignore it; LIO does). Costs no credit.
    pub fn send_i_logout(&mut self) {
        self.send_small(TagOnly::i_logout(0).encode());
        self.flush();
    }

    fn set_down(&mut self, reason: DownReason) {
        if self.down.is_none() {
            tracing::warn!("SRP channel down: {}", crate::Chain(&reason));
            self.down = Some(reason);
            let now = self.now;
            for e in self.tags.iter_mut().filter(|e| e.state != TagState::Idle) {
                e.held_since.get_or_insert(now);
            }
        }
    }

    /// Polls one batch of completions and handles them, calling `done` for every finished command.
    /// Returns how many work completions were processed (0: nothing was ready).
    pub fn process(&mut self, done: &mut dyn FnMut(Done)) -> usize {
        let mut wcs = std::mem::take(&mut self.wcs);
        let n = match self.t.poll(&mut wcs) {
            Ok(n) => n,
            Err(e) => {
                self.set_down(DownReason::Transport(e));
                0
            }
        };
        if n > 0 {
            self.last_wc = self.now;
        }
        for wc in &wcs[..n] {
            match wc.kind {
                WcKind::Send => self.on_send(wc),
                WcKind::Recv => self.on_recv(wc, done),
                // a bind or invalidation that failed: the QP is in the error state
                WcKind::Window if wc.status != WcStatus::Ok => {
                    self.set_down(DownReason::Completion {
                        kind: wc.kind,
                        status: wc.status,
                    })
                }
                WcKind::Window => {}
            }
        }
        self.wcs = wcs;
        if self.down.is_none() {
            self.drain_waiting();
        }
        self.flush();
        n
    }

    /// Posts what this pass queued (commands, CRED/AER answers, task management) as one chain:
    /// the front end calls it after a batch of [`Channel::submit`]s; the channel's own passes
    /// ([`Channel::process`], [`Channel::tick`], a reconnect's re-issue) call it themselves.
    pub fn flush(&mut self) {
        if let Err(e) = self.t.flush_sends() {
            self.set_down(DownReason::Transport(e));
        }
    }

    /// Sends waiting commands, in order, while credits and slots allow; a command whose LUN is
    /// being reset stays, in its place.
    fn drain_waiting(&mut self) {
        let mut i = 0;
        while self.can_send() && i < self.waiting.len() {
            let tag = self.waiting[i];
            if self.held(tag) {
                i += 1;
                continue;
            }
            self.waiting.remove(i);
            if let Err(e) = self.send_cmd(tag) {
                self.waiting.insert(i, tag);
                self.set_down(DownReason::Transport(e));
                break;
            }
        }
    }

    fn on_send(&mut self, wc: &Wc) {
        if wc.status != WcStatus::Ok {
            self.set_down(DownReason::Completion {
                kind: WcKind::Send,
                status: wc.status,
            });
        }
        if wc.id >= self.cfg.cmd_slots() {
            self.extra_free.push(wc.id);
            if let Some(iu) = self.small_pending.pop_front() {
                self.send_small(iu);
            }
            return;
        }
        let tags = &mut self.tags;
        self.slots.reap(wc.id, &mut |tag, slot| {
            let e = &mut tags[usize::from(tag)];
            if e.slot == Some(slot) {
                e.slot = None;
            }
        });
    }

    fn on_recv(&mut self, wc: &Wc, done: &mut dyn FnMut(Done)) {
        if wc.status != WcStatus::Ok {
            // flushed receives after a disconnect are expected; anything else is a failure
            self.set_down(DownReason::Completion {
                kind: WcKind::Recv,
                status: wc.status,
            });
            return;
        }
        let buf = self.t.recv_buf(wc.id);
        let iu = &buf[..buf.len().min(wc.len as usize)];
        // copy out what is needed: the buffer is reposted before acting on it
        let action = match parse_target_iu(iu) {
            Ok(TargetIu::Rsp(r)) => {
                let resid = if r.flags.has(RspFlags::DIUNDER) {
                    r.data_in_res_cnt
                } else if r.flags.has(RspFlags::DOUNDER) {
                    r.data_out_res_cnt
                } else {
                    0
                };
                let sense = if r.sense.is_empty() {
                    None
                } else {
                    Sense::parse(r.sense).ok()
                };
                Recv::Rsp(
                    r.tag,
                    r.req_lim_delta,
                    RspInfo {
                        status: r.status,
                        sense,
                        resid,
                        tmf_code: r.tsk_mgmt_status(),
                    },
                )
            }
            Ok(TargetIu::CredReq(c)) => Recv::Cred(c.tag, c.req_lim_delta),
            Ok(TargetIu::AerReq(a)) => {
                Recv::Aer(a.tag, a.req_lim_delta, Sense::parse(a.sense).ok())
            }
            Ok(TargetIu::TLogout(l)) => Recv::Logout(l.reason),
            Err(e) => Recv::Bad(e),
        };
        if let Err(e) = self.t.post_recv(wc.id) {
            self.set_down(DownReason::Transport(e));
        }
        match action {
            Recv::Rsp(srp_tag, delta, info) => {
                self.add_credits(delta);
                self.on_rsp(srp_tag, info, done);
            }
            Recv::Cred(tag, delta) => {
                self.stats.cred_reqs += 1;
                self.add_credits(delta);
                self.send_small(TagOnly::cred_rsp(tag).encode());
            }
            Recv::Aer(tag, delta, sense) => {
                self.stats.aer_reqs += 1;
                self.add_credits(delta);
                if let Some(n) = self.noisy.allow(std::time::Instant::now()) {
                    tracing::info!(
                        "asynchronous event from the target: {sense:?} ({n} more target requests \
                         left out of the log since the last line)"
                    );
                }
                self.send_small(TagOnly::aer_rsp(tag).encode());
            }
            Recv::Logout(reason) => self.set_down(DownReason::TargetLogout(reason)),
            Recv::Bad(e) => {
                self.stats.malformed += 1;
                self.set_down(DownReason::Malformed(e));
            }
        }
    }

    fn on_rsp(&mut self, srp_tag: u64, info: RspInfo, done: &mut dyn FnMut(Done)) {
        if srp_tag & TMF_TAG != 0 {
            return self.on_tmf_rsp(srp_tag, info);
        }
        let tag = (srp_tag & 0xffff) as u16;
        let gen = ((srp_tag >> 16) & 0xffff) as u16;
        let valid = srp_tag >> 32 == 0 && tag < self.cfg.depth;
        let e = match self.tags.get_mut(usize::from(tag)) {
            Some(e) if valid && e.gen == gen => e,
            _ => return self.unexpected(srp_tag),
        };
        match e.state {
            TagState::InFlight => self.finish(tag, info, done),
            _ => self.unexpected(srp_tag),
        }
    }

    /// A response for a tag with nothing outstanding (wrong, stale, or a second answer): ignored,
    /// counted, and logged at most once every 10 s.
    pub(super) fn unexpected(&mut self, srp_tag: u64) {
        self.stats.unexpected_rsp += 1;
        if let Some(n) = self.noisy.allow(std::time::Instant::now()) {
            tracing::warn!(
                "the target answered tag {srp_tag:#x}, which has no command outstanding: ignored \
                 ({n} more target requests left out of the log since the last line; {} such \
                 answers on this channel)",
                self.stats.unexpected_rsp
            );
        }
    }

    /// The response is in: complete, or retry.
    fn finish(&mut self, tag: u16, info: RspInfo, done: &mut dyn FnMut(Done)) {
        if info.status == 0 && info.sense.is_none() {
            // GOOD without sense, nearly every response: nothing to classify
            let outcome = CmdOutcome {
                status: ScsiStatus::Good,
                sense: None,
                resid: info.resid,
                errno: 0,
            };
            return self.complete(tag, outcome, done);
        }
        let idx = usize::from(tag);
        let status = ScsiStatus::from(info.status);
        let d = classify(status, info.sense.as_ref());
        let e = &mut self.tags[idx];
        if d.action == Action::RetryAfterDelay && self.down.is_none() {
            // 5, 10, 20 ... ms, at most 1 s apart, while the command is younger than its timeout
            let delay = (5u64 << e.retries.min(8)).min(1000);
            if self.now + delay < e.submitted + CMD_TIMEOUT_MS {
                // the target is done with the buffer until the retry opens it again
                self.t.close_window(tag);
                let e = &mut self.tags[idx];
                e.retries = e.retries.saturating_add(1);
                let until = self.now + delay;
                self.set_state(tag, TagState::Delayed { until });
                self.stats.delayed_retries += 1;
                self.next_due = self.next_due.min(self.now + delay);
                return;
            }
        }
        match d.action {
            Action::RefreshThenRetry(Refresh::Luns) => self.stats.luns_changed += 1,
            Action::RefreshThenRetry(Refresh::Capacity) => self.stats.capacity_changed += 1,
            _ => {}
        }
        let retry = matches!(d.action, Action::Retry | Action::RefreshThenRetry(_));
        if retry && e.retries < self.cfg.max_retries && self.down.is_none() {
            e.retries += 1;
            self.stats.retries += 1;
            self.set_state(tag, TagState::Idle);
            self.start(tag);
            return;
        }
        let outcome = CmdOutcome {
            status,
            sense: info.sense,
            resid: info.resid,
            errno: d.errno,
        };
        self.complete(tag, outcome, done);
    }

    fn complete(&mut self, tag: u16, outcome: CmdOutcome, done: &mut dyn FnMut(Done)) {
        self.t.close_window(tag);
        self.set_state(tag, TagState::Idle);
        self.busy -= 1;
        self.stats.completed += 1;
        done(Done { tag, outcome });
    }
}

enum Recv {
    Rsp(u64, i32, RspInfo),
    Cred(u64, i32),
    Aer(u64, i32, Option<Sense>),
    Logout(TLogoutReason),
    Bad(WireError),
}

mod config;
mod credits;
mod outcome;
mod relogin;
mod segments;
mod slots;
mod timed;

#[cfg(test)]
mod tests;
