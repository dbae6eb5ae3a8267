//! The NBD connection's loop driven over the fake target, with a real socket and the fake's real
//! fds: what the path's contract ([`crate::path::Sleep`]) says wakes it does wake it.

use super::pool::Pool;
use super::*;
use crate::channel::block::tests::GEO;
use crate::channel::fake::FakeTarget;
use crate::channel::{send_slots, Channel, ChannelConfig};
use crate::path::{Fresh, Path, Spare};
use crate::rdma::TagBufs;
use crate::session::rport::Rport;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

const DEPTH: u16 = 8;

/// Logs in again to the same fake target, or refuses every login.
struct Relog {
    refuse: bool,
}

impl Connect for Relog {
    type T = FakeTarget;
    type Error = std::io::Error;

    fn connect(&self, old: &mut FakeTarget) -> Result<Fresh<FakeTarget>, std::io::Error> {
        if self.refuse {
            return Err(std::io::Error::other("login rejected"));
        }
        Ok(Fresh {
            t: old.successor(),
            req_lim: 16,
            max_imm: 8192,
        })
    }
}

fn export() -> Export {
    Export {
        name: "t".into(),
        size: 1 << 20,
        min_block: 512,
        max_io: 64 << 10,
        read_only: false,
        fast_zero: false,
        trim: false,
        cache: WriteCache::LEGACY,
        max_trim: 1 << 20,
        max_zero: 1 << 20,
        lba_status: AtomicBool::new(false),
        write_same: AtomicBool::new(true),
        source: Source::Null,
        status: Arc::new(ExportStatus::new(1)),
    }
}

/// A connection in transmission over the fake target (with fds), and the client's end.
fn connection(ex: &Export, relog: Relog, timers: Timers) -> (Conn<'_, Relog>, Client) {
    connection_from(ex, relog, timers, &fake_pool())
}

/// An export's pool of one channel over the fake target.
fn fake_pool() -> Arc<Pool<Spare<FakeTarget>>> {
    let fake = FakeTarget::new(1 << 20, 512, send_slots(DEPTH, 4), DEPTH + 8).with_fds();
    let login: pool::Login<Spare<FakeTarget>> = Box::new(|| unreachable!("no new login"));
    let channels = vec![Spare::new(Channel::new(fake, ChannelConfig::fake(DEPTH)))];
    Arc::new(Pool::with_login(
        channels,
        login,
        Duration::ZERO,
        Duration::ZERO,
    ))
}

/// A connection over a channel of `pool` (as `Exec::open` makes one).
fn connection_from<'e>(
    ex: &'e Export,
    relog: Relog,
    timers: Timers,
    pool: &Arc<Pool<Spare<FakeTarget>>>,
) -> (Conn<'e, Relog>, Client) {
    let spare = pool.take().expect("the pool's channel");
    let name = "NBD connection".to_string();
    let fresh = || TagBufs::new(DEPTH, ex.max_io);
    let path = Path::resume(spare, relog, Rport::new(timers), name, fresh).expect("registers");
    let exec = Exec::Srp {
        path: Some(path),
        geo: GEO,
        pool: pool.clone(),
        counted: exec::Counted::claim(&ex.status, DEPTH),
    };
    let (ours, s) = UnixStream::pair().expect("socket pair");
    let client = Client { s, got: Vec::new() };
    let neg = Negotiated::default();
    let c = Conn::new(Stream::Unix(ours), ex, exec, neg, DEPTH).expect("non-blocking");
    (c, client)
}

fn path<'c>(c: &'c mut Conn<'_, Relog>) -> &'c mut Path<Relog> {
    match &mut c.exec {
        Exec::Srp { path: Some(p), .. } => p,
        _ => unreachable!("an SRP connection"),
    }
}

const TIMERS: Timers = Timers {
    reconnect_delay: Some(0),
    fast_io_fail_tmo: None,
    dev_loss_tmo: Some(1),
};

fn spin() -> Spin {
    Spin {
        spins: 0,
        last: Instant::now(),
    }
}

