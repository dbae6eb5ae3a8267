//! The NBD listener: where an export listens, the socket made safely, and an accept loop that a
//! client cannot take down: accept errors (EMFILE under a descriptor flood) are logged and retried
//! with a back-off, connections are capped, a client has a deadline to finish the handshake, and a
//! thread that cannot be created costs that connection only.

use super::tls::TlsConn;
use crate::frontend::socket::bind_unix;
use crate::ratelimit::RateLimit;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where to listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A unix socket (the default; created 0600).
    Unix(PathBuf),
    /// TCP (with TLS, or without it only when --no-tls says so).
    Tcp(SocketAddr),
}

/// A listen address that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ListenError {
    /// `unix:` with nothing after it.
    #[error("unix: needs a path, e.g. unix:/run/srp-ublk/disk0.sock")]
    NoPath,
    /// `tcp:` with no ADDRESS:PORT.
    #[error("'{0}': expected tcp:ADDRESS:PORT, e.g. tcp:127.0.0.1:10809")]
    BadTcp(String),
    /// Neither form.
    #[error("'{0}': expected unix:PATH or tcp:ADDRESS:PORT")]
    Unknown(String),
}

impl Listen {
    /// Parses `unix:PATH` or `tcp:ADDR:PORT`.
    pub fn parse(s: &str) -> Result<Listen, ListenError> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(ListenError::NoPath);
            }
            return Ok(Listen::Unix(PathBuf::from(p)));
        }
        if let Some(a) = s.strip_prefix("tcp:") {
            return a
                .parse()
                .map(Listen::Tcp)
                .map_err(|_| ListenError::BadTcp(a.into()));
        }
        Err(ListenError::Unknown(s.into()))
    }
}

/// Who may connect and what one client may hold of the server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once; more are closed at once (QEMU's nbd-server-start's default is
    /// 100).
    pub max_connections: usize,
    /// Time a client has from connecting to the end of the handshake (qemu-nbd: 10 s).
    pub handshake_timeout: Duration,
    /// A unix socket's group, which may connect besides its owner (None: the owner only).
    pub socket_group: Option<u32>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 100,
            handshake_timeout: Duration::from_secs(10),
            socket_group: None,
        }
    }
}

/// A client's connection.
pub(super) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
    /// TCP after NBD_OPT_STARTTLS.
    Tls(Box<TlsConn>),
    /// What is left of a connection whose TLS handshake failed.
    Gone,
}

fn tcp_timeouts(s: &TcpStream, t: Option<Duration>) -> io::Result<()> {
    s.set_read_timeout(t).and(s.set_write_timeout(t))
}

fn gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the connection's TLS handshake failed",
    )
}

impl Stream {
    pub(super) fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(nb),
            Stream::Tcp(s) => s.set_nonblocking(nb),
            Stream::Tls(t) => t.sock.set_nonblocking(nb),
            Stream::Gone => Err(gone()),
        }
    }
    pub(super) fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t).and(s.set_write_timeout(t)),
            Stream::Tcp(s) => tcp_timeouts(s, t),
            Stream::Tls(c) => tcp_timeouts(&c.sock, t),
            Stream::Gone => Err(gone()),
        }
    }
    /// Whether TLS is on.
    pub(super) fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }
    /// Sends what TLS holds back as far as the socket takes it; returns whether some is left
    /// (the caller then waits for POLLOUT).
    pub(super) fn flush_pending(&mut self) -> io::Result<bool> {
        match self {
            Stream::Tls(t) => t.flush_tls().map(|()| t.wants_write()),
            _ => Ok(false),
        }
    }
    /// Data is readable without the socket being so (decrypted and held by TLS).
    pub(super) fn buffered(&mut self) -> bool {
        match self {
            Stream::Tls(t) => t.buffered(),
            _ => false,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
            Stream::Tls(t) => t.read(b),
            Stream::Gone => Err(gone()),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
            Stream::Tls(t) => t.write(b),
            Stream::Gone => Err(gone()),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tls(t) => t.flush_tls(),
            _ => Ok(()),
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Tls(t) => t.sock.as_raw_fd(),
            Stream::Gone => -1,
        }
    }
}

/// A stream whose every read and write must end by `deadline`: a client dribbling one byte at a
/// time cannot stretch the handshake.
pub(super) struct Timed<'a> {
    pub(super) s: &'a mut Stream,
    pub(super) deadline: Instant,
}

