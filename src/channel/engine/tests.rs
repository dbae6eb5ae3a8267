//! The engine over the fake target: data round trips, pipelining with credits, and the faults the lab
//! cannot trigger on demand.

use super::*;
use crate::channel::block::{to_scsi, BlockOp, Geometry};
use crate::channel::fake::FakeTarget;
use crate::channel::Login;
use crate::wire::scsi::Cdb;
use crate::wire::srp::{opcode, TskMgmtFunc};

const DEPTH: u16 = 8;
const GEO: Geometry = Geometry {
    block_shift: 9,
    blocks: 2048,
    unmap: true,
    write_same_unmap: true,
    cache: crate::channel::block::WriteCache::LEGACY,
    lbpme: false,
    lbprz: false,
    write_same: true,
};

fn cfg(req_lim: i32) -> ChannelConfig {
    ChannelConfig {
        depth: DEPTH,
        send_depth: DEPTH,
        extra_slots: 4,
        lun: ScsiLun::from_int(0),
        req_lim,
        max_imm: 8192,
        imm_data_offset: 68,
        max_it_iu_len: 8260,
        max_retries: 3,
    }
}

fn setup(req_lim: i32) -> (Channel<FakeTarget>, Vec<DataBuf>) {
    let mut t = FakeTarget::new(
        1 << 20,
        512,
        crate::channel::send_slots(DEPTH, 4),
        DEPTH + 8,
    );
    let bufs = (0..DEPTH).map(|_| t.alloc(65536)).collect();
    (Channel::new(t, cfg(req_lim)), bufs)
}

/// Runs the channel until nothing completes any more; returns what finished.
fn drain(ch: &mut Channel<FakeTarget>) -> Vec<Done> {
    // what the front end does after a batch of submits: post the chain
    ch.flush();
    let mut out = Vec::new();
    while ch.process(&mut |d| out.push(d)) > 0 {}
    out
}

fn io(ch: &mut Channel<FakeTarget>, bufs: &[DataBuf], tag: u16, op: BlockOp, off: u64, len: u32) {
    io_to(ch, bufs, LUN0, tag, (op, off, len));
}

/// A 4 KiB write of tag `tag`'s buffer to byte `tag x 4096` of LUN 0 (not yet submitted).
fn write_4k(bufs: &[DataBuf], tag: u16) -> ScsiCmd {
    let w = BlockOp::Write { fua: false };
    let b = bufs[usize::from(tag)];
    to_scsi(LUN0, w, u64::from(tag) * 4096, 4096, &GEO, b, &mut []).unwrap()
}

const LUN0: ScsiLun = ScsiLun([0; 8]);
/// Another logical unit behind the same channel (the fake serves one disk whatever the LUN).
const LUN1: ScsiLun = ScsiLun([0, 1, 0, 0, 0, 0, 0, 0]);

fn io_to(
    ch: &mut Channel<FakeTarget>,
    bufs: &[DataBuf],
    lun: ScsiLun,
    tag: u16,
    (op, off, len): (BlockOp, u64, u32),
) {
    let b = bufs[usize::from(tag)];
    let mut scratch = vec![0u8; 4096];
    let cmd = to_scsi(lun, op, off, len, &GEO, b, &mut scratch).unwrap();
    if matches!(op, BlockOp::Discard | BlockOp::WriteZeroes { .. }) {
        ch.transport().buf(b)[..4096].copy_from_slice(&scratch);
    }
    ch.submit(tag, cmd).unwrap();
    ch.flush();
}

#[test]
fn write_then_read_direct_and_immediate() {
    let (mut ch, bufs) = setup(16);
    // 4 KiB goes as immediate data, 64 KiB by RDMA READ of our buffer
    for (tag, len) in [(0u16, 4096u32), (1, 65536)] {
        let pat: Vec<u8> = (0..len).map(|i| (i as u8) ^ (tag as u8 * 31)).collect();
        ch.transport().buf(bufs[usize::from(tag)])[..len as usize].copy_from_slice(&pat);
        io(
            &mut ch,
            &bufs,
            tag,
            BlockOp::Write { fua: false },
            u64::from(tag) * 131072,
            len,
        );
    }
    let done = drain(&mut ch);
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|d| d.outcome.errno == 0));
    for (tag, len) in [(2u16, 4096u32), (3, 65536)] {
        io(
            &mut ch,
            &bufs,
            tag,
            BlockOp::Read,
            u64::from(tag - 2) * 131072,
            len,
        );
    }
    let done = drain(&mut ch);
    assert_eq!(done.len(), 2);
    for (tag, wtag, len) in [(2u16, 0u8, 4096usize), (3, 1, 65536)] {
        let got = ch.transport().buf(bufs[usize::from(tag)])[..len].to_vec();
        let want: Vec<u8> = (0..len as u32).map(|i| (i as u8) ^ (wtag * 31)).collect();
        assert_eq!(got, want, "tag {tag}");
    }
    assert_eq!(ch.req_lim(), 16, "one credit back per response");
    assert_eq!(ch.busy(), 0);
}

#[test]
fn pipelined_commands_respect_credits() {
    // 4 credits: at most 3 commands out at once (one kept for task management)
    let (mut ch, bufs) = setup(4);
    ch.transport().faults.hold_rsps = true;
    for tag in 0..DEPTH {
        io(
            &mut ch,
            &bufs,
            tag,
            BlockOp::Read,
            u64::from(tag) * 4096,
            4096,
        );
    }
    drain(&mut ch);
    assert_eq!(
        ch.transport().log.len(),
        3,
        "only req_lim - 1 commands may be sent"
    );
    assert_eq!(ch.stats().credit_stalls, 5);
    assert_eq!(ch.req_lim(), 1);
    ch.transport().faults.hold_rsps = false;
    ch.transport().release_held();
    let mut done = drain(&mut ch);
    while done.len() < usize::from(DEPTH) {
        ch.transport().release_held();
        let more = drain(&mut ch);
        assert!(!more.is_empty(), "stuck with {} done", done.len());
        done.extend(more);
    }
    assert_eq!(done.len(), usize::from(DEPTH));
    assert_eq!(ch.stats().min_req_lim, 1);
    assert_eq!(ch.req_lim(), 4);
}

