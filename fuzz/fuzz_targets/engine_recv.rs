//! The engine's receive path as the target controls it: arbitrary IUs (responses with any tag,
//! lengths and credits, CRED_REQ, AER_REQ, T_LOGOUT, garbage), genuine responses released late,
//! time passing, and stray RDMA WRITEs with the keys commands carried, while reads are outstanding
//! on the fake target (per-command windows, as in production). The engine must never panic, never
//! complete a command that is not outstanding, and a stray write may land only in the buffer of a
//! command that is still outstanding.
#![no_main]
use libfuzzer_sys::fuzz_target;
use srp_ublk::channel::fake::FakeTarget;
use srp_ublk::channel::{Channel, ChannelConfig, DataBuf, DataDir, ScsiCmd};
use srp_ublk::wire::scsi::Cdb;

const DEPTH: u16 = 8;

fuzz_target!(|data: &[u8]| {
    let mut t = FakeTarget::new(1 << 20, 512, srp_ublk::channel::send_slots(DEPTH, 4), DEPTH + 8);
    t.faults.hold_rsps = true;
    let bufs: Vec<DataBuf> = (0..DEPTH).map(|_| t.alloc(4096)).collect();
    let cfg = ChannelConfig::fake(DEPTH);
    let mut ch = Channel::new(t, cfg);
    let mut outstanding = [false; DEPTH as usize];
    // the key, address and tag each read carried
    let mut keys: Vec<(u32, u64, usize)> = Vec::new();
    let mut now = 0u64;
    let mut rest = data;
    while let [op, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (payload, next) = tail.split_at(n);
        rest = next;
        let arg = payload.first().copied().unwrap_or(0);
        match op % 5 {
            0 => {
                let tag = arg % DEPTH as u8;
                let cmd = ScsiCmd {
                    lun: Default::default(),
                    cdb: Cdb::read16(u64::from(arg), 8, false),
                    data: DataDir::In(bufs[usize::from(tag)]),
                };
                if !outstanding[usize::from(tag)] && ch.submit(u16::from(tag), cmd).is_ok() {
                    outstanding[usize::from(tag)] = true;
                    ch.flush();
                    if let Some((key, va, _)) = ch.test_transport().last_direct {
                        keys.push((key, va, usize::from(tag)));
                    }
                }
            }
            1 => ch.test_transport().inject(payload.to_vec()),
            2 => {
                if let Some(&(key, va, tag)) = keys.get(usize::from(arg) % keys.len().max(1)) {
                    let landed = ch.test_transport().rdma_write(key, va, &payload[1.min(n)..]);
                    assert!(
                        !landed || outstanding[tag],
                        "a stray write landed in tag {tag}'s buffer with no command outstanding"
                    );
                }
            }
            3 => ch.test_transport().release_held(),
            _ => {
                now += u64::from(arg) * 250;
                ch.tick(now);
            }
        }
        ch.process(&mut |d| {
            let i = usize::from(d.tag);
            assert!(outstanding[i], "tag {} completed while not outstanding", d.tag);
            outstanding[i] = false;
        });
    }
});
