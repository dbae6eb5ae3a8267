//! The connection manager side of an endpoint: its events, read without blocking the thread
//! longer than a login step allows.

use super::{Endpoint, LoginPlan};
use crate::rdma::RdmaError;
use rdma_sys::*;
use std::os::fd::RawFd;
use std::ptr::{null_mut, NonNull};
use std::time::{Duration, Instant};

/// A copied CM event.
/// The kernel-side timeout of one address resolution attempt (ib_srp's SRP_PATH_REC_TIMEOUT_MS).
pub(super) const RESOLVE_STEP_MS: i32 = 1000;
/// The least time to wait for the event of an attempt, even past the login's deadline: the kernel
/// answers each attempt within its own timeout.
const STEP_WAIT_MIN: Duration = Duration::from_millis(RESOLVE_STEP_MS as u64 + 500);

pub(crate) struct CmEvent {
    pub(crate) kind: rdma_cm_event_type::Type,
    pub(crate) status: i32,
    /// The id the event is about (for a connect request, the new connection's; read by the
    /// target side, `rdma::listener`).
    #[cfg_attr(not(feature = "lab-target"), allow(dead_code))]
    pub(crate) id: *mut rdma_cm_id,
    pub(crate) private: Vec<u8>,
}

/// Reads one event from `ec` without blocking, copies what is used of it, and acks it.
///
/// # Safety
/// `ec` is a valid, non-blocking event channel.
pub(crate) unsafe fn take_event(ec: *mut rdma_event_channel) -> Option<CmEvent> {
    let mut ev: *mut rdma_cm_event = null_mut();
    // SAFETY: ec is valid and non-blocking (the caller's promise); ev is an out-parameter.
    if unsafe { rdma_get_cm_event(ec, &mut ev) } != 0 {
        return None;
    }
    let ev = NonNull::new(ev)?;
    // SAFETY: ev is a valid event until acked; the private data pointer/length describe bytes
    // owned by the event, copied here before the ack frees them.
    let out = unsafe {
        let e = ev.as_ref();
        let conn = &e.param.conn;
        let private = if conn.private_data.is_null() {
            Vec::new()
        } else {
            std::slice::from_raw_parts(
                conn.private_data as *const u8,
                usize::from(conn.private_data_len),
            )
            .to_vec()
        };
        CmEvent {
            kind: e.event,
            status: e.status,
            id: e.id,
            private,
        }
    };
    // SAFETY: ev came from rdma_get_cm_event and is acked exactly once; a connect request's id
    // stays valid after the ack.
    unsafe { rdma_ack_cm_event(ev.as_ptr()) };
    Some(out)
}

pub(crate) fn event_name(kind: rdma_cm_event_type::Type) -> String {
    // SAFETY: rdma_event_str returns a pointer to a static NUL-terminated string for any value.
    let p = unsafe { rdma_event_str(kind) };
    if p.is_null() {
        return format!("event {kind}");
    }
    // SAFETY: p is non-null and points to a static C string (see above).
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

pub(crate) fn set_nonblocking(fd: RawFd) -> Result<(), RdmaError> {
    // SAFETY: fcntl on a file descriptor we own; F_GETFL/F_SETFL take and return plain ints.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(RdmaError::os("fcntl(O_NONBLOCK)"));
    }
    Ok(())
}

pub(crate) fn wait_readable(fd: RawFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd, count 1.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

impl Endpoint {
    pub(super) fn try_event(&mut self) -> Option<CmEvent> {
        if self.ec.is_null() {
            return None;
        }
        // SAFETY: ec is valid (checked above) and non-blocking (create_id).
        unsafe { take_event(self.ec) }
    }

    pub(super) fn next_event(
        &mut self,
        what: &'static str,
        timeout: Duration,
    ) -> Result<CmEvent, RdmaError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(ev) = self.try_event() {
                return Ok(ev);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.cm_fd().is_some_and(|fd| wait_readable(fd, left)) {
                return Err(RdmaError::Timeout {
                    what,
                    dest: self.dest,
                    secs: timeout.as_secs(),
                });
            }
        }
    }

    /// Address resolution, in steps of [`RESOLVE_STEP_MS`] until `tmo`, as ib_srp does it
    /// (SRP_PATH_REC_TIMEOUT_MS): the kernel retries a resolution whose neighbour (ARP) is not yet
    /// known only when a neighbour update event wakes it or when the timeout given ends. Where no
    /// event comes (two rxe devices on a veth pair in one namespace), one long timeout would spend
    /// all of it waiting for an answer that arrived in the first milliseconds.
    pub(super) fn resolve_addr(
        &mut self,
        plan: &LoginPlan,
        tmo: Duration,
    ) -> Result<(), RdmaError> {
        let deadline = Instant::now() + tmo;
        loop {
            let (mut dst, mut src_ss) = (plan.dst, plan.src);
            let src_ptr = src_ss.as_mut().map_or(null_mut(), |s| {
                s as *mut libc::sockaddr_storage as *mut libc::sockaddr
            });
            // SAFETY: id is valid; src/dst point to initialized sockaddr_storage values (IP or
            // AF_IB) that outlive the call (librdmacm copies them).
            let rc = unsafe {
                rdma_resolve_addr(
                    self.id,
                    src_ptr,
                    &mut dst as *mut _ as *mut libc::sockaddr,
                    RESOLVE_STEP_MS,
                )
            };
            if rc != 0 {
                return Err(RdmaError::Unreachable {
                    dest: self.dest,
                    detail: format!("rdma_resolve_addr: {}", std::io::Error::last_os_error()),
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = self.next_event("address resolution", left.max(STEP_WAIT_MIN))?;
            match ev.kind {
                rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED => return Ok(()),
                rdma_cm_event_type::RDMA_CM_EVENT_ADDR_ERROR
                    if ev.status == -libc::ETIMEDOUT && Instant::now() < deadline =>
                {
                    continue
                }
                _ => {
                    return Err(RdmaError::Unreachable {
                        dest: self.dest,
                        detail: format!(
                            "address resolution: {} (status {})",
                            event_name(ev.kind),
                            ev.status
                        ),
                    })
                }
            }
        }
    }

    pub(super) fn expect_event(
        &mut self,
        what: &'static str,
        want: rdma_cm_event_type::Type,
        timeout: Duration,
    ) -> Result<(), RdmaError> {
        let ev = self.next_event(what, timeout)?;
        if ev.kind == want {
            return Ok(());
        }
        Err(RdmaError::Unreachable {
            dest: self.dest,
            detail: format!("{what}: {} (status {})", event_name(ev.kind), ev.status),
        })
    }
}
