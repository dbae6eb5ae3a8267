//! A virtqueue's worker over the fake target, with virtio-queue's mock split ring in guest memory
//! standing in for the driver: requests go to the target as segments of the guest's memory (one
//! per buffer, split where a buffer crosses a memory region), through the queue's buffers when
//! they have more segments than a command carries, and bad requests are answered, not served.

use super::request::{kind, status};
use super::worker::{Vring, Worker};
use super::Device;
use crate::channel::block::tests::GEO;
use crate::channel::fake::FakeTarget;
use crate::channel::{send_slots, Channel, ChannelConfig};
use crate::frontend::status::ExportStatus;
use crate::path::Path;
use crate::rdma::TagBufs;
use crate::session::rport::Rport;
use crate::session::timers::Timers;
use std::sync::Arc;
use vhost_user_backend::VringT;
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};

const DEPTH: u16 = 8;
const NEXT: u16 = 1;
const WRITE: u16 = 2;
const INDIRECT: u16 = 4;
/// Where the requests' headers, status bytes and data live (the ring is at 0).
const HDR: u64 = 0x10_0000;
const STATUS: u64 = 0x11_0000;
/// The first memory region ends here, where the second starts (a buffer may cross).
const REGION0_END: u64 = 0x40_0000;

pub(super) use crate::path::fake::FakeRelogin as Relog;

struct Rig {
    mem: Arc<GuestMemoryMmap<()>>,
    vring: Vring,
    worker: Worker<Relog>,
    next_desc: u16,
    desc_table: GuestAddress,
    avail: GuestAddress,
    used: GuestAddress,
    /// What the worker publishes.
    published: Arc<ExportStatus>,
}

/// The ring's size.
const QSIZE: u16 = 64;

fn rig(max_segs: u16) -> Rig {
    let mem = Arc::new(
        GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), REGION0_END as usize),
            (GuestAddress(REGION0_END), 0x10_0000),
        ])
        .unwrap(),
    );
    let q = MockSplitQueue::create(&*mem, GuestAddress(0), QSIZE);
    let (desc_table, avail, used) = (q.desc_table_addr(), q.avail_addr(), q.used_addr());
    let vring = Vring::new(GuestMemoryAtomic::new((*mem).clone()), QSIZE).unwrap();
    vring.set_queue_info(desc_table.0, avail.0, used.0).unwrap();
    vring.set_queue_size(QSIZE);
    vring.set_queue_ready(true);
    vring.set_enabled(true);
    let published = Arc::new(ExportStatus::new(1));
    let dev = Arc::new(device(max_segs));
    let mut worker = Worker::new(0, fake_path(max_segs), dev, published.clone()).unwrap();
    worker.new_connection();
    Rig {
        published,
        mem,
        vring,
        worker,
        next_desc: 0,
        desc_table,
        avail,
        used,
    }
}

/// A queue's path over the fake target (a 1 MiB disk of 512-byte blocks), its commands carrying
/// up to `max_segs` segments.
pub(super) fn fake_path(max_segs: u16) -> Path<Relog> {
    let mut t = FakeTarget::new(1 << 20, 512, send_slots(DEPTH, 4), DEPTH + 8).with_fds();
    t.max_segs = max_segs;
    let cfg = ChannelConfig::fake(DEPTH);
    let timers = Timers {
        reconnect_delay: Some(1),
        fast_io_fail_tmo: Some(5),
        dev_loss_tmo: Some(60),
    };
    Path::new(
        Channel::new(t, cfg),
        Relog,
        TagBufs::new(DEPTH, 64 << 10),
        Rport::new(timers),
        "vhost queue 0".into(),
    )
    .unwrap()
}