/// Runs passes until `until` holds or `within` passed; whether it held.
fn drive(
    c: &mut Conn<'_, Relog>,
    within: Duration,
    mut until: impl FnMut(&mut Conn<'_, Relog>) -> bool,
) -> bool {
    let (t, mut s) = (Instant::now(), spin());
    while t.elapsed() < within {
        if until(c) {
            return true;
        }
        if c.pass(&mut s).expect("the connection serves") {
            return until(c);
        }
    }
    false
}

fn read_request(cookie: u64) -> Vec<u8> {
    let mut b = nbd::REQUEST_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&0u16.to_be_bytes());
    b.extend_from_slice(&cmd::READ.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&0u64.to_be_bytes());
    b.extend_from_slice(&4096u32.to_be_bytes());
    b
}

/// The client's end: what it has read so far.
struct Client {
    s: UnixStream,
    got: Vec<u8>,
}

impl Client {
    fn send(&mut self, b: &[u8]) {
        self.s.set_nonblocking(false).expect("blocking");
        self.s.write_all(b).expect("request");
    }

    /// The next simple reply's error and cookie, once it has arrived (a read's data stays).
    fn reply(&mut self) -> Option<(u32, u64)> {
        self.s.set_nonblocking(true).expect("non-blocking");
        let mut b = [0u8; 8192];
        while let Ok(n @ 1..) = self.s.read(&mut b) {
            self.got.extend_from_slice(&b[..n]);
        }
        if self.got.len() < 16 {
            return None;
        }
        let r: Vec<u8> = self.got.drain(..16).collect();
        let word = |i: usize| u32::from_be_bytes(r[i..i + 4].try_into().expect("4 bytes"));
        Some((
            word(4),
            u64::from_be_bytes(r[8..16].try_into().expect("8 bytes")),
        ))
    }
}

#[test]
fn a_target_disconnect_on_an_idle_connection_is_acted_on() {
    let ex = export();
    let (mut c, mut client) = connection(&ex, Relog { refuse: false }, TIMERS);
    assert!(!drive(&mut c, Duration::from_millis(20), |_| false), "idle");
    path(&mut c).transport_mut().disconnect();
    // the connection manager's fd wakes the sleeping connection: the channel goes down and
    // logs in again (reconnect_delay 0), with no request to notice it
    let back = drive(&mut c, Duration::from_secs(3), |c| {
        path(c).reconnects() == 1
    });
    assert!(back, "the target's disconnect was not acted on");
    client.send(&read_request(7));
    let mut got = None;
    drive(&mut c, Duration::from_secs(3), |_| {
        got = got.or_else(|| client.reply());
        got.is_some()
    });
    assert_eq!(got, Some((0, 7)), "a read on the new login");
}

#[test]
fn dev_loss_ends_the_connection_after_failing_what_it_held() {
    let ex = export();
    let (mut c, mut client) = connection(&ex, Relog { refuse: true }, TIMERS);
    path(&mut c).transport_mut().faults.hold_rsps = true;
    client.send(&read_request(9));
    assert!(drive(&mut c, Duration::from_secs(1), |c| c.exec.busy()));
    path(&mut c).transport_mut().disconnect();
    // down, every login refused: dev_loss_tmo (1 s) fails the held read and ends the connection
    let t = Instant::now();
    let ended = drive(&mut c, Duration::from_secs(5), |c| c.ended.is_some());
    assert!(
        ended,
        "the connection outlived dev_loss_tmo ({:?})",
        t.elapsed()
    );
    assert_eq!(c.ended, Some(Event::Lost));
    assert!(drive(&mut c, Duration::from_secs(1), |_| false) || c.out.is_empty());
    assert_eq!(client.reply(), Some((err::EIO, 9)), "the held read failed");
}

