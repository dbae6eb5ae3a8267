//! One SRP channel = one queue's I/O engine: tag table, credits (`req_lim`), send slots, receive ring,
//! SRP_RSP handling, CRED_REQ / AER_REQ answers. Owned by one thread; nothing in it is shared.
//!
//! The engine is generic over a [`Transport`] ([`Post`] sends and receives and polls completions,
//! [`Memory`] lends registered memory to the target, [`Login`] watches the login), so the RDMA
//! endpoint drives it in production and an in-process fake target (`fake`, built for tests) drives
//! it in tests. It never sees libublk or NBD: front ends hand it [`ScsiCmd`]s built by [`block`]
//! and get [`Done`]s back.

pub mod block;
mod engine;
#[cfg(any(test, feature = "test-utils"))]
pub mod fake;
mod transport;

pub use engine::{
    send_slots, Channel, ChannelConfig, ChannelStats, CmdOutcome, Done, DownReason, PortDown,
    ReissueLimit, SubmitError, Timeout, TmfAnswer, CMD_TIMEOUT_MS, LINK_CHECK_MS, STALL_MS,
    TMF_TIMEOUT_MS,
};

pub use transport::{Login, Memory, Post, Transport};

use crate::wire::scsi::Cdb;
use crate::wire::srp::ScsiLun;
use std::sync::OnceLock;
use std::time::Instant;

/// Milliseconds since the process first asked: the clock the front ends hand their channels
/// ([`Channel::set_clock`], [`Channel::tick`]).
pub fn clock_ms() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// A registered buffer the target can RDMA-read or -write (one tag's data buffer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataBuf {
    /// Start address (in the initiator's address space; what goes in a direct descriptor).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key, for gathering immediate data from it.
    pub lkey: u32,
    /// Remote key, for the target's RDMA.
    pub rkey: u32,
}

impl DataBuf {
    /// The most one descriptor covers (a memory region may be larger: a guest's RAM above 4 GiB).
    pub const MAX_LEN: u32 = 1 << 31;

    /// `len` bytes at `addr` under one pair of keys, as descriptors of at most [`Self::MAX_LEN`].
    pub fn spans(addr: u64, len: usize, lkey: u32, rkey: u32) -> impl Iterator<Item = DataBuf> {
        let len = len as u64;
        (0..len)
            .step_by(Self::MAX_LEN as usize)
            .map(move |off| DataBuf {
                addr: addr + off,
                len: (len - off).min(u64::from(Self::MAX_LEN)) as u32,
                lkey,
                rkey,
            })
    }

    /// The first `len` bytes of this buffer.
    pub fn prefix(self, len: u32) -> DataBuf {
        DataBuf {
            len: len.min(self.len),
            ..self
        }
    }
}

/// Which queue a work completion came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcKind {
    /// A send (an IU we posted) completed.
    Send,
    /// A receive completed: an IU from the target is in that receive buffer.
    Recv,
    /// A memory window's bind or invalidation (reported only when it failed or was flushed).
    Window,
}

/// What a command's window lets the target do with its buffer: the one direction its data moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteAccess {
    /// Data-out (writes): the target RDMA-reads the buffer.
    Read,
    /// Data-in (reads): the target RDMA-writes the buffer.
    Write,
}

/// Status of a work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// Success.
    Ok,
    /// Flushed because the QP went to the error state (disconnect, teardown).
    Flushed,
    /// Any other failure (the verbs status code).
    Error(u32),
}

/// One work completion, reduced to what the engine needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc {
    /// Send or receive.
    pub kind: WcKind,
    /// The send slot or receive buffer index.
    pub id: u16,
    /// Bytes received (receives only).
    pub len: u32,
    /// Status.
    pub status: WcStatus,
}

/// A transport operation that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op} failed")]
pub struct TransportError {
    /// The operation (e.g. "ibv_post_send").
    pub op: &'static str,
    /// Why.
    #[source]
    pub cause: TransportCause,
}

/// Why a transport operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportCause {
    /// The channel is stopped: it went down and waits for its reconnect.
    #[error("the channel is stopped (reconnecting)")]
    Stopped,
    /// Every send slot is in use.
    #[error("no free send slot")]
    NoSendSlot,
    /// A send slot or length outside the login's.
    #[error("send slot {slot} / length {len} is outside the login's send slots")]
    BadSlot {
        /// The slot.
        slot: u16,
        /// The length.
        len: usize,
    },
    /// A receive buffer outside the login's.
    #[error("receive buffer {0} is outside the login's")]
    BadRecv(u16),
    /// A descriptor whose local key no registration of this login has.
    #[error("no registration has local key {0:#x}")]
    UnknownKey(u32),
    /// A tag with no memory window.
    #[error("no memory window for tag {0}")]
    NoWindow(u16),
    /// The IU does not encode.
    #[error("the IU does not encode")]
    Encode(#[source] crate::wire::WireError),
    /// A verbs call failed with this errno.
    #[error("{}", std::io::Error::from_raw_os_error(*.0))]
    Os(i32),
    /// The fake target refused work request N of a chain, as told to.
    #[error("work request {0} of the chain refused (injected)")]
    Injected(usize),
}

/// Which way a command's data goes, and where it lives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataDir {
    /// No data.
    #[default]
    None,
    /// Target to initiator (reads): the target RDMA-writes this buffer.
    In(DataBuf),
    /// Initiator to target (writes): sent as immediate data when it fits, else RDMA-read by the target.
    Out(DataBuf),
    /// Target to initiator into the tag's segments ([`Channel::submit_segments`]), this many
    /// bytes in all.
    InSegments(u32),
    /// Initiator to target from the tag's segments, this many bytes in all: RDMA-read by the
    /// target.
    OutSegments(u32),
}

/// A SCSI command for the channel to carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScsiCmd {
    /// The logical unit it addresses (a channel reaches every LUN the target maps it).
    pub lun: ScsiLun,
    /// The CDB.
    pub cdb: Cdb,
    /// Its data.
    pub data: DataDir,
}

#[cfg(test)]
mod tests {
    use super::DataBuf;

    #[test]
    fn a_region_over_4_gib_is_lent_as_spans_that_tile_it() {
        let spans: Vec<_> = DataBuf::spans(0x1000, 5 << 30, 7, 9).collect();
        let lens: Vec<_> = spans.iter().map(|s| s.len).collect();
        assert_eq!(lens, [1 << 31, 1 << 31, 1 << 30]);
        assert!(spans
            .windows(2)
            .all(|w| w[0].addr + u64::from(w[0].len) == w[1].addr));
        assert!(spans.iter().all(|s| (s.lkey, s.rkey) == (7, 9)));
        assert_eq!(DataBuf::spans(0, 0, 1, 1).count(), 0);
    }
}