/// The fake target's disk as a virtio-blk device.
pub(super) fn device(max_segs: u16) -> Device {
    Device {
        size: (1 << 20).into(),
        block_size: 512,
        physical_exp: 0,
        opt_io: 0,
        read_only: false,
        geo: GEO,
        serial: b"SRPSERIAL0001".to_vec(),
        max_io: 64 << 10,
        seg_max: u32::from(max_segs),
        size_max: 4096,
        max_discard: 2048,
        max_write_zeroes: 2048,
        write_zeroes_may_unmap: false,
    }
}

impl Rig {
    /// Puts a request on the ring: its header, `data` (address, length) and status byte.
    fn request(&mut self, kind: u32, sector: u64, data: &[(u64, u32)], device_writes: bool) {
        let n = self.next_desc;
        let hdr = HDR + u64::from(n) * 16;
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        self.mem.write_slice(&h, GuestAddress(hdr)).unwrap();
        self.mem
            .write_obj(0xffu8, GuestAddress(STATUS + u64::from(n)))
            .unwrap();
        let dflag = if device_writes { WRITE } else { 0 };
        let mut descs = vec![(hdr, 16u32, 0u16)];
        descs.extend(data.iter().map(|&(a, l)| (a, l, dflag)));
        descs.push((STATUS + u64::from(n), 1, WRITE));
        // the descriptors at `n`.., then the chain's head on the avail ring
        let last = descs.len() - 1;
        for (i, &(a, l, f)) in descs.iter().enumerate() {
            let flags = if i < last { f | NEXT } else { f };
            let d = RawDescriptor::from(SplitDescriptor::new(a, l, flags, n + i as u16 + 1));
            let at = self.desc_table.0 + u64::from(n + i as u16) * 16;
            self.mem.write_obj(d, GuestAddress(at)).unwrap();
        }
        self.push_head(n);
        self.next_desc += descs.len() as u16;
    }

    /// Puts raw descriptors (address, length, flags, next) at table slot `at`, `at` on the ring.
    fn raw(&mut self, at: u16, descs: &[(u64, u32, u16, u16)]) {
        for (i, &(a, l, f, next)) in descs.iter().enumerate() {
            let d = RawDescriptor::from(SplitDescriptor::new(a, l, f, next));
            let slot = self.desc_table.0 + u64::from(at + i as u16) * 16;
            self.mem.write_obj(d, GuestAddress(slot)).unwrap();
        }
        self.push_head(at);
        self.next_desc = self.next_desc.max(at + descs.len() as u16);
    }

    /// Makes the chain at `head` available.
    fn push_head(&mut self, head: u16) {
        let idx: u16 = self.mem.read_obj(GuestAddress(self.avail.0 + 2)).unwrap();
        let slot = self.avail.0 + 4 + u64::from(idx % QSIZE) * 2;
        self.mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.mem
            .write_obj(idx.wrapping_add(1), GuestAddress(self.avail.0 + 2))
            .unwrap();
    }

    /// The used ring's index: how many chains the device gave back.
    fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(self.used.0 + 2)).unwrap()
    }

    /// Runs the worker until the ring's requests are answered (the fake answers at once).
    fn run(&mut self) {
        let mem = Some((1, Some(self.mem.clone())));
        self.worker.pass(&self.vring, mem);
        for _ in 0..10 {
            self.worker.pass(&self.vring, None);
        }
    }

    fn status(&self, first_desc: u16) -> u8 {
        self.mem
            .read_obj(GuestAddress(STATUS + u64::from(first_desc)))
            .unwrap()
    }
}

