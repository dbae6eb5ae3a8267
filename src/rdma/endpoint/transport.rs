//! The endpoint as the channel engine's [`Transport`]: posts, polls and the completion channel.

use super::window::data_access;
use super::{Endpoint, WR_RECV, WR_SEND, WR_WINDOW};
use crate::channel::{
    DataBuf, Login, Memory, PortDown, Post, RemoteAccess, TransportCause, TransportError, Wc,
    WcKind, WcStatus,
};
use crate::rdma::mem::Registration;
use crate::rdma::Lent;
use rdma_sys::*;
use std::os::fd::RawFd;
use std::ptr::null_mut;

/// A work request queued for the next [`Post::flush_sends`]: a SEND with its gather list
/// (linked when the chain is posted), or a memory window's bind or invalidation.
pub(super) struct Queued {
    pub(super) wr: ibv_send_wr,
    sge: [ibv_sge; 2],
    /// The window this request binds, if it is a bind.
    pub(super) bound: Option<usize>,
}

impl Queued {
    /// An unsignalled request without data: the caller fills in what its opcode uses.
    pub(super) fn empty(wr_id: u64, opcode: ibv_wr_opcode::Type) -> Queued {
        // SAFETY: ibv_send_wr is a plain C struct (with unions); all-zero is valid before the
        // fields an opcode uses are set.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.opcode = opcode;
        let sge = ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        };
        Queued {
            wr,
            sge: [sge; 2],
            bound: None,
        }
    }
}

/// The state of a local port from sysfs ("4: ACTIVE"), when the device has one.
pub(super) fn port_state(device: &str, port: u8) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/infiniband/{device}/ports/{port}/state"))
        .ok()
        .map(|s| s.trim().to_string())
}

pub(super) fn closed(op: &'static str) -> TransportError {
    TransportError {
        op,
        cause: TransportCause::Stopped,
    }
}

fn terr(op: &'static str, code: i32) -> TransportError {
    TransportError {
        op,
        cause: TransportCause::Os(code),
    }
}

impl Endpoint {
    /// Reads and acks one completion event; returns whether there was one.
    pub(super) fn take_cq_event(&mut self) -> bool {
        if self.comp.is_null() {
            return false;
        }
        let mut cq = null_mut();
        let mut ctx = null_mut();
        // SAFETY: comp is valid and non-blocking; cq/ctx are out-parameters.
        if unsafe { ibv_get_cq_event(self.comp, &mut cq, &mut ctx) } != 0 {
            return false;
        }
        // SAFETY: the event came from one of our CQs; acked at once, the count stays even.
        unsafe { ibv_ack_cq_events(cq, 1) };
        // that CQ is no longer armed
        let fired = usize::from(cq == self.send_cq);
        self.armed[fired] = false;
        true
    }
}

impl Endpoint {
    /// Queues `q` for the next post; posts at once when the chain is as long as the send queue
    /// (a SEND per slot, and in command scope a bind and an invalidation per slot).
    pub(super) fn queue(&mut self, q: Queued) -> Result<(), TransportError> {
        self.chain.push(q);
        if self.chain.len() >= self.send_wrs {
            return self.flush_chain();
        }
        Ok(())
    }

    /// Posts the queued work requests as one list: one doorbell (on rxe one system call).
    pub(super) fn flush_chain(&mut self) -> Result<(), TransportError> {
        if let Some(e) = self.post_failed.take() {
            return Err(e);
        }
        if self.chain.is_empty() {
            return Ok(());
        }
        let mut chain = std::mem::take(&mut self.chain);
        if self.closed || self.quiesced {
            self.windows_posted(&chain, false);
            chain.clear();
            self.chain = chain;
            return Err(closed("ibv_post_send"));
        }
        let n = chain.len();
        let base = chain.as_mut_ptr();
        for i in 0..n {
            // SAFETY: i < n = len: each pointer is to an element of `chain`, which is not resized
            // until the post below has returned.
            unsafe {
                let q = base.add(i);
                (*q).wr.sg_list = (*q).sge.as_mut_ptr();
                (*q).wr.next = if i + 1 < n {
                    &mut (*base.add(i + 1)).wr
                } else {
                    null_mut()
                };
            }
        }
        let mut bad = null_mut();
        // SAFETY: the QP is valid; the linked work requests and their gather lists live in `chain`
        // across the call (the provider copies them into the send queue). The slots' bytes and any
        // immediate data buffers are registered memory the engine leaves untouched until each
        // slot's send completion (its tag stays busy); a bind names a window and a region of ours.
        let rc = unsafe { ibv_post_send((*self.id).qp, &mut (*base).wr, &mut bad) };
        self.windows_posted(&chain, rc == 0);
        chain.clear();
        self.chain = chain;
        if rc != 0 {
            return Err(terr("ibv_post_send", rc));
        }
        Ok(())
    }
}

