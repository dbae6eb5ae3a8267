//! The path's lifecycle over the fake target, front-end free: time is what the test hands in.

use super::*;
use crate::channel::block::WriteCache;
use crate::channel::fake::FakeTarget;
use crate::channel::ChannelConfig;
use crate::session::timers::Timers;
use crate::wire::scsi::cdb::op;
use std::cell::Cell;

const DEPTH: u16 = 8;
/// The LUN the tests' commands address, unless a test names others.
const LUN: ScsiLun = ScsiLun([0; 8]);
const BUF: u32 = 64 * 1024;
const GEO: Geometry = Geometry {
    block_shift: 9,
    blocks: 2048,
    unmap: true,
    write_same_unmap: true,
    cache: WriteCache::LEGACY,
    lbpme: false,
    lbprz: false,
    write_same: true,
};
const TIMERS: Timers = Timers {
    reconnect_delay: Some(1),
    fast_io_fail_tmo: Some(5),
    dev_loss_tmo: Some(60),
};

/// Logs in again to the same fake target; refuses as many logins as asked first.
#[derive(Default)]
struct FakeConnect {
    refuse: Cell<u32>,
    attempts: Cell<u32>,
    /// The RDMA device the next login's route goes through, when it changes.
    device: Cell<Option<u32>>,
}

impl Connect for &FakeConnect {
    type T = FakeTarget;
    type Error = std::io::Error;

    fn connect(&self, old: &mut FakeTarget) -> Result<Fresh<FakeTarget>, std::io::Error> {
        self.attempts.set(self.attempts.get() + 1);
        if self.refuse.get() > 0 {
            self.refuse.set(self.refuse.get() - 1);
            return Err(std::io::Error::other("login rejected"));
        }
        let mut t = old.successor();
        if let Some(d) = self.device.take() {
            t.device = d;
        }
        Ok(Fresh {
            t,
            req_lim: 16,
            max_imm: 8192,
        })
    }
}

impl FakeConnect {
    /// A target that refuses every new login.
    fn refusing() -> FakeConnect {
        FakeConnect {
            refuse: Cell::new(u32::MAX),
            ..Default::default()
        }
    }
}

/// A read on tag 0 whose response never comes.
fn read_unanswered(p: &mut Path<&FakeConnect>) {
    p.ch.transport().faults.hold_rsps = true;
    read(p, 0, 0);
}

fn channel() -> Channel<FakeTarget> {
    let t = FakeTarget::new(
        1 << 20,
        512,
        crate::channel::send_slots(DEPTH, 4),
        DEPTH + 8,
    );
    Channel::new(t, ChannelConfig::fake(DEPTH))
}

fn path(c: &FakeConnect) -> Path<&FakeConnect> {
    let bufs = TagBufs::new(DEPTH, BUF);
    Path::new(channel(), c, bufs, Rport::new(TIMERS), "queue 0".into()).expect("registers")
}

/// What finished: (tag, errno, the first 4 KiB of its buffer).
type Finished = Vec<(u16, i32, Vec<u8>)>;

fn service(p: &mut Path<&FakeConnect>, now: Instant) -> (Finished, Option<Event>) {
    let mut out = Vec::new();
    let (_, ev) = p.service(now, &mut |d, b| {
        let data = b.tag_data(d.tag)[..4096].to_vec();
        out.push((d.tag, d.outcome.errno, data));
    });
    (out, ev)
}

fn write(p: &mut Path<&FakeConnect>, tag: u16, lba: u64, byte: u8, now: Instant) {
    p.buf(tag)[..4096].fill(byte);
    let w = BlockOp::Write { fua: false };
    p.submit(tag, LUN, w, lba * 512, 4096, &GEO)
        .expect("submitted");
    let (done, _) = service(p, now);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].1, 0, "the write of tag {tag} failed");
}

fn read(p: &mut Path<&FakeConnect>, tag: u16, lba: u64) {
    p.buf(tag).fill(0);
    p.submit(tag, LUN, BlockOp::Read, lba * 512, 4096, &GEO)
        .expect("submitted");
}

/// Takes the channel down as a malformed IU from the target does.
fn break_channel(p: &mut Path<&FakeConnect>) {
    p.ch.transport().inject(vec![0xc1, 0, 0]);
}

fn reads_sent(p: &mut Path<&FakeConnect>) -> Vec<u64> {
    p.ch.transport()
        .log
        .iter()
        .filter(|(opc, _)| *opc == op::READ_16)
        .map(|&(_, tag)| tag & 0xffff)
        .collect()
}