#[test]
fn a_response_that_beats_its_send_completion_completes_the_command() {
    let (mut ch, bufs) = setup(16);
    ch.transport().faults.rsp_before_send = true;
    ch.transport().faults.hold_send_wcs = true;
    // one tag used again and again, as fio at QD1 does: each write completes at its response and
    // the next goes out on a spare slot while the SEND completions are still out
    let slots = usize::from(DEPTH) * 2;
    for i in 0..slots {
        ch.transport().buf(bufs[0])[..4096].fill(i as u8);
        io(&mut ch, &bufs, 0, BlockOp::Write { fua: true }, 0, 4096);
        let done = drain(&mut ch);
        assert_eq!(done.len(), 1, "write {i} completes at its response");
        assert_eq!(done[0].outcome.errno, 0);
        assert_eq!(&ch.transport().disk[..4096], &[i as u8; 4096][..]);
        assert!(!ch.wants_send_completions());
    }
    // every slot is waiting for its SEND completion: the next command waits for one, and asks
    // for a wake-up when one comes
    ch.transport().buf(bufs[0])[..4096].fill(0xee);
    io(&mut ch, &bufs, 0, BlockOp::Write { fua: true }, 0, 4096);
    assert!(drain(&mut ch).is_empty());
    assert_eq!(
        ch.transport().log.len(),
        slots,
        "not sent without a free slot"
    );
    assert!(ch.wants_send_completions());
    let st = ch.stats();
    assert_eq!(
        (st.slot_stalls, st.credit_stalls),
        (1, 0),
        "a wait for a slot, not a credit"
    );
    ch.arm().unwrap();
    assert!(ch.transport().armed_sends);
    ch.transport().release_send_wcs();
    let done = drain(&mut ch);
    assert_eq!(done.len(), 1, "sent once a SEND completion freed a slot");
    assert_eq!(&ch.transport().disk[..4096], &[0xee; 4096][..]);
    assert!(!ch.wants_send_completions());
    ch.arm().unwrap();
    assert!(
        !ch.transport().armed_sends,
        "no wake-up for SEND completions alone"
    );
    assert_eq!((ch.busy(), ch.req_lim()), (0, 16));
}

#[test]
fn selective_signalling_gives_back_every_slot_posted_before_a_signalled_send() {
    let (mut ch, bufs) = setup(16);
    let every = u32::from(cfg(16).signal_every());
    // a read never answered keeps the queue from being alone (a lone command is signalled)
    ch.transport().faults.drop_next_rsp = true;
    io(&mut ch, &bufs, 7, BlockOp::Read, 0, 512);
    assert!(drain(&mut ch).is_empty());
    // 40 passes of 3 writes each on tags 0-2: 120 SENDs through 16 command slots, each slot
    // used again many times, most of them never reporting a completion of their own
    for pass in 0..40u32 {
        for tag in 0..3u16 {
            let fill = (pass * 3 + u32::from(tag)) as u8;
            ch.transport().buf(bufs[usize::from(tag)])[..4096].fill(fill);
            ch.submit(tag, write_4k(&bufs, tag)).unwrap();
        }
        let done = drain(&mut ch);
        assert_eq!(done.len(), 3, "pass {pass}");
        assert!(done.iter().all(|d| d.outcome.errno == 0));
        for tag in 0..3usize {
            let want = (pass * 3 + tag as u32) as u8;
            let got = &ch.transport().disk[tag * 4096..(tag + 1) * 4096];
            assert_eq!(got, &[want; 4096][..], "pass {pass} tag {tag}");
        }
        assert!(
            !ch.wants_send_completions(),
            "no slot waited for (pass {pass})"
        );
    }
    assert_eq!(
        ch.transport().sends,
        (121, 1 + 120 / every),
        "the lone read, then one SEND in {every}"
    );
    assert_eq!((ch.stats().credit_stalls, ch.stats().slot_stalls), (0, 0));
    assert_eq!((ch.busy(), ch.req_lim()), (1, 15), "the unanswered read");
}

#[test]
fn a_chain_refused_in_the_middle_loses_and_doubles_nothing() {
    let (mut ch, bufs) = setup(16);
    for tag in 0..4u16 {
        ch.transport().buf(bufs[usize::from(tag)])[..4096].fill(0x10 + tag as u8);
        ch.submit(tag, write_4k(&bufs, tag)).unwrap();
    }
    // one pass's four SRP_CMDs, posted as one chain that the HCA refuses at the third
    ch.transport().faults.fail_post_at = Some(2);
    let mut done = drain(&mut ch);
    assert!(
        matches!(ch.down(), Some(DownReason::Transport(_))),
        "a refused post takes the channel down: {:?}",
        ch.down()
    );
    assert_eq!(
        ch.transport().log.len(),
        2,
        "the two ahead of the refusal went"
    );
    assert_eq!(done.len(), 2, "and were answered");
    // the front end stops the transport and logs in again: what did not go is sent there
    ch.transport().stop();
    let new = ch.transport().successor();
    drop(ch.reconnect(new, 16, 8192, &mut |_, b| b));
    assert_eq!(
        ch.resume(1_000, ReissueLimit::new(None), &mut |d| done.push(d)),
        0
    );
    done.extend(drain(&mut ch));
    let mut tags: Vec<u16> = done.iter().map(|d| d.tag).collect();
    tags.sort();
    assert_eq!(tags, [0, 1, 2, 3], "each command completes once");
    assert!(done.iter().all(|d| d.outcome.errno == 0));
    assert_eq!(
        ch.transport().log.len(),
        2,
        "only the two refused are sent again"
    );
    for tag in 0..4usize {
        let got = &ch.transport().disk[tag * 4096..(tag + 1) * 4096];
        assert_eq!(got, &[0x10 + tag as u8; 4096][..], "block of tag {tag}");
    }
    assert_eq!(ch.busy(), 0);
}

#[test]
fn cred_req_and_aer_req_are_answered_without_credit() {
    let (mut ch, bufs) = setup(2);
    ch.transport().faults.delta_per_rsp = Some(0);
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 512);
    io(&mut ch, &bufs, 1, BlockOp::Read, 0, 512);
    let done = drain(&mut ch);
    assert_eq!(
        done.len(),
        1,
        "second command waits: responses return no credit"
    );
    assert_eq!(ch.req_lim(), 1);
    ch.transport().send_cred_req(5, 0x77);
    let done = drain(&mut ch);
    assert_eq!(
        done.len(),
        1,
        "the waiting command went once CRED_REQ granted credits"
    );
    assert_eq!(ch.stats().cred_reqs, 1);
    ch.transport().send_aer_req(1, 0x78);
    drain(&mut ch);
    let small = ch.transport().small_ius.clone();
    assert_eq!(
        small,
        vec![(opcode::CRED_RSP, 0x77), (opcode::AER_RSP, 0x78)]
    );
    assert_eq!(ch.req_lim(), 1 + 5 - 1 + 1);
}

