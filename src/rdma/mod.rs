//! RDMA: libibverbs and librdmacm through `rdma-sys`. The only FFI in srp-ublk, and with
//! [`crate::ublk`] (the ublk driver's io_uring commands) the only `unsafe`.
//!
//! [`Endpoint::connect`] logs one SRP channel in over RDMA/CM: resolve address and route, create the
//! PD, completion channel, CQ and RC QP on the device the route chose, register the IU region, post
//! the receives, `rdma_connect` with the 56-byte `srp_login_req_rdma` as private data, and decode the
//! LOGIN_RSP (or LOGIN_REJ) from the CM event's private data. The [`Endpoint`] is then the channel
//! engine's [`crate::channel::Transport`]. Dropping it disconnects, flushes and frees everything.

mod endpoint;
#[cfg(feature = "lab-target")]
pub mod listener;
pub mod mem;
pub mod neigh;
mod sockaddr;
mod tagbufs;
pub mod umad;

pub use endpoint::{ConnectParams, Endpoint};
pub use mem::Lent;
pub use sockaddr::{ib_sockaddr, rdma_cm_service_id, SockaddrIb, AF_IB, RDMA_PS_IB, RDMA_PS_TCP};
pub use tagbufs::TagBufs;

use crate::wire::srp::LoginRejReason;
use crate::wire::WireError;
use std::net::SocketAddr;
use std::os::fd::RawFd;

/// What went wrong setting up or running an RDMA channel. Messages name the cause and the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaError {
    /// `dest=[IPv6%NAME]:PORT` names an interface this host does not have.
    #[error("dest= is scoped by interface '{name}', which this host does not have ({detail}): see `ip link`")]
    NoInterface {
        /// The interface name.
        name: String,
        /// The lookup's error.
        detail: String,
    },
    /// No RDMA device has a route to the target.
    #[error(
        "target {dest} is unreachable over RDMA ({detail}): check that an RDMA device (e.g. \
         `rdma link add rxe0 type rxe netdev eth0`) is up with an address on the route to it, \
         and use src= to pick the local address"
    )]
    Unreachable {
        /// The target address.
        dest: SocketAddr,
        /// The CM's event.
        detail: String,
    },
    /// Nothing accepted the connection (no SRP target listening on that port).
    #[error(
        "no SRP target answered at {dest} ({detail}): check the port in dest= (LIO listens only \
         when /sys/kernel/config/target/srpt/discovery_auth/rdma_cm_port is set)"
    )]
    NoListener {
        /// The target address.
        dest: SocketAddr,
        /// The CM's reject status.
        detail: String,
    },
    /// The target refused the login.
    #[error("target rejected login: {reason} - {}", rej_hint(*.reason, .dest))]
    LoginRejected {
        /// The SRP reason.
        reason: LoginRejReason,
        /// The target address.
        dest: SocketAddr,
    },
    /// A CM step did not finish in time.
    #[error("timed out after {secs} s waiting for {what} from {dest}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// The target address.
        dest: SocketAddr,
        /// How long.
        secs: u64,
    },
    /// The target's login answer did not decode.
    #[error("target {dest} sent a login answer that does not decode")]
    BadLoginReply {
        /// The target address.
        dest: SocketAddr,
        /// Why.
        #[source]
        source: WireError,
    },
    /// The login parameters the target granted cannot work with this initiator.
    #[error("target {dest}: {detail}")]
    Incompatible {
        /// The target address.
        dest: SocketAddr,
        /// What does not fit.
        detail: String,
    },
    /// The device cannot open a buffer to the target per command.
    #[error(
        "RDMA device {device} cannot allocate type 2 memory windows, which rkey_scope=command \
         (the default) needs to let the target reach a buffer only while its command is \
         outstanding: use --rkey-scope login (or rkey_scope=login in the target string) to \
         register every buffer for the whole login instead"
    )]
    NoWindows {
        /// The RDMA device.
        device: String,
        /// What ibv_alloc_mw said.
        #[source]
        source: std::io::Error,
    },
    /// A verbs or CM call failed.
    #[error("{op} failed")]
    Os {
        /// The call.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

fn rej_hint(reason: LoginRejReason, dest: &SocketAddr) -> String {
    match reason {
        LoginRejReason::ChannelLimitReached => format!(
            "check the target's ACL for {} (LIO names RDMA/CM ACLs by the target-side IP) and its \
             channel limit",
            dest.ip()
        ),
        r => r.hint().to_string(),
    }
}

/// The lock every thread holds across librdmacm's lifecycle calls (a login, an endpoint's
/// teardown, a protection domain's end): queues reconnecting together would otherwise run
/// librdmacm's device-list bookkeeping concurrently with each other's teardown, which librdmacm 44
/// does not survive in every interleaving around a device removal. Never taken on the I/O path. A
/// thread that holds it already (a domain ending inside a teardown) gets it again at once.
pub(crate) fn lifecycle() -> Lifecycle {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    thread_local!(static HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if HELD.get() {
        return Lifecycle(None);
    }
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    HELD.set(true);
    Lifecycle(Some((guard, ClearHeld(&HELD))))
}

/// [`lifecycle`]'s guard: the lock, or nothing where this thread held it already.
pub(crate) struct Lifecycle(
    #[allow(dead_code)] Option<(std::sync::MutexGuard<'static, ()>, ClearHeld)>,
);

/// Notes, when the outermost guard goes, that this thread no longer holds the lock.
struct ClearHeld(&'static std::thread::LocalKey<std::cell::Cell<bool>>);

impl Drop for ClearHeld {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

impl RdmaError {
    pub(crate) fn os(op: &'static str) -> Self {
        RdmaError::Os {
            op,
            source: std::io::Error::last_os_error(),
        }
    }

    /// The errno of a failed call (EIO for what is not one).
    pub(crate) fn errno(&self) -> i32 {
        match self {
            RdmaError::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        }
    }
}

/// Waits (poll(2)) for each `(fd, events)` (an fd of `None` is left out), at most `timeout`
/// (`None`: until one is ready); returns which were ready. Here because it is a system call on raw
/// descriptors, as the rest of this module's.
pub fn poll_fds<const N: usize>(
    fds: [(Option<RawFd>, i16); N],
    timeout: Option<std::time::Duration>,
) -> [bool; N] {
    let mut pfds = fds.map(|(fd, events)| libc::pollfd {
        fd: fd.unwrap_or(-1),
        events,
        revents: 0,
    });
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: poll(2) reads N pollfd entries that live on this stack for the call and writes only
    // their revents; a negative descriptor is ignored and a closed one reported (POLLNVAL), never
    // dereferenced.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), N as libc::nfds_t, ms) };
    if n <= 0 {
        return [false; N];
    }
    pfds.map(|p| p.revents != 0)
}

/// Whether RDMA device `name` (e.g. "rxe0") can be opened for verbs: its uverbs node is listed
/// under /sys/class/infiniband_verbs. A removal takes that node away first and then waits for
/// every process that has the device open, so this turns false as soon as a removal starts (the
/// device itself stays listed under /sys/class/infiniband until the removal finishes).
pub fn verbs_device_present(name: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/sys/class/infiniband_verbs") else {
        return false;
    };
    dir.flatten()
        .any(|e| std::fs::read_to_string(e.path().join("ibdev")).is_ok_and(|d| d.trim() == name))
}