#[test]
fn held_commands_are_reissued_in_their_first_order_on_the_new_logins_buffers() {
    let c = FakeConnect::default();
    let mut p = path(&c);
    let t0 = Instant::now();
    for (tag, byte) in [(0u16, 0xa1u8), (1, 0xb2), (2, 0xc3)] {
        write(&mut p, tag, u64::from(tag) * 8, byte, t0);
    }
    // reads on tags 5, 3, 4 (of the data of tags 2, 0, 1): their responses never come
    p.ch.transport().faults.hold_rsps = true;
    for (tag, lba) in [(5u16, 16u64), (3, 0), (4, 8)] {
        read(&mut p, tag, lba);
    }
    assert!(service(&mut p, t0).0.is_empty());
    break_channel(&mut p);
    let (done, ev) = service(&mut p, t0);
    assert!(done.is_empty(), "held, not failed: {done:?}");
    assert_eq!((ev, p.state()), (None, LinkState::Blocked));
    let gen = p.gen();
    // reconnect_delay later: a new login; the reads go again, in the order they first went
    let (done, _) = service(&mut p, t0 + Duration::from_millis(1000));
    assert_eq!(c.attempts.get(), 1);
    assert!(p.is_up());
    assert_eq!(reads_sent(&mut p), [5, 3, 4], "the new login's commands");
    let got: Vec<(u16, i32, u8)> = done.iter().map(|(t, e, d)| (*t, *e, d[4095])).collect();
    // the data came through the buffers as the new login registered them (the old login's keys
    // open nothing on the new one)
    assert_eq!(got, [(5, 0, 0xc3), (3, 0, 0xa1), (4, 0, 0xb2)]);
    assert_eq!((p.reconnects(), p.gen()), (1, gen));
}

/// The buffers are registered once per device: a reconnect through the same device keeps the
/// registration (and its keys), one through another device registers them there and the old
/// keys open nothing.
#[test]
fn a_reconnect_registers_the_buffers_again_only_on_another_device() {
    let c = FakeConnect::default();
    let mut p = path(&c);
    // login scope: a registration's own keys reach the buffers, as the target is told them
    p.ch.transport().rkey_scope = crate::wire::target::RkeyScope::Login;
    let t0 = Instant::now();
    write(&mut p, 0, 0, 0x5a, t0);
    let keys = p.data.clone();
    assert_eq!(p.ch.transport().registrations, 1);
    for (round, device, registrations) in [(1u64, None, 1), (2, Some(7), 2)] {
        c.device.set(device);
        break_channel(&mut p);
        assert!(service(&mut p, t0).0.is_empty());
        service(&mut p, t0 + Duration::from_secs(round));
        assert_eq!(p.reconnects(), round);
        assert_eq!(
            p.ch.transport().registrations,
            registrations,
            "round {round}"
        );
        assert_eq!(p.data == keys, device.is_none(), "round {round}: the keys");
        read(&mut p, 1, 0);
        let (done, _) = service(&mut p, t0 + Duration::from_secs(round));
        assert_eq!(done, [(1, 0, vec![0x5a; 4096])], "round {round}");
    }
    // the first registration's keys open nothing on the new device
    let now = p.data[1];
    let t = p.ch.transport();
    assert!(t.rdma_write(now.rkey, now.addr, &[1]));
    assert!(!t.rdma_write(keys[1].rkey, keys[1].addr, &[1]));
}

#[test]
fn fast_io_fail_fails_held_and_new_commands_and_dev_loss_ends_the_path() {
    let c = FakeConnect::refusing();
    let mut p = path(&c);
    let t0 = Instant::now();
    read_unanswered(&mut p);
    break_channel(&mut p);
    let s = |secs: f64| t0 + Duration::from_secs_f64(secs);
    assert!(service(&mut p, s(0.0)).0.is_empty());
    assert!(
        service(&mut p, s(4.9)).0.is_empty(),
        "held before fast_io_fail_tmo"
    );
    let (done, ev) = service(&mut p, s(5.0));
    assert_eq!(
        (done.len(), done[0].0, done[0].1, ev),
        (1, 0, libc::EIO, None)
    );
    assert_eq!(p.state(), LinkState::FailFast);
    // a command that comes now fails at once
    let r = p.submit(1, LUN, BlockOp::Read, 0, 4096, &GEO);
    let (done, _) = service(&mut p, s(5.5));
    let failed_now = r.is_err() || done.iter().any(|(t, e, _)| *t == 1 && *e == libc::EIO);
    assert!(
        failed_now,
        "a new command after fast_io_fail: {r:?} {done:?}"
    );
    let (_, ev) = service(&mut p, s(60.0));
    assert_eq!((ev, p.state()), (Some(Event::Lost), LinkState::Lost));
    // the path is given up: no more logins
    let tries = c.attempts.get();
    service(&mut p, s(120.0));
    assert_eq!(c.attempts.get(), tries);
}

#[test]
fn a_refused_login_is_tried_again_every_reconnect_delay() {
    let c = FakeConnect {
        refuse: Cell::new(2),
        ..Default::default()
    };
    let mut p = path(&c);
    let t0 = Instant::now();
    break_channel(&mut p);
    let ms = |m: u64| t0 + Duration::from_millis(m);
    let mut tries = Vec::new();
    for at in [0, 500, 1000, 1500, 1999, 2000, 2500, 3000, 3500] {
        service(&mut p, ms(at));
        tries.push((at, c.attempts.get(), p.is_up()));
    }
    assert_eq!(
        tries,
        [
            (0, 0, false),
            (500, 0, false),
            (1000, 1, false),
            (1500, 1, false),
            (1999, 1, false),
            (2000, 2, false),
            (2500, 2, false),
            (3000, 3, true),
            (3500, 3, true),
        ]
    );
}