#[test]
fn unit_attention_is_retried_medium_error_fails() {
    let (mut ch, bufs) = setup(16);
    ch.transport()
        .faults
        .check_condition
        .push_back((6, 0x29, 0x03));
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 512);
    let done = drain(&mut ch);
    assert_eq!(done[0].outcome.errno, 0, "UNIT ATTENTION is absorbed");
    assert_eq!(ch.stats().retries, 1);
    assert_eq!(ch.stats().luns_changed, 0);
    // REPORTED LUNS DATA HAS CHANGED: absorbed too, and counted for the supervisor's rescan
    ch.transport()
        .faults
        .check_condition
        .push_back((6, 0x3f, 0x0e));
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 512);
    assert_eq!(drain(&mut ch)[0].outcome.errno, 0);
    assert_eq!(ch.stats().luns_changed, 1);
    // CAPACITY DATA HAS CHANGED: absorbed, and counted for the daemon's capacity check
    ch.transport()
        .faults
        .check_condition
        .push_back((6, 0x2a, 0x09));
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 512);
    assert_eq!(drain(&mut ch)[0].outcome.errno, 0);
    assert_eq!(ch.stats().capacity_changed, 1);
    assert_eq!(ch.stats().luns_changed, 1);
    ch.transport()
        .faults
        .check_condition
        .push_back((3, 0x11, 0));
    io(&mut ch, &bufs, 1, BlockOp::Read, 0, 512);
    let done = drain(&mut ch);
    assert_eq!(done[0].outcome.errno, errno::EIO);
    assert_eq!(done[0].outcome.sense.unwrap().asc, 0x11);
    // a UA that never clears gives up after max_retries
    for _ in 0..4 {
        ch.transport()
            .faults
            .check_condition
            .push_back((6, 0x29, 0));
    }
    io(&mut ch, &bufs, 2, BlockOp::Read, 0, 512);
    let done = drain(&mut ch);
    assert_eq!(done[0].outcome.errno, errno::EIO);
}

#[test]
fn late_and_unknown_responses_are_dropped() {
    let (mut ch, bufs) = setup(16);
    ch.transport().faults.drop_next_rsp = true;
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 512);
    assert!(
        drain(&mut ch).is_empty(),
        "lost response: nothing completes"
    );
    // a response with a stale generation for tag 0 and one for a tag that does not exist
    let stale = 0u64; // generation 0 never goes out: every send bumps the generation first
    let rsp = |tag| {
        let r = crate::wire::srp::SrpRsp::good(tag, 1);
        let mut b = vec![0u8; 36];
        r.encode(&mut b).unwrap();
        b
    };
    ch.transport().inject(rsp(stale));
    ch.transport().inject(rsp(0x1_0000_0000));
    ch.transport().inject(rsp(u64::from(DEPTH + 1)));
    assert!(drain(&mut ch).is_empty());
    assert_eq!(ch.stats().unexpected_rsp, 3);
    assert!(ch.down().is_none());
    assert_eq!(ch.busy(), 1);
}

#[test]
fn malformed_iu_and_t_logout_take_the_channel_down_without_panic() {
    let (mut ch, bufs) = setup(16);
    ch.transport().inject(vec![0xc1, 0, 0]);
    drain(&mut ch);
    assert!(matches!(ch.down(), Some(DownReason::Malformed(_))));
    assert!(matches!(
        ch.submit(
            0,
            ScsiCmd {
                lun: LUN0,
                cdb: Cdb::test_unit_ready(),
                data: DataDir::None
            }
        ),
        Err(SubmitError::Down(_))
    ));

    let (mut ch, bufs2) = setup(16);
    ch.transport().faults.hold_rsps = true;
    io(&mut ch, &bufs2, 3, BlockOp::Read, 0, 512);
    ch.transport().send_t_logout();
    drain(&mut ch);
    assert!(matches!(ch.down(), Some(DownReason::TargetLogout(_))));
    let mut failed = Vec::new();
    ch.fail_all(errno::EIO, &mut |d| failed.push(d));
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].outcome.bytes(512), Err(errno::EIO));
    let _ = bufs;
}

#[test]
fn discard_write_zeroes_flush_and_logout() {
    let (mut ch, bufs) = setup(16);
    ch.transport().disk[..4096].fill(0x5a);
    io(&mut ch, &bufs, 0, BlockOp::Discard, 0, 1024);
    io(
        &mut ch,
        &bufs,
        1,
        BlockOp::WriteZeroes { may_unmap: false },
        2048,
        2048,
    );
    io(&mut ch, &bufs, 2, BlockOp::Flush, 0, 0);
    let done = drain(&mut ch);
    assert_eq!(done.len(), 3);
    assert!(done.iter().all(|d| d.outcome.errno == 0), "{done:?}");
    let disk = &ch.transport().disk;
    assert!(disk[..1024].iter().all(|&b| b == 0));
    assert!(disk[1024..2048].iter().all(|&b| b == 0x5a));
    assert!(disk[2048..4096].iter().all(|&b| b == 0));
    ch.send_i_logout();
    drain(&mut ch);
    assert_eq!(ch.transport().small_ius, vec![(opcode::I_LOGOUT, 0)]);
}

#[test]
fn submit_checks_tags() {
    let (mut ch, bufs) = setup(16);
    ch.transport().faults.hold_rsps = true;
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 512);
    let tur = ScsiCmd {
        lun: LUN0,
        cdb: Cdb::test_unit_ready(),
        data: DataDir::None,
    };
    assert_eq!(ch.submit(0, tur), Err(SubmitError::Busy(0)));
    assert_eq!(ch.submit(DEPTH, tur), Err(SubmitError::BadTag(DEPTH)));
}

