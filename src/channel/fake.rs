//! An in-process SRP target behind the [`Transport`](super::Transport) traits, for fast deterministic
//! tests and fault injection (what the lab cannot trigger on demand). It executes SRP_CMDs against a RAM disk: READ(16),
//! WRITE(16), SYNCHRONIZE CACHE(16), UNMAP, WRITE SAME(16), TEST UNIT READY, READ CAPACITY(16).
//!
//! Data buffers are owned by the fake ([`FakeTarget::alloc`]): a descriptor's `key` names the buffer
//! and `va - addr` is the offset, so no raw memory is touched. With [`RkeyScope::Command`] (the
//! default, as in production) the target reaches a buffer only through the window the engine opens
//! per command ([`Memory::open_window`]), in its direction and range, until it is closed; a
//! remote access outside one fails the way a real HCA fails it (the QP goes to the error state).

use super::{
    DataBuf, Login, Memory, PortDown, Post, RemoteAccess, TransportCause, TransportError, Wc,
    WcKind, WcStatus,
};
use crate::rdma::Lent;
use crate::wire::scsi::cdb::op;
use crate::wire::srp::{
    parse_initiator_iu, AerReq, CredReq, DataDesc, DirectBuf, InitiatorIu, RspFlags, ScsiLun,
    SrpRsp, TLogout, TLogoutReason, TskMgmtFunc,
};
use crate::wire::target::RkeyScope;
use std::collections::VecDeque;

mod faults;
mod fds;
mod scsi;

pub use faults::Faults;

/// The fake target.
pub struct FakeTarget {
    /// The disk.
    pub disk: Vec<u8>,
    /// Logical block size.
    pub block: u32,
    /// Faults to inject.
    pub faults: Faults,
    /// Commands received (CDB opcode, SRP tag), in order.
    pub log: Vec<(u8, u64)>,
    /// The logical unit each command of [`FakeTarget::log`] addressed.
    pub luns: Vec<ScsiLun>,
    /// Small IUs received (opcode, tag): CRED_RSP, AER_RSP, I_LOGOUT.
    pub small_ius: Vec<(u8, u64)>,
    /// Task management requests received (function, task tag).
    pub tmfs: Vec<(TskMgmtFunc, u64)>,
    /// The logical unit each of [`FakeTarget::tmfs`] named.
    pub tmf_luns: Vec<ScsiLun>,
    imm_data_offset: usize,
    send_slots: Vec<Vec<u8>>,
    recv: Vec<Vec<u8>>,
    recv_posted: Vec<bool>,
    bufs: Vec<Vec<u8>>,
    /// Tag buffers registered by [`Memory::register`] or adopted: (first key, how many,
    /// the memory).
    tag_bufs: Vec<(u32, u32, Lent)>,
    next_tag_key: u32,
    /// The simulated RDMA device: a registration made on one serves a login on the same one.
    pub device: u32,
    /// Registrations made ([`Memory::register`]), by this login and its predecessors.
    pub registrations: u32,
    cq: VecDeque<Wc>,
    outbox: VecDeque<Vec<u8>>,
    held: Vec<Vec<u8>>,
    /// SENDs queued by `post_send` for the next `flush_sends` (slot, length, immediate data,
    /// signalled).
    chain: Vec<QueuedSend>,
    /// SENDs executed, and how many of them were signalled.
    pub sends: (u32, u32),
    held_send_wcs: Vec<Wc>,
    armed: bool,
    /// Whether the last arm asked for send completions too.
    pub armed_sends: bool,
    stopped: bool,
    /// Closed by [`Login::release_if_removed`].
    pub released: bool,
    /// How long the target may reach a buffer.
    pub rkey_scope: RkeyScope,
    /// The last direct descriptor a command carried (key, va, len): what a target would keep.
    pub last_direct: Option<(u32, u64, u32)>,
    /// The last indirect descriptor's buffers, if its table was inline whole.
    pub last_indirect: Option<Vec<DirectBuf>>,
    /// Remote accesses refused (no open window for the key, range or direction).
    pub access_errors: u32,
    /// Open windows, by tag and segment.
    windows: Vec<Vec<Option<FakeWindow>>>,
    /// The most data segments a command may have ([`Memory::max_segments`]).
    pub max_segs: u16,
    next_window_key: u32,
    /// Real fds to sleep on ([`FakeTarget::with_fds`]).
    fds: Option<Box<fds::Fds>>,
    /// The disk's file, in place of [`FakeTarget::disk`] ([`FakeTarget::with_file`]).
    file: Option<std::fs::File>,
}