#[test]
fn a_siblings_failure_takes_the_path_down_and_both_reconnect() {
    let (c0, c1) = (FakeConnect::default(), FakeConnect::default());
    let (mut p0, mut p1) = (path(&c0), path(&c1));
    let link = Arc::new(SessionLink::new(2).expect("eventfds"));
    p0.join(link.clone(), 0);
    p1.join(link.clone(), 1);
    let t0 = Instant::now();
    write(&mut p1, 0, 0, 0x5a, t0);
    break_channel(&mut p0);
    service(&mut p0, t0);
    assert!(!p0.is_up());
    // queue 1's channel is fine, but it goes down with its sibling
    service(&mut p1, t0);
    assert_eq!(p1.state(), LinkState::Blocked);
    assert_eq!(p1.channel().down(), Some(&DownReason::Session));
    let later = t0 + Duration::from_secs(1);
    service(&mut p0, later);
    service(&mut p1, later);
    assert!(p0.is_up() && p1.is_up());
    assert_eq!((c0.attempts.get(), c1.attempts.get()), (1, 1));
    // the sibling's new login serves: the data written before is there
    read(&mut p1, 2, 0);
    let (done, _) = service(&mut p1, later);
    assert_eq!((done[0].1, done[0].2[0]), (0, 0x5a));
    // one failure takes the others down once: nothing more happens
    service(&mut p0, later);
    service(&mut p1, later);
    assert!(p0.is_up() && p1.is_up());
}

#[test]
fn with_a_leader_queue_0_logs_in_first_in_each_epoch_and_the_others_after_it() {
    let (c0, c1) = (FakeConnect::default(), FakeConnect::default());
    let (mut p0, mut p1) = (path(&c0), path(&c1));
    let link = Arc::new(SessionLink::new(2).expect("eventfds").with_leader(false));
    p0.join(link.clone(), 0);
    p1.join(link.clone(), 1);
    let t0 = Instant::now();
    write(&mut p1, 0, 0, 0x5a, t0);
    // queue 1's channel fails: both go down
    break_channel(&mut p1);
    service(&mut p1, t0);
    service(&mut p0, t0);
    assert!(!p0.is_up() && !p1.is_up());
    let later = t0 + Duration::from_secs(1);
    // queue 1's reconnect_delay is up, queue 0 has not logged in again: queue 1 waits for it,
    // without an attempt (a MULTI login first would be ended by queue 0's SINGLE)
    service(&mut p1, later);
    assert!(!p1.is_up());
    assert_eq!(c1.attempts.get(), 0);
    service(&mut p0, later);
    assert!(p0.is_up());
    assert_eq!(c0.attempts.get(), 1);
    // queue 0's login lets queue 1 log in (and wakes it): at its next look it does, and its
    // new login serves the data written before
    assert!(link.may_log_in(1, link.epoch()));
    let next = later + DOWN_TICK;
    service(&mut p1, next);
    assert!(p1.is_up());
    assert_eq!(c1.attempts.get(), 1);
    read(&mut p1, 2, 0);
    let (done, _) = service(&mut p1, next);
    assert_eq!((done[0].1, done[0].2[0]), (0, 0x5a));
}

#[test]
fn a_path_that_starts_down_holds_io_and_registers_its_buffers_at_its_first_login() {
    let c = FakeConnect::default();
    let mut ch = channel();
    ch.declare_down(DownReason::Handover {
        device: "rxe0".into(),
    });
    ch.transport().stop();
    let at = Instant::now();
    let rport = Rport::down_since(TIMERS, at);
    let bufs = TagBufs::new(DEPTH, BUF);
    let mut p = Path::new(ch, &c, bufs, rport, "queue 0".into()).expect("no registration yet");
    assert_eq!(p.state(), LinkState::Blocked);
    read(&mut p, 0, 0);
    assert!(service(&mut p, at).0.is_empty(), "held");
    let (done, _) = service(&mut p, at + Duration::from_secs(1));
    assert!(p.is_up());
    assert_eq!(
        done.iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(),
        [(0, 0)]
    );
}

#[test]
fn device_removal_releases_the_login_at_once_and_says_so() {
    let c = FakeConnect::refusing();
    let mut p = path(&c);
    let t0 = Instant::now();
    read_unanswered(&mut p);
    p.ch.transport().faults.removed = true;
    p.ch.declare_down(DownReason::Completion {
        kind: crate::channel::WcKind::Recv,
        status: crate::channel::WcStatus::Flushed,
    });
    let (done, ev) = service(&mut p, t0);
    assert!(matches!(ev, Some(Event::Removed { .. })), "{ev:?}");
    assert!(p.ch.transport().released, "the login is let go of at once");
    assert!(done.is_empty(), "the read is held: {done:?}");
    // said once
    let (_, ev) = service(&mut p, t0 + Duration::from_millis(100));
    assert_eq!(ev, None);
}

/// A path whose tags register their first 8 KiB, with `stages` staging buffers.
fn staged_path(c: &FakeConnect, stages: u16) -> Path<&FakeConnect> {
    let bufs = TagBufs::with_head(DEPTH, BUF, 8192, stages);
    Path::new(channel(), c, bufs, Rport::new(TIMERS), "queue 0".into()).expect("registers")
}