#[test]
fn guest_buffers_go_to_the_target_as_segments_and_back() {
    let mut r = rig(16);
    let pat: Vec<u8> = (0..12288u32).map(|i| (i % 253) as u8).collect();
    // three buffers, the second crossing from region 0 into region 1: four segments
    let cross = REGION0_END - 2048;
    r.mem
        .write_slice(&pat[..4096], GuestAddress(0x20_0000))
        .unwrap();
    r.mem
        .write_slice(&pat[4096..8192], GuestAddress(cross))
        .unwrap();
    r.mem
        .write_slice(&pat[8192..], GuestAddress(0x30_0000))
        .unwrap();
    r.request(
        kind::OUT,
        8,
        &[(0x20_0000, 4096), (cross, 4096), (0x30_0000, 4096)],
        false,
    );
    r.run();
    assert_eq!(r.status(0), status::OK);
    // read it back into two other buffers
    r.request(
        kind::IN,
        8,
        &[(0x28_0000, 8192), (REGION0_END + 0x8000, 4096)],
        true,
    );
    r.run();
    assert_eq!(r.status(5), status::OK);
    let mut got = vec![0u8; 12288];
    r.mem
        .read_slice(&mut got[..8192], GuestAddress(0x28_0000))
        .unwrap();
    r.mem
        .read_slice(&mut got[8192..], GuestAddress(REGION0_END + 0x8000))
        .unwrap();
    assert_eq!(got, pat);
    let c = r.worker.counters();
    assert_eq!(
        (c.requests, c.zero_copy_bytes, c.copied_bytes, c.errors),
        (2, 24576, 0, 0)
    );
    // and what `srp-ublk list` and `stats` see
    let mut q = crate::session::state::QueueState::default();
    r.published.queues[0].load_into(&mut q);
    let io = &q.io;
    assert_eq!(
        (
            io.write_ops,
            io.write_bytes,
            io.read_ops,
            io.read_bytes,
            io.errors
        ),
        (1, 12288, 1, 12288, 0)
    );
    assert_eq!((q.zero_copy_bytes, q.copied_bytes, q.cmds), (24576, 0, 2));
    assert_ne!(q.tid, 0, "the worker's thread");
}

#[test]
fn more_segments_than_a_command_carries_are_copied() {
    let mut r = rig(2);
    let pat: Vec<u8> = (0..1536u32).map(|i| (i % 7) as u8 + 1).collect();
    for (i, chunk) in pat.chunks(512).enumerate() {
        r.mem
            .write_slice(chunk, GuestAddress(0x20_0000 + i as u64 * 0x1000))
            .unwrap();
    }
    let bufs = [(0x20_0000, 512), (0x20_1000, 512), (0x20_2000, 512)];
    r.request(kind::OUT, 0, &bufs, false);
    r.run();
    assert_eq!(r.status(0), status::OK);
    let out = [(0x30_0000, 512), (0x30_1000, 512), (0x30_2000, 512)];
    r.request(kind::IN, 0, &out, true);
    r.run();
    assert_eq!(r.status(5), status::OK);
    let mut got = Vec::new();
    for (a, l) in out {
        let mut b = vec![0u8; l as usize];
        r.mem.read_slice(&mut b, GuestAddress(a)).unwrap();
        got.extend(b);
    }
    assert_eq!(got, pat);
    let c = r.worker.counters();
    assert_eq!((c.zero_copy_bytes, c.copied_bytes), (0, 3072));
}

#[test]
fn bad_requests_are_answered_not_served() {
    let mut r = rig(16);
    // a write of 100 bytes (not whole blocks), past the end, a read into device-readable
    // buffers, an unknown type, then GET_ID
    r.request(kind::OUT, 0, &[(0x20_0000, 100)], false);
    r.request(kind::OUT, 2047, &[(0x20_0000, 1024)], false);
    r.request(kind::IN, 0, &[(0x20_0000, 512)], false);
    r.request(99, 0, &[(0x20_0000, 512)], false);
    r.request(kind::GET_ID, 0, &[(0x21_0000, 20)], true);
    r.run();
    let firsts = [0u16, 3, 6, 9, 12];
    let got: Vec<u8> = firsts.iter().map(|&d| r.status(d)).collect();
    assert_eq!(
        got,
        [
            status::IOERR,
            status::IOERR,
            status::IOERR,
            status::UNSUPP,
            status::OK
        ]
    );
    let mut id = [0u8; 20];
    r.mem.read_slice(&mut id, GuestAddress(0x21_0000)).unwrap();
    assert_eq!(&id[..13], b"SRPSERIAL0001");
    assert_eq!(r.worker.counters().errors, 4);
}