/// Tag buffers registered on a fake device: their first key and memory.
pub struct FakeRegistration {
    device: u32,
    first: u32,
    keep: Lent,
}

/// A SEND queued for the next chain: slot, length, immediate data, signalled.
type QueuedSend = (u16, usize, Option<DataBuf>, bool);

/// One command's window: the key the target got opens `len` bytes at `va` of buffer `lkey`.
#[derive(Clone, Copy, Debug)]
struct FakeWindow {
    key: u32,
    lkey: u32,
    va: u64,
    len: u32,
    access: RemoteAccess,
}

const BUF_BASE: u64 = 1 << 40;
/// Keys of registered tag buffers start here (below: buffers from [`FakeTarget::alloc`]).
const TAG_KEY_BASE: u32 = 1 << 20;
/// Window keys start here; each bind gets a new one.
const WINDOW_KEY_BASE: u32 = 1 << 28;

impl FakeTarget {
    /// A target with a `disk_bytes` RAM disk, `slots` send slots and `nr_recv` posted receives.
    pub fn new(disk_bytes: usize, block: u32, slots: u16, nr_recv: u16) -> Self {
        FakeTarget {
            disk: vec![0; disk_bytes],
            block,
            faults: Faults::default(),
            log: Vec::new(),
            luns: Vec::new(),
            small_ius: Vec::new(),
            tmfs: Vec::new(),
            tmf_luns: Vec::new(),
            imm_data_offset: 68,
            send_slots: vec![vec![0; 8260]; usize::from(slots)],
            recv: vec![vec![0; 8260]; usize::from(nr_recv)],
            recv_posted: vec![true; usize::from(nr_recv)],
            bufs: Vec::new(),
            tag_bufs: Vec::new(),
            next_tag_key: TAG_KEY_BASE,
            device: 0,
            registrations: 0,
            cq: VecDeque::new(),
            outbox: VecDeque::new(),
            held: Vec::new(),
            chain: Vec::new(),
            sends: (0, 0),
            held_send_wcs: Vec::new(),
            armed: false,
            armed_sends: false,
            stopped: false,
            released: false,
            rkey_scope: RkeyScope::default(),
            last_direct: None,
            last_indirect: None,
            access_errors: 0,
            windows: Vec::new(),
            max_segs: 16,
            next_window_key: WINDOW_KEY_BASE,
            fds: None,
            file: None,
        }
    }

    /// This target with a completion channel and a connection manager fd a loop can sleep on
    /// (poll(2)); its successors get fds of their own.
    pub fn with_fds(mut self) -> Self {
        self.fds = Some(fds::Fds::new());
        self
    }

    /// The target disconnects the login (a DREQ): the connection manager's fd turns readable, and
    /// once the initiator reads the event its queue pair is in the error state (its receives
    /// complete flushed), as a real login's is.
    pub fn disconnect(&mut self) {
        if let Some(f) = &mut self.fds {
            f.cm_event("DISCONNECTED");
        }
    }

    /// Raises the completion channel when it is armed and a completion waits.
    fn kick(&mut self) {
        if let (true, false, Some(f)) = (self.armed, self.cq.is_empty(), &mut self.fds) {
            f.notify();
        }
    }