impl Post for Endpoint {
    fn send_buf(&mut self, slot: u16) -> &mut [u8] {
        let r = self.slot_range(slot);
        &mut self.iu[r]
    }

    fn post_send(
        &mut self,
        slot: u16,
        len: usize,
        imm: Option<DataBuf>,
        signal: bool,
    ) -> Result<(), TransportError> {
        if self.closed || self.quiesced {
            return Err(closed("ibv_post_send"));
        }
        if slot >= self.nr_send || len > self.send_size {
            return Err(TransportError {
                op: "ibv_post_send",
                cause: TransportCause::BadSlot { slot, len },
            });
        }
        let r = self.slot_range(slot);
        // SAFETY: iu_mr is the valid MR covering `iu`.
        let lkey = unsafe { (*self.iu_mr).lkey };
        let mut sge = [
            ibv_sge {
                addr: self.iu[r].as_ptr() as u64,
                length: len as u32,
                lkey,
            },
            ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            },
        ];
        let mut n = 1;
        if let Some(b) = imm {
            sge[1] = ibv_sge {
                addr: b.addr,
                length: b.len,
                lkey: b.lkey,
            };
            n = 2;
        }
        let mut q = Queued::empty(WR_SEND | u64::from(slot), ibv_wr_opcode::IBV_WR_SEND);
        q.wr.num_sge = n;
        if signal {
            q.wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        q.sge = sge;
        // posted with the others of this pass by `flush_sends`: one doorbell (on rxe one system
        // call) for every command a loop pass sends
        self.queue(q)
    }

    fn flush_sends(&mut self) -> Result<(), TransportError> {
        self.flush_chain()
    }

    fn recv_buf(&self, idx: u16) -> &[u8] {
        &self.iu[self.recv_range(idx)]
    }