const BIG: u32 = 32 * 1024;

/// A 32 KiB pattern that differs at every 4 KiB.
fn pattern(seed: u8) -> Vec<u8> {
    (0..BIG)
        .map(|i| seed.wrapping_add((i >> 12) as u8) ^ (i as u8))
        .collect()
}

/// Everything that finished: (tag, errno, the first 32 KiB of its buffer).
fn service_big(p: &mut Path<&FakeConnect>, now: Instant) -> Finished {
    let mut out = Vec::new();
    p.service(now, &mut |d, b| {
        let data = b.tag_data(d.tag)[..BIG as usize].to_vec();
        out.push((d.tag, d.outcome.errno, data));
    });
    out
}

fn submit_big(p: &mut Path<&FakeConnect>, tag: u16, op: BlockOp, lba: u64) {
    p.submit(tag, LUN, op, lba * 512, BIG, &GEO)
        .expect("submitted");
}

#[test]
fn each_command_names_its_own_lun_also_after_waiting_for_room() {
    let c = FakeConnect::default();
    let mut p = staged_path(&c, 1);
    let (l3, l5) = (ScsiLun::from_int(3), ScsiLun::from_int(5));
    let w = BlockOp::Write { fua: false };
    p.submit(0, l3, BlockOp::Read, 0, 4096, &GEO)
        .expect("submitted");
    // two writes larger than a tag's head for one staging buffer: the second waits for it
    p.submit(1, l5, w, 64 * 512, BIG, &GEO).expect("submitted");
    p.submit(2, l3, w, 128 * 512, BIG, &GEO).expect("submitted");
    let now = Instant::now();
    let mut done = Vec::new();
    for _ in 0..10 {
        done.extend(service_big(&mut p, now));
    }
    assert_eq!(done.len(), 3, "{done:?}");
    assert!(done.iter().all(|d| d.1 == 0), "{done:?}");
    assert_eq!(p.ch.transport().luns, vec![l3, l5, l3]);
}

#[test]
fn commands_larger_than_the_head_are_staged_and_wait_in_order_for_a_staging_buffer() {
    let c = FakeConnect::default();
    let mut p = staged_path(&c, 2);
    let t0 = Instant::now();
    let w = BlockOp::Write { fua: false };
    // three 32 KiB writes for two staging buffers, and a 4 KiB one from its tag's head
    for tag in 0..3u16 {
        p.buf(tag)[..BIG as usize].copy_from_slice(&pattern(tag as u8));
        submit_big(&mut p, tag, w, u64::from(tag) * 64);
    }
    p.buf(3)[..4096].fill(0x77);
    p.submit(3, LUN, w, 300 * 512, 4096, &GEO)
        .expect("submitted");
    assert_eq!(p.busy(), 4, "the waiting write counts as busy");
    assert_eq!(
        p.buffer_stalls(),
        1,
        "the small write took no staging buffer"
    );
    let mut done = service_big(&mut p, t0);
    // the waiting write went out as a staging buffer came back; its response is the next pass's
    done.extend(service_big(&mut p, t0));
    let order: Vec<(u16, i32)> = done.iter().map(|d| (d.0, d.1)).collect();
    // the small write is not held behind the large one waiting
    assert_eq!(order, [(0, 0), (1, 0), (3, 0), (2, 0)]);
    assert_eq!(p.busy(), 0);
    // read every byte back through the staging buffers onto other tags
    for (tag, lba) in [(4u16, 0u64), (5, 64), (6, 128)] {
        p.buf(tag).fill(0);
        submit_big(&mut p, tag, BlockOp::Read, lba);
    }
    let mut done = service_big(&mut p, t0);
    done.extend(service_big(&mut p, t0));
    assert_eq!(done.len(), 3);
    for (tag, errno, data) in done {
        assert_eq!(errno, 0);
        assert!(data == pattern(tag as u8 - 4), "tag {tag}'s data");
    }
}

#[test]
fn a_held_staged_read_is_reissued_through_its_staging_buffer_on_the_new_login() {
    let c = FakeConnect::default();
    let mut p = staged_path(&c, 1);
    let t0 = Instant::now();
    p.buf(0)[..BIG as usize].copy_from_slice(&pattern(9));
    submit_big(&mut p, 0, BlockOp::Write { fua: false }, 0);
    assert_eq!(service_big(&mut p, t0)[0].1, 0);
    p.ch.transport().faults.hold_rsps = true;
    p.buf(1).fill(0);
    submit_big(&mut p, 1, BlockOp::Read, 0);
    assert!(service_big(&mut p, t0).is_empty());
    break_channel(&mut p);
    assert!(service_big(&mut p, t0).is_empty(), "held");
    let done = service_big(&mut p, t0 + Duration::from_secs(1));
    assert!(p.is_up());
    assert_eq!((done.len(), done[0].0, done[0].1), (1, 1, 0));
    assert!(done[0].2 == pattern(9), "the re-issued read's data");
}