    /// A registered data buffer of `len` bytes owned by the fake.
    pub fn alloc(&mut self, len: u32) -> DataBuf {
        self.bufs.push(vec![0; len as usize]);
        let key = self.bufs.len() as u32;
        DataBuf {
            addr: BUF_BASE * u64::from(key),
            len,
            lkey: key,
            rkey: key,
        }
    }

    /// A new login to the same target (a reconnect): the successor takes over the disk and the
    /// registered buffers, with fresh queues, no faults and nothing in flight; this one keeps nothing
    /// (what the old channel had in flight is gone with it).
    pub fn successor(&mut self) -> FakeTarget {
        let mut t = FakeTarget::new(
            0,
            self.block,
            self.send_slots.len() as u16,
            self.recv.len() as u16,
        );
        t.disk = std::mem::take(&mut self.disk);
        t.file = self.file.take();
        t.bufs = std::mem::take(&mut self.bufs);
        // keys are never reused: a late access with an old registration's key fails
        t.next_tag_key = self.next_tag_key;
        (t.device, t.registrations) = (self.device, self.registrations);
        t.next_window_key = self.next_window_key;
        (t.rkey_scope, t.max_segs) = (self.rkey_scope, self.max_segs);
        if self.fds.is_some() {
            t.fds = Some(fds::Fds::new());
        }
        t
    }

    /// The bytes of a buffer from [`FakeTarget::alloc`].
    pub fn buf(&mut self, b: DataBuf) -> &mut [u8] {
        &mut self.bufs[b.lkey as usize - 1]
    }

    fn mem(&mut self, key: u32, va: u64, len: u32) -> Option<&mut [u8]> {
        let b = self.bufs.get_mut((key as usize).checked_sub(1)?)?;
        let off = va.checked_sub(BUF_BASE * u64::from(key))? as usize;
        b.get_mut(off..off.checked_add(len as usize)?)
    }

    /// The registered tag buffers `key` opens, if this login registered it.
    fn tag_mem(&self, key: u32) -> Option<&Lent> {
        self.tag_bufs
            .iter()
            .find(|(first, n, _)| (*first..*first + *n).contains(&key))
            .map(|(_, _, k)| k)
    }

    /// The buffer (local key) a remote `key` reaches for `len` bytes at `va` in direction
    /// `access`, if it reaches it: through an open window in command scope, by the registration's
    /// own key in login scope.
    fn remote(&self, key: u32, va: u64, len: u32, access: RemoteAccess) -> Option<u32> {
        if self.rkey_scope == RkeyScope::Login {
            return Some(key);
        }
        let w = self
            .windows
            .iter()
            .flatten()
            .flatten()
            .find(|w| w.key == key)?;
        let end = va.checked_add(u64::from(len))?;
        (w.access == access && va >= w.va && end <= w.va + u64::from(w.len)).then_some(w.lkey)
    }

    /// Reads `len` bytes at `va` of buffer `lkey` (a local gather, or a remote read let through).
    fn local_read(&mut self, lkey: u32, va: u64, len: u32) -> Option<Vec<u8>> {
        match self.tag_mem(lkey) {
            // SAFETY: the fake runs only inside the path's transport calls, while the path holds
            // no reference to its buffers' memory (it makes them only between those calls).
            Some(k) => unsafe { k.dma_read(va, len as usize) },
            None => self.mem(lkey, va, len).map(|m| m.to_vec()),
        }
    }

    /// The target's RDMA READ of `len` bytes at `va` under `key`.
    fn dma_read(&mut self, key: u32, va: u64, len: u32) -> Option<Vec<u8>> {
        let lkey = self.remote(key, va, len, RemoteAccess::Read)?;
        self.local_read(lkey, va, len)
    }

