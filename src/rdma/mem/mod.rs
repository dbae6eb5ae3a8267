//! The memory layer: an RDMA device's protection domain ([`Domain`]), shared by every channel of
//! the daemon on that device and outliving their logins, and memory registered against it
//! ([`Registration`]), which a path keeps from one login to the next on the same device. A queue
//! therefore registers its buffers once, not on every reconnect, and the daemon allocates one
//! protection domain per RDMA device, not one per login ([`counts`] says how many of each).
//!
//! What keeps this sound is the device's verbs context: librdmacm opens one per device and closes
//! it when the device is being removed and the last CM id on it is destroyed. A domain holds a CM id
//! of its own, bound to the device (its `anchor`), so the context outlives the domain, every
//! registration against it and every login on it; each of those holds the domain, which goes (its
//! anchor last) when the last of them does. A device removal therefore completes once every path
//! on the device has let go of its registration and its logins, which [`crate::path`] does when it
//! sees the removal. Where the anchor cannot be bound (it is logged), the order of those releases
//! carries the same guarantee: a path drops its registrations before its login (on a removal, and
//! by field order), a login drops its share of them and of the domain before its CM id, so the
//! last release happens while some CM id still holds the context.

use super::{lifecycle, RdmaError};
use crate::channel::DataBuf;
mod lent;
pub use lent::Lent;

use rdma_sys::*;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Protection domains allocated since the process started.
static DOMAINS_MADE: AtomicU64 = AtomicU64::new(0);
/// Data regions registered since the process started.
static REGIONS_MADE: AtomicU64 = AtomicU64::new(0);
/// Bytes of data regions registered now.
static PINNED: AtomicU64 = AtomicU64::new(0);

/// What the daemon has registered with its RDMA devices: the numbers `list` and `stats` show.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemCounts {
    /// Protection domains allocated since the daemon started (one per RDMA device it used, and
    /// one more each time a device came back).
    pub domains: u64,
    /// Data buffer regions registered since the daemon started (a queue's pool is one; a
    /// reconnect on the same device adds none).
    pub registrations: u64,
    /// Bytes of data buffers registered (pinned) now.
    pub pinned_bytes: u64,
}

/// The daemon's registration counters.
pub fn counts() -> MemCounts {
    MemCounts {
        domains: DOMAINS_MADE.load(Relaxed),
        registrations: REGIONS_MADE.load(Relaxed),
        pinned_bytes: PINNED.load(Relaxed),
    }
}

/// An RDMA device's protection domain, shared by the daemon's channels on the device.
pub struct Domain {
    /// A CM id bound to the device (synchronous: no events are ever read from it), holding
    /// librdmacm's reference on the device's context.
    anchor: *mut rdma_cm_id,
    /// The device's context (librdmacm's, as every CM id on the device has it).
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    device: String,
}

// SAFETY: the pointers are set once in `Domain::of` and never change; libibverbs and librdmacm
// objects may be used from any thread, and what is done with them (allocating windows, queue pairs
// and registrations on the PD) is thread-safe in libibverbs.
unsafe impl Send for Domain {}
// SAFETY: as for Send: no method mutates the domain.
unsafe impl Sync for Domain {}

/// The daemon's live domains, one per device context.
static LIVE: Mutex<Vec<Weak<Domain>>> = Mutex::new(Vec::new());

