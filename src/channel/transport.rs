//! What the channel engine needs from the RDMA connection (or from a fake target), split by what
//! it does: [`Post`] moves IUs and reports completions, [`Memory`] lends registered memory to the
//! target, [`Login`] says how the login itself is doing. A [`Transport`] is all three; the
//! engine's hot path uses [`Post`] and [`Memory::open_window`] only.

#[cfg(doc)]
use super::LINK_CHECK_MS;
use super::{DataBuf, PortDown, RemoteAccess, TransportError, Wc};
use std::os::fd::RawFd;

/// A login's send and receive queues and their completions.
pub trait Post {
    /// Send slot `slot`'s buffer, where an IU is encoded before [`Post::post_send`].
    fn send_buf(&mut self, slot: u16) -> &mut [u8];
    /// Queues the first `len` bytes of send slot `slot` as one SEND (posted by
    /// [`Post::flush_sends`], or at once by a transport without a chain); with `imm`, that
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
    /// Posts the SENDs [`Post::post_send`] queued, as one chain (one doorbell). A transport
    /// that posts at once has nothing to do.
    fn flush_sends(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
    /// Receive buffer `idx` (valid between its completion and the next [`Post::post_recv`]).
    fn recv_buf(&self, idx: u16) -> &[u8];
    /// (Re)posts receive buffer `idx`.
    fn post_recv(&mut self, idx: u16) -> Result<(), TransportError>;
    /// Number of receive buffers.
    fn nr_recv(&self) -> u16;
    /// Polls up to `out.len()` completions.
    fn poll(&mut self, out: &mut [Wc]) -> Result<usize, TransportError>;
    /// Asks for a notification on [`Post::notify_fd`] at the next receive completion, and with
    /// `sends` at the next send completion too (a transport with one completion queue notifies at
    /// either anyway).
    fn arm(&mut self, sends: bool) -> Result<(), TransportError>;
    /// A file descriptor that becomes readable when an armed completion arrives.
    fn notify_fd(&self) -> Option<RawFd>;
    /// Consumes pending notifications (after the fd became readable).
    fn ack_notify(&mut self) -> Result<(), TransportError>;
}

/// Memory the target reaches: registrations that outlive a login, and the windows a command opens
/// over them.
pub trait Memory {
    /// Memory lent for registration with its owner (the memory layer's `rdma::Lent`: named here
    /// as a type of the implementation, so that `channel` imports nothing of `rdma`).
    type Lent;
    /// Memory registered through [`Memory::register`].
    type Registered: Send;
    /// Registers `mem` for the target's RDMA on this transport's device: the registration (the
    /// memory kept allocated while it lives), and one descriptor per region. A path keeps it from
    /// one login to the next ([`Memory::adopt`]).
    fn register(
        &mut self,
        mem: &Self::Lent,
    ) -> Result<(Self::Registered, Vec<DataBuf>), TransportError>;
    /// Whether `reg`, registered on an earlier login, serves this one too (the same device and
    /// access): the target then reaches the buffers through it, with the keys it had.
    fn adopt(&mut self, reg: &Self::Registered) -> bool;
    /// Lets go of registered buffers (nothing in flight uses them): what closes their windows
    /// goes out now, so that the registration can be dropped.
    fn release_bufs(&mut self);
    /// Opens `buf`, segment `seg` of the command on tag `win`, to the target in the one
    /// direction `access` names, until [`Memory::close_window`]: returns the descriptor to
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
    /// The most segments one command may have ([`Memory::open_window`]'s `seg` below it):
    /// what the send queue was sized for.
    fn max_segments(&self) -> u16 {
        1
    }
}

/// The login under the queues: its connection manager, its local port, its end.
pub trait Login {
    /// Why the local link cannot carry the channel (its port is down), if it cannot. Asked only when
    /// commands have waited [`LINK_CHECK_MS`] without a completion: a response lost with
    /// the link leaves nothing for the HCA to retry, so no completion would ever say so.
    fn link_down(&mut self) -> Option<PortDown> {
        None
    }
    /// Stops the transport: no completion and no RDMA reaches a buffer any more (the QP in the
    /// error state, drained); its disconnect waits until it is replaced or dropped.
    fn stop(&mut self) {}
    /// Whether [`Login::stop`] (or a close) happened.
    fn is_stopped(&self) -> bool {
        false
    }
    /// Whether the device under the transport is going away (and the transport not yet
    /// released): what [`Login::release_if_removed`] would act on.
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

/// Everything a channel needs: queues, memory and login.
pub trait Transport: Post + Memory + Login {}

impl<T: Post + Memory + Login> Transport for T {}