    /// The target's RDMA WRITE of `data` at `va` under `key` (at most `len` bytes are open).
    fn dma_write(&mut self, key: u32, va: u64, len: u32, data: &[u8]) -> bool {
        if data.len() > len as usize {
            return false;
        }
        let Some(lkey) = self.remote(key, va, data.len() as u32, RemoteAccess::Write) else {
            return false;
        };
        match self.tag_mem(lkey) {
            // SAFETY: as in `local_read`.
            Some(k) => unsafe { k.dma_write(va, data) },
            None => match self.mem(lkey, va, len) {
                Some(m) => {
                    m[..data.len()].copy_from_slice(data);
                    true
                }
                None => false,
            },
        }
    }

    /// An RDMA WRITE the target sends on its own (late, stray or hostile): lands if `key` reaches
    /// the range now; otherwise fails as on an HCA: a remote access error puts the QP in the error
    /// state, so the initiator's receives complete flushed and nothing more arrives.
    pub fn rdma_write(&mut self, key: u32, va: u64, data: &[u8]) -> bool {
        if self.dma_write(key, va, data.len() as u32, data) {
            return true;
        }
        self.access_errors += 1;
        self.stop();
        self.cq.push_back(Wc {
            kind: WcKind::Recv,
            id: 0,
            len: 0,
            status: WcStatus::Flushed,
        });
        false
    }

    /// Sends an IU to the initiator (delivered into the next posted receive).
    pub fn inject(&mut self, iu: Vec<u8>) {
        self.outbox.push_back(iu);
        self.deliver();
    }

    /// Sends SRP_CRED_REQ granting `delta` credits.
    pub fn send_cred_req(&mut self, delta: i32, tag: u64) {
        self.inject(
            CredReq {
                sol_not: 0,
                req_lim_delta: delta,
                tag,
            }
            .encode()
            .to_vec(),
        );
    }

    /// Sends SRP_AER_REQ with a unit attention.
    pub fn send_aer_req(&mut self, delta: i32, tag: u64) {
        let sense = [
            0x70, 0, 6, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x3f, 0x0e, 0, 0, 0, 0,
        ];
        let a = AerReq {
            sol_not: 0,
            req_lim_delta: delta,
            tag,
            lun: ScsiLun::from_int(0),
            sense: &sense,
        };
        let mut b = vec![0u8; 64];
        let n = a.encode(&mut b).expect("fits");
        b.truncate(n);
        self.inject(b);
    }

    /// Sends SRP_T_LOGOUT.
    pub fn send_t_logout(&mut self) {
        self.inject(
            TLogout {
                sol_not: 0,
                reason: TLogoutReason::Inactive,
                tag: 0,
            }
            .encode()
            .to_vec(),
        );
    }

    /// Delivers the held responses.
    pub fn release_held(&mut self) {
        let held = std::mem::take(&mut self.held);
        self.outbox.extend(held);
        self.deliver();
    }

    /// Delivers the held SEND completions.
    pub fn release_send_wcs(&mut self) {
        self.cq.extend(self.held_send_wcs.drain(..));
        self.kick();
    }

    /// Whether a completion notification was requested.
    pub fn armed(&self) -> bool {
        self.armed
    }

    /// Executes one SEND: the command's response (if any) and the send completion go to the CQ.
    fn send_now(&mut self, (slot, len, imm, signal): QueuedSend) -> Result<(), TransportError> {
        self.sends.0 += 1;
        self.sends.1 += u32::from(signal);
        let mut iu = self.send_slots[usize::from(slot)][..len].to_vec();
        if let Some(b) = imm {
            let data = self
                .local_read(b.lkey, b.addr, b.len)
                .ok_or(TransportError {
                    op: "fake post_send",
                    cause: TransportCause::UnknownKey(b.lkey),
                })?;
            iu.extend_from_slice(&data);
        }
        let rsp = self.execute(&iu);
        let send_wc = Wc {
            kind: WcKind::Send,
            id: slot,
            len: 0,
            status: WcStatus::Ok,
        };
        let send_wc =
            (signal && !std::mem::take(&mut self.faults.drop_next_send_wc)).then_some(send_wc);
        let send_wc = match send_wc {
            Some(wc) if self.faults.hold_send_wcs => {
                self.held_send_wcs.push(wc);
                None
            }
            wc => wc,
        };
        if !self.faults.rsp_before_send {
            self.cq.extend(send_wc);
        }
        if let Some(r) = rsp {
            if self.faults.hold_rsps {
                self.held.push(r);
            } else {
                self.outbox.push_back(r);
                self.deliver();
            }
        }
        if self.faults.rsp_before_send {
            self.cq.extend(send_wc);
        }
        Ok(())
    }