impl Domain {
    /// The domain of the device CM id `id` resolved its route to: the daemon's, or a new one.
    ///
    /// # Safety
    /// `id` is a valid CM id whose route is resolved (its `verbs` and local address are set).
    pub(super) unsafe fn of(id: *mut rdma_cm_id, device: &str) -> Result<Arc<Domain>, RdmaError> {
        // SAFETY: id is valid and resolved (the caller's promise).
        let ctx = unsafe { (*id).verbs };
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|w| w.strong_count() > 0);
        // a live domain holds its context open, so an equal pointer is the same device's context
        if let Some(d) = live.iter().filter_map(Weak::upgrade).find(|d| d.ctx == ctx) {
            return Ok(d);
        }
        // SAFETY: as above.
        let d = Arc::new(unsafe { Domain::new(id, ctx, device) }?);
        live.push(Arc::downgrade(&d));
        Ok(d)
    }

    /// # Safety
    /// As [`Domain::of`]; `ctx` is `id`'s context.
    unsafe fn new(
        id: *mut rdma_cm_id,
        ctx: *mut ibv_context,
        device: &str,
    ) -> Result<Domain, RdmaError> {
        let mut d = Domain {
            anchor: null_mut(),
            ctx,
            pd: null_mut(),
            device: device.to_string(),
        };
        // the anchor first: from then on the context stays open whatever happens to `id`
        // SAFETY: id is valid and resolved (the caller's promise).
        match unsafe { anchor(id) } {
            Ok(a) => d.anchor = a,
            // a login must not fail for it: without the anchor, the registrations still go
            // before their logins' CM ids (see the module documentation)
            Err(e) => tracing::warn!(
                "RDMA device {device}: no CM id of srp-ublk's own holds the device ({}); its \
                 protection domain lives as long as its logins",
                crate::Chain(&e)
            ),
        }
        // SAFETY: ctx is open: `id` (alive for this call) or the anchor holds it.
        d.pd = unsafe { ibv_alloc_pd(ctx) };
        if d.pd.is_null() {
            return Err(RdmaError::os("ibv_alloc_pd"));
        }
        DOMAINS_MADE.fetch_add(1, Relaxed);
        Ok(d)
    }

    /// The protection domain, for queue pairs, windows and registrations on the device.
    pub(super) fn pd(&self) -> *mut ibv_pd {
        self.pd
    }

    /// Registers the `len` bytes at `ptr` with `access` on this domain.
    ///
    /// # Safety
    /// The memory stays allocated, at that address, until the MR is deregistered.
    pub(super) unsafe fn reg_mr(
        &self,
        ptr: *mut u8,
        len: usize,
        access: ibv_access_flags,
    ) -> Result<*mut ibv_mr, RdmaError> {
        // SAFETY: pd is valid while `self` lives; the memory outlives the MR (the caller's
        // promise).
        let mr = unsafe { ibv_reg_mr(self.pd, ptr as *mut libc::c_void, len, access.0 as i32) };
        if mr.is_null() {
            return Err(RdmaError::os("ibv_reg_mr"));
        }
        Ok(mr)
    }
}

/// A CM id of our own bound to `id`'s local address (port 0), on the same device.
///
/// # Safety
/// `id` is a valid CM id whose route is resolved.
unsafe fn anchor(id: *mut rdma_cm_id) -> Result<*mut rdma_cm_id, RdmaError> {
    // SAFETY: id is valid and resolved (the caller's promise): its port space, device and local
    // address (of its family's length) are set.
    let (ps, ctx, unported) = unsafe {
        let local: *const libc::sockaddr = rdma_get_local_addr(&*id);
        ((*id).ps, (*id).verbs, super::sockaddr::unported(local))
    };
    let Some(mut addr) = unported else {
        return Err(RdmaError::os("rdma_get_local_addr"));
    };
    let mut anchor = null_mut();
    // SAFETY: a null channel asks for a synchronous id; anchor is an out-parameter.
    if unsafe { rdma_create_id(null_mut(), &mut anchor, null_mut(), ps) } != 0 {
        return Err(RdmaError::os("rdma_create_id"));
    }
    // SAFETY: anchor is a valid new id; addr is a sockaddr of the id's family on our stack.
    let bound =
        unsafe { rdma_bind_addr(anchor, (&mut addr as *mut libc::sockaddr_storage).cast()) } == 0;
    // SAFETY: anchor is valid; after a bind its verbs is the device the address is on.
    if bound && unsafe { (*anchor).verbs } == ctx {
        return Ok(anchor);
    }
    let e = RdmaError::os("rdma_bind_addr (the protection domain's anchor)");
    // SAFETY: anchor is valid, has no QP and no event was ever read from it.
    unsafe { rdma_destroy_id(anchor) };
    Err(e)
}

