//! A hostile SRP target for the lab: it accepts srp-ublk's logins over RDMA/CM on a soft-RoCE
//! address, serves a RAM disk (TEST UNIT READY, INQUIRY, READ CAPACITY(16), READ(16), WRITE(16),
//! SYNCHRONIZE CACHE(16)), and misbehaves the way `--case` says, once per process:
//!
//! - `none`: behaves.
//! - `late-write`: when a READ(16) of at least `--min-bytes` (64 KiB) arrives for a buffer an
//!   earlier read already completed in, it RDMA-writes the data, then garbage ("HOSTILE!") under
//!   the earlier read's key, then answers.
//! - `stale-read`: when a WRITE(16) of at least `--min-bytes` arrives for a buffer an earlier read
//!   completed in, it first RDMA-reads that buffer under the earlier read's key.
//!
//! and, on the first READ(16) of at least `--min-bytes`, with the IUs it sends:
//!
//! - `wrong-tag`: answers a tag the initiator never sent first, then the right one;
//! - `stale-tag`: answers the tag of the last completed command first, then the right one;
//! - `twice`: answers the command twice;
//! - `overlong`: answers with an SRP_RSP whose sense length runs past the IU (and nothing else);
//! - `credits`: every answer grants 2^30 credits (req_lim would overflow);
//! - `flood`: after its answer, sends 300 SRP_CRED_REQ and 300 SRP_AER_REQ;
//! - `idle-aer`: once the initiator has sent nothing for a second after that read, sends one
//!   SRP_AER_REQ (an idle initiator must still notice what its target sends);
//! - `logout`: sends SRP_T_LOGOUT right after every login (this one on every login);
//! - `silent`: answers no command at all (on every login).
//! - `lba-status`: (with `--thin`) answers every GET LBA STATUS with an extent that starts past
//!   the block asked for and calls it deallocated, then one that goes back to it.
//!
//! With `--thin` the disk is thin provisioned (READ CAPACITY(16) LBPME and LBPRZ): a block is
//! mapped once written, and GET LBA STATUS answers which blocks are.
//!
//! (The size keeps the attack off the kernel's 4 KiB partition-table reads, which land in the page
//! cache, and on the test's own 64 KiB direct reads and writes.)
//!
//! Every access it attempts is logged on stderr with its outcome ("landed", or "refused: remote
//! access error"), which the lab test asserts on. After a refused access the connection is gone
//! (its QP is in the error state); the initiator logs in again and this target serves it.
//!
//! Run: `hostile_target --listen 10.77.0.1:5556 --case late-write [--mib 64] [--min-bytes N]
//! [--thin]` (the lab builds it with `cargo build --release --features lab-target --example
//! hostile_target`).