    fn deliver(&mut self) {
        while let Some(iu) = self.outbox.front() {
            let Some(idx) = self.recv_posted.iter().position(|&p| p) else {
                return;
            };
            self.recv_posted[idx] = false;
            let n = iu.len().min(self.recv[idx].len());
            self.recv[idx][..n].copy_from_slice(&iu[..n]);
            self.cq.push_back(Wc {
                kind: WcKind::Recv,
                id: idx as u16,
                len: n as u32,
                status: WcStatus::Ok,
            });
            self.outbox.pop_front();
        }
        self.kick();
    }

    fn respond(&mut self, tag: u64, status: u8, sense: &[u8], resid: u32, flags: u8) -> Vec<u8> {
        let r = SrpRsp {
            sol_not: 0,
            req_lim_delta: self.faults.delta_per_rsp.unwrap_or(1),
            tag,
            flags: RspFlags(flags),
            status,
            data_out_res_cnt: 0,
            data_in_res_cnt: resid,
            resp_data: &[],
            sense,
        };
        let mut b = vec![0u8; 256];
        let n = r.encode(&mut b).expect("fits");
        b.truncate(n);
        b
    }

    /// A GOOD SRP_RSP for `tag` (to inject as a late or duplicate response).
    pub fn respond_good(&mut self, tag: u64) -> Vec<u8> {
        self.respond(tag, 0, &[], 0, 0)
    }

    /// A task management response: RSPVALID with the response code in byte 3 (as LIO sends it).
    fn respond_tmf(&mut self, tag: u64, code: u8) -> Vec<u8> {
        let r = SrpRsp {
            sol_not: 0,
            req_lim_delta: 1,
            tag,
            flags: RspFlags(RspFlags::RSPVALID),
            status: 0,
            data_out_res_cnt: 0,
            data_in_res_cnt: 0,
            resp_data: &[0, 0, 0, code],
            sense: &[],
        };
        let mut b = vec![0u8; 64];
        let n = r.encode(&mut b).expect("fits");
        b.truncate(n);
        b
    }

    /// Executes one SRP_CMD; returns the SRP_RSP to send.
    fn execute(&mut self, iu: &[u8]) -> Option<Vec<u8>> {
        let p = match parse_initiator_iu(iu, self.imm_data_offset) {
            Ok(InitiatorIu::Cmd(p)) => p,
            Ok(InitiatorIu::TskMgmt(t)) => {
                self.tmfs.push((t.func, t.task_tag));
                self.tmf_luns.push(t.lun);
                let code = self.faults.tmf_answers.pop_front().unwrap_or(Some(0))?;
                return Some(self.respond_tmf(t.tag, code));
            }
            Ok(InitiatorIu::ILogout(t))
            | Ok(InitiatorIu::CredRsp(t))
            | Ok(InitiatorIu::AerRsp(t)) => {
                self.small_ius.push((t.opcode, t.tag));
                return None;
            }
            Err(_) => return Some(self.respond(0, 0x02, &sense(0x05, 0x24, 0), 0, 0)),
        };
        let c = &p.cmd;
        self.log.push((c.cdb[0], c.tag));
        self.luns.push(c.lun);
        if let (DataDesc::Direct(d), _) | (_, DataDesc::Direct(d)) = (c.data_in, c.data_out) {
            self.last_direct = Some((d.key, d.va, d.len));
        }
        if let (d @ DataDesc::Indirect { .. }, _) | (_, d @ DataDesc::Indirect { .. }) =
            (c.data_in, c.data_out)
        {
            self.last_indirect = scsi::direct_bufs(&d);
        }
        if let Some(injected) = self.injected_fault(c.tag) {
            return injected;
        }
        if self.faults.refuse.contains(&c.cdb[0]) {
            return Some(self.respond(c.tag, 2, &sense(5, 0x20, 0), 0, 0));
        }
        Some(match c.cdb[0] {
            op::READ_16 => self.read_16(c),
            op::WRITE_16 | op::WRITE_SAME_16 | op::UNMAP => self.write(c, p.immediate),
            op::SYNCHRONIZE_CACHE_16 | op::TEST_UNIT_READY => self.respond(c.tag, 0, &[], 0, 0),
            _ => self.respond(c.tag, 2, &sense(5, 0x20, 0), 0, 0),
        })
    }