#[test]
fn a_delayed_retry_wakes_the_connection_when_it_is_due() {
    // BUSY: the read is sent again 5 ms later (the channel's first retry delay); the sleeping
    // connection must wake for it then, not at a fixed poll interval
    let ex = export();
    let (mut c, mut client) = connection(&ex, Relog { refuse: false }, TIMERS);
    path(&mut c).transport_mut().faults.busy_next = 1;
    let t = Instant::now();
    client.send(&read_request(3));
    let mut got = None;
    drive(&mut c, Duration::from_secs(2), |_| {
        got = got.or_else(|| client.reply());
        got.is_some()
    });
    let took = t.elapsed();
    assert_eq!(got, Some((0, 3)));
    assert!(
        took >= Duration::from_millis(1) && took < Duration::from_millis(100),
        "the retry's timer fired after {took:?}"
    );
}

/// Reads 4 KiB on `c` and waits for the reply and its data.
fn read_once(c: &mut Conn<'_, Relog>, client: &mut Client, cookie: u64) {
    client.send(&read_request(cookie));
    client.s.set_nonblocking(true).expect("non-blocking");
    let mut b = [0u8; 8192];
    drive(c, Duration::from_secs(2), |_| {
        while let Ok(n @ 1..) = client.s.read(&mut b) {
            client.got.extend_from_slice(&b[..n]);
        }
        client.got.len() >= 16 + 4096
    });
    assert_eq!(client.reply(), Some((0, cookie)));
    client.got.drain(..4096);
}

#[test]
fn the_next_connection_over_a_channel_registers_nothing() {
    let ex = export();
    let pool = fake_pool();
    let (mut c, mut client) = connection_from(&ex, Relog { refuse: false }, TIMERS, &pool);
    read_once(&mut c, &mut client, 1);
    assert_eq!(path(&mut c).transport_mut().registrations, 1);
    drop(c);
    // the channel is back in the pool with the connection's buffers still registered
    let (mut c, mut client) = connection_from(&ex, Relog { refuse: false }, TIMERS, &pool);
    assert_eq!(
        path(&mut c).transport_mut().registrations,
        1,
        "the second connection registered its buffers again"
    );
    read_once(&mut c, &mut client, 2);
    read_once(&mut c, &mut client, 3);
}

#[test]
fn a_channel_that_went_down_while_spare_logs_in_again_under_the_next_connection() {
    let ex = export();
    let pool = fake_pool();
    let (mut c, mut client) = connection_from(&ex, Relog { refuse: false }, TIMERS, &pool);
    read_once(&mut c, &mut client, 1);
    drop(c);
    // the target drops the login while no connection uses the channel
    let mut spare = pool.take().expect("the spare channel");
    spare.transport_mut().disconnect();
    pool.give_back(spare);
    // the next connection resumes the kept buffers on it: the channel goes down, logs in again
    // on the same device and adopts their registration
    let (mut c, mut client) = connection_from(&ex, Relog { refuse: false }, TIMERS, &pool);
    let back = drive(&mut c, Duration::from_secs(3), |c| {
        path(c).reconnects() == 1
    });
    assert!(back, "the disconnect was not acted on");
    read_once(&mut c, &mut client, 2);
    assert_eq!(
        path(&mut c).transport_mut().registrations,
        1,
        "the kept registration serves the new login"
    );
}

#[test]
fn a_connections_counters_are_published_and_the_next_in_its_slot_carries_them_on() {
    let ex = export();
    let (mut c, mut client) = connection(&ex, Relog { refuse: false }, TIMERS);
    read_once(&mut c, &mut client, 1);
    read_once(&mut c, &mut client, 2);
    drop(c);
    let mut q = crate::session::state::QueueState::default();
    ex.status.queues[0].load_into(&mut q);
    assert_eq!((q.io.read_ops, q.io.read_bytes, q.cmds), (2, 8192, 2));
    assert_eq!(q.io.lat.iter().sum::<u64>(), 2, "two latencies");
    // the slot is free again: the next connection takes it and counts on from there
    let (mut c, mut client) = connection(&ex, Relog { refuse: false }, TIMERS);
    read_once(&mut c, &mut client, 3);
    // a connection publishes when it sleeps
    drive(&mut c, Duration::from_millis(20), |_| false);
    ex.status.queues[0].load_into(&mut q);
    assert_eq!((q.io.read_ops, q.cmds, q.state.as_str()), (3, 3, "running"));
}