#[test]
fn execute_runs_one_command_synchronously() {
    let (mut ch, _) = setup(16);
    let o = ch
        .execute(
            5,
            ScsiCmd {
                lun: LUN0,
                cdb: Cdb::test_unit_ready(),
                data: DataDir::None,
            },
            std::time::Duration::from_secs(1),
        )
        .unwrap();
    assert_eq!(o.errno, 0);
    ch.transport().faults.drop_next_rsp = true;
    let e = ch.execute(
        5,
        ScsiCmd {
            lun: LUN0,
            cdb: Cdb::test_unit_ready(),
            data: DataDir::None,
        },
        std::time::Duration::from_millis(20),
    );
    assert!(matches!(e, Err(SubmitError::Down(_))));
}

#[test]
fn a_burst_of_cred_reqs_is_answered_in_full() {
    // 4 extra slots, 10 CRED_REQs arriving together: the responses beyond the free slots wait for
    // send completions instead of taking the channel down
    let (mut ch, _) = setup(8);
    for i in 0..10u64 {
        ch.transport().send_cred_req(1, 0x100 + i);
    }
    drain(&mut ch);
    assert!(ch.down().is_none(), "{:?}", ch.down());
    let answered: Vec<u64> = ch
        .transport()
        .small_ius
        .iter()
        .map(|&(op, tag)| {
            assert_eq!(op, opcode::CRED_RSP);
            tag
        })
        .collect();
    assert_eq!(
        answered,
        (0x100..0x10a).collect::<Vec<_>>(),
        "every CRED_REQ answered, in order"
    );
    assert_eq!(ch.req_lim(), 8 + 10);
    assert_eq!(ch.stats().cred_reqs, 10);
    assert_eq!(ch.stats().dropped_small, 0);
}

#[test]
fn reconnect_reissues_what_was_in_flight_and_what_was_held() {
    let (mut ch, bufs) = setup(16);
    let pat: Vec<u8> = (0..65536u32).map(|i| (i * 7 + 3) as u8).collect();
    ch.transport().buf(bufs[0])[..4096].copy_from_slice(&pat[..4096]);
    ch.transport().buf(bufs[1]).copy_from_slice(&pat);
    ch.transport().faults.hold_rsps = true;
    io(&mut ch, &bufs, 0, BlockOp::Write { fua: false }, 0, 4096);
    io(
        &mut ch,
        &bufs,
        1,
        BlockOp::Write { fua: false },
        65536,
        65536,
    );
    assert!(drain(&mut ch).is_empty());
    // the target drops the channel with both writes unanswered
    ch.transport().send_t_logout();
    assert!(drain(&mut ch).is_empty());
    assert!(ch.down().is_some());
    // new I/O while down is refused, unless held for the reconnect
    let b = bufs[2];
    let read = to_scsi(LUN0, BlockOp::Read, 65536, 65536, &GEO, b, &mut []).unwrap();
    assert!(matches!(ch.submit(2, read), Err(SubmitError::Down(_))));
    ch.set_hold(true);
    ch.submit(2, read).unwrap();
    assert_eq!(ch.busy(), 3);
    // held for the reconnect: not a wait for credit or for a send slot
    assert_eq!((ch.stats().credit_stalls, ch.stats().slot_stalls), (0, 0));
    let new = ch.transport().successor();
    let mut rekeyed = Vec::new();
    let old = ch.reconnect(new, 16, 8192, &mut |tag, b| {
        rekeyed.push(tag);
        b
    });
    drop(old);
    assert_eq!(
        ch.resume(0, ReissueLimit::new(Some(15_000)), &mut |_| {}),
        0
    );
    let done = drain(&mut ch);
    assert_eq!(done.len(), 3, "{done:?}");
    assert!(done.iter().all(|d| d.outcome.errno == 0), "{done:?}");
    rekeyed.sort();
    assert_eq!(rekeyed, [0, 1, 2]);
    // the re-sent writes went to the new login, in their first order, then the held read
    let tags: Vec<u16> = ch.transport().log.iter().map(|&(_, t)| t as u16).collect();
    assert_eq!(tags, [0, 1, 2]);
    assert_eq!(ch.transport().buf(bufs[2]), &pat[..]);
    assert_eq!(&ch.transport().disk[..4096], &pat[..4096]);
}

#[test]
fn fast_io_fail_fails_held_commands_and_refuses_new_ones() {
    let (mut ch, bufs) = setup(16);
    ch.transport().faults.hold_rsps = true;
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 4096);
    ch.transport().send_t_logout();
    drain(&mut ch);
    ch.set_hold(true);
    io(&mut ch, &bufs, 1, BlockOp::Read, 4096, 4096);
    // fast_io_fail_tmo expires: the front end stops holding and fails what waits
    ch.set_hold(false);
    let mut failed = Vec::new();
    ch.fail_all(errno::EIO, &mut |d| failed.push(d));
    assert_eq!(failed.len(), 2);
    assert!(failed.iter().all(|d| d.outcome.errno == errno::EIO));
    assert_eq!(ch.busy(), 0);
    let cmd = to_scsi(LUN0, BlockOp::Read, 0, 4096, &GEO, bufs[2], &mut []).unwrap();
    assert!(matches!(ch.submit(2, cmd), Err(SubmitError::Down(_))));
}

/// Ticks the channel's clock forward to `ms` (in 100 ms steps, draining between) and returns what
/// completed on the way.
fn run_until(ch: &mut Channel<FakeTarget>, from: u64, ms: u64) -> Vec<Done> {
    let mut out = Vec::new();
    let mut now = from;
    while now <= ms {
        ch.tick(now);
        out.extend(drain(ch));
        now += 100;
    }
    out
}

#[test]
fn lost_response_is_aborted_and_sent_again_late_response_dropped() {
    let (mut ch, bufs) = setup(16);
    ch.tick(1_000);
    ch.transport().faults.drop_next_rsp = true;
    ch.transport().buf(bufs[0])[..512].fill(0x5a);
    io(&mut ch, &bufs, 0, BlockOp::Write { fua: false }, 0, 512);
    let first_tag = ch.transport().log[0].1;
    assert!(
        run_until(&mut ch, 1_000, 30_900).is_empty(),
        "nothing before the timeout"
    );
    assert!(ch.transport().tmfs.is_empty());
    let done = run_until(&mut ch, 31_000, 31_500);
    assert_eq!(
        ch.transport().tmfs,
        vec![(TskMgmtFunc::AbortTask, first_tag)],
        "ABORT TASK names the lost command's SRP tag"
    );
    assert_eq!(done.len(), 1, "sent again after the abort, and completed");
    assert_eq!(done[0].outcome.errno, 0);
    assert_eq!(&ch.transport().disk[..512], &[0x5a; 512][..]);
    let second_tag = ch.transport().log[1].1;
    assert_ne!(first_tag, second_tag, "a new tag generation");
    // the first attempt's response, arriving late now, matches nothing
    let late = ch.transport().respond_good(first_tag);
    ch.transport().inject(late);
    assert!(drain(&mut ch).is_empty());
    assert_eq!(ch.stats().unexpected_rsp, 1);
    assert_eq!((ch.stats().timeouts, ch.stats().tmfs), (1, 1));
    assert!(ch.down().is_none());
    assert_eq!(ch.busy(), 0);
}

