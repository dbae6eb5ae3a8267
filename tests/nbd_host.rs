//! The NBD front end on the host, against `--backend mem` (no lab needed): real clients (nbdinfo,
//! qemu-img, qemu-io, nbdcopy, fio's nbd engine) and hostile ones (bad magic, past-the-end, oversized
//! writes, unknown commands, a client that vanishes mid-request). Tests assert on data.
//!
//! The client tools come from Debian packages that `just deps` installs (libnbd-bin, qemu-utils, fio);
//! a missing tool fails the test with the package to install, it never skips.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server {
    child: Child,
    sock: PathBuf,
    _dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}

fn server(backend: &str, name: &str) -> Server {
    server_with(backend, name, &[], None)
}

/// A server with extra `serve` arguments, under an open-files limit if `nofile` is given.
fn server_with(backend: &str, name: &str, extra: &[&str], nofile: Option<u32>) -> Server {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("srp-ublk-nbd-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("nbd.sock");
    let bin = env!("CARGO_BIN_EXE_srp-ublk");
    let mut cmd = match nofile {
        Some(n) => {
            let mut c = tool("prlimit", "util-linux");
            c.arg(format!("--nofile={n}:{n}")).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let child = cmd
        .args(["serve", "--backend", backend, "--name", name, "--nbd"])
        .arg(format!("unix:{}", sock.display()))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start srp-ublk serve");
    let start = Instant::now();
    while !sock.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "server did not create {}",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Server {
        child,
        sock,
        _dir: dir,
    }
}

fn tool(name: &str, package: &str) -> Command {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).exists()))
        .unwrap_or(false);
    assert!(
        found,
        "{name} is not installed: apt-get install {package} (or run `just deps`)"
    );
    Command::new(name)
}

fn run(mut c: Command) -> String {
    let out = c.output().expect("run tool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{c:?} failed: {text}");
    text
}

fn uri(s: &Server, name: &str) -> String {
    format!("nbd+unix:///{name}?socket={}", s.sock.display())
}

fn image_opts(s: &Server, name: &str) -> String {
    format!(
        "driver=nbd,server.type=unix,server.path={},export={name}",
        s.sock.display()
    )
}

#[test]
fn nbdinfo_reports_truthful_flags() {
    let s = server("mem:64M", "disk");
    let mut c = tool("nbdinfo", "libnbd-bin");
    c.arg(uri(&s, "disk"));
    let out = run(c);
    for want in [
        "export-size: 67108864",
        "can_flush: true",
        "can_fua: true",
        "can_multi_conn: true",
        "can_trim: true",
        "can_zero: true",
        "block_size_minimum: 512",
    ] {
        assert!(out.contains(want), "nbdinfo lacks {want}: {out}");
    }
    let mut c = tool("nbdinfo", "libnbd-bin");
    c.args(["--list", &uri(&s, "")]);
    assert!(run(c).contains("export=\"disk\""));
}

#[test]
fn qemu_img_and_qemu_io_with_the_documented_blockdev_options() {
    let s = server("mem:64M", "vm0");
    let mut c = tool("qemu-img", "qemu-utils");
    c.args(["info", "--image-opts", &image_opts(&s, "vm0")]);
    assert!(run(c).contains("virtual size: 64 MiB"));
    let mut c = tool("qemu-io", "qemu-utils");
    c.args(["--image-opts", &image_opts(&s, "vm0")]);
    for cmd in [
        "write -P 0xab 4096 64k",
        "read -P 0xab 4096 64k",
        "discard 4096 8k",
        "read -P 0 4096 8k",
        "read -P 0xab 12288 4k",
        "write -z 1M 128k",
        "read -P 0 1M 128k",
        "flush",
    ] {
        c.args(["-c", cmd]);
    }
    let out = run(c);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    assert!(
        out.contains("read 65536/65536 bytes at offset 4096"),
        "{out}"
    );
}

