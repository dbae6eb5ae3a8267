//! The initiator's per-I/O work alone: the channel engine issuing 4 KiB READ(16)s at queue depth 32 to
//! a transport that answers every SRP_CMD at once with a canned good SRP_RSP (no data is moved, no
//! target logic runs). Run under `valgrind --tool=callgrind` by `just bench hotpath` to count
//! instructions per I/O (two run lengths, subtracted, cancel start-up), or plainly for ns per I/O.
//!
//! usage: hotpath [IOS]

use srp_ublk::channel::{
    Channel, ChannelConfig, DataBuf, DataDir, Login, Memory, Post, ScsiCmd, TransportError, Wc,
    WcKind, WcStatus,
};
use srp_ublk::wire::scsi::Cdb;
use srp_ublk::wire::srp::{ScsiLun, SrpRsp};
use std::collections::VecDeque;

const DEPTH: u16 = 32;

/// A target that answers instantly.
struct Instant {
    send: Vec<[u8; 512]>,
    recv: Vec<[u8; 64]>,
    next_recv: u16,
    cq: VecDeque<Wc>,
    rsp: [u8; 36],
}

impl Instant {
    fn new() -> Self {
        let r = SrpRsp::good(0, 1);
        let mut rsp = [0u8; 36];
        r.encode(&mut rsp).expect("36 bytes");
        Instant {
            send: vec![[0; 512]; usize::from(srp_ublk::channel::send_slots(DEPTH, 4))],
            recv: vec![[0; 64]; usize::from(DEPTH) + 16],
            next_recv: 0,
            cq: VecDeque::with_capacity(4 * usize::from(DEPTH)),
            rsp,
        }
    }
}

impl Post for Instant {
    fn send_buf(&mut self, slot: u16) -> &mut [u8] {
        &mut self.send[usize::from(slot)]
    }

    fn post_send(
        &mut self,
        slot: u16,
        _len: usize,
        _imm: Option<DataBuf>,
        signal: bool,
    ) -> Result<(), TransportError> {
        let idx = self.next_recv;
        self.next_recv = (self.next_recv + 1) % self.recv.len() as u16;
        let tag: [u8; 8] = self.send[usize::from(slot)][8..16]
            .try_into()
            .expect("8 bytes");
        let r = &mut self.recv[usize::from(idx)];
        r[..36].copy_from_slice(&self.rsp);
        r[8..16].copy_from_slice(&tag);
        if signal {
            self.cq.push_back(Wc {
                kind: WcKind::Send,
                id: slot,
                len: 0,
                status: WcStatus::Ok,
            });
        }
        self.cq.push_back(Wc {
            kind: WcKind::Recv,
            id: idx,
            len: 36,
            status: WcStatus::Ok,
        });
        Ok(())
    }

    fn recv_buf(&self, idx: u16) -> &[u8] {
        &self.recv[usize::from(idx)]
    }

    fn post_recv(&mut self, _idx: u16) -> Result<(), TransportError> {
        Ok(())
    }

    fn nr_recv(&self) -> u16 {
        self.recv.len() as u16
    }

    fn poll(&mut self, out: &mut [Wc]) -> Result<usize, TransportError> {
        let n = out.len().min(self.cq.len());
        for (o, wc) in out.iter_mut().zip(self.cq.drain(..n)) {
            *o = wc;
        }
        Ok(n)
    }

    fn arm(&mut self, _sends: bool) -> Result<(), TransportError> {
        Ok(())
    }

    fn notify_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    fn ack_notify(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
}

impl Memory for Instant {
    type Lent = srp_ublk::rdma::Lent;
    type Registered = ();

    fn register(
        &mut self,
        mem: &srp_ublk::rdma::Lent,
    ) -> Result<((), Vec<DataBuf>), srp_ublk::channel::TransportError> {
        let descs = mem
            .regions()
            .map(|(addr, len)| DataBuf {
                addr,
                len: len as u32,
                lkey: 1,
                rkey: 1,
            })
            .collect();
        Ok(((), descs))
    }

    fn adopt(&mut self, _: &()) -> bool {
        true
    }

    fn release_bufs(&mut self) {}
}

impl Login for Instant {}

fn main() {
    let ios: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let cfg = ChannelConfig {
        depth: DEPTH,
        send_depth: DEPTH,
        extra_slots: 4,
        lun: ScsiLun::from_int(0),
        req_lim: 128,
        max_imm: 8192,
        imm_data_offset: 68,
        max_it_iu_len: 8260,
        max_retries: 5,
    };
    let mut ch = Channel::new(Instant::new(), cfg);
    let bufs: Vec<DataBuf> = (0..DEPTH)
        .map(|t| DataBuf {
            addr: 0x7f00_0000_0000 + u64::from(t) * 4096,
            len: 4096,
            lkey: 1,
            rkey: 2,
        })
        .collect();
    let start = std::time::Instant::now();
    let (mut issued, mut done) = (0u64, 0u64);
    let mut free: Vec<u16> = (0..DEPTH).collect();
    while done < ios {
        while issued < ios {
            let Some(tag) = free.pop() else { break };
            let lba = (issued * 8) & 0xf_ffff;
            let cmd = ScsiCmd {
                lun: Default::default(),
                cdb: Cdb::read16(lba, 8, false),
                data: DataDir::In(bufs[usize::from(tag)]),
            };
            ch.submit(tag, cmd).expect("submit");
            issued += 1;
        }
        ch.process(&mut |d| {
            debug_assert_eq!(d.outcome.errno, 0);
            free.push(d.tag);
            done += 1;
        });
    }
    let ns = start.elapsed().as_nanos() as f64 / ios as f64;
    println!(
        "{ios} I/Os, {ns:.1} ns per I/O (submit + SRP_CMD encode + completion + SRP_RSP decode)"
    );
}
