//! RDMA: libibverbs and librdmacm through `rdma-sys`. The only FFI (and, with the ublk front end's buffer
//! registration, the only `unsafe`) in srp-ublk.
//!
//! [`Endpoint::connect`] logs one SRP channel in over RDMA/CM: resolve address and route, create the
//! PD, completion channel, CQ and RC QP on the device the route chose, register the IU region, post
//! the receives, `rdma_connect` with the 56-byte `srp_login_req_rdma` as private data, and decode the
//! LOGIN_RSP (or LOGIN_REJ) from the CM event's private data. The [`Endpoint`] is then the channel
//! engine's [`crate::channel::Transport`]. Dropping it disconnects, flushes and frees everything.

mod endpoint;
pub mod neigh;
mod sockaddr;

pub use endpoint::{ConnectParams, Endpoint};
pub use sockaddr::{ib_sockaddr, rdma_cm_service_id, SockaddrIb, AF_IB, RDMA_PS_IB, RDMA_PS_TCP};

use crate::wire::srp::LoginRejReason;
use crate::wire::WireError;
use std::net::SocketAddr;

/// What went wrong setting up or running an RDMA channel. Messages name the cause and the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaError {
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

/// The lock every thread holds across librdmacm's lifecycle calls (a login, an endpoint's teardown,
/// [`forget_removed_devices`]): librdmacm 44 can leave its internal lock held when a device list
/// sync runs concurrently with another thread destroying an id, wedging every later call. Never taken
/// on the I/O path.
pub(crate) fn lifecycle() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Has librdmacm re-read the device list, so that it lets go of a device that is being removed (it
/// keeps a handle open per device; the kernel waits for every handle before it lets the device go).
/// Call while an endpoint on that device is still open: librdmacm then marks the device dead and
/// closes its handle when that endpoint's CM id goes.
///
/// Two traps in librdmacm 44, both seen in the lab as a daemon whose every later CM call hung:
/// `rdma_get_devices` drops a listed device it cannot open (one half-way through removal or
/// creation) although the device list still holds it, and once its own list is empty while devices
/// exist, its initialisation re-enters itself and deadlocks on its lock. So the re-read happens only
/// while an endpoint keeps the list non-empty (the caller's) and when every listed device opens;
/// returns false when it did not happen (try again shortly).
pub(crate) fn forget_removed_devices() -> bool {
    let _l = lifecycle();
    if !every_device_opens() {
        return false;
    }
    let mut n = 0;
    // SAFETY: rdma_get_devices returns a NULL-terminated array (or NULL) that rdma_free_devices
    // releases; nothing is kept from it.
    unsafe {
        let list = rdma_sys::rdma_get_devices(&mut n);
        if !list.is_null() {
            rdma_sys::rdma_free_devices(list);
        }
    }
    true
}

/// Whether every RDMA device libibverbs lists can be opened now.
fn every_device_opens() -> bool {
    let mut n = 0;
    // SAFETY: ibv_get_device_list returns an array of n device pointers (or NULL), freed below;
    // each opened context is closed at once.
    unsafe {
        let list = rdma_sys::ibv_get_device_list(&mut n);
        if list.is_null() {
            return false;
        }
        let mut ok = true;
        for i in 0..usize::try_from(n).unwrap_or(0) {
            let ctx = rdma_sys::ibv_open_device(*list.add(i));
            if ctx.is_null() {
                ok = false;
            } else {
                rdma_sys::ibv_close_device(ctx);
            }
        }
        rdma_sys::ibv_free_device_list(list);
        ok
    }
}

impl RdmaError {
    pub(crate) fn os(op: &'static str) -> Self {
        RdmaError::Os {
            op,
            source: std::io::Error::last_os_error(),
        }
    }
}