#[test]
fn discard_and_write_zeroes_take_one_range_of_whole_blocks() {
    let mut r = rig(16);
    let ones = vec![0x11u8; 8192];
    r.mem.write_slice(&ones, GuestAddress(0x20_0000)).unwrap();
    r.request(kind::OUT, 0, &[(0x20_0000, 8192)], false);
    r.run();
    assert_eq!(r.status(0), status::OK);
    // ranges: sectors 0..8 zeroed, 8..16 discarded (the fake zeroes it too), a bad flag, the unmap
    // flag on a discard, two ranges, past the limit
    let range = |at: u64, sector: u64, n: u32, flags: u32| {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&sector.to_le_bytes());
        b[8..12].copy_from_slice(&n.to_le_bytes());
        b[12..16].copy_from_slice(&flags.to_le_bytes());
        r.mem.write_slice(&b, GuestAddress(at)).unwrap();
    };
    range(0x30_0000, 0, 8, 0);
    range(0x30_0010, 8, 8, 0);
    range(0x30_0020, 0, 8, 2);
    range(0x30_0030, 0, 8, 1);
    range(0x30_0040, 0, 4096, 0);
    r.request(kind::WRITE_ZEROES, 0, &[(0x30_0000, 16)], false);
    r.request(kind::DISCARD, 0, &[(0x30_0010, 16)], false);
    r.request(kind::WRITE_ZEROES, 0, &[(0x30_0020, 16)], false);
    r.request(kind::DISCARD, 0, &[(0x30_0030, 16)], false);
    r.request(kind::DISCARD, 0, &[(0x30_0000, 32)], false);
    r.request(kind::DISCARD, 0, &[(0x30_0040, 16)], false);
    r.run();
    let got: Vec<u8> = [3u16, 6, 9, 12, 15, 18]
        .iter()
        .map(|&d| r.status(d))
        .collect();
    assert_eq!(
        got,
        [
            status::OK,
            status::OK,
            status::UNSUPP,
            status::UNSUPP,
            status::IOERR,
            status::IOERR
        ]
    );
    r.request(kind::IN, 0, &[(0x28_0000, 8192)], true);
    r.run();
    let mut back = vec![0xffu8; 8192];
    r.mem
        .read_slice(&mut back, GuestAddress(0x28_0000))
        .unwrap();
    assert!(back.iter().all(|&b| b == 0), "zeroed and discarded");
}