use srp_ublk::rdma::listener::{Incoming, Listener, OpFailed, Peer, RECV_BYTES};
use srp_ublk::wire::srp::{
    parse_initiator_iu, AerReq, BufFormats, CredReq, DataDesc, DirectBuf, InitiatorIu, LoginReq,
    LoginRsp, RspFlags, ScsiLun, SrpRsp, TLogout, TLogoutReason, TskMgmt,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const BLOCK: u64 = 512;
const IMM_DATA_OFFSET: usize = 68;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Case {
    None,
    LateWrite,
    StaleRead,
    WrongTag,
    StaleTag,
    Twice,
    Overlong,
    Credits,
    Flood,
    IdleAer,
    Logout,
    Silent,
    LbaStatus,
}

const CASES: [(&str, Case); 13] = [
    ("none", Case::None),
    ("late-write", Case::LateWrite),
    ("stale-read", Case::StaleRead),
    ("wrong-tag", Case::WrongTag),
    ("stale-tag", Case::StaleTag),
    ("twice", Case::Twice),
    ("overlong", Case::Overlong),
    ("credits", Case::Credits),
    ("flood", Case::Flood),
    ("idle-aer", Case::IdleAer),
    ("logout", Case::Logout),
    ("silent", Case::Silent),
    ("lba-status", Case::LbaStatus),
];

struct Target {
    disk: Vec<u8>,
    case: Case,
    /// The key of the last completed read into each buffer (by its address).
    read_keys: HashMap<u64, u32>,
    attacked: bool,
    /// The least transfer an attack is made on.
    min_bytes: u32,
    /// The tag of the last command answered.
    last_tag: Option<u64>,
    /// Thin provisioned: which blocks a write has mapped.
    mapped: Option<Vec<bool>>,
    /// When the initiator last sent an IU.
    last_iu: Instant,
    /// `idle-aer`: the event is still to be sent.
    aer_due: bool,
}

/// What a command's execution ends with.
enum Outcome {
    Status(u8, Vec<u8>),
    /// The connection failed under us (a refused access): no answer can be sent.
    Lost(OpFailed),
}

fn good() -> Outcome {
    Outcome::Status(0, Vec::new())
}

fn check(key: u8, asc: u8) -> Outcome {
    let mut s = vec![0u8; 18];
    (s[0], s[2], s[7], s[12]) = (0x70, key, 10, asc);
    Outcome::Status(2, s)
}

fn inquiry(cdb: &[u8]) -> Option<Vec<u8>> {
    if cdb[1] & 1 != 0 {
        return None; // no VPD pages
    }
    let mut d = vec![0u8; 96];
    (d[2], d[3], d[4]) = (5, 2, 91);
    d[8..16].copy_from_slice(b"SRPUBLK ");
    d[16..32].copy_from_slice(b"HOSTILE TARGET  ");
    d[32..36].copy_from_slice(b"0001");
    Some(d)
}

impl Target {
    fn read_capacity(&self) -> Vec<u8> {
        let mut d = vec![0u8; 32];
        let last = self.disk.len() as u64 / BLOCK - 1;
        d[..8].copy_from_slice(&last.to_be_bytes());
        d[8..12].copy_from_slice(&(BLOCK as u32).to_be_bytes());
        if self.mapped.is_some() {
            d[14] = 0xc0; // LBPME, LBPRZ
        }
        d
    }

    /// GET LBA STATUS parameter data from the LBA in `cdb`: runs of mapped and deallocated
    /// blocks, as many as the allocation length holds (the `lba-status` case lies instead).
    fn lba_status(&self, cdb: &[u8]) -> Option<Vec<u8>> {
        let mapped = self.mapped.as_ref()?;
        let lba = u64::from_be_bytes(cdb[2..10].try_into().ok()?) as usize;
        let alloc = u32::from_be_bytes(cdb[10..14].try_into().ok()?) as usize;
        if lba >= mapped.len() || alloc < 24 {
            return None;
        }
        let mut runs: Vec<(usize, usize, u8)> = Vec::new();
        if self.case == Case::LbaStatus {
            eprintln!("hostile: lba-status: GET LBA STATUS at LBA {lba} answered with lies");
            runs = vec![(lba + 8, 8, 1), (lba, 8, 1)];
        } else {
            let mut at = lba;
            while at < mapped.len() && 8 + 16 * (runs.len() + 1) <= alloc {
                let m = mapped[at];
                let n = mapped[at..].iter().take_while(|&&b| b == m).count();
                runs.push((at, n, if m { 0 } else { 1 }));
                at += n;
            }
        }
        let mut d = ((4 + 16 * runs.len()) as u32).to_be_bytes().to_vec();
        d.extend_from_slice(&[0; 4]);
        for (at, n, st) in runs {
            d.extend_from_slice(&(at as u64).to_be_bytes());
            d.extend_from_slice(&(n as u32).to_be_bytes());
            d.extend_from_slice(&[st, 0, 0, 0]);
        }
        Some(d)
    }

    fn range(&self, cdb: &[u8]) -> Option<std::ops::Range<usize>> {
        let lba = u64::from_be_bytes(cdb[2..10].try_into().ok()?);
        let n = u64::from(u32::from_be_bytes(cdb[10..14].try_into().ok()?));
        let end = lba.checked_add(n)?.checked_mul(BLOCK)?;
        (end <= self.disk.len() as u64).then(|| (lba * BLOCK) as usize..end as usize)
    }

    /// The key of the last completed read into `d`'s buffer, when `case` is this run's and its
    /// one attack is still to come on a transfer this large (it is then spent).
    fn stale_key(&mut self, case: Case, d: &DirectBuf) -> Option<u32> {
        if self.case != case || self.attacked || d.len < self.min_bytes {
            return None;
        }
        let old = *self.read_keys.get(&d.va)?;
        self.attacked = true;
        Some(old)
    }

    /// Data-in: RDMA-writes `data` to the command's buffer (and, once, the late write).
    fn data_in(&mut self, p: &mut Peer, desc: DataDesc, data: &[u8], read16: bool) -> Outcome {
        let DataDesc::Direct(d) = desc else {
            return check(5, 0x24);
        };
        let n = data.len().min(d.len as usize);
        if let Err(e) = p.write(&data[..n], d.va, d.key) {
            return Outcome::Lost(e);
        }
        if !read16 {
            return good();
        }
        if let Some(old) = self.stale_key(Case::LateWrite, &d) {
            let junk: Vec<u8> = b"HOSTILE!".iter().copied().cycle().take(n).collect();
            let r = p.write(&junk, d.va, old);
            eprintln!(
                "hostile: late-write: RDMA WRITE of {n} bytes at {:#x} under key {old:#x} (a \
                 completed read's; this read's is {:#x}): {}",
                d.va,
                d.key,
                verdict(&r)
            );
            if let Err(e) = r {
                return Outcome::Lost(e);
            }
        }
        self.read_keys.insert(d.va, d.key);
        good()
    }

    /// Data-out: the command's data, from immediate data or by RDMA READ (and, once, the stale
    /// read first).
    fn data_out(&mut self, p: &mut Peer, desc: DataDesc, imm: &[u8]) -> Result<Vec<u8>, OpFailed> {
        match desc {
            DataDesc::Immediate { .. } => Ok(imm.to_vec()),
            DataDesc::Direct(d) => {
                if let Some(old) = self.stale_key(Case::StaleRead, &d) {
                    let r = p.read(d.va, old, d.len as usize);
                    eprintln!(
                        "hostile: stale-read: RDMA READ of {} bytes at {:#x} under key {old:#x} (a \
                         completed read's; this write's is {:#x}): {}",
                        d.len,
                        d.va,
                        d.key,
                        verdict(&r)
                    );
                    r?;
                }
                p.read(d.va, d.key, d.len as usize)
            }
            _ => Ok(Vec::new()),
        }
    }

    fn execute(&mut self, p: &mut Peer, iu: &[u8]) -> Option<(u64, Outcome, bool)> {
        let cmd = match parse_initiator_iu(iu, IMM_DATA_OFFSET) {
            Ok(InitiatorIu::Cmd(c)) => c,
            Ok(InitiatorIu::TskMgmt(t)) => return Some((t.tag, tmf(t), false)),
            Ok(_) => return None,
            Err(e) => {
                eprintln!("hostile: an IU that does not decode: {e}");
                return None;
            }
        };
        let c = &cmd.cmd;
        let cdb = c.cdb;
        let big_read =
            cdb[0] == 0x88 && matches!(c.data_in, DataDesc::Direct(d) if d.len >= self.min_bytes);
        let out = match cdb[0] {
            0x00 | 0x91 => good(),
            0x12 => match inquiry(cdb) {
                Some(d) => self.data_in(p, c.data_in, &d, false),
                None => check(5, 0x24),
            },
            0x9e if cdb[1] & 0x1f == 0x10 => {
                let d = self.read_capacity();
                self.data_in(p, c.data_in, &d, false)
            }
            0x9e if cdb[1] & 0x1f == 0x12 => match self.lba_status(cdb) {
                Some(d) => self.data_in(p, c.data_in, &d, false),
                None => check(5, 0x24),
            },
            0x88 => match self.range(cdb) {
                Some(r) => {
                    let d = self.disk[r].to_vec();
                    self.data_in(p, c.data_in, &d, true)
                }
                None => check(5, 0x21),
            },
            0x8a => match self.range(cdb) {
                Some(r) => match self.data_out(p, c.data_out, cmd.immediate) {
                    Ok(d) if d.len() >= r.len() => {
                        let len = r.len();
                        if let Some(m) = self.mapped.as_mut() {
                            let b = r.start / BLOCK as usize..r.end / BLOCK as usize;
                            m[b].fill(true);
                        }
                        self.disk[r].copy_from_slice(&d[..len]);
                        good()
                    }
                    Ok(_) => check(5, 0x24),
                    Err(e) => Outcome::Lost(e),
                },
                None => check(5, 0x21),
            },
            _ => check(5, 0x20),
        };
        Some((c.tag, out, big_read))
    }

    /// Sends the answer to `tag`, misbehaving as the case says.
    fn answer(
        &mut self,
        p: &mut Peer,
        tag: u64,
        status: u8,
        sense: &[u8],
        big_read: bool,
    ) -> Result<(), OpFailed> {
        let delta = if self.case == Case::Credits {
            1 << 30
        } else {
            1
        };
        let attack = big_read && !self.attacked;
        let last = self.last_tag.replace(tag);
        if !attack {
            return respond(p, tag, status, sense, delta);
        }
        self.attacked = true;
        match self.case {
            Case::WrongTag => {
                eprintln!(
                    "hostile: wrong-tag: answering tag {:#x} (never sent) before {tag:#x}",
                    tag | 1 << 40
                );
                respond(p, tag | 1 << 40, 0, &[], 1)?;
            }
            Case::StaleTag => {
                let stale = last.unwrap_or(tag ^ 0x10000);
                eprintln!("hostile: stale-tag: answering tag {stale:#x} (already answered) before {tag:#x}");
                respond(p, stale, 0, &[], 1)?;
            }
            Case::Twice => {
                eprintln!("hostile: twice: answering tag {tag:#x} twice");
                respond(p, tag, status, sense, delta)?;
            }
            Case::Overlong => {
                eprintln!(
                    "hostile: overlong: answering tag {tag:#x} with a sense length past the IU"
                );
                let mut buf = [0u8; 64];
                let n = SrpRsp::good(tag, 1).encode(&mut buf).expect("fits");
                // flags (byte 18): sense valid; sense_data_len (bytes 28..32): past the IU
                buf[18] |= RspFlags::SNSVALID;
                buf[28..32].copy_from_slice(&4096u32.to_be_bytes());
                return p.send(&buf[..n]);
            }
            Case::Flood => {
                respond(p, tag, status, sense, delta)?;
                eprintln!("hostile: flood: 300 SRP_CRED_REQ and 300 SRP_AER_REQ");
                for i in 0..300u64 {
                    p.send(
                        &CredReq {
                            sol_not: 0,
                            req_lim_delta: 0,
                            tag: i,
                        }
                        .encode(),
                    )?;
                    send_aer(p, 1000 + i)?;
                }
                return Ok(());
            }
            Case::Credits => eprintln!("hostile: credits: every answer grants {delta} credits"),
            Case::IdleAer => self.aer_due = true,
            _ => {}
        }
        respond(p, tag, status, sense, delta)
    }
}

/// Sends an SRP_AER_REQ for LUN 0 (UNIT ATTENTION: capacity data has changed).
fn send_aer(p: &mut Peer, tag: u64) -> Result<(), OpFailed> {
    let sense = [0x70, 0, 6, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x2a, 9];
    let mut aer = [0u8; 64];
    let aer_req = AerReq {
        sol_not: 0,
        req_lim_delta: 0,
        tag,
        lun: ScsiLun::from_int(0),
        sense: &sense,
    };
    let n = aer_req.encode(&mut aer).expect("fits");
    p.send(&aer[..n])
}

fn tmf(t: TskMgmt) -> Outcome {
    eprintln!(
        "hostile: task management {:?} for tag {:#x}",
        t.func, t.task_tag
    );
    Outcome::Status(0, Vec::new())
}

fn verdict<T>(r: &Result<T, OpFailed>) -> String {
    match r {
        Ok(_) => "landed".into(),
        Err(e) => format!("refused: {}", e.status),
    }
}

fn respond(p: &mut Peer, tag: u64, status: u8, sense: &[u8], delta: i32) -> Result<(), OpFailed> {
    let rsp = SrpRsp {
        flags: RspFlags(if sense.is_empty() {
            0
        } else {
            RspFlags::SNSVALID
        }),
        status,
        sense,
        ..SrpRsp::good(tag, delta)
    };
    let mut buf = [0u8; 256];
    let n = rsp
        .encode(&mut buf)
        .expect("an SRP_RSP with 18 bytes of sense fits");
    p.send(&buf[..n])
}

fn accept(mut p: Peer, private: &[u8]) -> Option<Peer> {
    let req = match LoginReq::parse_rdma(private) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("hostile: a login request that does not decode: {e}");
            return None;
        }
    };
    let rsp = LoginRsp {
        req_lim_delta: 32,
        tag: req.tag,
        max_it_iu_len: req.req_it_iu_len.min(RECV_BYTES as u32),
        max_ti_iu_len: 256,
        buf_fmt: BufFormats(BufFormats::DIRECT),
        rsp_flags: 0,
    };
    match p.accept(&rsp.encode()) {
        Ok(()) => {
            eprintln!("hostile: login accepted");
            Some(p)
        }
        Err(e) => {
            eprintln!("hostile: rdma_accept: {e}");
            None
        }
    }
}