    fn post_recv(&mut self, idx: u16) -> Result<(), TransportError> {
        if self.closed || self.quiesced {
            return Err(closed("ibv_post_recv"));
        }
        if idx >= self.nr_recv {
            return Err(TransportError {
                op: "ibv_post_recv",
                cause: TransportCause::BadRecv(idx),
            });
        }
        let r = self.recv_range(idx);
        // SAFETY: iu_mr is the valid MR covering `iu`.
        let lkey = unsafe { (*self.iu_mr).lkey };
        let mut sge = ibv_sge {
            addr: self.iu[r].as_ptr() as u64,
            length: self.recv_size as u32,
            lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id: WR_RECV | u64::from(idx),
            next: null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = null_mut();
        // SAFETY: the QP is valid; the buffer is registered memory the engine does not read again
        // until its receive completion.
        let rc = unsafe { ibv_post_recv((*self.id).qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(terr("ibv_post_recv", rc));
        }
        Ok(())
    }

    fn nr_recv(&self) -> u16 {
        self.nr_recv
    }

    fn poll(&mut self, out: &mut [Wc]) -> Result<usize, TransportError> {
        if self.recv_cq.is_null() {
            return Ok(0);
        }
        let want = out.len().min(self.raw_wcs.len());
        // responses first; SEND completions fill what room is left
        let mut n = 0;
        for cq in [self.recv_cq, self.send_cq] {
            let room = &mut self.raw_wcs[n..want];
            if room.is_empty() {
                break;
            }
            // SAFETY: cq is valid (both are created together); `room` has space for its length.
            let got = unsafe { ibv_poll_cq(cq, room.len() as i32, room.as_mut_ptr()) };
            if got < 0 {
                return Err(terr("ibv_poll_cq", -got));
            }
            n += got as usize;
        }
        for (o, w) in out.iter_mut().zip(&self.raw_wcs[..n]) {
            let kind = if w.wr_id & WR_RECV != 0 {
                WcKind::Recv
            } else if w.wr_id & WR_WINDOW != 0 {
                WcKind::Window
            } else {
                WcKind::Send
            };
            let status = match w.status {
                ibv_wc_status::IBV_WC_SUCCESS => WcStatus::Ok,
                ibv_wc_status::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
                s => WcStatus::Error(s),
            };
            *o = Wc {
                kind,
                id: (w.wr_id & 0xffff) as u16,
                len: w.byte_len,
                status,
            };
        }
        Ok(n)
    }

    fn arm(&mut self, sends: bool) -> Result<(), TransportError> {
        if self.closed {
            return Ok(());
        }
        let cqs = [self.recv_cq, self.send_cq];
        for (i, &cq) in cqs[..if sends { 2 } else { 1 }].iter().enumerate() {
            if self.armed[i] {
                continue;
            }
            // SAFETY: cq is valid while the endpoint is not closed.
            let rc = unsafe { ibv_req_notify_cq(cq, 0) };
            if rc != 0 {
                return Err(terr("ibv_req_notify_cq", rc));
            }
            self.armed[i] = true;
        }
        Ok(())
    }

    fn notify_fd(&self) -> Option<RawFd> {
        if self.comp.is_null() {
            return None;
        }
        // SAFETY: comp is valid until close() nulls it.
        Some(unsafe { (*self.comp).fd })
    }

    fn ack_notify(&mut self) -> Result<(), TransportError> {
        // One event per wake-up: the CQ is armed again before the next sleep, and an event still
        // queued keeps the fd readable, so the next poll of it returns at once (reading until
        // EAGAIN cost a second read per wake-up).
        self.take_cq_event();
        Ok(())
    }
}

impl Memory for Endpoint {
    type Lent = Lent;
    type Registered = Registration;

    fn register(&mut self, mem: &Lent) -> Result<(Registration, Vec<DataBuf>), TransportError> {
        let Some(domain) = self.domain.clone() else {
            return Err(closed("ibv_reg_mr"));
        };
        let (reg, descs) = Registration::new(domain, mem, data_access(self.scope))
            .map_err(|e| terr("ibv_reg_mr", e.errno()))?;
        self.data = Some(reg.share());
        Ok((reg, descs))
    }

    fn adopt(&mut self, reg: &Registration) -> bool {
        let access = data_access(self.scope);
        let serves = self.domain.as_ref().is_some_and(|d| reg.serves(d, access));
        if serves {
            self.data = Some(reg.share());
        }
        serves
    }

    fn release_bufs(&mut self) {
        // the invalidations the last completions queued go out: a region cannot be
        // deregistered while a window is still bound to it
        let _ = self.flush_chain();
        self.data = None;
    }

    fn open_window(
        &mut self,
        win: u16,
        seg: u16,
        buf: DataBuf,
        access: RemoteAccess,
    ) -> Result<DataBuf, TransportError> {
        self.bind_window(win, seg, buf, access)
    }

    fn max_segments(&self) -> u16 {
        self.max_segs
    }

    fn close_window(&mut self, win: u16) {
        self.invalidate_window(win);
    }
}

impl Login for Endpoint {
    fn stop(&mut self) {
        self.quiesce();
    }

    fn is_stopped(&self) -> bool {
        Endpoint::is_stopped(self)
    }

    fn removing(&self) -> bool {
        !self.closed && self.device_removed()
    }

    fn release_if_removed(&mut self) -> bool {
        Endpoint::release_if_removed(self)
    }

    fn cm_fd(&self) -> Option<RawFd> {
        Endpoint::cm_fd(self)
    }

    fn poll_cm(&mut self) -> Option<String> {
        Endpoint::poll_cm(self)
    }

    fn link_down(&mut self) -> Option<PortDown> {
        let state = port_state(&self.device, self.port)?;
        (!state.contains("ACTIVE")).then(|| PortDown {
            device: self.device.clone(),
            port: self.port,
            state,
        })
    }
}
