//! The target side of an RDMA/CM connection, for test targets (the lab's hostile SRP target):
//! listen, take a connection request with its private data, accept or reject it, then exchange
//! IUs and move data with RDMA WRITE and READ against the initiator's descriptors. Synchronous and
//! single-threaded: a data transfer or a SEND is posted and its completion waited for, receives
//! that complete meanwhile are kept in order. Built with the `lab-target` feature only.

use super::endpoint::{event_name, set_nonblocking, take_event, wait_readable, CmEvent};
use super::{sockaddr, RdmaError};
use rdma_sys::*;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

/// Bytes of one receive buffer: the largest IU a peer may send (an SRP_CMD with 8 KiB of
/// immediate data).
pub const RECV_BYTES: usize = 8260;
const NR_RECV: usize = 64;
const SEND_BYTES: usize = 4096;
/// The data staging area: transfers are done in pieces of this size.
const DATA_BYTES: usize = 1 << 20;
const WR_RECV: u64 = 1 << 32;
const WR_OP: u64 = 2 << 32;
/// How long a posted SEND, WRITE or READ may take before the peer counts as gone.
const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// A listening RDMA/CM id and its event channel.
pub struct Listener {
    ec: *mut rdma_event_channel,
    id: *mut rdma_cm_id,
}

/// What the listener's event channel said.
pub enum Incoming {
    /// A connection request: the peer (queues set up, receives posted) and its private data.
    Request(Peer, Vec<u8>),
    /// Any other event (ESTABLISHED, DISCONNECTED, ...), by name, and whether it ends a connection.
    Event {
        /// The event's name.
        name: String,
        /// DISCONNECTED, or an error that ends the connection.
        ends: bool,
        /// The connection it is about ([`Peer::conn`]).
        conn: usize,
    },
}

/// A work completion that did not succeed, or an operation that never completed.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {status}")]
pub struct OpFailed {
    /// The operation.
    pub op: &'static str,
    /// The completion status (e.g. "remote access error"), or why there was none.
    pub status: String,
}

/// Where a posted operation is.
enum OpState {
    /// No completion yet.
    Pending,
    /// Completed successfully.
    Done,
    /// Completed with this status.
    Failed(String),
}

// SAFETY: the CM objects may be used from any thread; a Listener is owned by one thread.
unsafe impl Send for Listener {}

impl Listener {
    /// Listens on `addr` (an address of an RDMA device, e.g. soft-RoCE's netdev address).
    pub fn bind(addr: SocketAddr) -> Result<Listener, RdmaError> {
        // SAFETY: plain constructor; null is checked.
        let ec = unsafe { rdma_create_event_channel() };
        if ec.is_null() {
            return Err(RdmaError::os("rdma_create_event_channel"));
        }
        let mut l = Listener { ec, id: null_mut() };
        // SAFETY: ec is valid.
        set_nonblocking(unsafe { (*ec).fd })?;
        // SAFETY: ec is valid; id is an out-parameter.
        if unsafe { rdma_create_id(ec, &mut l.id, null_mut(), rdma_port_space::RDMA_PS_TCP) } != 0 {
            return Err(RdmaError::os("rdma_create_id"));
        }
        let mut ss = sockaddr::ip_sockaddr(addr);
        // SAFETY: id is valid; ss is an initialized sockaddr that outlives the call.
        if unsafe { rdma_bind_addr(l.id, &mut ss as *mut _ as *mut libc::sockaddr) } != 0 {
            return Err(RdmaError::os("rdma_bind_addr"));
        }
        // SAFETY: id is bound.
        if unsafe { rdma_listen(l.id, 16) } != 0 {
            return Err(RdmaError::os("rdma_listen"));
        }
        Ok(l)
    }

    /// The next CM event, waiting at most `timeout`.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Incoming>, RdmaError> {
        // SAFETY: ec is valid until drop.
        if !wait_readable(unsafe { (*self.ec).fd }, timeout) {
            return Ok(None);
        }
        // SAFETY: ec is valid until drop, and non-blocking.
        let Some(CmEvent {
            kind, id, private, ..
        }) = (unsafe { take_event(self.ec) })
        else {
            return Ok(None);
        };
        if kind == rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
            return Ok(Some(Incoming::Request(Peer::new(id)?, private)));
        }
        let name = event_name(kind);
        let ends = !matches!(
            kind,
            rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED
                | rdma_cm_event_type::RDMA_CM_EVENT_TIMEWAIT_EXIT
        );
        Ok(Some(Incoming::Event {
            name,
            ends,
            conn: id as usize,
        }))
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if !self.id.is_null() {
            // SAFETY: id is ours; every event was acked when read.
            unsafe { rdma_destroy_id(self.id) };
        }
        // SAFETY: ec is ours and has no ids left.
        unsafe { rdma_destroy_event_channel(self.ec) };
    }
}

/// One accepted (or about to be) connection's queues and buffers.
pub struct Peer {
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    mr: *mut ibv_mr,
    /// Receive buffers, then the send buffer, then the data staging area.
    mem: Box<[u8]>,
    recvd: VecDeque<Vec<u8>>,
    qp: bool,
}

