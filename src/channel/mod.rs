//! One SRP channel = one queue's I/O engine: tag table, credits (`req_lim`), send slots, receive ring,
//! SRP_RSP handling, CRED_REQ / AER_REQ answers. Owned by one thread; nothing in it is shared.
//!
//! The engine is generic over a small [`Transport`] (post a send, post a receive, poll completions) so
//! the RDMA endpoint drives it in production and an in-process fake target (`fake`, built for
//! tests) drives it in tests. It never sees libublk or NBD: front ends hand it [`ScsiCmd`]s built by [`block`] and get
//! [`Done`]s back.

pub mod block;
mod engine;
#[cfg(any(test, feature = "test-utils"))]
pub mod fake;

pub use engine::{
    send_slots, Channel, ChannelConfig, ChannelStats, CmdOutcome, Done, DownReason, PortDown,
    ReissueLimit, SubmitError, Timeout, TmfAnswer, CMD_TIMEOUT_MS, LINK_CHECK_MS, STALL_MS,
    TMF_TIMEOUT_MS,
};

use crate::rdma::Lent;
use crate::wire::scsi::Cdb;
use std::os::fd::RawFd;
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

/// What the channel engine needs from the RDMA connection (or from a fake target).
pub trait Transport {
    /// Memory registered through [`Transport::register`].
    type Registered: Send;
    /// Send slot `slot`'s buffer, where an IU is encoded before [`Transport::post_send`].
    fn send_buf(&mut self, slot: u16) -> &mut [u8];
    /// Queues the first `len` bytes of send slot `slot` as one SEND (posted by
    /// [`Transport::flush_sends`], or at once by a transport without a chain); with `imm`, that
    /// buffer's bytes follow as a second gather entry (immediate data). Only a `signal`led SEND
    /// reports its completion (a failed one always does); the SEND queue completes in order, so
    /// that completion says every SEND posted before it completed too. The slot stays busy until
    /// then.
    fn post_send(
        &mut self,
        slot: u16,
        len: usize,
        imm: Option<DataBuf>,
        signal: bool,
    ) -> Result<(), TransportError>;
    /// Posts the SENDs [`Transport::post_send`] queued, as one chain (one doorbell). A transport
    /// that posts at once has nothing to do.
    fn flush_sends(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
    /// Receive buffer `idx` (valid between its completion and the next [`Transport::post_recv`]).
    fn recv_buf(&self, idx: u16) -> &[u8];
    /// (Re)posts receive buffer `idx`.
    fn post_recv(&mut self, idx: u16) -> Result<(), TransportError>;
    /// Number of receive buffers.
    fn nr_recv(&self) -> u16;
    /// Polls up to `out.len()` completions.
    fn poll(&mut self, out: &mut [Wc]) -> Result<usize, TransportError>;
    /// Asks for a notification on [`Transport::notify_fd`] at the next receive completion, and with
    /// `sends` at the next send completion too (a transport with one completion queue notifies at
    /// either anyway).
    fn arm(&mut self, sends: bool) -> Result<(), TransportError>;
    /// A file descriptor that becomes readable when an armed completion arrives.
    fn notify_fd(&self) -> Option<RawFd>;
    /// Consumes pending notifications (after the fd became readable).
    fn ack_notify(&mut self) -> Result<(), TransportError>;
    /// Why the local link cannot carry the channel (its port is down), if it cannot. Asked only when
    /// commands have waited [`LINK_CHECK_MS`] without a completion: a response lost with
    /// the link leaves nothing for the HCA to retry, so no completion would ever say so.
    fn link_down(&mut self) -> Option<PortDown> {
        None
    }
    /// Registers `mem` for the target's RDMA on this transport's device: the registration (the
    /// memory kept allocated while it lives), and one descriptor per region. A path keeps it from
    /// one login to the next ([`Transport::adopt`]).
    fn register(&mut self, mem: &Lent) -> Result<(Self::Registered, Vec<DataBuf>), TransportError>;
    /// Whether `reg`, registered on an earlier login, serves this one too (the same device and
    /// access): the target then reaches the buffers through it, with the keys it had.
    fn adopt(&mut self, reg: &Self::Registered) -> bool;
    /// Lets go of registered buffers (nothing in flight uses them): what closes their windows
    /// goes out now, so that the registration can be dropped.
    fn release_bufs(&mut self);
    /// Opens `buf`, segment `seg` of the command on tag `win`, to the target in the one
    /// direction `access` names, until [`Transport::close_window`]: returns the descriptor to
    /// send, whose `rkey` reaches that byte range only. Queued ahead of the command's SEND, in the
    /// same chain. A transport whose registrations are login-wide returns `buf` as it is.
    fn open_window(
        &mut self,
        win: u16,
        seg: u16,
        buf: DataBuf,
        access: RemoteAccess,
    ) -> Result<DataBuf, TransportError> {
        let _ = (win, seg, access);
        Ok(buf)
    }
    /// Closes every open window of tag `win` (the command's response is in, or it was given
    /// up): queued with the next post, so the target's access fails from then on, before any
    /// later work request of this channel executes. Nothing to do when nothing is open.
    fn close_window(&mut self, win: u16) {
        let _ = win;
    }
    /// The most segments one command may have ([`Transport::open_window`]'s `seg` below it):
    /// what the send queue was sized for.
    fn max_segments(&self) -> u16 {
        1
    }
    /// Stops the transport: no completion and no RDMA reaches a buffer any more (the QP in the
    /// error state, drained); its disconnect waits until it is replaced or dropped.
    fn stop(&mut self) {}
    /// Whether [`Transport::stop`] (or a close) happened.
    fn is_stopped(&self) -> bool {
        false
    }
    /// Whether the device under the transport is going away (and the transport not yet
    /// released): what [`Transport::release_if_removed`] would act on.
    fn removing(&self) -> bool {
        false
    }
    /// When the device under the transport is going away: closes it at once and says so.
    fn release_if_removed(&mut self) -> bool {
        false
    }
    /// The connection manager's event fd, if there is one.
    fn cm_fd(&self) -> Option<RawFd> {
        None
    }
    /// The next connection manager event (acted on), by name.
    fn poll_cm(&mut self) -> Option<String> {
        None
    }
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