impl Drop for Domain {
    fn drop(&mut self) {
        let _l = lifecycle();
        if !self.pd.is_null() {
            // SAFETY: pd is ours; every queue pair, window and registration on it holds this
            // domain, so none is left; the anchor still holds the context open.
            unsafe { ibv_dealloc_pd(self.pd) };
        }
        if !self.anchor.is_null() {
            // SAFETY: anchor is ours, has no QP, and no event was ever read from it (so its
            // destruction waits for no acknowledgement).
            unsafe { rdma_destroy_id(self.anchor) };
        }
    }
}

/// Data buffers registered with a [`Domain`] for the target's RDMA, one memory region each, kept
/// from one login to the next on the same device. The regions are deregistered when the last
/// holder lets go: the path that registered them, or a login still using them to bind windows.
/// The memory stays allocated (its owner kept) until then.
pub struct Registration(Arc<Regions>);

struct Regions {
    domain: Arc<Domain>,
    access: ibv_access_flags,
    mrs: Vec<*mut ibv_mr>,
    bytes: u64,
    keep: Lent,
}

// SAFETY: the MRs belong to these regions alone and are only read until the drop deregisters
// them; libibverbs allows that from any thread.
unsafe impl Send for Regions {}
// SAFETY: as for Send: nothing mutates them before the drop.
unsafe impl Sync for Regions {}

impl Registration {
    /// Registers each of `mem`'s regions with `access`; descriptors per region ([`DataBuf::spans`]).
    pub(super) fn new(
        domain: Arc<Domain>,
        mem: &Lent,
        access: ibv_access_flags,
    ) -> Result<(Registration, Vec<DataBuf>), RdmaError> {
        let mut r = Regions {
            domain,
            access,
            mrs: Vec::new(),
            bytes: 0,
            keep: mem.clone(),
        };
        let mut descs = Vec::new();
        for (addr, len) in mem.regions() {
            // SAFETY: addr..addr+len is memory `keep` holds allocated, at this address, until these
            // regions are gone (their drop deregisters first): what a Lent promises.
            let mr = unsafe { r.domain.reg_mr(addr as *mut u8, len, access) }?;
            r.mrs.push(mr);
            r.bytes += len as u64;
            PINNED.fetch_add(len as u64, Relaxed);
            REGIONS_MADE.fetch_add(1, Relaxed);
            // SAFETY: mr is a valid MR returned by ibv_reg_mr.
            let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
            descs.extend(DataBuf::spans(addr, len, lkey, rkey));
        }
        Ok((Registration(Arc::new(r)), descs))
    }

    /// Whether this registration serves a login on `domain` with `access`.
    pub(super) fn serves(&self, domain: &Arc<Domain>, access: ibv_access_flags) -> bool {
        Arc::ptr_eq(&self.0.domain, domain) && self.0.access == access
    }

    /// Another holder of the same regions, for a login that binds windows to them.
    pub(super) fn share(&self) -> Registration {
        Registration(self.0.clone())
    }

    /// The memory regions, valid while this registration is held.
    pub(super) fn mrs(&self) -> &[*mut ibv_mr] {
        &self.0.mrs
    }
}

impl Drop for Regions {
    fn drop(&mut self) {
        // a region cannot be deregistered while a window is still bound to it, which lasts until
        // the invalidation the last completion queued executes (or its login is closed)
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            // SAFETY: each MR is ours and nothing holds it any more (every holder of these
            // regions is gone); one that fails stays registered (and in `mrs`).
            self.mrs.retain(|&mr| unsafe { ibv_dereg_mr(mr) } != 0);
            if self.mrs.is_empty() || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if self.mrs.is_empty() {
            PINNED.fetch_sub(self.bytes, Relaxed);
            return;
        }
        // still registered: the HCA may reach the memory, so it is never freed, nor the domain
        tracing::warn!(
            "{} data buffer registration(s) on {} still had a window bound after 1 s; their \
             memory stays allocated",
            self.mrs.len(),
            self.domain.device
        );
        std::mem::forget(self.keep.clone());
        std::mem::forget(self.domain.clone());
    }
}