impl Timed<'_> {
    /// NBD_OPT_STARTTLS was acknowledged: the TLS handshake, within the same deadline; the stream
    /// is TLS from then on.
    pub(super) fn start_tls(&mut self, cfg: Arc<rustls::ServerConfig>) -> io::Result<()> {
        let Stream::Tcp(sock) = std::mem::replace(self.s, Stream::Gone) else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "TLS is served on TCP only",
            ));
        };
        let deadline = self.deadline;
        let conn = TlsConn::accept(cfg, sock, |s| {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(late());
            }
            tcp_timeouts(s, Some(left))
        })
        .map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => late(),
            _ => e,
        })?;
        *self.s = Stream::Tls(Box::new(conn));
        Ok(())
    }

    /// Whether TLS is on.
    pub(super) fn is_tls(&self) -> bool {
        self.s.is_tls()
    }
}

fn late() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the client did not finish the handshake in time (--handshake-timeout)",
    )
}

impl Timed<'_> {
    fn arm(&self) -> io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late());
        }
        self.s.set_timeouts(Some(left))
    }
}

fn timed_out<T>(r: io::Result<T>) -> io::Result<T> {
    r.map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => late(),
        _ => e,
    })
}

impl Read for Timed<'_> {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        timed_out(self.s.read(b))
    }
}

impl Write for Timed<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.arm()?;
        timed_out(self.s.write(b))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Counts a connection while it lives.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Accepts connections until the process ends, handing each to `conn` on a thread of its own.
pub(super) fn accept_loop(
    mut accept: impl FnMut() -> io::Result<Stream>,
    limits: Limits,
    conn: impl Fn(Stream) + Send + Sync + 'static,
) -> ! {
    let conn = Arc::new(conn);
    let live = Arc::new(AtomicUsize::new(0));
    let mut backoff = Duration::ZERO;
    let mut errors = RateLimit::new(Duration::from_secs(10));
    let mut refusals = RateLimit::new(Duration::from_secs(10));
    loop {
        let s = match accept() {
            Ok(s) => {
                backoff = Duration::ZERO;
                s
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // EMFILE, ENFILE, ENOBUFS, ECONNABORTED...: none is a reason to stop serving
                backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                if let Some(n) = errors.allow(Instant::now()) {
                    tracing::warn!(
                        "NBD: accepting a connection failed: {e} ({n} more since the last line); \
                         retrying in {backoff:?} (raise LimitNOFILE if this is EMFILE)"
                    );
                }
                std::thread::sleep(backoff);
                continue;
            }
        };
        if live.load(Ordering::Acquire) >= limits.max_connections {
            if let Some(n) = refusals.allow(Instant::now()) {
                tracing::warn!(
                    "NBD: connection refused: {} connections already served (--max-connections; \
                     {n} more refused since the last line)",
                    limits.max_connections
                );
            }
            continue; // dropping the stream closes it
        }
        live.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(live.clone());
        let conn = conn.clone();
        let spawned = std::thread::Builder::new()
            .name("nbd-conn".into())
            .spawn(move || {
                let _slot = slot;
                conn(s)
            });
        if let Err(e) = spawned {
            if let Some(n) = errors.allow(Instant::now()) {
                tracing::warn!("NBD: no thread for a new connection ({e}; {n} more since the last line): connection closed");
            }
        }
    }
}

/// Listens on `listen` and runs `conn` for each connection until the process ends; `ready` runs
/// once the socket accepts.
pub(super) fn serve(
    listen: &Listen,
    limits: Limits,
    ready: impl FnOnce(),
    conn: impl Fn(Stream) + Send + Sync + 'static,
) -> io::Result<()> {
    match listen {
        Listen::Unix(path) => {
            let l = bind_unix(path, limits.socket_group).map_err(io::Error::other)?;
            ready();
            accept_loop(|| l.accept().map(|(s, _)| Stream::Unix(s)), limits, conn)
        }
        Listen::Tcp(addr) => {
            let l = TcpListener::bind(addr)?;
            ready();
            accept_loop(
                || {
                    let (s, _) = l.accept()?;
                    let _ = s.set_nodelay(true);
                    Ok(Stream::Tcp(s))
                },
                limits,
                conn,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_specs() {
        assert_eq!(
            Listen::parse("unix:/tmp/x.sock"),
            Ok(Listen::Unix("/tmp/x.sock".into()))
        );
        assert_eq!(
            Listen::parse("tcp:127.0.0.1:10809"),
            Ok(Listen::Tcp("127.0.0.1:10809".parse().unwrap()))
        );
        assert!(Listen::parse("tcp:localhost").is_err());
        assert!(Listen::parse("unix:").is_err());
        assert!(Listen::parse("/tmp/x").is_err());
    }
}