// SAFETY: as for Listener: verbs objects may be used from any thread; one thread owns a Peer.
unsafe impl Send for Peer {}

impl Peer {
    fn new(id: *mut rdma_cm_id) -> Result<Peer, RdmaError> {
        let mut p = Peer {
            id,
            pd: null_mut(),
            cq: null_mut(),
            mr: null_mut(),
            mem: vec![0u8; NR_RECV * RECV_BYTES + SEND_BYTES + DATA_BYTES].into_boxed_slice(),
            recvd: VecDeque::new(),
            qp: false,
        };
        // SAFETY: a connect request's id has its device context set.
        let ctx = unsafe { (*id).verbs };
        // SAFETY: ctx is valid.
        p.pd = unsafe { ibv_alloc_pd(ctx) };
        if p.pd.is_null() {
            return Err(RdmaError::os("ibv_alloc_pd"));
        }
        // SAFETY: ctx is valid; no completion channel (the CQ is polled).
        p.cq = unsafe { ibv_create_cq(ctx, (NR_RECV + 64) as i32, null_mut(), null_mut(), 0) };
        if p.cq.is_null() {
            return Err(RdmaError::os("ibv_create_cq"));
        }
        // SAFETY: ibv_qp_init_attr is a plain C struct; all-zero is a valid start.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = p.cq;
        attr.recv_cq = p.cq;
        attr.cap.max_send_wr = 64;
        attr.cap.max_recv_wr = NR_RECV as u32;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 1;
        // SAFETY: id, pd and attr (with a valid CQ) are valid.
        if unsafe { rdma_create_qp(id, p.pd, &mut attr) } != 0 {
            return Err(RdmaError::os("rdma_create_qp"));
        }
        p.qp = true;
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
        // SAFETY: pd is valid; mem is owned by the Peer and outlives the MR (deregistered in drop).
        p.mr = unsafe { ibv_reg_mr(p.pd, p.mem.as_mut_ptr().cast(), p.mem.len(), access) };
        if p.mr.is_null() {
            return Err(RdmaError::os("ibv_reg_mr"));
        }
        for i in 0..NR_RECV {
            p.post_recv(i)?;
        }
        Ok(p)
    }