#[test]
fn abort_refused_escalates_to_lun_reset_then_down() {
    let (mut ch, bufs) = setup(16);
    ch.tick(0);
    ch.transport().faults.drop_next_rsp = true;
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 512);
    // ABORT TASK refused (FUNCTION FAILED), LUN RESET unanswered
    ch.transport().faults.tmf_answers.extend([Some(0x05), None]);
    ch.transport().faults.hold_rsps = true;
    io(&mut ch, &bufs, 1, BlockOp::Read, 512, 512);
    ch.transport().faults.hold_rsps = false;
    assert!(run_until(&mut ch, 0, 30_500).is_empty());
    assert_eq!(ch.transport().tmfs.len(), 2, "ABORT TASK, then LUN RESET");
    assert_eq!(ch.transport().tmfs[1].0, TskMgmtFunc::LunReset);
    // while the reset is out, nothing new is sent
    let sent = ch.transport().log.len();
    io(&mut ch, &bufs, 2, BlockOp::Read, 1024, 512);
    drain(&mut ch);
    assert_eq!(ch.transport().log.len(), sent, "held behind LUN RESET");
    assert!(ch.down().is_none());
    run_until(&mut ch, 30_600, 35_600);
    assert!(
        matches!(ch.down(), Some(DownReason::Timeout(_))),
        "unanswered LUN RESET takes the channel down: {:?}",
        ch.down()
    );
    assert_eq!(
        ch.busy(),
        3,
        "nothing lost: all three wait for the reconnect"
    );
}

#[test]
fn lun_reset_success_resends_everything_outstanding() {
    let (mut ch, bufs) = setup(16);
    ch.tick(0);
    ch.transport().faults.hold_rsps = true;
    for tag in 0..3 {
        io(
            &mut ch,
            &bufs,
            tag,
            BlockOp::Read,
            u64::from(tag) * 512,
            512,
        );
    }
    ch.transport().faults.hold_rsps = false;
    // the held responses are never released: ABORT TASK unanswered, LUN RESET completes
    ch.transport().faults.tmf_answers.push_back(None);
    let done = run_until(&mut ch, 0, 36_000);
    assert_eq!(ch.transport().tmfs.len(), 2);
    assert_eq!(done.len(), 3, "all three sent again after the reset");
    assert!(done.iter().all(|d| d.outcome.errno == 0));
    assert_eq!(ch.transport().log.len(), 6);
    assert!(ch.down().is_none());
}

#[test]
fn each_command_names_its_own_lun_and_a_lun_reset_holds_that_lun_only() {
    let (mut ch, bufs) = setup(16);
    ch.tick(0);
    // a read on LUN 1 whose response is lost, and one on LUN 0 whose response is held
    ch.transport().faults.drop_next_rsp = true;
    io_to(&mut ch, &bufs, LUN1, 0, (BlockOp::Read, 0, 512));
    ch.transport().faults.hold_rsps = true;
    io_to(&mut ch, &bufs, LUN0, 1, (BlockOp::Read, 512, 512));
    ch.transport().faults.hold_rsps = false;
    assert_eq!(
        ch.transport().luns,
        [LUN1, LUN0],
        "each SRP_CMD names its LUN"
    );
    // ABORT TASK refused, LUN RESET unanswered
    ch.transport().faults.tmf_answers.extend([Some(0x05), None]);
    let done = run_until(&mut ch, 0, 30_500);
    assert!(done.is_empty());
    let t = ch.transport();
    assert_eq!(
        (
            t.tmfs.iter().map(|t| t.0).collect::<Vec<_>>(),
            &t.tmf_luns[..]
        ),
        (
            vec![TskMgmtFunc::AbortTask, TskMgmtFunc::LunReset],
            &[LUN1, LUN1][..]
        ),
        "ABORT TASK and LUN RESET name the timed-out command's LUN"
    );
    // while LUN 1's reset is out, LUN 1 waits and LUN 0 carries on
    let sent = ch.transport().log.len();
    io_to(&mut ch, &bufs, LUN1, 2, (BlockOp::Read, 1024, 512));
    io_to(&mut ch, &bufs, LUN0, 3, (BlockOp::Read, 1536, 512));
    let done = drain(&mut ch);
    assert_eq!(
        ch.transport().luns[sent..],
        [LUN0],
        "only LUN 0's command went"
    );
    assert_eq!(done.iter().map(|d| d.tag).collect::<Vec<_>>(), [3]);
    assert_eq!(
        ch.stats().credit_stalls + ch.stats().slot_stalls,
        0,
        "a held command is no stall"
    );
    assert!(ch.down().is_none());
}

#[test]
fn a_lun_reset_sends_again_its_own_luns_commands_only() {
    let (mut ch, bufs) = setup(16);
    ch.tick(0);
    ch.transport().faults.hold_rsps = true;
    io_to(&mut ch, &bufs, LUN1, 0, (BlockOp::Read, 0, 512));
    io_to(&mut ch, &bufs, LUN1, 1, (BlockOp::Read, 512, 512));
    ch.transport().faults.hold_rsps = false;
    // LUN 0's command is sent later, so tag 0 (LUN 1) is the one that times out
    ch.tick(10_000);
    ch.transport().faults.hold_rsps = true;
    io_to(&mut ch, &bufs, LUN0, 2, (BlockOp::Read, 1024, 512));
    ch.transport().faults.hold_rsps = false;
    // ABORT TASK unanswered, LUN RESET of LUN 1 completes
    ch.transport().faults.tmf_answers.push_back(None);
    let done = run_until(&mut ch, 10_000, 36_000);
    assert_eq!(ch.transport().tmf_luns, [LUN1, LUN1]);
    assert_eq!(
        ch.transport().luns[3..],
        [LUN1, LUN1],
        "both LUN 1 commands sent again, LUN 0's left to its own response"
    );
    let mut tags: Vec<u16> = done.iter().map(|d| d.tag).collect();
    tags.sort();
    assert_eq!(tags, [0, 1]);
    assert_eq!(ch.busy(), 1, "LUN 0's command is still out");
    assert!(ch.down().is_none());
}