/// Serves the current connection's IUs until there is none for a while.
fn serve(t: &mut Target, peer: &mut Option<Peer>) {
    let Some(p) = peer.as_mut() else {
        return;
    };
    loop {
        let iu = match p.recv(Duration::from_millis(2)) {
            Ok(Some(iu)) => iu,
            Ok(None) if t.aer_due && t.last_iu.elapsed() >= Duration::from_secs(1) => {
                t.aer_due = false;
                eprintln!("hostile: idle-aer: SRP_AER_REQ to an initiator idle for a second");
                if let Err(e) = send_aer(p, 1000) {
                    eprintln!("hostile: {e}: dropping the connection");
                    *peer = None;
                }
                return;
            }
            Ok(None) => return,
            Err(e) => {
                eprintln!("hostile: {e}: dropping the connection");
                *peer = None;
                return;
            }
        };
        t.last_iu = Instant::now();
        if t.case == Case::Silent {
            continue;
        }
        let Some((tag, out, big_read)) = t.execute(p, &iu) else {
            continue;
        };
        let sent = match out {
            Outcome::Status(status, sense) => t.answer(p, tag, status, &sense, big_read),
            Outcome::Lost(e) => Err(e),
        };
        if let Err(e) = sent {
            eprintln!("hostile: {e}: the connection is gone; waiting for a new login");
            *peer = None;
            return;
        }
    }
}

