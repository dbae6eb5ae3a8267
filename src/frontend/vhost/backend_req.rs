//! The backend's channel to the VMM (VHOST_USER_PROTOCOL_F_BACKEND_REQ), for the one message a
//! block device sends there: VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, after the LUN's capacity
//! changed; the VMM then reads the configuration again (GET_CONFIG) and interrupts the guest.
//!
//! rust-vmm's `vhost` (0.18) hands the channel to the backend as its `Backend`, which sends only
//! the shared-object and shared-memory messages. So the connection's loop looks at each message
//! before the request handler reads it (MSG_PEEK: the message stays, and the kernel gives the
//! peek its own copies of the message's descriptors), and keeps its own copy of the channel from
//! SET_BACKEND_REQ_FD. Nothing else reads or writes that copy.

use std::io::{IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use vhost::vhost_user::message::{BackendReq, FrontendReq};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Descriptors a vhost-user message carries at most (a memory table's).
const MAX_FDS: usize = 32;
/// The header's version bits: vhost-user's version 1.
const VERSION_1: u32 = 0x1;
/// How long a message to the VMM may wait for room on the channel.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// A vhost-user message's header (vhost 0.18 keeps its own private), in the host's byte order.
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
struct Header {
    request: u32,
    flags: u32,
    size: u32,
}
const _: () = assert!(std::mem::size_of::<Header>() == 12);

/// What a look at the connection's next message found.
pub(super) struct Peeked {
    /// The message's request code (`None`: the connection ended, or less than a header came).
    pub request: Option<u32>,
    /// The backend channel, when the message is SET_BACKEND_REQ_FD with a unix stream socket.
    pub channel: Option<UnixStream>,
}

/// Looks at the next message on the connection `sock` without taking it: its request code, and
/// the backend channel's descriptor when it is SET_BACKEND_REQ_FD (the handler then reads the
/// message and answers it, or ends the connection over it, as it does without the look). Blocks
/// until a message (or the end of the connection) comes.
pub(super) fn peek(sock: &UnixStream) -> std::io::Result<Peeked> {
    let mut hdr = [0u8; std::mem::size_of::<Header>()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(&mut hdr)],
        &mut control,
        rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::CMSG_CLOEXEC,
    )?;
    // every descriptor the peek copied is closed here but the channel's
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in control.drain() {
        if let rustix::net::RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    let request = Header::read_from_bytes(&hdr)
        .ok()
        .filter(|_| got.bytes == hdr.len())
        .map(|h| h.request);
    let is_channel = request == Some(u32::from(FrontendReq::SET_BACKEND_REQ_FD));
    let channel = match (is_channel, fds.len()) {
        (true, 1) => fds.pop().filter(is_unix_stream).map(UnixStream::from),
        _ => None,
    };
    // a VMM that stops reading the channel holds up no thread of the server
    if let Some(c) = &channel {
        c.set_write_timeout(Some(WRITE_TIMEOUT))?;
    }
    Ok(Peeked { request, channel })
}

/// Whether `fd` is a unix stream socket, as the backend channel must be (vhost's handler refuses
/// the message otherwise, and nothing is written to it).
fn is_unix_stream(fd: &OwnedFd) -> bool {
    use rustix::net::{getsockname, sockopt::socket_type, AddressFamily, SocketType};
    socket_type(fd).is_ok_and(|t| t == SocketType::STREAM)
        && getsockname(fd).is_ok_and(|a| a.address_family() == AddressFamily::UNIX)
}

/// Tells the VMM on its backend channel that the device's configuration changed. Asks no reply
/// (REPLY_ACK is not offered): the VMM answers by reading the configuration on the connection,
/// which the connection's own thread serves.
pub(super) fn send_config_change(mut channel: &UnixStream) -> std::io::Result<()> {
    let hdr = Header {
        request: BackendReq::CONFIG_CHANGE_MSG.into(),
        flags: VERSION_1,
        size: 0,
    };
    channel.write_all(hdr.as_bytes())
}