#[test]
fn fast_io_fail_fails_the_commands_waiting_for_a_staging_buffer_too() {
    let c = FakeConnect::refusing();
    let mut p = staged_path(&c, 1);
    let t0 = Instant::now();
    p.ch.transport().faults.hold_rsps = true;
    submit_big(&mut p, 0, BlockOp::Read, 0);
    submit_big(&mut p, 1, BlockOp::Read, 64);
    assert_eq!(p.busy(), 2);
    break_channel(&mut p);
    assert!(service_big(&mut p, t0).is_empty());
    let done = service_big(&mut p, t0 + Duration::from_secs(5));
    let mut got: Vec<(u16, i32)> = done.iter().map(|d| (d.0, d.1)).collect();
    got.sort();
    assert_eq!(got, [(0, libc::EIO), (1, libc::EIO)]);
    assert_eq!(p.busy(), 0);
}

#[test]
fn a_command_larger_than_every_buffer_is_refused_not_left_waiting() {
    let c = FakeConnect::default();
    // two staging buffers side by side are still not one buffer of twice the size
    for mut p in [path(&c), staged_path(&c, 1), staged_path(&c, 2)] {
        let r = p.submit(0, LUN, BlockOp::Read, 0, BUF * 2, &GEO);
        assert_eq!((r, p.busy()), (Err(libc::EINVAL), 0));
        // the staging buffer it took was given back
        submit_big(&mut p, 1, BlockOp::Read, 0);
        assert_eq!(service_big(&mut p, Instant::now())[0].1, 0);
    }
}

/// A path whose buffers are a pool of `bytes` (ublk's NEED_GET_DATA).
fn pool_path(c: &FakeConnect, bytes: u32) -> Path<&FakeConnect> {
    let bufs = TagBufs::pool_of(DEPTH, BUF, bytes);
    Path::new(channel(), c, bufs, Rport::new(TIMERS), "queue 0".into()).expect("registers")
}

/// Everything that finished: (tag, errno, the first 32 KiB of what its commit names).
fn service_pool(p: &mut Path<&FakeConnect>, now: Instant) -> Finished {
    let mut out = Vec::new();
    p.service(now, &mut |d, b| {
        // SAFETY: the span is the finished read's, and nothing refers to the pool's memory (the
        // kernel's copy out of it, as a test has it)
        let data = unsafe { b.lent().dma_read(b.commit_addr(d.tag), BIG as usize) };
        out.push((d.tag, d.outcome.errno, data.expect("inside the pool")));
    });
    out
}

/// The kernel's NEED_GET_DATA copy: `data` into the span reserved at `addr`.
fn get_data(p: &mut Path<&FakeConnect>, addr: u64, data: &[u8]) {
    // SAFETY: the span is reserved for the write and nothing refers to the pool's memory (the
    // kernel's copy into it, as a test has it)
    let copied = unsafe { p.bufs().lent().dma_write(addr, data) };
    assert!(copied, "inside the pool");
}

#[test]
fn pool_commands_take_spans_in_arrival_order_and_reads_keep_theirs_until_committed() {
    let c = FakeConnect::default();
    let mut p = pool_path(&c, 2 * BIG);
    let t0 = Instant::now();
    let w = BlockOp::Write { fua: false };
    // two 32 KiB writes fill the pool; a third and a 4 KiB one wait, in order
    for tag in 0..2u16 {
        let addr = p.reserve(tag, BIG).expect("fits").expect("room");
        get_data(&mut p, addr, &pattern(tag as u8));
        submit_big(&mut p, tag, w, u64::from(tag) * 64);
    }
    assert_eq!(p.reserve(2, BIG), Ok(None));
    assert_eq!(p.reserve(3, 4096), Ok(None), "not ahead of the one waiting");
    assert_eq!(p.busy(), 4);
    assert_eq!(p.buffer_stalls(), 2);
    let done = service_pool(&mut p, t0);
    assert_eq!(
        done.iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(),
        [(0, 0), (1, 0)]
    );
    // the writes' spans came back at once: both reservations hold theirs
    let granted = p.granted();
    assert_eq!(granted.iter().map(|g| g.0).collect::<Vec<_>>(), [2, 3]);
    assert!(p.granted().is_empty(), "said once");
    get_data(&mut p, granted[0].1, &pattern(2));
    submit_big(&mut p, 2, w, 128);
    get_data(&mut p, granted[1].1, &[0x33; 4096]);
    p.submit(3, LUN, w, 300 * 512, 4096, &GEO)
        .expect("submitted");
    assert_eq!(service_pool(&mut p, t0).len(), 2);
    // two 32 KiB reads fill it again; their data is where their commits point
    for (tag, lba) in [(4u16, 0u64), (5, 64)] {
        submit_big(&mut p, tag, BlockOp::Read, lba);
    }
    let done = service_pool(&mut p, t0);
    assert_eq!(done.len(), 2);
    for (tag, errno, data) in &done {
        assert_eq!(*errno, 0);
        assert!(*data == pattern(*tag as u8 - 4), "tag {tag}'s data");
    }
    // a read's span is the kernel's to copy from until its commit is submitted
    assert!(!p.commits_hold_waiters(), "nobody waits");
    submit_big(&mut p, 6, BlockOp::Read, 128);
    assert_eq!(p.busy(), 1);
    assert!(service_pool(&mut p, t0).is_empty(), "waits for the commits");
    assert!(p.commits_hold_waiters(), "the front end must not sleep now");
    assert_eq!(p.buffer_stalls(), 3, "a read that waits counts too");
    p.committed(&mut |_, _| {});
    assert!(!p.commits_hold_waiters());
    let done = service_pool(&mut p, t0);
    assert_eq!((done.len(), done[0].0, done[0].1), (1, 6, 0));
    assert!(done[0].2 == pattern(2));
    // FLUSH takes nothing; WRITE SAME's block takes a unit
    p.submit(7, LUN, BlockOp::Flush, 0, 0, &GEO).expect("flush");
    let wz = BlockOp::WriteZeroes { may_unmap: false };
    p.submit(0, LUN, wz, 0, 4096, &GEO).expect("write zeroes");
    p.committed(&mut |_, _| {});
    let done = service_pool(&mut p, t0);
    assert_eq!(done.iter().map(|d| d.1).collect::<Vec<_>>(), [0, 0]);
}

