//! A hostile VMM on the vhost-user socket: memory tables the backend must refuse (overlapping
//! regions, a region past the end of its file, a region whose end wraps), a message that is not
//! vhost-user, and a client that vanishes mid-message. Each ends that connection, never the
//! server: the next VMM (rust-vmm's own frontend) is served, and reads the device's
//! configuration.

use super::tests::{device, fake_path};
use super::{serve, Backend};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_blk::VIRTIO_BLK_F_FLUSH;

/// A server on a socket of its own, in a thread that outlives the test (it serves until the
/// process ends).
fn server(dir: &FsPath) -> PathBuf {
    let sock = dir.join("vhost.sock");
    let backend = Arc::new(Backend::new(device(4), vec![fake_path(4)]).expect("a backend"));
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
    f.set_protocol_features(proto & VhostUserProtocolFeatures::CONFIG)
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
