//! What the engine reports: how a command ended, why a channel went down, its counters.

use super::super::{TransportError, WcKind, WcStatus};
use super::{CMD_TIMEOUT_MS, STALL_MS};
use crate::wire::scsi::{ScsiStatus, Sense};
use crate::wire::srp::{TLogoutReason, TskMgmtFunc};
use crate::wire::WireError;

/// Why a channel stopped carrying I/O.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DownReason {
    /// The target sent SRP_T_LOGOUT.
    #[error("target logged the channel out ({0:?})")]
    TargetLogout(TLogoutReason),
    /// The target sent an IU that does not decode; the channel must be reset.
    #[error("malformed IU from the target: {0}")]
    Malformed(#[source] WireError),
    /// Posting or polling failed.
    #[error("transport failure")]
    Transport(#[source] TransportError),
    /// A work request completed in error (flushed after a disconnect or a QP error, retries
    /// exceeded, ...).
    #[error("transport failure: {} completion {status:?}", wc_name(*.kind))]
    Completion {
        /// Which queue it came from.
        kind: WcKind,
        /// Its status.
        status: WcStatus,
    },
    /// The local port under the channel is down, with commands waiting.
    #[error("transport failure: {0}")]
    LinkDown(PortDown),
    /// A command timed out and task management did not recover it (or could not be sent), or
    /// nothing completed for too long with commands outstanding.
    #[error(transparent)]
    Timeout(Timeout),
    /// The channel never logged in: this process took the device over from one whose RDMA device
    /// was removed.
    #[error("RDMA device {device} removed; taken over from the previous image of this daemon")]
    Handover {
        /// The RDMA device the previous image used.
        device: String,
    },
    /// Another channel of the session failed: every channel reconnects (ib_srp's
    /// srp_reconnect_rport), so a queue idle through a fault does not find a dead channel later.
    #[error("another channel of the session failed")]
    Session,
}

fn wc_name(kind: WcKind) -> &'static str {
    match kind {
        WcKind::Send => "send",
        WcKind::Recv => "receive",
        WcKind::Window => "memory window",
    }
}

/// A local port that is not active.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("local RDMA port {device}/{port} is {state}")]
pub struct PortDown {
    /// The RDMA device.
    pub device: String,
    /// Its port.
    pub port: u8,
    /// The state sysfs gives ("1: DOWN").
    pub state: String,
}

/// How a task management request ended, when it did not complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TmfAnswer {
    /// No answer within [`TMF_TIMEOUT_MS`](super::TMF_TIMEOUT_MS).
    #[error("unanswered")]
    None,
    /// Refused with this response code.
    #[error("refused (response code {0:#x})")]
    Refused(u8),
}

/// Which time limit took a channel down.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Timeout {
    /// The HCA never completed a command's send: the QP is stuck.
    #[error("command (tag {tag}) not sent by the HCA within {} s", CMD_TIMEOUT_MS / 1000)]
    NotSent {
        /// The command's tag.
        tag: u16,
    },
    /// Commands outstanding and no work completion at all for [`STALL_MS`].
    #[error("no completion for {} s with {outstanding} command(s) outstanding", STALL_MS / 1000)]
    Stalled {
        /// Commands outstanding.
        outstanding: u16,
    },
    /// A command timed out and LOGICAL UNIT RESET failed or went unanswered.
    #[error("a command timed out and LOGICAL UNIT RESET was {answer}")]
    LunReset {
        /// What the target answered.
        answer: TmfAnswer,
    },
    /// A command timed out and no slot or credit was left for task management.
    #[error("a command timed out and {func:?} cannot be sent (req_lim {req_lim})")]
    TmfUnsendable {
        /// The request that could not go.
        func: TskMgmtFunc,
        /// Credits then.
        req_lim: i32,
    },
    /// A synchronous command ([`Channel::execute`](super::Channel::execute)) got no answer in time.
    #[error("no response within {0:?}")]
    NoResponse(std::time::Duration),
}

/// Counters, for `list` and the benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// SRP_CMDs sent (including retries).
    pub cmds: u64,
    /// Commands completed to the front end.
    pub completed: u64,
    /// Times a command waited for credits (not counting commands held while the channel is down or
    /// a LUN reset is out).
    pub credit_stalls: u64,
    /// Times a command had its credit but waited for a free send slot (every slot's SEND not yet
    /// reaped: the fabric completes SENDs late).
    pub slot_stalls: u64,
    /// Retries after retryable statuses.
    pub retries: u64,
    /// Responses for no outstanding command (late or duplicate), dropped.
    pub unexpected_rsp: u64,
    /// Malformed IUs from the target.
    pub malformed: u64,
    /// SRP_CRED_REQs answered.
    pub cred_reqs: u64,
    /// SRP_AER_REQs answered.
    pub aer_reqs: u64,
    /// Lowest credit count seen.
    pub min_req_lim: i32,
    /// CRED/AER responses dropped because the target's requests outran every send slot.
    pub dropped_small: u64,
    /// Commands that timed out (ABORT TASK sent).
    pub timeouts: u64,
    /// REPORTED LUNS DATA HAS CHANGED unit attentions seen (the target maps other LUNs now).
    pub luns_changed: u64,
    /// CAPACITY DATA HAS CHANGED unit attentions seen (the LUN was resized).
    pub capacity_changed: u64,
    /// Task management requests sent (ABORT TASK, LOGICAL UNIT RESET).
    pub tmfs: u64,
    /// Retries after a delay (BUSY, TASK SET FULL, becoming ready).
    pub delayed_retries: u64,
}

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdOutcome {
    /// SCSI status.
    pub status: ScsiStatus,
    /// Decoded sense data, when the target sent some.
    pub sense: Option<Sense>,
    /// Bytes not transferred (data-in or data-out underflow residual).
    pub resid: u32,
    /// 0 on success, else the (positive) errno for the block layer.
    pub errno: i32,
}

impl CmdOutcome {
    pub(super) fn failed(errno: i32) -> Self {
        CmdOutcome {
            status: ScsiStatus::Good,
            sense: None,
            resid: 0,
            errno,
        }
    }
    /// Bytes transferred out of `len` on success, or the errno.
    pub fn bytes(&self, len: u32) -> Result<u32, i32> {
        if self.errno == 0 {
            Ok(len.saturating_sub(self.resid))
        } else {
            Err(self.errno)
        }
    }
}

/// A finished command, handed back to the front end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Done {
    /// The tag it was submitted with.
    pub tag: u16,
    /// How it ended.
    pub outcome: CmdOutcome,
}

impl Done {
    /// Command `tag` ended with `errno` without a response (never sent, or given up).
    pub fn failed(tag: u16, errno: i32) -> Done {
        Done {
            tag,
            outcome: CmdOutcome::failed(errno),
        }
    }
}

/// Why a submit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The tag is outside `0..depth`.
    #[error("tag {0} is outside the channel's depth")]
    BadTag(u16),
    /// The tag already has a command in flight.
    #[error("tag {0} already has a command in flight")]
    Busy(u16),
    /// The channel is down.
    #[error("channel is down: {0}")]
    Down(DownReason),
    /// A command's data in more segments than the channel carries (or in none).
    #[error("{given} data segments where a command carries 1 to {max}")]
    Segments {
        /// The segments given.
        given: usize,
        /// The most the channel takes.
        max: u16,
    },
}