    /// The next injected fault for command `tag`, if one is due: its response dropped
    /// (`Some(None)`), BUSY, or a CHECK CONDITION with the queued sense.
    fn injected_fault(&mut self, tag: u64) -> Option<Option<Vec<u8>>> {
        if self.faults.drop_next_rsp {
            self.faults.drop_next_rsp = false;
            return Some(None);
        }
        if self.faults.busy_next > 0 {
            self.faults.busy_next -= 1;
            return Some(Some(self.respond(tag, 0x08, &[], 0, 0)));
        }
        let (k, a, q) = self.faults.check_condition.pop_front()?;
        Some(Some(self.respond(tag, 0x02, &sense(k, a, q), 0, 0)))
    }
}

/// Fixed-format sense bytes.
pub fn sense(key: u8, asc: u8, ascq: u8) -> Vec<u8> {
    crate::wire::scsi::sense::fixed_sense(key, asc, ascq).to_vec()
}

impl Post for FakeTarget {
    fn send_buf(&mut self, slot: u16) -> &mut [u8] {
        &mut self.send_slots[usize::from(slot)]
    }

    fn post_send(
        &mut self,
        slot: u16,
        len: usize,
        imm: Option<DataBuf>,
        signal: bool,
    ) -> Result<(), TransportError> {
        self.chain.push((slot, len, imm, signal));
        Ok(())
    }

    fn flush_sends(&mut self) -> Result<(), TransportError> {
        let chain = std::mem::take(&mut self.chain);
        let fail_at = self.faults.fail_post_at.take();
        for (i, send) in chain.into_iter().enumerate() {
            if fail_at == Some(i) {
                return Err(TransportError {
                    op: "fake post_send",
                    cause: TransportCause::Injected(i),
                });
            }
            self.send_now(send)?;
        }
        self.kick();
        Ok(())
    }

    fn recv_buf(&self, idx: u16) -> &[u8] {
        &self.recv[usize::from(idx)]
    }

    fn post_recv(&mut self, idx: u16) -> Result<(), TransportError> {
        self.recv_posted[usize::from(idx)] = true;
        self.deliver();
        Ok(())
    }

    fn nr_recv(&self) -> u16 {
        self.recv.len() as u16
    }

    fn poll(&mut self, out: &mut [Wc]) -> Result<usize, TransportError> {
        let n = out.len().min(self.cq.len());
        for (slot, wc) in out.iter_mut().zip(self.cq.drain(..n)) {
            *slot = wc;
        }
        Ok(n)
    }

    fn arm(&mut self, sends: bool) -> Result<(), TransportError> {
        if std::mem::take(&mut self.faults.break_on_arm) {
            // it lands just before the arm, and the arm never fires (a QP in the error state
            // completes nothing more)
            self.armed = false;
            self.inject(vec![0xc1, 0, 0]);
            return Ok(());
        }
        (self.armed, self.armed_sends) = (true, sends);
        self.kick();
        Ok(())
    }