#[test]
fn at_fast_io_fail_a_waiting_pool_write_gets_its_span_and_fails() {
    let c = FakeConnect::refusing();
    let mut p = pool_path(&c, BIG);
    let t0 = Instant::now();
    p.ch.transport().faults.hold_rsps = true;
    submit_big(&mut p, 0, BlockOp::Read, 0);
    assert_eq!(p.reserve(1, BIG), Ok(None));
    assert_eq!(
        p.reserve(2, BIG * 2),
        Err(libc::EINVAL),
        "larger than the pool"
    );
    break_channel(&mut p);
    assert!(service_pool(&mut p, t0).is_empty());
    let done = service_pool(&mut p, t0 + Duration::from_secs(5));
    assert_eq!((done.len(), done[0].0, done[0].1), (1, 0, libc::EIO));
    assert_eq!(p.busy(), 1, "the write waits for the read's commit");
    p.committed(&mut |_, _| {});
    let granted = p.granted();
    assert_eq!(granted.iter().map(|g| g.0).collect::<Vec<_>>(), [1]);
    let r = p.submit(1, LUN, BlockOp::Write { fua: false }, 0, BIG, &GEO);
    assert_eq!((r, p.busy()), (Err(libc::EIO), 0));
}

#[test]
fn closing_fails_pool_writes_still_waiting() {
    let c = FakeConnect::default();
    let mut p = pool_path(&c, BIG);
    assert!(p.reserve(0, BIG).expect("fits").is_some());
    assert_eq!(p.reserve(1, 4096), Ok(None));
    let mut failed = Vec::new();
    p.close(&mut |d, _| failed.push((d.tag, d.outcome.errno)));
    assert_eq!(failed, [(1, libc::EIO)]);
}

#[test]
fn a_held_pool_read_is_reissued_at_its_span_on_the_new_login() {
    let c = FakeConnect::default();
    let mut p = pool_path(&c, 2 * BIG);
    let t0 = Instant::now();
    let addr = p.reserve(0, BIG).expect("fits").expect("room");
    get_data(&mut p, addr, &pattern(5));
    submit_big(&mut p, 0, BlockOp::Write { fua: false }, 0);
    assert_eq!(service_pool(&mut p, t0)[0].1, 0);
    p.ch.transport().faults.hold_rsps = true;
    submit_big(&mut p, 1, BlockOp::Read, 0);
    assert!(service_pool(&mut p, t0).is_empty());
    break_channel(&mut p);
    assert!(service_pool(&mut p, t0).is_empty(), "held");
    let done = service_pool(&mut p, t0 + Duration::from_secs(1));
    assert!(p.is_up());
    assert_eq!((done.len(), done[0].0, done[0].1), (1, 1, 0));
    assert!(done[0].2 == pattern(5), "the re-issued read's data");
}

#[test]
fn a_waiting_pool_discard_waits_for_its_parameters_not_its_range() {
    let c = FakeConnect::default();
    let mut p = pool_path(&c, BIG);
    let t0 = Instant::now();
    assert!(p.reserve(0, BIG).expect("fits").is_some());
    // 512 KiB unmapped: 4 KiB of UNMAP parameters, after the write that fills the pool
    p.submit(1, LUN, BlockOp::Discard, 0, 16 * BIG, &GEO)
        .expect("queued");
    assert_eq!(p.busy(), 1);
    submit_big(&mut p, 0, BlockOp::Write { fua: false }, 0);
    let mut done = service_pool(&mut p, t0);
    done.extend(service_pool(&mut p, t0));
    let got: Vec<(u16, i32)> = done.iter().map(|d| (d.0, d.1)).collect();
    assert_eq!(got, [(0, 0), (1, 0)]);
    assert_eq!(p.busy(), 0);
}

/// What finished, (tag, errno), whatever the buffers.
fn service_errnos(p: &mut Path<&FakeConnect>, now: Instant) -> Vec<(u16, i32)> {
    let mut out = Vec::new();
    p.service(now, &mut |d, _| out.push((d.tag, d.outcome.errno)));
    out
}