#[test]
fn no_credit_for_task_management_takes_the_channel_down() {
    // 2 credits: one command out, the last credit kept for task management; the lost response
    // returns nothing, so the ABORT takes the last one -- and with 1 credit it can still go
    let (mut ch, bufs) = setup(2);
    ch.tick(0);
    ch.transport().faults.drop_next_rsp = true;
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 512);
    ch.transport().faults.tmf_answers.push_back(None);
    run_until(&mut ch, 0, 35_500);
    assert_eq!(
        ch.transport().tmfs.len(),
        1,
        "ABORT TASK took the kept credit"
    );
    assert!(
        matches!(ch.down(), Some(DownReason::Timeout(_))),
        "no credit for LUN RESET: down ({:?})",
        ch.down()
    );
}

#[test]
fn busy_is_retried_with_backoff_within_the_command_timeout() {
    let (mut ch, bufs) = setup(16);
    ch.tick(0);
    ch.transport().faults.busy_next = 3;
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 512);
    assert!(drain(&mut ch).is_empty(), "BUSY: waits");
    assert_eq!(ch.next_tick_in(), Some(5), "first retry after 5 ms");
    let mut done = Vec::new();
    let mut now = 0;
    while done.is_empty() && now < 1_000 {
        now += 1;
        ch.tick(now);
        done.extend(drain(&mut ch));
    }
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].outcome.errno, 0);
    assert_eq!(now, 5 + 10 + 20, "5, 10, 20 ms apart");
    assert_eq!(ch.stats().delayed_retries, 3);
    // a target that stays busy: EBUSY once the command is CMD_TIMEOUT_MS old
    ch.transport().faults.busy_next = u32::MAX;
    io(&mut ch, &bufs, 1, BlockOp::Read, 0, 512);
    let done = run_until(&mut ch, now, now + CMD_TIMEOUT_MS + 1_000);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].outcome.errno, errno::EBUSY);
    assert!(ch.down().is_none());
}

#[test]
fn send_never_completing_takes_the_channel_down_at_the_timeout() {
    let (mut ch, bufs) = setup(16);
    ch.tick(0);
    // a command sent alone is signalled (its SEND completion is the queue's early wake-up);
    // answered, it completes whatever became of its SEND
    ch.transport().faults.drop_next_send_wc = true;
    io(&mut ch, &bufs, 1, BlockOp::Read, 0, 512);
    assert_eq!(
        drain(&mut ch).len(),
        1,
        "answered, SEND not completed: done"
    );
    assert_eq!(ch.transport().sends, (1, 1));
    // unanswered and its signalled SEND never completes: no ABORT TASK can help, down at the
    // command timeout
    ch.transport().faults.drop_next_send_wc = true;
    ch.transport().faults.drop_next_rsp = true;
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 512);
    assert!(drain(&mut ch).is_empty());
    assert!(
        ch.wants_send_completions(),
        "a lone command's SEND wakes the queue"
    );
    assert_eq!(ch.transport().sends, (2, 2));
    run_until(&mut ch, 0, CMD_TIMEOUT_MS + 500);
    assert!(
        matches!(ch.down(), Some(DownReason::Timeout(_))),
        "a SEND the HCA never finishes: down at the command timeout ({:?})",
        ch.down()
    );
    assert_eq!(ch.transport().tmfs.len(), 0);
    assert_eq!(ch.busy(), 1);
}

/// The target drops the channel at `now` with what is outstanding unanswered; a new login follows.
fn drop_and_relogin(ch: &mut Channel<FakeTarget>, now: u64) {
    ch.set_clock(now);
    ch.transport().send_t_logout();
    drain(ch);
    assert!(ch.down().is_some());
    let mut new = ch.transport().successor();
    new.faults.hold_rsps = true;
    drop(ch.reconnect(new, 16, 8192, &mut |_, b| b));
}

#[test]
fn a_command_re_issued_more_than_the_limit_fails_with_eio() {
    // a target that accepts every login, then logs the channel out again with the write unanswered
    let (mut ch, bufs) = setup(16);
    ch.transport().faults.hold_rsps = true;
    io(&mut ch, &bufs, 0, BlockOp::Write { fua: false }, 0, 4096);
    let limit = ReissueLimit::new(None);
    for round in 1..=5 {
        drop_and_relogin(&mut ch, round * 1000);
        let mut failed = Vec::new();
        assert_eq!(ch.resume(round * 1000, limit, &mut |d| failed.push(d)), 0);
        assert!(failed.is_empty(), "failed at re-issue {round}");
        assert_eq!(ch.busy(), 1);
    }
    drop_and_relogin(&mut ch, 6000);
    let mut failed = Vec::new();
    assert_eq!(ch.resume(6000, limit, &mut |d| failed.push(d)), 1);
    assert_eq!(failed.len(), 1);
    assert_eq!((failed[0].tag, failed[0].outcome.errno), (0, errno::EIO));
    assert_eq!(ch.busy(), 0);
}

#[test]
fn fast_io_fail_counts_from_a_command_s_first_hold_not_the_last_login() {
    let (mut ch, bufs) = setup(16);
    ch.transport().faults.hold_rsps = true;
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 4096);
    let limit = ReissueLimit::new(Some(15_000));
    // down at 1 s, back at 5 s: re-issued; a command submitted after the login has its own clock
    drop_and_relogin(&mut ch, 1000);
    assert_eq!(ch.resume(5000, limit, &mut |_| {}), 0);
    ch.set_clock(9000);
    io(&mut ch, &bufs, 1, BlockOp::Read, 4096, 4096);
    // down again at 10 s, back at 16.5 s: tag 0 was first held 15.5 s ago and fails; tag 1,
    // first held at 10 s, is re-issued
    drop_and_relogin(&mut ch, 10_000);
    let mut failed = Vec::new();
    assert_eq!(ch.resume(16_500, limit, &mut |d| failed.push(d)), 1);
    assert_eq!((failed[0].tag, failed[0].outcome.errno), (0, errno::EIO));
    assert_eq!(ch.busy(), 1);
    // tag 1 stays first held at 10 s through another outage; tag 2, submitted while the channel
    // is down (at 17 s), is held from then
    ch.transport().send_t_logout();
    drain(&mut ch);
    ch.set_hold(true);
    ch.set_clock(17_000);
    io(&mut ch, &bufs, 2, BlockOp::Read, 8192, 4096);
    let mut new = ch.transport().successor();
    new.faults.hold_rsps = true;
    drop(ch.reconnect(new, 16, 8192, &mut |_, b| b));
    let mut failed = Vec::new();
    assert_eq!(ch.resume(31_000, limit, &mut |d| failed.push(d)), 1);
    assert_eq!(failed[0].tag, 1);
    assert_eq!(ch.busy(), 1);
}