#[test]
fn nbdcopy_both_directions() {
    let s = server("mem:32M", "disk");
    let dir = s._dir.clone();
    let src = dir.join("src.raw");
    let back = dir.join("back.raw");
    let data: Vec<u8> = (0..(8u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let mut c = tool("nbdcopy", "libnbd-bin");
    c.arg(&src).arg(uri(&s, "disk"));
    run(c);
    let mut c = tool("nbdcopy", "libnbd-bin");
    c.arg(uri(&s, "disk")).arg(&back);
    run(c);
    let got = std::fs::read(&back).unwrap();
    assert_eq!(got.len(), 32 << 20);
    assert!(got[..data.len()] == data[..], "data read back differs");
    assert!(
        got[data.len()..].iter().all(|&b| b == 0),
        "bytes past the copy are not zero"
    );
}

#[test]
fn fio_nbd_engine_with_verify() {
    let s = server("mem:64M", "disk");
    let mut c = tool("fio", "fio");
    c.args([
        "--name=v",
        "--ioengine=nbd",
        &format!("--uri={}", uri(&s, "disk")),
        "--rw=randrw",
        "--bs=4k",
        "--iodepth=32",
        "--size=32m",
        "--verify=crc32c",
        "--verify_fatal=1",
        // no verify state file left in the working directory
        "--verify_state_save=0",
        "--eta=never",
    ]);
    let out = run(c);
    assert!(out.contains("err= 0"), "{out}");
}

// ---- the protocol by hand

fn connect(p: &Path) -> UnixStream {
    let s = UnixStream::connect(p).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Reads the greeting, answers fixed newstyle + no zeroes, and sends NBD_OPT_GO for export `name`.
fn send_go(p: &Path, name: &str) -> UnixStream {
    let mut s = connect(p);
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    assert_eq!(&g[0..16], b"NBDMAGICIHAVEOPT");
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&0u16.to_be_bytes());
    let mut o = b"IHAVEOPT".to_vec();
    o.extend_from_slice(&7u32.to_be_bytes());
    o.extend_from_slice(&(data.len() as u32).to_be_bytes());
    o.extend_from_slice(&data);
    s.write_all(&o).unwrap();
    s
}

/// Fixed-newstyle handshake with GO on export `name`; returns the stream in transmission.
fn go(p: &Path, name: &str) -> UnixStream {
    let mut s = send_go(p, name);
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        let mut d = vec![0u8; len];
        s.read_exact(&mut d).unwrap();
        assert!(
            kind & 0x8000_0000 == 0,
            "GO refused: {}",
            String::from_utf8_lossy(&d)
        );
        if kind == 1 {
            return s;
        }
    }
}

fn request(kind: u16, flags: u16, cookie: u64, off: u64, len: u32) -> Vec<u8> {
    let mut b = 0x2560_9513u32.to_be_bytes().to_vec();
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&off.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

fn reply(s: &mut UnixStream) -> (u32, u64) {
    let mut r = [0u8; 16];
    s.read_exact(&mut r).unwrap();
    assert_eq!(&r[0..4], &0x6744_6698u32.to_be_bytes());
    (
        u32::from_be_bytes(r[4..8].try_into().unwrap()),
        u64::from_be_bytes(r[8..16].try_into().unwrap()),
    )
}

fn write_at(s: &mut UnixStream, cookie: u64, off: u64, data: &[u8]) -> u32 {
    let mut b = request(1, 0, cookie, off, data.len() as u32);
    b.extend_from_slice(data);
    s.write_all(&b).unwrap();
    let (e, c) = reply(s);
    assert_eq!(c, cookie);
    e
}

fn read_at(s: &mut UnixStream, cookie: u64, off: u64, len: u32) -> (u32, Vec<u8>) {
    s.write_all(&request(0, 0, cookie, off, len)).unwrap();
    let (e, c) = reply(s);
    assert_eq!(c, cookie);
    let mut d = vec![0u8; if e == 0 { len as usize } else { 0 }];
    s.read_exact(&mut d).unwrap();
    (e, d)
}

#[test]
fn hostile_requests_get_errors_and_nothing_outside_the_range_is_written() {
    let srv = server("mem:1M", "disk");
    let mut s = go(&srv.sock, "disk");
    let big_srv = server("mem:64M", "big");
    let mut big = go(&big_srv.sock, "big");
    // a write past the largest request (32 MiB) inside the export: EINVAL, its payload skipped,
    // the stream stays in sync
    assert_eq!(write_at(&mut big, 1, 0, &vec![0xcc; (32 << 20) + 4096]), 22);
    assert_eq!(
        read_at(&mut big, 2, 0, 4096),
        (0, vec![0; 4096]),
        "nothing of it was written"
    );
    // a known pattern around the end of the export
    assert_eq!(write_at(&mut s, 1, (1 << 20) - 4096, &[0x5a; 4096]), 0);
    // past the end: error, and the last block untouched
    assert_eq!(
        write_at(&mut s, 2, (1 << 20) - 512, &[0xee; 1024]),
        28,
        "ENOSPC past the end"
    );
    assert_eq!(
        read_at(&mut s, 3, (1 << 20) - 512, 1024).0,
        22,
        "EINVAL reading past the end"
    );
    assert_eq!(
        read_at(&mut s, 4, u64::MAX - 10, 100).0,
        22,
        "offset overflow"
    );
    // past the end: ENOSPC, payload skipped
    assert_eq!(write_at(&mut s, 5, 0, &vec![0xcc; (1 << 20) + 4096]), 28);
    // unknown command
    s.write_all(&request(99, 0, 6, 0, 0)).unwrap();
    assert_eq!(reply(&mut s), (22, 6));
    // the pattern is intact and the rest still zero
    let (e, d) = read_at(&mut s, 7, (1 << 20) - 8192, 8192);
    assert_eq!(e, 0);
    assert!(d[..4096].iter().all(|&b| b == 0) && d[4096..].iter().all(|&b| b == 0x5a));
    // pipelined requests are answered (any order) with their own cookies
    let mut batch = Vec::new();
    for i in 0..32u64 {
        batch.extend(request(0, 0, 100 + i, i * 4096, 4096));
    }
    s.write_all(&batch).unwrap();
    let mut seen = Vec::new();
    for _ in 0..32 {
        let (e, c) = reply(&mut s);
        assert_eq!(e, 0);
        let mut d = vec![0u8; 4096];
        s.read_exact(&mut d).unwrap();
        seen.push(c);
    }
    seen.sort();
    assert_eq!(seen, (100..132).collect::<Vec<_>>());
    // FAST_ZERO on a source that can zero fast is accepted
    s.write_all(&request(6, 1 << 4, 8, 0, 4096)).unwrap();
    assert_eq!(reply(&mut s), (0, 8));
    // clean disconnect
    s.write_all(&request(2, 0, 9, 0, 0)).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
}

#[test]
fn bad_magic_or_a_vanishing_client_only_ends_that_connection() {
    let srv = server("mem:1M", "disk");
    let mut good = go(&srv.sock, "disk");
    assert_eq!(write_at(&mut good, 1, 0, &[0x11; 512]), 0);
    // bad magic: the server closes that connection
    let mut bad = go(&srv.sock, "disk");
    let mut r = request(0, 0, 1, 0, 512);
    r[0] = 0;
    bad.write_all(&r).unwrap();
    let mut buf = [0u8; 16];
    assert!(
        matches!(bad.read(&mut buf), Ok(0) | Err(_)),
        "bad magic must close the connection"
    );
    // a client that sends half a write and vanishes
    let mut gone = go(&srv.sock, "disk");
    let mut w = request(1, 0, 1, 0, 4096);
    w.extend_from_slice(&[0x99; 100]);
    gone.write_all(&w).unwrap();
    drop(gone);
    // a client that dies mid-handshake
    let mut half = connect(&srv.sock);
    let mut g = [0u8; 18];
    half.read_exact(&mut g).unwrap();
    drop(half);
    std::thread::sleep(Duration::from_millis(200));
    // the first connection still works, and the partial write wrote nothing
    let (e, d) = read_at(&mut good, 2, 0, 4096);
    assert_eq!(e, 0);
    assert!(d[..512].iter().all(|&b| b == 0x11) && d[512..].iter().all(|&b| b == 0));
    // and new connections are accepted
    let mut again = go(&srv.sock, "disk");
    assert_eq!(read_at(&mut again, 3, 0, 512).1, vec![0x11; 512]);
}

#[test]
fn unknown_export_is_refused_in_the_handshake() {
    let srv = server("mem:1M", "disk");
    let mut s = send_go(&srv.sock, "nope");
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(
        u32::from_be_bytes(h[12..16].try_into().unwrap()),
        0x8000_0006,
        "NBD_REP_ERR_UNKNOWN"
    );
}

/// Sends option `opt` with `data` (fixed newstyle, after the client flags).
fn send_opt(s: &mut UnixStream, opt: u32, data: &[u8]) {
    let mut o = b"IHAVEOPT".to_vec();
    o.extend_from_slice(&opt.to_be_bytes());
    o.extend_from_slice(&(data.len() as u32).to_be_bytes());
    o.extend_from_slice(data);
    s.write_all(&o).unwrap();
}

/// One option reply: the option it answers, its type and its data.
fn opt_reply(s: &mut UnixStream) -> (u32, u32, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(
        &h[0..8],
        &0x0003_e889_0455_65a9u64.to_be_bytes(),
        "option reply magic"
    );
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    let mut d = vec![0u8; len];
    s.read_exact(&mut d).unwrap();
    let word = |i: usize| u32::from_be_bytes(h[i..i + 4].try_into().unwrap());
    (word(8), word(12), d)
}

#[test]
fn options_before_the_export_each_get_their_reply_and_export_name_serves() {
    const LIST: u32 = 3;
    const STARTTLS: u32 = 5;
    const INFO: u32 = 6;
    const REP_ACK: u32 = 1;
    const REP_SERVER: u32 = 2;
    const REP_INFO: u32 = 3;
    const ERR_UNSUP: u32 = 0x8000_0001;
    const ERR_INVALID: u32 = 0x8000_0003;
    const ERR_UNKNOWN: u32 = 0x8000_0006;
    let srv = server("mem:1M", "disk");
    let mut s = connect(&srv.sock);
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap(); // FIXED_NEWSTYLE | NO_ZEROES

    send_opt(&mut s, LIST, &[]);
    let (o, kind, d) = opt_reply(&mut s);
    assert_eq!((o, kind), (LIST, REP_SERVER));
    assert_eq!(&d, b"\0\0\0\x04disk");
    assert_eq!(opt_reply(&mut s).1, REP_ACK);
    send_opt(&mut s, LIST, b"x");
    let (_, kind, d) = opt_reply(&mut s);
    assert_eq!(
        (kind, d.as_slice()),
        (ERR_INVALID, b"LIST takes no data".as_slice())
    );

    // INFO on another name: refused with the name the server has, and the handshake goes on
    let mut q = 4u32.to_be_bytes().to_vec();
    q.extend_from_slice(b"nope\0\0");
    send_opt(&mut s, INFO, &q);
    let (o, kind, d) = opt_reply(&mut s);
    assert_eq!((o, kind), (INFO, ERR_UNKNOWN));
    assert_eq!(
        String::from_utf8_lossy(&d),
        "no export 'nope'; this server exports 'disk'"
    );
    send_opt(&mut s, STARTTLS, &[]);
    let (_, kind, d) = opt_reply(&mut s);
    assert_eq!(
        (kind, d.as_slice()),
        (ERR_UNSUP, b"this export is served without TLS".as_slice())
    );
    send_opt(&mut s, 99, &[]);
    assert_eq!(opt_reply(&mut s), (99, ERR_UNSUP, vec![]));

    // INFO on the export: its size and flags, block sizes, then ACK
    let mut q = 4u32.to_be_bytes().to_vec();
    q.extend_from_slice(b"disk\0\0");
    send_opt(&mut s, INFO, &q);
    let (_, kind, d) = opt_reply(&mut s);
    assert_eq!(
        (kind, &d[0..2]),
        (REP_INFO, &[0u8, 0][..]),
        "NBD_INFO_EXPORT first"
    );
    assert_eq!(u64::from_be_bytes(d[2..10].try_into().unwrap()), 1 << 20);
    let (_, kind, d) = opt_reply(&mut s);
    assert_eq!(
        (kind, &d[0..2]),
        (REP_INFO, &[0u8, 3][..]),
        "NBD_INFO_BLOCK_SIZE"
    );
    assert_eq!(opt_reply(&mut s).1, REP_ACK);

    // EXPORT_NAME: size and flags without the 124 zeroes (NO_ZEROES), then transmission
    send_opt(&mut s, 1, b"disk");
    let mut e = [0u8; 10];
    s.read_exact(&mut e).unwrap();
    assert_eq!(u64::from_be_bytes(e[0..8].try_into().unwrap()), 1 << 20);
    assert_eq!(write_at(&mut s, 1, 4096, &[0x5a; 512]), 0);
    assert_eq!(read_at(&mut s, 2, 4096, 512), (0, vec![0x5a; 512]));
}

#[test]
fn a_trim_larger_than_one_command_is_done_whole_and_answered_once() {
    // the mem backend carries TRIM / WRITE_ZEROES out in 64 MiB commands
    let s = server("mem:256M", "big");
    let mut c = go(&s.sock, "big");
    let data = vec![0xabu8; 1 << 20];
    for off in [0u64, 100 << 20, 199 << 20, 200 << 20] {
        assert_eq!(write_at(&mut c, off, off, &data), 0);
    }
    // TRIM 200 MiB from 0 (FUA: a sync after the last chunk), then WRITE_ZEROES 150 MiB over it
    c.write_all(&request(4, 1, 77, 0, 200 << 20)).unwrap();
    assert_eq!(reply(&mut c), (0, 77));
    c.write_all(&request(6, 0, 78, 50 << 20, 150 << 20))
        .unwrap();
    assert_eq!(reply(&mut c), (0, 78));
    for off in [0u64, 100 << 20, 199 << 20] {
        let (e, got) = read_at(&mut c, 1, off, 1 << 20);
        assert_eq!(e, 0);
        assert!(got.iter().all(|&b| b == 0), "MiB at {off} not zeroed");
    }
    let (e, got) = read_at(&mut c, 2, 200 << 20, 1 << 20);
    assert_eq!(e, 0);
    assert_eq!(got, data, "data past the trimmed range changed");
}

/// Connects and reads the greeting, then says nothing more.
fn idle_client(p: &Path) -> UnixStream {
    let mut s = connect(p);
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    s
}

/// Whether the server has closed `s` (EOF or reset within `within`).
fn closed_within(s: &mut UnixStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

#[test]
fn a_client_that_does_not_finish_the_handshake_is_dropped() {
    let s = server_with("mem:16M", "d", &["--handshake-timeout", "1"], None);
    let mut slow = idle_client(&s.sock);
    // one byte of the client flags every 300 ms: the deadline is for the whole handshake
    let t = Instant::now();
    let mut dropped = false;
    for _ in 0..10 {
        if slow.write_all(&[0]).is_err() || closed_within(&mut slow, Duration::from_millis(300)) {
            dropped = true;
            break;
        }
    }
    assert!(
        dropped,
        "a dribbling client was still connected after {:?}",
        t.elapsed()
    );
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "dropped only after {:?}",
        t.elapsed()
    );
    let mut good = go(&s.sock, "d");
    assert_eq!(write_at(&mut good, 1, 0, &[7u8; 512]), 0);
}

#[test]
fn connections_past_the_limit_are_closed_and_the_served_ones_kept() {
    let s = server_with("mem:16M", "d", &["--max-connections", "2"], None);
    let mut a = go(&s.sock, "d");
    let mut b = go(&s.sock, "d");
    let mut c = connect(&s.sock);
    assert!(
        closed_within(&mut c, Duration::from_secs(5)),
        "a third connection was served"
    );
    assert_eq!(write_at(&mut a, 1, 0, &[1u8; 512]), 0);
    drop(b.write_all(&request(2, 0, 0, 0, 0))); // NBD_CMD_DISC
    drop(b);
    // the slot comes back once the connection's thread has ended
    let t = Instant::now();
    loop {
        let mut d = connect(&s.sock);
        let mut g = [0u8; 18];
        if d.read_exact(&mut g).is_ok() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no slot after a client left"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(read_at(&mut a, 2, 0, 512).1, vec![1u8; 512]);
}

#[test]
fn more_idle_clients_than_descriptors_do_not_stop_the_server() {
    // 64 descriptors, 100 clients that never finish the handshake: accept() fails with EMFILE
    // until the deadline frees descriptors; the server keeps going and serves a good client
    let s = server_with("mem:16M", "d", &["--handshake-timeout", "1"], Some(64));
    let idle: Vec<UnixStream> = (0..100).map(|_| connect(&s.sock)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let mut good = loop {
        let mut c = connect(&s.sock);
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut g = [0u8; 18];
        if c.read_exact(&mut g).is_ok() {
            drop(c);
            break go(&s.sock, "d");
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the server stopped serving"
        );
    };
    assert_eq!(write_at(&mut good, 1, 4096, &[9u8; 4096]), 0);
    assert_eq!(read_at(&mut good, 2, 4096, 4096).1, vec![9u8; 4096]);
    drop(idle);
    let mut server = s;
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server exited"
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as the gnutls clients (qemu's
/// tls-creds-x509, libnbd's tls-certificates) look for them in a directory: ca-cert.pem,
/// client-cert.pem, client-key.pem; the server's are server-cert.pem / server-key.pem.
fn make_certs(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let openssl = |args: &[&str]| {
        let mut c = tool("openssl", "openssl");
        c.current_dir(dir).args(args);
        run(c);
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut a = vec!["req", "-x509"];
    a.extend(ec);
    a.extend(["-keyout", "ca-key.pem", "-out", "ca-cert.pem", "-days", "2"]);
    a.extend(["-subj", "/CN=srp-ublk test CA"]);
    a.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
    a.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
    openssl(&a);
    for (who, usage, san) in [
        (
            "server",
            "serverAuth",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        ),
        ("client", "clientAuth", ""),
    ] {
        let ext = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n{san}"
        );
        std::fs::write(dir.join(format!("{who}.ext")), ext).unwrap();
        let (key, csr) = (format!("{who}-key.pem"), format!("{who}.csr"));
        let mut a = vec!["req"];
        a.extend(ec);
        a.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=127.0.0.1"]);
        openssl(&a);
        let (cert, ext) = (format!("{who}-cert.pem"), format!("{who}.ext"));
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca-cert.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
    }
}

/// A free TCP port on the loopback address.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct TcpServer {
    child: Child,
    port: u16,
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tcp_server(extra: &[&str]) -> TcpServer {
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_srp-ublk"))
        .args(["serve", "--backend", "mem:16M", "--name", "x", "--nbd"])
        .arg(format!("tcp:127.0.0.1:{port}"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start srp-ublk serve");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(st) = child.try_wait().unwrap() {
            let mut e = String::new();
            child.stderr.take().unwrap().read_to_string(&mut e).unwrap();
            panic!("serve exited ({st}): {e}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "server did not listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    TcpServer { child, port }
}

#[test]
fn tls_exports_serve_qemu_and_nbdinfo_and_refuse_clients_without_tls() {
    let dir = std::env::temp_dir().join(format!("srp-ublk-tls-{}", std::process::id()));
    make_certs(&dir);
    let (cert, key) = (dir.join("server-cert.pem"), dir.join("server-key.pem"));
    let s = tcp_server(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    // the gnutls clients find ca-cert.pem (and no client certificate) in their directory
    let cdir = dir.join("client-noauth");
    std::fs::create_dir_all(&cdir).unwrap();
    std::fs::copy(dir.join("ca-cert.pem"), cdir.join("ca-cert.pem")).unwrap();
    let mut c = tool("nbdinfo", "libnbd-bin");
    c.arg(format!(
        "nbds://127.0.0.1:{}/x?tls-certificates={}",
        s.port,
        cdir.display()
    ));
    let out = run(c);
    assert!(out.contains("with TLS"), "{out}");
    assert!(out.contains("export-size: 16777216"), "{out}");
    let mut c = tool("qemu-io", "qemu-utils");
    c.arg("--object")
        .arg(format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", cdir.display()))
        .arg("--image-opts")
        .arg(format!(
            "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={},export=x,tls-creds=tls0",
            s.port
        ));
    for cmd in ["write -P 0x5c 4096 256k", "read -P 0x5c 4096 256k", "flush"] {
        c.args(["-c", cmd]);
    }
    let out = run(c);
    assert!(
        out.contains("read 262144/262144 bytes at offset 4096"),
        "{out}"
    );
    assert!(!out.contains("Pattern verification failed"), "{out}");
    // pipelined, two connections, both directions: the non-blocking TLS path with full buffers
    let uri = format!(
        "nbds://127.0.0.1:{}/x?tls-certificates={}",
        s.port,
        cdir.display()
    );
    let (src, back) = (dir.join("pattern"), dir.join("back"));
    let data: Vec<u8> = (0..16u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let mut c = tool("nbdcopy", "libnbd-bin");
    c.args(["--requests=32", "--connections=2"])
        .arg(&src)
        .arg(&uri);
    run(c);
    let mut c = tool("nbdcopy", "libnbd-bin");
    c.args(["--requests=32"]).arg(&uri).arg(&back);
    run(c);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "data read back over TLS differs"
    );
    // a client that does not start TLS gets nothing: nbdinfo fails, a raw GO gets ERR_TLS_REQD
    let mut c = tool("nbdinfo", "libnbd-bin");
    c.arg(format!("nbd://127.0.0.1:{}/x", s.port));
    assert!(
        !c.output().unwrap().status.success(),
        "nbdinfo without TLS was served"
    );
    let mut t = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut g = [0u8; 18];
    t.read_exact(&mut g).unwrap();
    t.write_all(&3u32.to_be_bytes()).unwrap();
    let mut o = b"IHAVEOPT".to_vec();
    o.extend_from_slice(&7u32.to_be_bytes());
    o.extend_from_slice(&6u32.to_be_bytes());
    o.extend_from_slice(&[0, 0, 0, 0, 0, 0]); // name "", no info requests
    t.write_all(&o).unwrap();
    let mut h = [0u8; 20];
    t.read_exact(&mut h).unwrap();
    assert_eq!(
        u32::from_be_bytes(h[12..16].try_into().unwrap()),
        0x8000_0005
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tls_with_a_client_ca_serves_only_clients_with_a_certificate() {
    let dir = std::env::temp_dir().join(format!("srp-ublk-tlsca-{}", std::process::id()));
    make_certs(&dir);
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let s = tcp_server(&[
        "--tls-cert",
        &p("server-cert.pem"),
        "--tls-key",
        &p("server-key.pem"),
        "--tls-ca",
        &p("ca-cert.pem"),
    ]);
    let uri = |d: &Path| {
        format!(
            "nbds://127.0.0.1:{}/x?tls-certificates={}",
            s.port,
            d.display()
        )
    };
    let noauth = dir.join("client-noauth");
    std::fs::create_dir_all(&noauth).unwrap();
    std::fs::copy(dir.join("ca-cert.pem"), noauth.join("ca-cert.pem")).unwrap();
    let mut c = tool("nbdinfo", "libnbd-bin");
    c.arg(uri(&noauth));
    assert!(
        !c.output().unwrap().status.success(),
        "a client without a certificate was served"
    );
    // the directory with client-cert.pem / client-key.pem
    let mut c = tool("nbdinfo", "libnbd-bin");
    c.arg(uri(&dir));
    assert!(run(c).contains("export-size: 16777216"));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tcp_export_without_tls_needs_its_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_srp-ublk"))
        .args(["serve", "--backend", "mem:1M", "--nbd", "tcp:127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a TCP export needs TLS") && err.contains("--no-tls"),
        "{err}"
    );
    let s = tcp_server(&["--no-tls"]);
    let mut c = tool("nbdinfo", "libnbd-bin");
    c.arg(format!("nbd://127.0.0.1:{}/x", s.port));
    assert!(run(c).contains("export-size: 16777216"));
}

#[test]
fn block_status_and_structured_reads_match_nbdkit_on_the_same_image() {
    // the same 16 MiB of data behind srp-ublk (mem) and behind nbdkit's file plugin: nbdinfo --map
    // and qemu-img map must say the same (all data, never a hole that would make a client skip
    // data), and qemu-img convert must read the same bytes through structured replies
    let s = server("mem:16M", "img");
    let dir = s.sock.parent().unwrap().to_path_buf();
    let img = dir.join("img.raw");
    let data: Vec<u8> = (0..16u32 << 20)
        .map(|i| (i.wrapping_mul(40503) >> 7) as u8)
        .collect();
    std::fs::write(&img, &data).unwrap();
    let ours = uri(&s, "img");
    let mut c = tool("nbdcopy", "libnbd-bin");
    c.arg(&img).arg(&ours);
    run(c);
    let ksock = dir.join("nbdkit.sock");
    let mut kit = tool("nbdkit", "nbdkit")
        .args(["--foreground", "-U"])
        .arg(&ksock)
        .args(["file"])
        .arg(&img)
        .spawn()
        .expect("start nbdkit");
    let t = Instant::now();
    while !ksock.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "nbdkit did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let theirs = format!("nbd+unix:///?socket={}", ksock.display());
    let map = |u: &str| {
        let mut c = tool("nbdinfo", "libnbd-bin");
        c.args(["--map", u]);
        run(c)
    };
    let qmap = |path: &Path, export: &str| {
        let mut c = tool("qemu-img", "qemu-utils");
        c.args(["map", "--output=json", "--image-opts"])
            .arg(format!(
                "driver=nbd,server.type=unix,server.path={}{export}",
                path.display()
            ));
        run(c)
    };
    let (m_ours, m_theirs) = (map(&ours), map(&theirs));
    let (q_ours, q_theirs) = (qmap(&s.sock, ",export=img"), qmap(&ksock, ""));
    let _ = kit.kill();
    let _ = kit.wait();
    assert_eq!(m_ours, m_theirs, "nbdinfo --map differs from nbdkit's");
    assert!(m_ours.contains("16777216    0  data"), "{m_ours}");
    assert_eq!(q_ours, q_theirs, "qemu-img map differs from nbdkit's");
    let back = dir.join("back.raw");
    let mut c = tool("qemu-img", "qemu-utils");
    c.args(["convert", "-f", "raw", "-O", "raw", &ours])
        .arg(&back);
    run(c);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "qemu-img convert read other bytes"
    );
    // BLOCK_STATUS without a negotiated context is refused
    let mut raw = go(&s.sock, "img");
    raw.write_all(&request(7, 0, 9, 0, 4096)).unwrap();
    assert_eq!(reply(&mut raw), (22, 9));
}

/// A pattern no two MiB of which are alike.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 11) as u8)
        .collect()
}

/// GO after NBD_OPT_STRUCTURED_REPLY: replies to reads are chunks from now on.
fn go_structured(p: &Path, name: &str) -> UnixStream {
    let mut s = connect(p);
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    send_opt(&mut s, 8, &[]);
    assert_eq!(opt_reply(&mut s).1, 1, "STRUCTURED_REPLY acknowledged");
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&0u16.to_be_bytes());
    send_opt(&mut s, 7, &data);
    while opt_reply(&mut s).1 != 1 {}
    s
}

/// A structured reply chunk: (flags, type, cookie, payload).
fn chunk(s: &mut UnixStream) -> (u16, u16, u64, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(&h[0..4], &0x668e_33efu32.to_be_bytes(), "chunk magic");
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    let mut d = vec![0u8; len];
    s.read_exact(&mut d).unwrap();
    let half = |i: usize| u16::from_be_bytes(h[i..i + 2].try_into().unwrap());
    (
        half(4),
        half(6),
        u64::from_be_bytes(h[8..16].try_into().unwrap()),
        d,
    )
}

#[test]
fn requests_up_to_32_mib_are_served_whole_and_larger_ones_refused() {
    // the kernel's nbd client sends up to 32 MiB whatever the server advertises (qemu-nbd and
    // nbdkit serve that much): one command carries at most 1 MiB here, so these go in parts
    let srv = server("mem:96M", "big");
    let mut s = go(&srv.sock, "big");
    let a = pattern(32 << 20, 1);
    assert_eq!(write_at(&mut s, 1, 4096, &a), 0, "32 MiB write");
    let (e, got) = read_at(&mut s, 2, 4096, 32 << 20);
    assert_eq!(e, 0);
    assert!(got == a, "32 MiB read back differs");
    // pipelined: two large writes and a small one behind them, then a read across both
    let (b, c) = (pattern((5 << 20) + 512, 2), pattern(3 << 20, 3));
    let mut batch = request(1, 1, 10, 40 << 20, b.len() as u32);
    batch.extend_from_slice(&b);
    batch.extend(request(
        1,
        0,
        11,
        (40 << 20) + b.len() as u64,
        c.len() as u32,
    ));
    batch.extend_from_slice(&c);
    batch.extend(request(1, 0, 12, 0, 512));
    batch.extend_from_slice(&[0x77; 512]);
    s.write_all(&batch).unwrap();
    let mut cookies: Vec<u64> = (0..3)
        .map(|_| reply(&mut s))
        .map(|(e, c)| {
            assert_eq!(e, 0, "cookie {c}");
            c
        })
        .collect();
    cookies.sort();
    assert_eq!(cookies, [10, 11, 12]);
    let (e, got) = read_at(&mut s, 13, 40 << 20, (b.len() + c.len()) as u32);
    assert_eq!(e, 0);
    assert!(
        got[..b.len()] == b[..] && got[b.len()..] == c[..],
        "pipelined writes"
    );
    // 33 MiB: EINVAL on a simple connection, and the connection still serves
    assert_eq!(write_at(&mut s, 14, 0, &vec![0xee; 33 << 20]), 22);
    assert_eq!(read_at(&mut s, 15, 0, 33 << 20).0, 22);
    let (e, got) = read_at(&mut s, 16, 4096, 4096);
    assert_eq!(
        (e, &got[..]),
        (0, &a[..4096]),
        "nothing of the refused write landed"
    );
    // structured replies: one data chunk for 32 MiB, EOVERFLOW past it
    let mut t = go_structured(&srv.sock, "big");
    t.write_all(&request(0, 0, 20, 4096, 32 << 20)).unwrap();
    let (flags, kind, cookie, d) = chunk(&mut t);
    assert_eq!(
        (flags, kind, cookie),
        (1, 1, 20),
        "one OFFSET_DATA chunk, DONE"
    );
    assert_eq!(&d[..8], &4096u64.to_be_bytes());
    assert!(d[8..] == a[..], "structured 32 MiB read differs");
    t.write_all(&request(0, 0, 21, 0, (32 << 20) + 512))
        .unwrap();
    let (flags, kind, cookie, d) = chunk(&mut t);
    assert_eq!((flags, kind, cookie), (1, 0x8001, 21), "an ERROR chunk");
    assert_eq!(&d[..4], &75u32.to_be_bytes(), "EOVERFLOW");
    t.write_all(&request(1, 0, 22, 0, (32 << 20) + 512))
        .unwrap();
    t.write_all(&vec![0u8; (32 << 20) + 512]).unwrap();
    assert_eq!(reply(&mut t), (75, 22), "a write past 32 MiB: EOVERFLOW");
    t.write_all(&request(0, 0, 23, 4096, 512)).unwrap();
    assert_eq!(
        chunk(&mut t).3[8..],
        a[..512],
        "the connection still serves"
    );
}

#[test]
fn write_zeroes_is_answered_as_the_spec_says_for_each_flag() {
    const NO_HOLE: u16 = 1 << 1;
    const FAST_ZERO: u16 = 1 << 4;
    let srv = server("mem:8M", "z");
    let mut s = go(&srv.sock, "z");
    let data = pattern(4 << 20, 4);
    assert_eq!(write_at(&mut s, 1, 0, &data), 0);
    // (flags, range in MiB, answer): zeroed unless refused
    let cases = [
        (0, 0, 0),
        (NO_HOLE, 1, 0),
        (FAST_ZERO, 2, 0),
        // writing zeros is never fast: FAST_ZERO with NO_HOLE fails at once and zeroes nothing
        (FAST_ZERO | NO_HOLE, 3, 95),
    ];
    for (i, (flags, mib, want)) in cases.into_iter().enumerate() {
        let cookie = 100 + i as u64;
        s.write_all(&request(6, flags, cookie, mib << 20, 1 << 20))
            .unwrap();
        assert_eq!(
            reply(&mut s),
            (want, cookie),
            "WRITE_ZEROES flags {flags:#x}"
        );
        let (e, got) = read_at(&mut s, 200 + i as u64, mib << 20, 1 << 20);
        assert_eq!(e, 0);
        let at = (mib << 20) as usize;
        if want == 0 {
            assert!(got.iter().all(|&b| b == 0), "flags {flags:#x}: not zeroed");
        } else {
            assert!(got == data[at..at + (1 << 20)], "flags {flags:#x}: changed");
        }
    }
}