#[test]
fn a_lun_that_refuses_write_same_is_zeroed_by_zero_writes_from_tag_or_pool_buffers() {
    for pooled in [false, true] {
        let c = FakeConnect::default();
        let mut p = if pooled { pool_path(&c, BIG) } else { path(&c) };
        let t0 = Instant::now();
        p.ch.transport().disk.fill(0xab);
        p.ch.transport().faults.refuse = vec![op::WRITE_SAME_16];
        let z = BlockOp::WriteZeroes { may_unmap: true };
        p.submit(0, LUN, z, 8 * 512, 16 << 10, &GEO)
            .expect("submitted");
        assert_eq!(
            service_errnos(&mut p, t0),
            [(0, libc::EOPNOTSUPP)],
            "pool {pooled}"
        );
        assert!(
            p.ch.transport().disk.iter().all(|&b| b == 0xab),
            "refused: untouched"
        );
        // what a front end sends next: zeros written, from a tag buffer holding other data
        p.buf(1).fill(0xcd);
        p.submit(1, LUN, BlockOp::ZeroWrite, 8 * 512, 16 << 10, &GEO)
            .expect("submitted");
        assert_eq!(service_errnos(&mut p, t0), [(1, 0)], "pool {pooled}");
        let disk = &p.ch.transport().disk;
        let (at, end) = (8 * 512, 8 * 512 + (16 << 10));
        assert!(
            disk[at..end].iter().all(|&b| b == 0),
            "pool {pooled}: not zeroed"
        );
        assert!(disk[..at].iter().chain(&disk[end..]).all(|&b| b == 0xab));
        let log = &p.ch.transport().log;
        assert_eq!(log.last().map(|l| l.0), Some(op::WRITE_16));
        // longer than the buffers hold: refused, nothing written
        let too_long = p.submit(2, LUN, BlockOp::ZeroWrite, 0, 4 * BIG, &GEO);
        assert_eq!(too_long, Err(libc::EINVAL), "pool {pooled}");
    }
}

/// Memory a front end lends is registered with the channel's, kept over a reconnect through the
/// same device (a command held over it keeps the loan's keys: its data lands in the lent memory),
/// registered again through another (new keys, the loan's generation moves), and a command held
/// over that reconnect goes to the new keys.
#[test]
fn lent_memory_follows_the_device_and_held_segments_are_rekeyed() {
    let c = FakeConnect::default();
    let mut p = path(&c);
    p.ch.transport().rkey_scope = crate::wire::target::RkeyScope::Login;
    let t0 = Instant::now();
    write(&mut p, 0, 0, 0x77, t0);
    // a guest's memory, in tests another set of buffers: two regions
    let guest = TagBufs::new(2, 8192);
    p.lend(guest.lent()).expect("registered");
    let gen = p.loan_gen();
    let (_, descs) = p.loan().expect("registered at once");
    let descs = descs.to_vec();
    assert_eq!(descs.len(), 2);
    let segs = [descs[0].prefix(2048), descs[1].prefix(2048)];
    // a read of LBA 0..8 into the two regions' first 2 KiB
    let read_on_loan = |p: &mut Path<&FakeConnect>, tag: u16| {
        p.submit_segments(
            tag,
            LUN,
            crate::wire::scsi::Cdb::read16(0, 8, false),
            false,
            &segs,
        )
        .expect("submitted")
    };
    read_on_loan(&mut p, 3);
    service(&mut p, t0);
    let lent = guest.lent();
    // SAFETY: the read completed; nothing else refers to the guest's memory
    let got = unsafe { lent.dma_read(descs[1].addr, 2048) }.unwrap();
    assert!(got.iter().all(|&b| b == 0x77));
    // the same device: the loan stays registered, its keys unchanged, and a read on it held
    // over the reconnect is re-issued to the same keys (not to the tag's own buffer)
    write(&mut p, 1, 0, 0x5c, t0);
    p.ch.transport().faults.hold_rsps = true;
    read_on_loan(&mut p, 3);
    service(&mut p, t0);
    break_channel(&mut p);
    service(&mut p, t0);
    let (done, _) = service(&mut p, t0 + Duration::from_secs(1));
    assert_eq!((p.reconnects(), p.loan_gen()), (1, gen));
    assert_eq!(p.loan().unwrap().1, &descs[..]);
    assert_eq!(
        done.iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(),
        [(3, 0)],
        "the held read on the loan"
    );
    // SAFETY: the read completed; nothing else refers to the guest's memory
    let got = unsafe { lent.dma_read(descs[1].addr, 2048) }.unwrap();
    assert!(got.iter().all(|&b| b == 0x5c), "the re-issued read's data");
    // another device, with a read on the loan held over the reconnect
    p.ch.transport().faults.hold_rsps = true;
    read_on_loan(&mut p, 4);
    service(&mut p, t0 + Duration::from_secs(1));
    c.device.set(Some(9));
    break_channel(&mut p);
    service(&mut p, t0 + Duration::from_secs(1));
    let (done, _) = service(&mut p, t0 + Duration::from_secs(2));
    assert_eq!(p.reconnects(), 2);
    assert_eq!(
        done.iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(),
        [(4, 0)]
    );
    assert_ne!(p.loan_gen(), gen);
    let now = p.loan().unwrap().1.to_vec();
    assert_ne!(
        now[1].lkey, descs[1].lkey,
        "registered again on the new device"
    );
    assert_eq!(now[1].addr, descs[1].addr);
}