#[test]
fn a_response_lost_with_the_link_takes_the_channel_down_once_the_port_is_down() {
    // the command was sent and acknowledged; its response went with the link: nothing completes
    let (mut ch, bufs) = setup(16);
    ch.set_clock(0);
    ch.transport().faults.drop_next_rsp = true;
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 512);
    drain(&mut ch);
    // port up: a quiet channel is left to the command timeout
    for now in (0..=LINK_CHECK_MS * 3).step_by(500) {
        ch.tick(now);
    }
    assert!(ch.down().is_none(), "{:?}", ch.down());
    ch.transport().faults.link_down = true;
    ch.tick(LINK_CHECK_MS * 3 + SCAN_MS);
    match ch.down() {
        Some(DownReason::LinkDown(port)) => assert_eq!(port.state, "1: DOWN"),
        other => panic!("expected a transport failure naming the port, got {other:?}"),
    }
}

/// A read on tag 0 of `setup`'s channel, answered; returns the direct descriptor it carried.
fn read_tag0(ch: &mut Channel<FakeTarget>, bufs: &[DataBuf]) -> (u32, u64, u32) {
    io(ch, bufs, 0, BlockOp::Read, 0, 4096);
    assert_eq!(drain(ch).len(), 1);
    ch.transport().last_direct.expect("a direct descriptor")
}

/// A late RDMA WRITE with the key a completed read carried: with per-command windows it is
/// refused (the channel goes down, the buffer keeps what the read returned); with login-wide
/// registrations it lands, silently -- what `rkey_scope=command` prevents.
#[test]
fn a_late_write_with_a_completed_reads_key_lands_only_with_login_scope() {
    use crate::wire::target::RkeyScope;
    for scope in [RkeyScope::Command, RkeyScope::Login] {
        let (mut ch, bufs) = setup(16);
        ch.transport().rkey_scope = scope;
        ch.transport().disk[..4096].fill(0xab);
        let (key, va, _) = read_tag0(&mut ch, &bufs);
        let landed = ch.transport().rdma_write(key, va, &[0x66; 512]);
        drain(&mut ch);
        let buf = ch.transport().buf(bufs[0])[..4096].to_vec();
        match scope {
            RkeyScope::Command => {
                assert!(!landed);
                assert!(buf.iter().all(|&b| b == 0xab), "the read's data is intact");
                assert_eq!(ch.transport().access_errors, 1);
                assert!(
                    matches!(ch.down(), Some(DownReason::Completion { .. })),
                    "{:?}",
                    ch.down()
                );
            }
            RkeyScope::Login => {
                assert!(landed);
                assert_eq!(
                    &buf[..512],
                    &[0x66; 512],
                    "the late write corrupted the buffer"
                );
                assert!(ch.down().is_none());
            }
        }
    }
}

/// An outstanding command's window opens its buffer in one direction, over its byte range, and
/// a new command on the same tag gets a new key.
#[test]
fn a_window_opens_one_direction_over_one_range_with_a_key_per_command() {
    let (mut ch, bufs) = setup(16);
    let first = read_tag0(&mut ch, &bufs);
    let second = read_tag0(&mut ch, &bufs);
    assert_ne!(first.0, second.0, "a key per command");
    assert_ne!(first.0, bufs[0].rkey, "never the registration's key");

    let held = |op| {
        let (mut ch, bufs) = setup(16);
        ch.transport().faults.hold_rsps = true;
        io(&mut ch, &bufs, 1, op, 0, 65536);
        drain(&mut ch);
        let d = ch.transport().last_direct.expect("a direct descriptor");
        (ch, d)
    };
    // a write (data-out) is open to RDMA READ only
    let (mut ch, (key, va, len)) = held(BlockOp::Write { fua: false });
    assert_eq!(len, 65536);
    assert!(!ch.transport().rdma_write(key, va, &[1; 16]));
    // a read (data-in) is open to RDMA WRITE inside its range only
    let (mut ch2, (key, va, len)) = held(BlockOp::Read);
    assert!(ch2
        .transport()
        .rdma_write(key, va + u64::from(len) - 16, &[2; 16]));
    assert!(!ch2
        .transport()
        .rdma_write(key, va + u64::from(len) - 8, &[2; 16]));
    drain(&mut ch);
    drain(&mut ch2);
    assert!(ch.down().is_some() && ch2.down().is_some());
}

/// A target that grants credits past any queue (a buggy or hostile one) leaves `req_lim` at a
/// sane bound instead of wrapping or saturating.
#[test]
fn a_credit_grant_past_any_queue_is_kept_sane() {
    let (mut ch, bufs) = setup(16);
    for tag in [7, 8] {
        ch.transport().send_cred_req(i32::MAX, tag);
        drain(&mut ch);
        assert_eq!(ch.req_lim(), MAX_REQ_LIM);
    }
    io(&mut ch, &bufs, 0, BlockOp::Read, 0, 4096);
    assert_eq!(drain(&mut ch).len(), 1, "I/O still runs");
}

