//! Per-command remote access (`rkey_scope=command`): one type 2 memory window per tag, bound to
//! the command's byte range in the command's direction by a work request queued ahead of its
//! SEND, and invalidated locally (unsignalled) with the next post once its response is in. The
//! data buffers themselves are registered for local access and window binding only, so no key
//! the target ever saw reaches a buffer after its command: a late or stray RDMA fails at the
//! target with a remote access error (and the channel reconnects).
//!
//! The windows' work requests are unsignalled: a completion comes only when one fails or is
//! flushed ([`WcKind::Window`](crate::channel::WcKind::Window)).

use super::transport::{closed, Queued};
use super::{Endpoint, WR_WINDOW};
use crate::channel::{DataBuf, RemoteAccess, TransportCause, TransportError};
use crate::rdma::RdmaError;
use crate::wire::target::RkeyScope;
use rdma_sys::*;
use std::ptr::null_mut;

/// One tag's memory window.
pub(super) struct Window {
    mw: *mut ibv_mw,
    /// The key of the last bind we queued (the provider's `mw.rkey` follows once it is posted).
    rkey: u32,
    /// Bound (or a bind queued) and not yet invalidated.
    open: bool,
    /// A bind of this window is in the unposted chain.
    in_chain: bool,
}

/// The next key of a type 2 window: the low 8 bits are ours to change on every bind
/// (`ibv_inc_rkey`), so a key the target saw for one command never opens the next.
fn next_key(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// Work requests per command of at most `segs` segments in the send queue: its SEND, and in
/// command scope each segment's window's bind and invalidation.
pub(super) fn wrs_per_command(scope: RkeyScope, segs: u16) -> usize {
    match scope {
        RkeyScope::Command => 1 + 2 * usize::from(segs.max(1)),
        RkeyScope::Login => 1,
    }
}

/// The access flags for data buffers (and the scratch buffer) under `scope`.
pub(super) fn data_access(scope: RkeyScope) -> ibv_access_flags {
    let remote = match scope {
        RkeyScope::Command => ibv_access_flags::IBV_ACCESS_MW_BIND.0,
        RkeyScope::Login => {
            ibv_access_flags::IBV_ACCESS_REMOTE_READ.0 | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
        }
    };
    ibv_access_flags(ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 | remote)
}

impl Endpoint {
    /// Allocates `n` windows on the endpoint's PD (command scope only).
    pub(super) fn alloc_windows(&mut self, n: u16) -> Result<(), RdmaError> {
        if self.scope != RkeyScope::Command {
            return Ok(());
        }
        let Some(pd) = self.domain.as_ref().map(|d| d.pd()) else {
            return Err(RdmaError::os("ibv_alloc_mw"));
        };
        for _ in 0..n {
            // SAFETY: pd is valid while we hold the domain (set in create_queues); the result is
            // checked.
            let mw = unsafe { ibv_alloc_mw(pd, ibv_mw_type::IBV_MW_TYPE_2) }.unwrap_or(null_mut());
            if mw.is_null() {
                return Err(RdmaError::NoWindows {
                    device: self.device.clone(),
                    source: std::io::Error::last_os_error(),
                });
            }
            // SAFETY: mw is a valid window just allocated.
            let rkey = unsafe { (*mw).rkey };
            self.windows.push(Window {
                mw,
                rkey,
                open: false,
                in_chain: false,
            });
        }
        Ok(())
    }

    /// Deallocates every window, bound or not (a bound window holds its memory region: the
    /// regions can be deregistered only after this).
    pub(super) fn free_windows(&mut self) {
        for w in self.windows.drain(..) {
            // SAFETY: w.mw is a window of ours, deallocated once; only `close` calls this, after
            // the QP went to the error state and its work requests were flushed, so none that
            // names the window can still execute.
            unsafe { ibv_dealloc_mw(w.mw) };
        }
    }

    /// The memory region a descriptor's local key belongs to (tag `win`'s own buffer first).
    fn region(&self, win: u16, lkey: u32) -> Option<*mut ibv_mr> {
        // SAFETY: every MR of the registration this login holds, and scratch_mr, is a valid MR
        // (or null) while the endpoint holds them.
        let key = |mr: &*mut ibv_mr| !mr.is_null() && unsafe { (**mr).lkey } == lkey;
        let data = self.data.as_ref().map_or(&[][..], |r| r.mrs());
        if let Some(&mr) = data.get(usize::from(win)).filter(|mr| key(mr)) {
            return Some(mr);
        }
        data.iter().copied().chain([self.scratch_mr]).find(key)
    }

    /// Window `seg` of tag `win`: the windows are allocated a level (one per tag) at a time,
    /// level `seg` when a command first has that many segments.
    fn window_index(&mut self, win: u16, seg: u16) -> Result<usize, TransportError> {
        let bad = |cause| TransportError {
            op: "bind memory window",
            cause,
        };
        if win >= self.nr_windows || seg >= self.max_segs {
            return Err(bad(TransportCause::NoWindow(win)));
        }
        let i = usize::from(seg) * usize::from(self.nr_windows) + usize::from(win);
        while self.windows.len() <= i {
            self.alloc_windows(self.nr_windows)
                .map_err(|e| bad(TransportCause::Os(e.errno())))?;
        }
        Ok(i)
    }

    /// [`Memory::open_window`](crate::channel::Memory::open_window) for the endpoint.
    pub(super) fn bind_window(
        &mut self,
        win: u16,
        seg: u16,
        buf: DataBuf,
        access: RemoteAccess,
    ) -> Result<DataBuf, TransportError> {
        if self.scope == RkeyScope::Login || buf.len == 0 {
            return Ok(buf);
        }
        if self.closed || self.quiesced {
            return Err(closed("bind memory window"));
        }
        let mr = self.region(win, buf.lkey).ok_or(TransportError {
            op: "bind memory window",
            cause: TransportCause::UnknownKey(buf.lkey),
        })?;
        let i = self.window_index(win, seg)?;
        if self.windows[i].in_chain {
            // the provider reads the window's current key when the chain is posted
            self.flush_chain()?;
        }
        self.invalidate(i);
        let w = &mut self.windows[i];
        w.rkey = next_key(w.rkey);
        (w.open, w.in_chain) = (true, true);
        let mw_access = match access {
            RemoteAccess::Read => ibv_access_flags::IBV_ACCESS_REMOTE_READ.0,
            RemoteAccess::Write => ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0,
        };
        let mut q = Queued::empty(WR_WINDOW | i as u64, ibv_wr_opcode::IBV_WR_BIND_MW);
        q.wr.bind_mw_tso_union.bind_mw = bind_mw_t {
            mw: w.mw,
            rkey: w.rkey,
            bind_info: ibv_mw_bind_info {
                mr,
                addr: buf.addr,
                length: u64::from(buf.len),
                mw_access_flags: mw_access,
            },
        };
        q.bound = Some(i);
        let rkey = w.rkey;
        self.queue(q)?;
        Ok(DataBuf { rkey, ..buf })
    }

    /// [`Memory::close_window`](crate::channel::Memory::close_window) for the endpoint:
    /// every open window of tag `win`.
    pub(super) fn invalidate_window(&mut self, win: u16) {
        let n = usize::from(self.nr_windows);
        let mut i = usize::from(win);
        while i < self.windows.len() {
            self.invalidate(i);
            i += n;
        }
    }

    /// Invalidates window `i` if it is open.
    fn invalidate(&mut self, i: usize) {
        let Some(w) = self.windows.get_mut(i) else {
            return;
        };
        if !w.open {
            return;
        }
        w.open = false;
        if self.closed || self.quiesced {
            // the QP is in the error state: nothing reaches the buffer any more
            return;
        }
        let mut q = Queued::empty(WR_WINDOW | i as u64, ibv_wr_opcode::IBV_WR_LOCAL_INV);
        q.wr.imm_data_invalidated_rkey_union.invalidated_rkey = w.rkey;
        // a post that failed here (a full chain is posted at once) is reported by the next flush
        if let Err(e) = self.queue(q) {
            self.post_failed.get_or_insert(e);
        }
    }

    /// After a chain was posted (or dropped): the provider's key of every window bound in it is
    /// the one we chose.
    pub(super) fn windows_posted(&mut self, chain: &[Queued], posted: bool) {
        for i in chain.iter().filter_map(|q| q.bound) {
            let w = &mut self.windows[i];
            w.in_chain = false;
            if posted {
                // SAFETY: w.mw is a valid window of ours; the provider reads `rkey` only while
                // posting a bind, which is not happening now (one thread owns the endpoint).
                unsafe { (*w.mw).rkey = w.rkey };
            }
        }
    }
}