#[test]
fn a_channel_shared_by_two_devices_holds_both_depths_beyond_its_sends() {
    // two devices of DEPTH tags each on one channel whose login was sized for DEPTH / 2
    // commands (8 command send slots) and gives 16 credits (one kept back): what does not fit
    // waits, and every command reaches its own LUN with its own data
    let sends = DEPTH / 2;
    let t = FakeTarget::new(
        1 << 20,
        512,
        crate::channel::send_slots(sends, 4),
        DEPTH + 8,
    );
    let cfg = ChannelConfig::fake(sends).with_tags(2 * DEPTH);
    assert_eq!((cfg.depth, cfg.cmd_slots()), (2 * DEPTH, 2 * sends));
    let c = FakeConnect::default();
    let bufs = TagBufs::new(2 * DEPTH, BUF);
    let mut p = Path::new(
        Channel::new(t, cfg),
        &c,
        bufs,
        Rport::new(TIMERS),
        "queue 0".into(),
    )
    .expect("registers");
    let lun_of = |tag: u16| ScsiLun::from_int(u64::from(tag / DEPTH) + 1);
    let w = BlockOp::Write { fua: false };
    for tag in 0..2 * DEPTH {
        p.buf(tag)[..4096].fill(0x40 + tag as u8);
        p.submit(tag, lun_of(tag), w, u64::from(tag) * 4096, 4096, &GEO)
            .expect("submitted");
    }
    let now = Instant::now();
    let mut done = Vec::new();
    for _ in 0..10 {
        done.extend(service(&mut p, now).0);
    }
    let mut tags: Vec<(u16, i32)> = done.iter().map(|d| (d.0, d.1)).collect();
    tags.sort_unstable();
    let want: Vec<(u16, i32)> = (0..2 * DEPTH).map(|t| (t, 0)).collect();
    assert_eq!(tags, want, "every write completes once, without error");
    let st = p.channel().stats();
    assert!(
        st.credit_stalls + st.slot_stalls > 0,
        "{st:?}: nothing waited"
    );
    let mut luns = p.ch.transport().luns.clone();
    luns.sort_unstable_by_key(|l| l.0);
    let want: Vec<ScsiLun> = (0..2 * DEPTH).map(lun_of).collect();
    assert_eq!(luns, want, "each command went to its device's LUN");
    for tag in 0..2 * DEPTH {
        p.submit(
            tag,
            lun_of(tag),
            BlockOp::Read,
            u64::from(tag) * 4096,
            4096,
            &GEO,
        )
        .expect("submitted");
    }
    let mut done = Vec::new();
    for _ in 0..10 {
        done.extend(service(&mut p, now).0);
    }
    assert_eq!(done.len(), usize::from(2 * DEPTH));
    for (tag, errno, data) in done {
        assert_eq!(errno, 0);
        assert!(
            data.iter().all(|&b| b == 0x40 + tag as u8),
            "tag {tag} read back another tag's data"
        );
    }
}

#[test]
fn an_abandoned_pool_write_gives_its_span_back_and_what_waited_goes() {
    // a device stopped before the kernel copied its writes' data in: one write holds a span, one
    // waits for room behind it; a third (another device's) waits behind both
    let c = FakeConnect::default();
    let mut p = pool_path(&c, 2 * BIG);
    let held = p.reserve(0, 2 * BIG).expect("fits").expect("room");
    assert!(held > 0);
    assert_eq!(p.reserve(1, BIG), Ok(None));
    assert_eq!(p.reserve(2, BIG), Ok(None));
    let mut done = Vec::new();
    p.abandon(1, &mut |d, _| done.push(d.tag));
    assert!(p.granted().is_empty(), "the pool is still held by tag 0");
    p.abandon(0, &mut |d, _| done.push(d.tag));
    assert!(done.is_empty(), "nothing was sent, nothing completes");
    let granted: Vec<u16> = p.granted().iter().map(|g| g.0).collect();
    assert_eq!(granted, [2], "the other device's write got the room back");
    assert_eq!(p.busy(), 0, "no reservation is left waiting");
}

#[test]
fn a_login_that_fails_at_once_is_followed_by_the_next_attempt() {
    let c = FakeConnect::default();
    let mut p = path(&c);
    let t0 = Instant::now();
    let ms = |m: u64| t0 + Duration::from_millis(m);
    read_unanswered(&mut p);
    break_channel(&mut p);
    service(&mut p, ms(0));
    assert!(!p.is_up());
    // the reconnect's login goes down again at once (its first IU is malformed)
    service(&mut p, ms(1000));
    assert_eq!(c.attempts.get(), 1);
    break_channel(&mut p);
    let mut seen = Vec::new();
    for at in [1000, 1050, 1500, 2000, 2050] {
        service(&mut p, ms(at));
        seen.push((at, c.attempts.get(), p.is_up()));
        if !p.is_up() {
            assert_eq!(
                p.next_tick_in(),
                Some(DOWN_TICK),
                "a down path wants its next tick"
            );
        }
    }
    assert_eq!(
        seen,
        [
            (1000, 1, false),
            (1050, 1, false),
            (1500, 1, false),
            (2000, 2, true),
            (2050, 2, true)
        ]
    );
}