#[test]
fn hostile_chains_are_answered_and_the_target_sees_only_guest_memory() {
    let mut r = rig(16);
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&kind::OUT.to_le_bytes());
    r.mem.write_slice(&h, GuestAddress(HDR)).unwrap();
    let end = REGION0_END + 0x10_0000;
    // a chain that loops, and one that names a descriptor past the table
    r.raw(0, &[(HDR, 16, NEXT, 1), (0x20_0000, 512, NEXT, 0)]);
    r.raw(2, &[(HDR, 16, NEXT, QSIZE + 5)]);
    // a write from outside guest memory, a read running off its end
    r.request(kind::OUT, 0, &[(1 << 40, 512)], false);
    r.request(kind::IN, 0, &[(end - 256, 512)], true);
    // a status byte in a descriptor of no bytes, a header of 8 bytes, an indirect table outside
    // guest memory
    r.raw(9, &[(HDR, 16, NEXT, 10), (STATUS + 9, 0, WRITE, 0)]);
    r.raw(11, &[(HDR, 8, NEXT, 12), (STATUS + 11, 1, WRITE, 0)]);
    r.raw(13, &[(1 << 40, 64, INDIRECT, 0)]);
    // then a good write and its read back
    let pat: Vec<u8> = (0..1024u32).map(|i| (i % 251) as u8).collect();
    r.mem.write_slice(&pat, GuestAddress(0x20_0000)).unwrap();
    r.request(kind::OUT, 4, &[(0x20_0000, 1024)], false);
    r.request(kind::IN, 4, &[(0x28_0000, 1024)], true);
    r.run();
    assert_eq!(r.used_idx(), 9, "every chain given back");
    let got: Vec<u8> = [3u16, 6, 14, 17].iter().map(|&d| r.status(d)).collect();
    assert_eq!(got, [status::IOERR, status::IOERR, status::OK, status::OK]);
    let mut back = vec![0u8; 1024];
    r.mem
        .read_slice(&mut back, GuestAddress(0x28_0000))
        .unwrap();
    assert_eq!(back, pat);
    assert_eq!(r.worker.counters().errors, 7);
    // the target saw the read into the queue's own buffer and the good pair, nothing else, and
    // never reached outside what it was given
    let t = r.worker.target();
    let ops: Vec<u8> = t.log.iter().map(|&(op, _)| op).collect();
    assert_eq!(ops, [0x88, 0x8a, 0x88]);
    assert_eq!(t.access_errors, 0);
}

/// The heads in the used ring, in order.
fn used_heads(r: &Rig) -> Vec<u32> {
    (0..r.used_idx())
        .map(|i| {
            let at = r.used.0 + 4 + u64::from(i % QSIZE) * 8;
            r.mem.read_obj(GuestAddress(at)).unwrap()
        })
        .collect()
}

/// The heads queue 0 of `region` marks as taken and not used.
fn marked(region: &super::inflight::Inflight) -> Vec<u16> {
    region.queue(0).unwrap().marked()
}

#[test]
fn a_request_the_last_backend_took_is_taken_again_once_and_before_the_ring() {
    let mut r = rig(16);
    let (region, _file) = super::inflight::Inflight::create(1, QSIZE, 1).unwrap();
    let region = Arc::new(region);
    let pat: Vec<u8> = (0..512u32).map(|i| (i % 251) as u8).collect();
    r.mem.write_slice(&pat, GuestAddress(0x20_0000)).unwrap();
    // the killed backend took the write (head 0, its 7th request) from the ring, and no more
    r.request(kind::OUT, 4, &[(0x20_0000, 512)], false);
    region.queue(0).unwrap().taken(0, 7);
    // the guest put a read of the same block on the ring after it
    r.request(kind::IN, 4, &[(0x28_0000, 512)], true);
    let (again, counter) = region.queue(0).unwrap().resume(&r.vring).unwrap();
    assert_eq!((again.clone(), counter), (vec![0], 7));
    r.worker.track(region.clone(), again, counter);
    r.run();
    // both answered once, the write first: the read sees its data
    assert_eq!(used_heads(&r), vec![0, 3]);
    assert_eq!((r.status(0), r.status(3)), (status::OK, status::OK));
    let mut got = vec![0u8; 512];
    r.mem.read_slice(&mut got, GuestAddress(0x28_0000)).unwrap();
    assert_eq!(got, pat);
    assert!(marked(&region).is_empty(), "nothing left marked");
    // a backend after this one has nothing to take again
    let (again, _) = region.queue(0).unwrap().resume(&r.vring).unwrap();
    assert!(again.is_empty());
}