/// Sends SRP_T_LOGOUT on the connection just established.
fn logout(peer: &mut Option<Peer>) {
    let Some(p) = peer.as_mut() else {
        return;
    };
    let iu = TLogout {
        sol_not: 0,
        reason: TLogoutReason::NoReason,
        tag: 0,
    };
    eprintln!("hostile: logout: SRP_T_LOGOUT right after the login");
    if let Err(e) = p.send(&iu.encode()) {
        eprintln!("hostile: {e}");
        *peer = None;
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let listen = arg("--listen").unwrap_or_else(|| "10.77.0.1:5556".into());
    let name = arg("--case").unwrap_or_else(|| "none".into());
    let Some(&(_, case)) = CASES.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = CASES.iter().map(|(n, _)| *n).collect();
        eprintln!("hostile: unknown --case {name}: {}", names.join(", "));
        std::process::exit(2);
    };
    let mib: usize = arg("--mib").and_then(|m| m.parse().ok()).unwrap_or(64);
    let min_bytes: u32 = arg("--min-bytes")
        .and_then(|m| m.parse().ok())
        .unwrap_or(65536);
    let addr = match listen.parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hostile: --listen {listen}: {e}");
            std::process::exit(2);
        }
    };
    let mut l = match Listener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("hostile: listening on {listen}: {e}");
            std::process::exit(1);
        }
    };
    let thin = args.iter().any(|a| a == "--thin");
    let label = if thin { " (thin)" } else { "" };
    eprintln!("hostile: listening on {listen}, case {case:?}, {mib} MiB disk{label}");
    let mut t = Target {
        disk: vec![0u8; mib << 20],
        case,
        read_keys: HashMap::new(),
        attacked: false,
        min_bytes,
        last_tag: None,
        mapped: thin.then(|| vec![false; (mib << 20) / BLOCK as usize]),
        last_iu: Instant::now(),
        aer_due: false,
    };
    let mut peer: Option<Peer> = None;
    loop {
        match l.next(Duration::from_millis(if peer.is_some() { 0 } else { 100 })) {
            Ok(Some(Incoming::Request(p, private))) => {
                // one connection at a time: a new login replaces the old one
                peer = accept(p, &private);
                t.read_keys.clear();
                if case == Case::Logout {
                    // the QP sends once accepted: this reaches the initiator before any answer
                    logout(&mut peer);
                }
            }
            Ok(Some(Incoming::Event { name, ends, conn })) => {
                eprintln!("hostile: {name}");
                if ends && peer.as_ref().is_some_and(|p| p.conn() == conn) {
                    peer = None;
                }
            }
            Ok(None) => {}
            Err(e) => eprintln!("hostile: {e}"),
        }
        serve(&mut t, &mut peer);
    }
}