    fn notify_fd(&self) -> Option<std::os::fd::RawFd> {
        self.fds.as_ref().map(|f| f.cq_fd())
    }

    fn ack_notify(&mut self) -> Result<(), TransportError> {
        self.armed = false;
        if let Some(f) = &mut self.fds {
            f.ack();
        }
        Ok(())
    }
}

impl Memory for FakeTarget {
    type Lent = Lent;
    type Registered = FakeRegistration;

    fn register(&mut self, mem: &Lent) -> Result<(FakeRegistration, Vec<DataBuf>), TransportError> {
        let first = self.next_tag_key;
        let keep = mem.clone();
        let n = keep.len() as u32;
        self.next_tag_key += n;
        self.registrations += 1;
        self.tag_bufs.push((first, n, keep.clone()));
        let descs = mem
            .regions()
            .zip(first..)
            .flat_map(|((addr, len), key)| DataBuf::spans(addr, len, key, key))
            .collect();
        let reg = FakeRegistration {
            device: self.device,
            first,
            keep,
        };
        Ok((reg, descs))
    }

    fn adopt(&mut self, reg: &FakeRegistration) -> bool {
        if reg.device != self.device {
            return false;
        }
        let n = reg.keep.len() as u32;
        self.tag_bufs.push((reg.first, n, reg.keep.clone()));
        true
    }

    fn release_bufs(&mut self) {
        self.tag_bufs.clear();
    }

    fn open_window(
        &mut self,
        win: u16,
        seg: u16,
        buf: DataBuf,
        access: RemoteAccess,
    ) -> Result<DataBuf, TransportError> {
        if self.rkey_scope == RkeyScope::Login || buf.len == 0 {
            return Ok(buf);
        }
        let key = self.next_window_key;
        self.next_window_key += 1;
        let (i, s) = (usize::from(win), usize::from(seg));
        if self.windows.len() <= i {
            self.windows.resize(i + 1, Vec::new());
        }
        if self.windows[i].len() <= s {
            self.windows[i].resize(s + 1, None);
        }
        self.windows[i][s] = Some(FakeWindow {
            key,
            lkey: buf.lkey,
            va: buf.addr,
            len: buf.len,
            access,
        });
        Ok(DataBuf { rkey: key, ..buf })
    }

    fn close_window(&mut self, win: u16) {
        if let Some(w) = self.windows.get_mut(usize::from(win)) {
            w.fill(None);
        }
    }

    fn max_segments(&self) -> u16 {
        self.max_segs
    }
}

impl Login for FakeTarget {
    fn cm_fd(&self) -> Option<std::os::fd::RawFd> {
        self.fds.as_ref().map(|f| f.cm_fd())
    }

    fn poll_cm(&mut self) -> Option<String> {
        let ev = self.fds.as_mut()?.next_event()?;
        if ev == "DISCONNECTED" {
            // rdma_disconnect: the queue pair goes to the error state, posted receives flush
            self.outbox.clear();
            self.cq.push_back(Wc {
                kind: WcKind::Recv,
                id: 0,
                len: 0,
                status: WcStatus::Flushed,
            });
            self.kick();
        }
        Some(ev.to_string())
    }

    fn stop(&mut self) {
        self.stopped = true;
        // what was in flight is gone with the login
        self.outbox.clear();
        self.held.clear();
        self.chain.clear();
        self.held_send_wcs.clear();
    }

    fn is_stopped(&self) -> bool {
        self.stopped || self.released
    }

    fn removing(&self) -> bool {
        self.faults.removed && !self.released
    }

    fn release_if_removed(&mut self) -> bool {
        if !self.faults.removed || self.released {
            return false;
        }
        self.released = true;
        self.tag_bufs.clear();
        true
    }

    fn link_down(&mut self) -> Option<PortDown> {
        self.faults.link_down.then(|| PortDown {
            device: "fake".into(),
            port: 1,
            state: "1: DOWN".into(),
        })
    }
}
