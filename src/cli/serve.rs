//! `srp-ublk serve --nbd ...`: serve a target's LUN (or a demo backend) as an NBD export, in the
//! foreground (run it under systemd, or with `&`). One SRP channel per concurrent connection.

use anyhow::{bail, Context};
use clap::Args;
use srp_ublk::backend::{parse_spec, DemoKind, MemDisk};
use srp_ublk::channel::block::WriteCache;
use srp_ublk::frontend::nbd::{self, Export, Limits, Listen, Source};
use srp_ublk::session::Session;
use srp_ublk::wire::target::TargetSpec;
use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// `srp-ublk serve ...`
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where to listen: unix:PATH (default unix:/run/srp-ublk/NAME.sock, created 0600) or
    /// tcp:ADDRESS:PORT (unauthenticated; say so explicitly).
    #[arg(long)]
    pub nbd: Option<String>,
    /// The SRP target (an ib_srp add_target string).
    #[arg(
        long,
        short = 't',
        conflicts_with = "backend",
        required_unless_present = "backend"
    )]
    pub target: Option<String>,
    /// A demo/benchmark backend instead of SRP: null:SIZE (zeros, writes discarded) or mem:SIZE (RAM).
    #[arg(long)]
    pub backend: Option<String>,
    /// Session options.
    #[command(flatten)]
    pub session: super::SessionArgs,
    /// The export name.
    #[arg(long, default_value = "srp")]
    pub name: String,
    /// The SRP transport-class timers of each connection's channel.
    #[command(flatten)]
    pub timer_args: super::TimerArgs,
    /// Connections served at once; more are closed at once.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// TLS for a TCP export: the server's certificate chain (PEM). Clients must then start TLS
    /// (qemu's tls-creds-x509, nbds:// URIs) before anything is served.
    #[arg(long, requires = "tls_key", value_name = "FILE")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Require clients to present a certificate signed by this CA (PEM).
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Serve a TCP export without TLS: no encryption, no authentication; anyone who reaches the
    /// port can read and write the LUN.
    #[arg(long, conflicts_with = "tls_cert")]
    pub no_tls: bool,
    /// Seconds a client has to finish the handshake once connected.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub handshake_timeout: u64,
}

/// Checks an export name that names the default socket (`/run/srp-ublk/NAME.sock`): it must stay
/// a file name in that directory.
fn socket_name(name: &str) -> anyhow::Result<&str> {
    if name.is_empty() || name.starts_with('.') || name.contains(['/', '\0']) {
        bail!(
            "--name '{name}' cannot name a socket under {}: use letters, digits, '-', '_' (not \
             starting with '.'), or give the socket with --nbd unix:PATH",
            srp_ublk::session::state::run_dir().display()
        );
    }
    Ok(name)
}

/// The demo backends' TRIM / WRITE_ZEROES chunk.
const DEMO_CHUNK: u32 = 64 << 20;

/// Bytes in `blocks` blocks of `bs`, at most 1 GiB (one command's work), whole blocks.
fn chunk_bytes(blocks: u32, bs: u32) -> u32 {
    let cap = (1u32 << 30) / bs;
    blocks.clamp(1, cap) * bs
}