/// A command's data in several segments goes as one indirect descriptor, all inline, each
/// segment in its own window that closes with the command; one segment goes direct; more than the
/// channel carries is refused before anything is sent.
#[test]
fn segments_go_as_an_inline_indirect_table_with_a_window_each() {
    let (mut ch, bufs) = setup(16);
    // three segments of three buffers, one of them not at its buffer's start: 31 blocks
    let segs = [
        bufs[0].prefix(4096),
        DataBuf {
            addr: bufs[1].addr + 512,
            len: 8192,
            ..bufs[1]
        },
        bufs[2].prefix(3584),
    ];
    let total: u32 = segs.iter().map(|s| s.len).sum();
    let pat: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
    let mut at = 0;
    for s in &segs {
        let t = ch.transport();
        let b = bufs.iter().find(|b| b.lkey == s.lkey).copied().unwrap();
        let off = (s.addr - b.addr) as usize;
        t.buf(b)[off..off + s.len as usize].copy_from_slice(&pat[at..at + s.len as usize]);
        at += s.len as usize;
    }
    ch.submit_segments(4, LUN0, Cdb::write16(8, total / 512, false), true, &segs)
        .unwrap();
    assert!(drain(&mut ch).iter().all(|d| d.outcome.errno == 0));
    let t = ch.transport();
    assert_eq!(&t.disk[8 * 512..8 * 512 + total as usize], &pat[..]);
    let sent = t
        .last_indirect
        .take()
        .expect("an indirect descriptor, inline whole");
    let lens: Vec<u32> = sent.iter().map(|d| d.len).collect();
    assert_eq!(lens, [4096, 8192, 3584]);
    assert_eq!(sent[1].va, bufs[1].addr + 512);
    // each window closed with its command: the keys the target saw open nothing now
    for d in &sent {
        assert!(
            !t.rdma_write(d.key, d.va, &[0xff]),
            "window {:#x} still open",
            d.key
        );
    }
    // read back into the segments (in a fresh channel: the stray writes above broke this one)
    let (mut ch2, _) = setup(16);
    ch2.transport().disk = t.disk.clone();
    let bufs2: Vec<DataBuf> = (0..3).map(|_| ch2.transport().alloc(65536)).collect();
    let segs2 = [
        bufs2[0].prefix(1024),
        bufs2[1].prefix(12288),
        bufs2[2].prefix(2560),
    ];
    ch2.submit_segments(5, LUN0, Cdb::read16(8, total / 512, false), false, &segs2)
        .unwrap();
    assert!(drain(&mut ch2).iter().all(|d| d.outcome.errno == 0));
    let mut got = Vec::new();
    for s in &segs2 {
        got.extend_from_slice(&ch2.transport().buf(*s)[..s.len as usize]);
    }
    assert_eq!(got, pat);
    // one segment: a direct descriptor
    ch2.submit_segments(
        6,
        LUN0,
        Cdb::read16(8, 8, false),
        false,
        &[bufs2[0].prefix(4096)],
    )
    .unwrap();
    drain(&mut ch2);
    assert_eq!(ch2.transport().last_direct.map(|d| d.2), Some(4096));
    // the fake's send queue takes 16 segments a command
    assert_eq!(ch2.max_segments(), 16);
    let many = vec![bufs2[0].prefix(512); 17];
    let e = ch2
        .submit_segments(7, LUN0, Cdb::read16(0, 17, false), false, &many)
        .unwrap_err();
    assert_eq!(e, SubmitError::Segments { given: 17, max: 16 });
    assert_eq!(ch2.busy(), 0);
}

/// The segments an IU has room for bound what a command may carry: a 512-byte send slot holds
/// 27 descriptors behind the SRP_CMD and the indirect header.
#[test]
fn the_iu_bounds_the_segments() {
    assert_eq!(segments::inline_room(512), 27);
    assert_eq!(segments::inline_room(8260), 512);
    assert_eq!(segments::inline_room(60), 0);
}

/// A command in segments held over a reconnect has each segment re-keyed and goes again whole.
#[test]
fn held_segments_are_rekeyed_each_and_sent_again() {
    let (mut ch, bufs) = setup(16);
    ch.transport().disk[..8192].fill(0x3c);
    ch.transport().faults.hold_rsps = true;
    let segs = [bufs[0].prefix(4096), bufs[1].prefix(4096)];
    ch.submit_segments(0, LUN0, Cdb::read16(0, 16, false), false, &segs)
        .unwrap();
    assert!(drain(&mut ch).is_empty());
    ch.transport().send_t_logout();
    assert!(drain(&mut ch).is_empty());
    let new = ch.transport().successor();
    let mut rekeyed = Vec::new();
    drop(ch.reconnect(new, 16, 8192, &mut |tag, b| {
        rekeyed.push((tag, b.addr));
        b
    }));
    assert_eq!(rekeyed, [(0, bufs[0].addr), (0, bufs[1].addr)]);
    ch.resume(0, ReissueLimit::new(Some(15_000)), &mut |_| {});
    let done = drain(&mut ch);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].outcome.errno, 0);
    for b in &bufs[..2] {
        assert!(ch.transport().buf(*b)[..4096].iter().all(|&x| x == 0x3c));
    }
}

#[test]
fn a_channel_with_more_tags_than_its_login_sends_at_most_its_send_depth() {
    // 8 tags (two devices' 4) on a login sized for 4 commands, with 16 credits: 4 go out, the
    // others wait for answers, and all complete
    let mut t = FakeTarget::new(1 << 20, 512, crate::channel::send_slots(4, 4), 4 + 8);
    let bufs: Vec<DataBuf> = (0..DEPTH).map(|_| t.alloc(65536)).collect();
    let mut ch = Channel::new(t, ChannelConfig::fake(4).with_tags(DEPTH));
    ch.transport().faults.hold_rsps = true;
    for tag in 0..DEPTH {
        let lun = if tag < 4 { LUN0 } else { LUN1 };
        io_to(
            &mut ch,
            &bufs,
            lun,
            tag,
            (BlockOp::Read, u64::from(tag) * 4096, 4096),
        );
    }
    drain(&mut ch);
    assert_eq!(
        ch.transport().log.len(),
        4,
        "the login's send depth bounds what is out"
    );
    assert_eq!(ch.stats().slot_stalls, 4);
    ch.transport().faults.hold_rsps = false;
    let mut done = Vec::new();
    for _ in 0..10 {
        ch.transport().release_held();
        done.extend(drain(&mut ch));
    }
    let mut tags: Vec<u16> = done.iter().map(|d| d.tag).collect();
    tags.sort_unstable();
    assert_eq!(tags, (0..DEPTH).collect::<Vec<_>>());
    assert_eq!(ch.transport().log.len(), usize::from(DEPTH));
    assert_eq!(ch.busy(), 0);
}
