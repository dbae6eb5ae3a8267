//! A hostile VMM on the vhost-user socket: memory tables the backend must refuse (overlapping
//! regions, a region past the end of its file, a region whose end wraps), a message that is not
//! vhost-user, and a client that vanishes mid-message. Each ends that connection, never the
//! server: the next VMM (rust-vmm's own frontend) is served, and reads the device's
//! configuration. And a VMM reconnecting to a restarted backend with its inflight region: what
//! the last backend took and did not answer is taken again, once.

use super::tests::{device, fake_path};
use super::{serve, Backend};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_blk::VIRTIO_BLK_F_FLUSH;
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap, VolatileMemory};
use vmm_sys_util::eventfd::EventFd;

/// A server on a socket of its own, in a thread that outlives the test (it serves until the
/// process ends).
fn server(dir: &FsPath) -> PathBuf {
    let backend = Arc::new(Backend::new(device(4), vec![fake_path(4)]).expect("a backend"));
    serve_backend(dir, backend)
}

/// `backend` served as [`server`] serves its own.
fn serve_backend(dir: &FsPath, backend: Arc<Backend<super::tests::Relog>>) -> PathBuf {
    let sock = dir.join("vhost.sock");
    let (tx, rx) = std::sync::mpsc::channel();
    let at = sock.clone();
    std::thread::spawn(move || {
        let r = serve(&at, None, backend, move || {
            let _ = tx.send(());
        });
        panic!("the server returned: {:?}", r.err());
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("the server listens");
    sock
}

/// A VMM that negotiates features as QEMU does, up to the memory table.
/// (`queues`: what rust-vmm's frontend lets a request name; it checks the index itself.)
fn negotiate(sock: &FsPath, queues: u64) -> Frontend {
    negotiate_protocol(sock, queues, VhostUserProtocolFeatures::CONFIG)
}

/// [`negotiate`], taking the protocol features of `wanted` the backend offers.
fn negotiate_protocol(sock: &FsPath, queues: u64, wanted: VhostUserProtocolFeatures) -> Frontend {
    let mut f = Frontend::connect(sock, queues).expect("connects");
    f.set_owner().expect("SET_OWNER");
    let features = f.get_features().expect("GET_FEATURES");
    assert_ne!(
        features & (1 << VIRTIO_BLK_F_FLUSH),
        0,
        "FLUSH offered: {features:#x}"
    );
    f.set_features(features).expect("SET_FEATURES");
    let proto = f.get_protocol_features().expect("GET_PROTOCOL_FEATURES");
    f.set_protocol_features(proto & wanted)
        .expect("SET_PROTOCOL_FEATURES");
    f
}

/// A file of `len` bytes to map as guest memory.
fn guest_file(dir: &FsPath, name: &str, len: u64) -> std::fs::File {
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join(name))
        .expect("a guest memory file");
    f.set_len(len).expect("sized");
    f
}

fn region(gpa: u64, size: u64, file: &std::fs::File, offset: u64) -> VhostUserMemoryRegionInfo {
    VhostUserMemoryRegionInfo {
        guest_phys_addr: gpa,
        memory_size: size,
        userspace_addr: 0x7000_0000_0000_u64.wrapping_add(gpa),
        mmap_offset: offset,
        mmap_handle: file.as_raw_fd(),
    }
}

/// Whether the server has ended `f`'s connection: a request then fails.
fn ended(f: &Frontend) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if f.get_features().is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The next VMM is served: it reads the capacity (the fake target's 1 MiB in sectors) from the
/// configuration space.
fn served(sock: &FsPath, dir: &FsPath) {
    let mut f = negotiate(sock, 1);
    let mem = guest_file(dir, "good", 1 << 20);
    f.set_mem_table(&[region(0, 1 << 20, &mem, 0)])
        .expect("a good memory table is taken");
    let (_, cfg) = f
        .get_config(0, 8, VhostUserConfigFlags::WRITABLE, &[0; 8])
        .expect("GET_CONFIG");
    assert_eq!(u64::from_le_bytes(cfg[..8].try_into().unwrap()), 2048);
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("srp-ublk-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

#[test]
fn bad_memory_tables_end_their_connection_and_the_next_vmm_is_served() {
    let dir = scratch("vhost-hostile");
    let sock = server(&dir);
    let mem = guest_file(&dir, "mem", 2 << 20);
    let bad: [(&str, Vec<VhostUserMemoryRegionInfo>); 3] = [
        (
            "overlapping regions",
            vec![
                region(0, 1 << 20, &mem, 0),
                region(0x8_0000, 1 << 20, &mem, 1 << 20),
            ],
        ),
        // mapping it would succeed, and the first touch past the file's end would kill the
        // server with SIGBUS
        (
            "a region past its file's end",
            vec![region(0, 4 << 20, &mem, 0)],
        ),
        (
            "a region whose end wraps",
            vec![region(u64::MAX - 0xfff, 1 << 20, &mem, 0)],
        ),
    ];
    for (what, table) in bad {
        let f = negotiate(&sock, 1);
        let _ = f.set_mem_table(&table);
        assert!(ended(&f), "{what}: the connection was not ended");
        served(&sock, &dir);
    }
}

#[test]
fn bad_vring_setups_end_their_connection_and_the_next_vmm_is_served() {
    let dir = scratch("vhost-vrings");
    let sock = server(&dir);
    let mem = guest_file(&dir, "mem", 1 << 20);
    let table = [region(0, 1 << 20, &mem, 0)];
    let inside = 0x7000_0000_0000_u64;
    let ring = |desc, avail, used| VringConfigData {
        queue_max_size: 64,
        queue_size: 64,
        flags: 0,
        desc_table_addr: desc,
        used_ring_addr: used,
        avail_ring_addr: avail,
        log_addr: None,
    };
    type Step = Box<dyn Fn(&Frontend) -> vhost::Result<()>>;
    let bad: [(&str, Step); 4] = [
        (
            "a queue the device does not have",
            Box::new(|f| f.set_vring_num(5, 64)),
        ),
        ("a ring of 0 entries", Box::new(|f| f.set_vring_num(0, 0))),
        (
            "a ring past the device's largest",
            Box::new(|f| f.set_vring_num(0, 4096)),
        ),
        (
            "ring addresses outside the memory table",
            Box::new(move |f| {
                f.set_vring_num(0, 64)?;
                f.set_vring_addr(0, &ring(inside, inside + 0x1000, 0x1234_0000_0000))
            }),
        ),
    ];
    for (what, step) in bad {
        let f = negotiate(&sock, 8);
        f.set_mem_table(&table).expect("a good memory table");
        let refused = step(&f).is_err();
        assert!(refused || ended(&f), "{what}: neither refused nor ended");
        served(&sock, &dir);
    }
}

#[test]
fn a_message_that_is_not_vhost_user_or_stops_halfway_ends_only_its_connection() {
    let dir = scratch("vhost-garbage");
    let sock = server(&dir);
    // a header naming an unknown request with a body far past the protocol's limit
    let mut s = UnixStream::connect(&sock).expect("connects");
    let mut hdr = [0u8; 12];
    hdr[0..4].copy_from_slice(&9999u32.to_le_bytes());
    hdr[4..8].copy_from_slice(&1u32.to_le_bytes());
    hdr[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    s.write_all(&hdr).expect("sent");
    drop(s);
    served(&sock, &dir);
    // half a header, then the VMM is gone
    let mut s = UnixStream::connect(&sock).expect("connects");
    s.write_all(&hdr[..5]).expect("sent");
    drop(s);
    served(&sock, &dir);
    // a VMM that disconnects right after SET_OWNER
    let f = Frontend::connect(&sock, 1).expect("connects");
    f.set_owner().expect("SET_OWNER");
    drop(f);
    served(&sock, &dir);
}

/// Puts descriptor `d` (address, length, flags, next) at slot `at` of the table at `table`.
fn put_desc(mem: &GuestMemoryMmap<()>, table: u64, at: u16, d: (u64, u32, u16, u16)) {
    let raw = RawDescriptor::from(SplitDescriptor::new(d.0, d.1, d.2, d.3));
    mem.write_obj(raw, GuestAddress(table + u64::from(at) * 16))
        .unwrap();
}

/// A request of kind `kind` at `sector` with one data buffer (or none) at table slot `at`:
/// its header at 0x4000 + 16 * at, its status byte at 0x5000 + at.
fn put_request(
    mem: &GuestMemoryMmap<()>,
    table: u64,
    at: u16,
    kind: u32,
    sector: u64,
    data: Option<(u64, u32, bool)>,
) {
    let hdr = 0x4000 + u64::from(at) * 16;
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&h, GuestAddress(hdr)).unwrap();
    let status = 0x5000 + u64::from(at);
    mem.write_obj(0xffu8, GuestAddress(status)).unwrap();
    put_desc(mem, table, at, (hdr, 16, 1, at + 1));
    let mut next = at + 1;
    if let Some((a, l, w)) = data {
        put_desc(
            mem,
            table,
            next,
            (a, l, 1 | if w { 2 } else { 0 }, next + 1),
        );
        next += 1;
    }
    put_desc(mem, table, next, (status, 1, 2, 0));
}

#[test]
fn a_restarted_backend_takes_again_what_the_last_one_took_and_nothing_it_answered() {
    use vhost::vhost_user::message::VhostUserInflight;
    let dir = scratch("vhost-inflight");
    let sock = server(&dir);
    let file = guest_file(&dir, "ring", 1 << 20);
    let mem = GuestMemoryMmap::<()>::from_ranges_with_files(&[(
        GuestAddress(0),
        1 << 20,
        Some(FileOffset::new(file.try_clone().unwrap(), 0)),
    )])
    .unwrap();
    let q = MockSplitQueue::create(&mem, GuestAddress(0), 16);
    let (table, avail, used) = (q.desc_table_addr().0, q.avail_addr().0, q.used_addr().0);
    let pat: Vec<u8> = (0..512u32).map(|i| (i % 251) as u8).collect();
    mem.write_slice(&pat, GuestAddress(0x8000)).unwrap();
    // what the killed backend left: it took a write (head 0) and a flush (head 3) from the ring,
    // answered the flush (the used ring's entry 0) and died with the write at the target; the
    // guest has put a read of the written block after them (head 5)
    put_request(&mem, table, 0, 1, 2, Some((0x8000, 512, false)));
    put_request(&mem, table, 3, 4, 0, None);
    put_request(&mem, table, 5, 0, 2, Some((0x9000, 512, true)));
    for (i, head) in [0u16, 3, 5].into_iter().enumerate() {
        mem.write_obj(head, GuestAddress(avail + 4 + i as u64 * 2))
            .unwrap();
    }
    mem.write_obj(3u16, GuestAddress(avail + 2)).unwrap();
    mem.write_obj(3u32, GuestAddress(used + 4)).unwrap();
    mem.write_obj(1u32, GuestAddress(used + 8)).unwrap();
    mem.write_obj(1u16, GuestAddress(used + 2)).unwrap();
    mem.write_obj(0u8, GuestAddress(0x5003)).unwrap();
    // the VMM, as QEMU reconnects: its inflight region (from the first backend) marks the write
    let mut f = Frontend::connect(&sock, 1).expect("connects");
    f.set_owner().expect("SET_OWNER");
    let features = f.get_features().expect("GET_FEATURES");
    f.set_features(features).expect("SET_FEATURES");
    let proto = f.get_protocol_features().expect("GET_PROTOCOL_FEATURES");
    assert!(proto.contains(VhostUserProtocolFeatures::INFLIGHT_SHMFD));
    f.set_protocol_features(
        proto & (VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::INFLIGHT_SHMFD),
    )
    .expect("SET_PROTOCOL_FEATURES");
    f.set_mem_table(&[region(0, 1 << 20, &file, 0)])
        .expect("SET_MEM_TABLE");
    let ask = VhostUserInflight {
        mmap_size: 0,
        mmap_offset: 0,
        num_queues: 1,
        queue_size: 16,
    };
    let (info, region_file) = f.get_inflight_fd(&ask).expect("GET_INFLIGHT_FD");
    let region = vm_memory::MmapRegion::<()>::from_file(
        FileOffset::new(region_file.try_clone().unwrap(), 0),
        info.mmap_size as usize,
    )
    .unwrap();
    let s = region.as_volatile_slice();
    // head 0: inflight, the first taken (the layout of vhost-user.rst's "Inflight I/O tracking")
    s.write_obj(1u64, 16 + 8).unwrap();
    s.write_obj(1u8, 16).unwrap();
    s.write_obj(1u16, 14).unwrap();
    f.set_inflight_fd(&info, region_file.as_raw_fd())
        .expect("SET_INFLIGHT_FD");
    let va = |a: u64| 0x7000_0000_0000_u64 + a;
    f.set_vring_num(0, 16).expect("SET_VRING_NUM");
    f.set_vring_addr(
        0,
        &VringConfigData {
            queue_max_size: 16,
            queue_size: 16,
            flags: 0,
            desc_table_addr: va(table),
            used_ring_addr: va(used),
            avail_ring_addr: va(avail),
            log_addr: None,
        },
    )
    .expect("SET_VRING_ADDR");
    // QEMU could not ask the killed backend, so it starts the ring where the used ring is
    f.set_vring_base(0, 1).expect("SET_VRING_BASE");
    let (kick, call) = (EventFd::new(0).unwrap(), EventFd::new(0).unwrap());
    f.set_vring_call(0, &call).expect("SET_VRING_CALL");
    f.set_vring_kick(0, &kick).expect("SET_VRING_KICK");
    f.set_vring_enable(0, true).expect("SET_VRING_ENABLE");
    kick.write(1).unwrap();
    let t = Instant::now();
    while mem.read_obj::<u16>(GuestAddress(used + 2)).unwrap() < 3
        && t.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let heads: Vec<u32> = (0..mem.read_obj::<u16>(GuestAddress(used + 2)).unwrap())
        .map(|i| {
            mem.read_obj(GuestAddress(used + 4 + u64::from(i) * 8))
                .unwrap()
        })
        .collect();
    // the write taken again before the read, the flush not answered twice
    assert_eq!(heads, vec![3, 0, 5]);
    let st: Vec<u8> = [0x5000u64, 0x5003, 0x5005]
        .iter()
        .map(|&a| mem.read_obj(GuestAddress(a)).unwrap())
        .collect();
    assert_eq!(st, vec![0, 0, 0]);
    let mut got = vec![0u8; 512];
    mem.read_slice(&mut got, GuestAddress(0x9000)).unwrap();
    assert_eq!(got, pat, "the read sees the write taken again");
    // and the region has nothing marked any more
    let left: Vec<u8> = (0..16u64)
        .map(|h| s.read_obj(16 + h as usize * 16).unwrap())
        .collect();
    assert!(left.iter().all(|&b| b == 0), "{left:?}");
}

/// The LUN's capacity as READ CAPACITY(16) gives it.
fn capacity(blocks: u64) -> crate::wire::scsi::data::Capacity {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&(blocks - 1).to_be_bytes());
    b[8..].copy_from_slice(&512u32.to_be_bytes());
    crate::wire::scsi::data::Capacity::parse(&b).expect("12 bytes")
}

/// `backend`'s capacity checks started over a LUN whose capacity is each of `sizes` in turn.
fn watched(
    backend: &Backend<super::tests::Relog>,
    sizes: Vec<crate::wire::scsi::data::Capacity>,
) -> Arc<crate::frontend::capacity::CapacityStatus> {
    let n = sizes.len();
    let mut sizes = sizes.into_iter();
    backend
        .watch_capacity(
            "test".into(),
            Box::new(move || Ok(sizes.next().unwrap_or_else(|| panic!("{n} checks at most")))),
        )
        .expect("the checks start");
    backend.capacity()
}

/// Waits (10 s at most) until `n` capacity checks are done.
fn checks_done(cap: &crate::frontend::capacity::CapacityStatus, n: u64) {
    let t = Instant::now();
    while cap.checks.load(Relaxed) < n {
        assert!(t.elapsed() < Duration::from_secs(10), "{n} checks not done");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_grown_lun_reaches_the_vmm_as_a_configuration_change_and_the_guest_reads_the_new_size() {
    let dir = scratch("vhost-resize");
    let backend = Arc::new(Backend::new(device(4), vec![fake_path(4)]).expect("a backend"));
    let sock = serve_backend(&dir, backend.clone());
    let wanted = VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::BACKEND_REQ;
    let mut f = negotiate_protocol(&sock, 1, wanted);
    let (mut ours, theirs) = UnixStream::pair().expect("a socket pair");
    f.set_backend_request_fd(&theirs)
        .expect("SET_BACKEND_REQ_FD");
    let mem = guest_file(&dir, "mem", 1 << 20);
    f.set_mem_table(&[region(0, 1 << 20, &mem, 0)])
        .expect("a memory table");
    // the LUN doubled: 2 MiB, then asked again, still 2 MiB
    let cap = watched(&backend, vec![capacity(4096), capacity(4096)]);
    cap.check.store(true, Relaxed);
    ours.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a timeout");
    let mut msg = [0u8; 12];
    std::io::Read::read_exact(&mut ours, &mut msg).expect("a message on the backend channel");
    let word = |i: usize| u32::from_ne_bytes(msg[i..i + 4].try_into().unwrap());
    assert_eq!(
        (word(0), word(4), word(8)),
        (2, 1, 0),
        "VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, version 1, no body, no reply asked"
    );
    let (_, cfg) = f
        .get_config(0, 8, VhostUserConfigFlags::WRITABLE, &[0; 8])
        .expect("GET_CONFIG");
    assert_eq!(u64::from_le_bytes(cfg[..8].try_into().unwrap()), 4096);
    // unchanged: the second check tells the VMM nothing
    cap.check.store(true, Relaxed);
    checks_done(&cap, 2);
    ours.set_nonblocking(true).expect("non-blocking");
    let more = std::io::Read::read(&mut ours, &mut msg);
    assert!(
        more.as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "an unchanged capacity sent {more:?}"
    );
}

#[test]
fn a_backend_channel_that_is_not_a_unix_socket_is_never_written_to() {
    let dir = scratch("vhost-bad-channel");
    let backend = Arc::new(Backend::new(device(4), vec![fake_path(4)]).expect("a backend"));
    let sock = serve_backend(&dir, backend.clone());
    let wanted = VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::BACKEND_REQ;
    let mut f = negotiate_protocol(&sock, 1, wanted);
    let file = guest_file(&dir, "not-a-socket", 0);
    let _ = f.set_backend_request_fd(&file);
    let cap = watched(&backend, vec![capacity(4096)]);
    cap.check.store(true, Relaxed);
    checks_done(&cap, 1);
    let len = std::fs::metadata(dir.join("not-a-socket")).unwrap().len();
    assert_eq!(
        len, 0,
        "the server wrote to a file the VMM gave as its channel"
    );
    // and the next VMM reads the new size
    drop(f);
    let mut f = negotiate(&sock, 1);
    let (_, cfg) = f
        .get_config(0, 8, VhostUserConfigFlags::WRITABLE, &[0; 8])
        .expect("GET_CONFIG");
    assert_eq!(u64::from_le_bytes(cfg[..8].try_into().unwrap()), 4096);
}