/// Runs `serve`.
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let listen = match &a.nbd {
        Some(s) => Listen::parse(s)?,
        None => Listen::Unix(
            srp_ublk::session::state::run_dir().join(format!("{}.sock", socket_name(&a.name)?)),
        ),
    };
    let export = match (&a.target, &a.backend) {
        (Some(t), None) => {
            let target = a.session.apply(TargetSpec::parse(t)?);
            let timers = a.timer_args.timers()?;
            let s = Session::open(&target, &a.session.options(Some(&target))?)?;
            let geo = s.lun.geometry();
            let max_io = s.lun.max_io_bytes(target.opts.max_sect);
            let bs = s.lun.capacity.block_len;
            tracing::info!(
                "serving LUN {} ({} {}, {} bytes) over {} SRP channel(s)",
                s.lun.lun,
                s.lun.inquiry.vendor,
                s.lun.inquiry.product,
                s.lun.size(),
                s.channels.len()
            );
            Export {
                name: a.name.clone(),
                size: s.lun.size(),
                min_block: s.lun.capacity.block_len,
                max_io,
                read_only: s.lun.read_only,
                fast_zero: geo.write_same_unmap && s.lun.capacity.lbprz,
                trim: geo.unmap,
                cache: geo.cache,
                max_trim: chunk_bytes(s.lun.max_unmap_blocks(), bs),
                max_zero: chunk_bytes(s.lun.max_write_same_blocks(max_io), bs),
                lba_status: AtomicBool::new(geo.lbpme),
                source: Source::Srp {
                    pool: Arc::new(nbd::Pool::new(s.channels, s.relogin.clone())),
                    geo,
                    depth: s.depth,
                    relogin: s.relogin.clone(),
                    timers,
                },
            }
        }
        (None, Some(b)) => {
            let (kind, size) = parse_spec(b)?;
            tracing::warn!("serving the {b} demo backend: this is not storage");
            let source = match kind {
                DemoKind::Mem => Source::Mem(Arc::new(MemDisk::new(size))),
                DemoKind::Null => Source::Null,
            };
            Export {
                name: a.name.clone(),
                size,
                min_block: 512,
                max_io: 1 << 20,
                read_only: false,
                fast_zero: true,
                trim: true,
                // RAM with a cache's interface, so clients exercise FLUSH and FUA
                cache: WriteCache::LEGACY,
                max_trim: DEMO_CHUNK,
                max_zero: DEMO_CHUNK,
                lba_status: AtomicBool::new(false),
                source,
            }
        }
        _ => bail!("give --target STRING (an SRP target) or --backend null:SIZE|mem:SIZE"),
    };
    let where_ = match &listen {
        Listen::Unix(p) => format!("unix:{}", p.display()),
        Listen::Tcp(a) => format!("tcp:{a}"),
    };
    let name = a.name.clone();
    let tls = match (&listen, &a.tls_cert, &a.tls_key) {
        (Listen::Tcp(_), Some(cert), Some(key)) => Some(
            nbd::server_config(cert, key, a.tls_ca.as_deref())
                .context("loading the TLS certificate")?,
        ),
        (Listen::Unix(_), Some(_), _) => bail!(
            "--tls-cert is for TCP exports (--nbd tcp:ADDRESS:PORT); a unix socket is guarded by \
             its permissions"
        ),
        (Listen::Tcp(addr), None, _) if !a.no_tls => bail!(
            "a TCP export needs TLS: give --tls-cert FILE --tls-key FILE (and --tls-ca FILE to \
             require client certificates), or --no-tls to serve tcp:{addr} unencrypted and \
             unauthenticated"
        ),
        _ => None,
    };
    if let (Listen::Tcp(addr), true) = (&listen, a.no_tls) {
        tracing::warn!("NBD over TCP on {addr} without TLS (--no-tls): anyone who can reach it can read and write the LUN");
    }
    super::daemon::protect_from_reclaim();
    let limits = Limits {
        max_connections: a.max_connections as usize,
        handshake_timeout: std::time::Duration::from_secs(a.handshake_timeout),
    };
    nbd::serve(&listen, Arc::new(export), limits, tls, || {
        println!("serving NBD export '{name}' on {where_}");
        let _ = std::io::stdout().flush();
    })
    .with_context(|| format!("cannot serve on {where_}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_export_name_stays_in_the_socket_directory() {
        assert_eq!(socket_name("lun0").unwrap(), "lun0");
        for bad in ["", "../etc/x", "a/b", ".hidden", "..", "a\0b"] {
            let e = socket_name(bad).unwrap_err().to_string();
            assert!(e.contains("cannot name a socket"), "{bad:?}: {e}");
        }
    }
}
