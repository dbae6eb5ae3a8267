//! Stopping a channel: the CM's disconnect, the local quiesce (QP to error, no word on the wire),
//! and the ordered teardown `close` and `Drop` share.

use super::cm::event_name;
use super::Endpoint;
use crate::channel::{Post, Wc, WcKind, WcStatus};
use rdma_sys::*;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

impl Endpoint {
    /// Reads one pending CM event without blocking; on DISCONNECTED (or any error event) moves the
    /// QP to the error state so in-flight work flushes instead of hanging. Returns the event name.
    pub fn poll_cm(&mut self) -> Option<String> {
        let ev = self.try_event()?;
        let name = event_name(ev.kind);
        if ev.kind == rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED
            || ev.kind == rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL
            || ev.kind == rdma_cm_event_type::RDMA_CM_EVENT_TIMEWAIT_EXIT
        {
            self.disconnect();
        }
        Some(name)
    }

    /// Disconnects (DREQ): the QP goes to the error state and posted work flushes.
    pub fn disconnect(&mut self) {
        if self.connected {
            // SAFETY: id is valid and connected.
            unsafe { rdma_disconnect(self.id) };
            self.connected = false;
        }
    }

    /// Stops the channel at once without a word on the wire: the QP goes to the error state (a
    /// local verb, no CM message), and its flushed completions are drained. From then on the target
    /// can neither read nor write the registered buffers through this QP and no completion arrives,
    /// so commands can be re-issued elsewhere or failed. The CM disconnect waits for [`Endpoint::close`]
    /// (or the drop): sent while the fabric is down, CM messages can wedge the port's CM (rxe).
    pub fn quiesce(&mut self) {
        self.chain.clear();
        if !self.qp_created || self.quiesced {
            return;
        }
        // SAFETY: ibv_qp_attr is a plain C struct; all-zero plus the state is a valid request.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: id has a live QP (qp_created); attr is valid for the call.
        let rc = unsafe {
            ibv_modify_qp(
                (*self.id).qp,
                &mut attr,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
            )
        };
        if rc != 0 {
            // cannot stop it locally: tear everything down instead
            self.close();
            return;
        }
        self.drain();
        self.quiesced = true;
    }

    /// Polls flushed completions away (bounded, so a wedged device cannot hang us).
    fn drain(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut wcs = [Wc {
            kind: WcKind::Send,
            id: 0,
            len: 0,
            status: WcStatus::Ok,
        }; 32];
        while Instant::now() < deadline {
            match self.poll(&mut wcs) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }

    /// Tears the channel down now, in order (disconnect, drain the flushes, destroy the QP, deregister
    /// this login's memory regions, destroy the CQ, let go of the
    /// protection domain, destroy the CM id), as dropping does; idempotent. Afterwards
    /// nothing the target does can reach the registered buffers, no completion arrives, posting fails
    /// and polling finds nothing: a channel that went down can be failed or re-issued safely.
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        let _l = crate::rdma::lifecycle();
        self.disconnect();
        if self.qp_created {
            self.drain();
            // a bound window holds a reference on the QP: they go first
            self.free_windows();
            // SAFETY: id has a QP created by rdma_create_qp.
            unsafe { rdma_destroy_qp(self.id) };
            self.qp_created = false;
        }
        self.free_windows();
        for mr in [self.iu_mr, self.scratch_mr] {
            if !mr.is_null() {
                // SAFETY: mr is a valid MR of ours, deregistered once; the QP using it is gone.
                unsafe { ibv_dereg_mr(mr) };
            }
        }
        (self.iu_mr, self.scratch_mr) = (null_mut(), null_mut());
        // the windows are gone: the data buffers' regions can go when the path lets go too
        self.data = None;
        while self.take_cq_event() {}
        for cq in [&mut self.send_cq, &mut self.recv_cq] {
            if !cq.is_null() {
                // SAFETY: cq is valid, its QP is destroyed and every event is acked.
                unsafe { ibv_destroy_cq(*cq) };
                *cq = null_mut();
            }
        }
        if !self.comp.is_null() {
            // SAFETY: comp is valid and no CQ uses it any more.
            unsafe { ibv_destroy_comp_channel(self.comp) };
            self.comp = null_mut();
        }
        // nothing of this login is on the domain any more (a path's registration may still be)
        self.domain = None;
        if !self.id.is_null() {
            while self.try_event().is_some() {}
            // SAFETY: id is valid, its QP is destroyed and all its events are acked.
            unsafe { rdma_destroy_id(self.id) };
            self.id = null_mut();
        }
        if !self.ec.is_null() {
            // SAFETY: ec is valid and has no ids left.
            unsafe { rdma_destroy_event_channel(self.ec) };
            self.ec = null_mut();
        }
        self.closed = true;
    }

    /// Whether the RDMA device under this endpoint is being removed (`rdma link delete`, a driver
    /// unload): its uverbs node is gone from sysfs. (The CM's DEVICE_REMOVAL event can come before
    /// that, while librdmacm still sees the device and would keep its handle.)
    pub fn device_removed(&self) -> bool {
        !self.dev_path.as_os_str().is_empty() && !self.dev_path.exists()
    }

    /// Closes this endpoint now if its device is being removed (see [`Endpoint::device_removed`]);
    /// returns whether it did. The kernel finishes a removal only once every user has closed the
    /// device; librdmacm (44) keeps a handle of its own on every device it has used and lets go of
    /// it only when it re-reads its device list, which `rdma_get_devices` does -- and that call,
    /// tried in session 4, left librdmacm's list empty with devices present after a second removal,
    /// and its next initialisation deadlocked on its own lock. So the removal completes only when
    /// this process image ends: the ublk daemon then hands its device over to a fresh image of
    /// itself (`frontend::ublk`, [`crate::session::detached_channels`]).
    pub fn release_if_removed(&mut self) -> bool {
        if self.closed || !self.device_removed() {
            return false;
        }
        tracing::warn!(
            "RDMA device {} is being removed: releasing this channel",
            self.device
        );
        self.close();
        true
    }

    /// Whether [`Endpoint::close`] or [`Endpoint::quiesce`] stopped the channel.
    pub fn is_stopped(&self) -> bool {
        self.closed || self.quiesced
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.close();
    }
}