#[test]
fn a_request_used_before_the_backend_could_say_so_is_not_answered_twice() {
    let mut r = rig(16);
    let (region, _file) = super::inflight::Inflight::create(1, QSIZE, 1).unwrap();
    let region = Arc::new(region);
    // the killed backend took a flush (head 0) and put it in the used ring, and died before it
    // cleared its mark
    r.request(kind::FLUSH, 0, &[], false);
    let q = region.queue(0).unwrap();
    q.taken(0, 1);
    q.using(0);
    r.mem.write_obj(0u32, GuestAddress(r.used.0 + 4)).unwrap();
    r.mem.write_obj(1u32, GuestAddress(r.used.0 + 8)).unwrap();
    r.mem.write_obj(1u16, GuestAddress(r.used.0 + 2)).unwrap();
    r.request(kind::FLUSH, 0, &[], false);
    let (again, _) = q.resume(&r.vring).unwrap();
    assert!(
        again.is_empty(),
        "the used flush is not taken again: {again:?}"
    );
    r.worker.track(region.clone(), again, 1);
    r.run();
    assert_eq!(used_heads(&r), vec![0, 2]);
    assert!(marked(&region).is_empty());
}

#[test]
fn an_inflight_region_the_vmm_sizes_wrong_is_refused() {
    use super::inflight::{Inflight, InflightError};
    assert!(matches!(
        Inflight::create(3, 128, 2),
        Err(InflightError::Geometry { .. })
    ));
    assert!(matches!(
        Inflight::create(1, 0, 2),
        Err(InflightError::Geometry { .. })
    ));
    let (_, file) = Inflight::create(1, 128, 1).unwrap();
    let len = file.metadata().unwrap().len();
    // a size past the file's end would be SIGBUS at the first access
    assert!(matches!(
        Inflight::open(file.try_clone().unwrap(), 0, len * 2, 2, 128, 2),
        Err(InflightError::Short { .. })
    ));
    assert!(matches!(
        Inflight::open(file.try_clone().unwrap(), 64, len, 1, 128, 1),
        Err(InflightError::Short { .. })
    ));
    assert!(Inflight::open(file, 0, len, 1, 128, 1).is_ok());
    // a region for another ring size than the ring has is refused at the ring's start
    let r = rig(16);
    let (other, _) = Inflight::create(1, QSIZE / 2, 1).unwrap();
    assert!(matches!(
        other.queue(0).unwrap().resume(&r.vring),
        Err(InflightError::RingSize { .. })
    ));
}

#[test]
fn a_request_stays_marked_in_the_inflight_region_until_it_is_used() {
    let mut r = rig(16);
    let (region, _file) = super::inflight::Inflight::create(1, QSIZE, 1).unwrap();
    let region = Arc::new(region);
    r.worker.track(region.clone(), Vec::new(), 0);
    r.worker.target().faults.hold_rsps = true;
    r.request(kind::IN, 0, &[(0x20_0000, 512)], true);
    r.request(kind::FLUSH, 0, &[], false);
    r.run();
    // both with the target: a backend killed now leaves both to the next, in their order
    assert_eq!(r.used_idx(), 0);
    assert_eq!(marked(&region), vec![0, 3]);
    r.worker.target().faults.hold_rsps = false;
    r.worker.target().release_held();
    r.run();
    assert_eq!(used_heads(&r), vec![0, 3]);
    assert!(marked(&region).is_empty());
}

#[test]
fn a_channel_that_goes_down_as_the_worker_sleeps_wakes_it_for_the_reconnect() {
    let mut r = rig(16);
    // one pass, whose last poll (after the arm) finds the channel down
    r.worker.target().faults.break_on_arm = true;
    r.worker.pass(&r.vring, Some((1, Some(r.mem.clone()))));
    assert!(
        !r.worker.target().faults.break_on_arm,
        "the channel was armed"
    );
    // its down steps are timed: the worker's fd turns ready for them, and a pass then logs in
    // again (reconnect_delay 1 s) and serves
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_secs(5) {
        assert!(
            r.worker.wait(200),
            "no wake-up for the down channel's next step"
        );
        r.run();
        if r.published.queues[0]
            .reconnects
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
        {
            break;
        }
    }
    r.request(kind::IN, 0, &[(0x20_0000, 512)], true);
    r.run();
    assert_eq!(used_heads(&r), vec![0], "a read after the reconnect");
}