    fn post_recv(&mut self, i: usize) -> Result<(), RdmaError> {
        let mut sge = ibv_sge {
            addr: self.mem[i * RECV_BYTES..].as_ptr() as u64,
            length: RECV_BYTES as u32,
            // SAFETY: mr is valid.
            lkey: unsafe { (*self.mr).lkey },
        };
        let mut wr = ibv_recv_wr {
            wr_id: WR_RECV | i as u64,
            next: null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = null_mut();
        // SAFETY: the QP is valid; the buffer is registered and not read until its completion.
        if unsafe { ibv_post_recv((*self.id).qp, &mut wr, &mut bad) } != 0 {
            return Err(RdmaError::os("ibv_post_recv"));
        }
        Ok(())
    }

    /// Which connection this is (what [`Incoming::Event`] names).
    pub fn conn(&self) -> usize {
        self.id as usize
    }

    /// Accepts the connection, answering with `private` (an SRP_LOGIN_RSP).
    pub fn accept(&mut self, private: &[u8]) -> Result<(), RdmaError> {
        // SAFETY: rdma_conn_param is a plain C struct; all-zero is a valid start.
        let mut cp: rdma_conn_param = unsafe { std::mem::zeroed() };
        cp.private_data = private.as_ptr().cast();
        cp.private_data_len = private.len() as u8;
        cp.responder_resources = 4;
        cp.initiator_depth = 4;
        cp.rnr_retry_count = 7;
        // SAFETY: id has a QP; cp and its private data live across the call (copied).
        if unsafe { rdma_accept(self.id, &mut cp) } != 0 {
            return Err(RdmaError::os("rdma_accept"));
        }
        Ok(())
    }

    /// Rejects the connection with `private` (an SRP_LOGIN_REJ).
    pub fn reject(self, private: &[u8]) {
        // SAFETY: id is a connect request's id; the private data lives across the call.
        unsafe { rdma_reject(self.id, private.as_ptr().cast(), private.len() as u8) };
    }

    /// Polls completions once; receives are kept, and the outcome of operation `want` is returned.
    fn poll(&mut self, want: Option<u64>) -> Result<OpState, OpFailed> {
        // SAFETY: ibv_wc is a plain C struct; all-zero is a valid placeholder.
        let mut wcs: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
        // SAFETY: cq is valid; wcs has room for 16.
        let n = unsafe { ibv_poll_cq(self.cq, 16, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(OpFailed {
                op: "ibv_poll_cq",
                status: std::io::Error::from_raw_os_error(-n).to_string(),
            });
        }
        let mut out = OpState::Pending;
        for w in &wcs[..n as usize] {
            let ok = w.status == ibv_wc_status::IBV_WC_SUCCESS;
            if w.wr_id & WR_RECV != 0 {
                if ok {
                    let i = (w.wr_id & 0xffff) as usize;
                    let len = (w.byte_len as usize).min(RECV_BYTES);
                    self.recvd
                        .push_back(self.mem[i * RECV_BYTES..i * RECV_BYTES + len].to_vec());
                    let _ = self.post_recv(i);
                }
            } else if Some(w.wr_id) == want {
                out = if ok {
                    OpState::Done
                } else {
                    OpState::Failed(status_str(w.status))
                };
            }
        }
        Ok(out)
    }

    /// The next IU the initiator sent, waiting at most `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, OpFailed> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(iu) = self.recvd.pop_front() {
                return Ok(Some(iu));
            }
            self.poll(None)?;
            if self.recvd.is_empty() {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Posts one work request (on the staging area or the send buffer) and waits for it.
    fn run(
        &mut self,
        op: &'static str,
        mut wr: ibv_send_wr,
        mut sge: ibv_sge,
    ) -> Result<(), OpFailed> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = WR_OP | NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & 0xffff_ffff;
        wr.wr_id = id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad = null_mut();
        // SAFETY: the QP is valid; the gather entry names registered memory of ours that is not
        // touched until the completion this function waits for.
        if unsafe { ibv_post_send((*self.id).qp, &mut wr, &mut bad) } != 0 {
            return Err(OpFailed {
                op,
                status: std::io::Error::last_os_error().to_string(),
            });
        }
        let deadline = Instant::now() + OP_TIMEOUT;
        loop {
            match self.poll(Some(id))? {
                OpState::Done => return Ok(()),
                OpState::Failed(status) => return Err(OpFailed { op, status }),
                OpState::Pending if Instant::now() >= deadline => {
                    return Err(OpFailed {
                        op,
                        status: "no completion in 10 s".into(),
                    })
                }
                OpState::Pending => std::thread::sleep(Duration::from_micros(50)),
            }
        }
    }

    fn sge(&self, off: usize, len: usize) -> ibv_sge {
        ibv_sge {
            addr: self.mem[off..].as_ptr() as u64,
            length: len as u32,
            // SAFETY: mr is valid.
            lkey: unsafe { (*self.mr).lkey },
        }
    }

    /// Sends `iu` to the initiator.
    pub fn send(&mut self, iu: &[u8]) -> Result<(), OpFailed> {
        let off = NR_RECV * RECV_BYTES;
        let len = iu.len().min(SEND_BYTES);
        self.mem[off..off + len].copy_from_slice(&iu[..len]);
        // SAFETY: ibv_send_wr is a plain C struct; all-zero is valid before the fields are set.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        let sge = self.sge(off, len);
        self.run("SEND", wr, sge)
    }

    /// RDMA-writes `data` at `va` under `rkey` (in pieces of the staging area's size).
    pub fn write(&mut self, data: &[u8], va: u64, rkey: u32) -> Result<(), OpFailed> {
        let base = NR_RECV * RECV_BYTES + SEND_BYTES;
        for (i, chunk) in data.chunks(DATA_BYTES).enumerate() {
            self.mem[base..base + chunk.len()].copy_from_slice(chunk);
            // SAFETY: as in `send`.
            let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
            wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            wr.wr.rdma = rdma_t {
                remote_addr: va + (i * DATA_BYTES) as u64,
                rkey,
            };
            let sge = self.sge(base, chunk.len());
            self.run("RDMA WRITE", wr, sge)?;
        }
        Ok(())
    }

    /// RDMA-reads `len` bytes at `va` under `rkey`.
    pub fn read(&mut self, va: u64, rkey: u32, len: usize) -> Result<Vec<u8>, OpFailed> {
        let base = NR_RECV * RECV_BYTES + SEND_BYTES;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let n = (len - out.len()).min(DATA_BYTES);
            // SAFETY: as in `send`.
            let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
            wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
            wr.wr.rdma = rdma_t {
                remote_addr: va + out.len() as u64,
                rkey,
            };
            let sge = self.sge(base, n);
            self.run("RDMA READ", wr, sge)?;
            out.extend_from_slice(&self.mem[base..base + n]);
        }
        Ok(out)
    }
}

fn status_str(s: ibv_wc_status::Type) -> String {
    // SAFETY: ibv_wc_status_str returns a static string for any value.
    unsafe { std::ffi::CStr::from_ptr(ibv_wc_status_str(s)) }
        .to_string_lossy()
        .into_owned()
}

impl Drop for Peer {
    fn drop(&mut self) {
        // SAFETY: each object is ours and destroyed once, the QP first (nothing is posted after).
        unsafe {
            rdma_disconnect(self.id);
            if self.qp {
                rdma_destroy_qp(self.id);
            }
            if !self.mr.is_null() {
                ibv_dereg_mr(self.mr);
            }
            if !self.cq.is_null() {
                ibv_destroy_cq(self.cq);
            }
            if !self.pd.is_null() {
                ibv_dealloc_pd(self.pd);
            }
            rdma_destroy_id(self.id);
        }
    }
}
