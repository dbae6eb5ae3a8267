//! `srp-ublk serve --nbd ...`: serve a target's LUN (or a demo backend) as an NBD export, in the
//! foreground (run it under systemd, or with `&`). One SRP channel per concurrent connection.

use anyhow::{bail, Context};
use clap::{Args, Parser};
use srp_ublk::backend::{parse_spec, DemoKind, MemDisk};
use srp_ublk::channel::block::Geometry;
use srp_ublk::channel::block::WriteCache;
use srp_ublk::frontend::nbd::{self, Export, Limits, Listen, Source};
use srp_ublk::frontend::status::ExportStatus;
use srp_ublk::rdma::verbs_device_present;
use srp_ublk::session::exports::ExportState;
use srp_ublk::session::state::LunIdentity;
use srp_ublk::session::{detached_channels, Relogin, Session, SrpChannel, MAX_IO_BYTES};
use srp_ublk::wire::target::TargetSpec;
use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// `srp-ublk serve ...`
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where to listen: unix:PATH (default unix:/run/srp-ublk/NAME.sock, created 0600) or
    /// tcp:ADDRESS:PORT (with --tls-cert, or --no-tls).
    #[arg(long)]
    pub nbd: Option<String>,
    /// Serve the LUN as a vhost-user-blk disk on this unix socket instead of NBD: a VMM connects
    /// to it (QEMU's vhost-user-blk-pci with the guest's memory shared) and the target reads and
    /// writes the guest's memory directly.
    #[arg(
        long,
        value_name = "PATH",
        conflicts_with_all = ["nbd", "backend", "tls_cert", "no_tls"],
        requires = "target"
    )]
    pub vhost_user_blk: Option<std::path::PathBuf>,
    /// The SRP target (an ib_srp add_target string).
    #[arg(
        long,
        short = 't',
        conflicts_with = "backend",
        required_unless_present_any = ["backend", "config"]
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
    /// Let this group (a name or number) connect to the unix socket too: the socket is then
    /// 0660 and the group's from the start (libvirt's QEMU: libvirt-qemu on Debian, qemu on
    /// RHEL). Default: root only (0600).
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// Serve the export an export file describes: NAME (/etc/srp-ublk/exports.d/NAME.conf) or a
    /// path; `key = value` lines with this command's option names, `no-tls = yes` for the flag
    /// (srp-ublk-serve@NAME.service runs this).
    #[arg(
        long,
        value_name = "NAME|FILE",
        conflicts_with_all = ["target", "backend", "nbd", "vhost_user_blk"]
    )]
    pub config: Option<String>,
}

/// The options an export file may set (`serve`'s long options).
const EXPORT_KEYS: super::conf::Keys = super::conf::Keys {
    values: &[
        "name",
        "target",
        "lun",
        "queues",
        "depth",
        "timeout",
        "rkey-scope",
        "nbd",
        "vhost-user-blk",
        "socket-group",
        "max-connections",
        "handshake-timeout",
        "tls-cert",
        "tls-key",
        "tls-ca",
        "reconnect-delay",
        "fast-io-fail-tmo",
        "dev-loss-tmo",
    ],
    flags: &["no-tls"],
    required: "target",
};

/// The `serve` an export file describes; its name is the file's (exports.d/NAME.conf) unless it
/// says `name = ...`.
fn read_export(config: &str) -> anyhow::Result<ServeArgs> {
    let file = if config.contains('/') {
        std::path::PathBuf::from(config)
    } else {
        super::conf::exports_dir().join(format!("{config}.conf"))
    };
    let text = std::fs::read_to_string(&file).with_context(|| {
        super::status::not_found(format!("cannot read export file {}", file.display()))
    })?;
    let mut argv = super::conf::argv(&text, &file, &EXPORT_KEYS)?;
    if !argv.iter().any(|a| a == "--name") {
        let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned());
        argv.extend(["--name".to_string(), stem.unwrap_or_default()]);
    }
    let cli = super::Cli::try_parse_from(
        ["srp-ublk", "serve"]
            .into_iter()
            .map(String::from)
            .chain(argv),
    )
    .map_err(|e| {
        super::status::failed(
            super::status::Exit::Usage,
            format!("{}: {e}", file.display()),
        )
    })?;
    match cli.command {
        super::Command::Serve(a) => Ok(a),
        _ => unreachable!("parsed as serve"),
    }
}

impl ServeArgs {
    /// `--socket-group` as a group id: a name this host knows, or a number.
    pub fn socket_group(&self) -> anyhow::Result<Option<u32>> {
        let Some(g) = &self.socket_group else {
            return Ok(None);
        };
        if let Ok(gid) = g.parse::<u32>() {
            return Ok(Some(gid));
        }
        match nix::unistd::Group::from_name(g) {
            Ok(Some(group)) => Ok(Some(group.gid.as_raw())),
            Ok(None) => {
                bail!("--socket-group {g}: no such group on this host (see `getent group`)")
            }
            Err(e) => Err(anyhow::Error::new(e).context(format!("looking up group {g}"))),
        }
    }
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

/// What a server hands the image that replaces it when its RDMA device goes away
/// ([`watch_device`]): the export as it was served, so that the new image serves it at once and
/// its channels log in when the device is back (to this LUN only).
#[derive(serde::Serialize, serde::Deserialize)]
struct NbdHandover {
    max_io: u32,
    read_only: bool,
    geo: Geometry,
    max_trim: u32,
    max_zero: u32,
    depth: u16,
    channels: u16,
    lun: u64,
    rdma_device: String,
    identity: LunIdentity,
    #[serde(default)]
    vendor: String,
    #[serde(default)]
    product: String,
}

/// The environment variable that carries an [`NbdHandover`] (JSON) to the new image.
const HANDOVER_ENV: &str = "SRP_UBLK_NBD_HANDOVER";

/// A session opened on the target: its channels and what the export is.
fn opened(
    a: &ServeArgs,
    target: &TargetSpec,
) -> anyhow::Result<(NbdHandover, Vec<SrpChannel>, Relogin)> {
    let s = Session::open(target, &a.session.options(Some(target))?)?;
    // NBD clients send what they were built to send whatever maximum the server advertises
    // (nbdcopy 1.14: 256 KiB requests), so a connection's channel keeps srp-ublk's full size
    let max_io = s.lun.max_io_bytes(target.opts.max_sect, MAX_IO_BYTES);
    let bs = s.lun.capacity.block_len;
    tracing::info!(
        "serving LUN {} ({} {}, {} bytes) over {} SRP channel(s)",
        s.lun.lun,
        s.lun.inquiry.vendor,
        s.lun.inquiry.product,
        s.lun.size(),
        s.channels.len()
    );
    let h = NbdHandover {
        max_io,
        read_only: s.lun.read_only,
        geo: s.lun.geometry(),
        max_trim: chunk_bytes(s.lun.max_unmap_blocks(), bs),
        max_zero: chunk_bytes(s.lun.max_write_same_blocks(max_io), bs),
        depth: s.depth,
        channels: s.channels.len() as u16,
        lun: s.lun.lun,
        rdma_device: s.rdma_device.clone(),
        identity: s.lun.identity(),
        vendor: s.lun.inquiry.vendor.clone(),
        product: s.lun.inquiry.product.clone(),
    };
    Ok((h, s.channels, s.relogin))
}

/// The export a replaced image served ([`HANDOVER_ENV`]), on channels that log in once the RDMA
/// device is back.
fn taken_over(
    a: &ServeArgs,
    target: &TargetSpec,
    json: &str,
) -> anyhow::Result<(NbdHandover, Vec<SrpChannel>, Relogin)> {
    std::env::remove_var(HANDOVER_ENV);
    let h: NbdHandover = serde_json::from_str(json).with_context(|| {
        format!("{HANDOVER_ENV} does not describe an export (set by srp-ublk only)")
    })?;
    let channels = detached_channels(&h.rdma_device, h.channels, h.depth, h.lun, h.depth);
    let timeout = std::time::Duration::from_secs(a.session.timeout);
    let relogin =
        Relogin::new(target, h.lun, h.depth, timeout).expecting(h.lun, h.identity.clone());
    tracing::warn!(
        "serving LUN {} again after RDMA device {} went away: {} channel(s) log in as it comes back",
        h.lun,
        h.rdma_device,
        h.channels
    );
    Ok((h, channels, relogin))
}

/// Watches the RDMA device under the export: once it goes away, replaces this process's image
/// (execve: same pid, every descriptor closed) with one that serves the same export. librdmacm
/// keeps a handle on every device it has used until the process image ends, and the kernel finishes
/// a removal (`rdma link delete`, a driver unloaded) only then: a server that kept running would
/// hold the removal up for as long as it runs. Clients see their connection close (QEMU's
/// `reconnect-delay` reconnects and sends again what was not answered); the socket is bound again
/// at once and the export serves as soon as the device is back.
fn watch_device(h: NbdHandover) {
    let spawned = std::thread::Builder::new()
        .name("rdma-watch".into())
        .spawn(move || {
            let mut present = verbs_device_present(&h.rdma_device);
            loop {
                std::thread::sleep(std::time::Duration::from_millis(250));
                let now = verbs_device_present(&h.rdma_device);
                if present && !now {
                    hand_over(&h);
                }
                present = now;
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(
            "no thread to watch RDMA device removal ({e}): a removal waits for this server to end"
        );
    }
}

/// Replaces the image (see [`watch_device`]); returns only if that failed.
fn hand_over(h: &NbdHandover) {
    use std::os::unix::process::CommandExt;
    tracing::warn!(
        "RDMA device {} is being removed: serving the export from a new image of this process \
         (same pid) so that the removal can finish; clients reconnect",
        h.rdma_device
    );
    let json = match serde_json::to_string(h) {
        Ok(j) => j,
        Err(e) => return tracing::error!("cannot hand the export over: {e}"),
    };
    let err = std::process::Command::new("/proc/self/exe")
        .args(std::env::args_os().skip(1))
        .env(HANDOVER_ENV, json)
        .exec();
    tracing::error!(
        "cannot re-execute /proc/self/exe ({err}): the RDMA device's removal waits until this \
         server is stopped"
    );
}

/// Runs `serve`.
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    if let Some(config) = &a.config {
        return run(read_export(config)?);
    }
    super::exported::stop_removes_state()?;
    if let Some(socket) = &a.vhost_user_blk {
        return super::vhost::run(&a, socket);
    }
    super::logging::name_lines(&format!("export {}", a.name));
    let listen = match &a.nbd {
        Some(s) => Listen::parse(s)?,
        None => Listen::Unix(
            srp_ublk::session::state::run_dir().join(format!("{}.sock", socket_name(&a.name)?)),
        ),
    };
    // flags first: a TLS or socket mistake is reported before the login, not after it
    let tls = tls_config(&listen, &a)?;
    if let (Listen::Tcp(_), Some(_)) = (&listen, &a.socket_group) {
        bail!("--socket-group is for a unix socket; a TCP export is guarded by TLS (--tls-ca)");
    }
    let socket_group = a.socket_group()?;
    let where_ = match &listen {
        Listen::Unix(p) => format!("unix:{}", p.display()),
        Listen::Tcp(a) => format!("tcp:{a}"),
    };
    let (export, mut state) = match (&a.target, &a.backend) {
        (Some(t), None) => srp_export(&a, t, &where_)?,
        (None, Some(b)) => demo_export(&a, b, &where_)?,
        _ => bail!("give --target STRING (an SRP target) or --backend null:SIZE|mem:SIZE"),
    };
    state.max_connections = a.max_connections;
    let status = export.status.clone();
    let name = a.name.clone();
    super::daemon::protect_from_reclaim();
    let limits = Limits {
        max_connections: a.max_connections as usize,
        handshake_timeout: std::time::Duration::from_secs(a.handshake_timeout),
        socket_group,
    };
    nbd::serve(&listen, Arc::new(export), limits, tls, || {
        println!("serving NBD export '{name}' on {where_}");
        let _ = std::io::stdout().flush();
        super::exported::publish(state, status);
    })
    .with_context(|| format!("cannot serve on {where_}"))
}

/// An export of the SRP LUN `t` names, taken over from a previous image or logged in afresh, and
/// its state file's view, listening on `listen`.
fn srp_export(a: &ServeArgs, t: &str, listen: &str) -> anyhow::Result<(Export, ExportState)> {
    let target = a.session.apply(TargetSpec::parse(t)?);
    let timers = a.timer_args.timers()?;
    let (h, channels, relogin) = match std::env::var(HANDOVER_ENV) {
        Ok(json) => taken_over(a, &target, &json)?,
        Err(_) => opened(a, &target)?,
    };
    let status = Arc::new(ExportStatus::new(channels.len()));
    let state = ExportState {
        target: target.to_string(),
        lun: h.lun,
        size: h.identity.size,
        block_size: h.identity.block_size,
        read_only: h.read_only,
        vendor: h.vendor.clone(),
        product: h.product.clone(),
        wwid: h.identity.wwid.clone(),
        rdma_device: h.rdma_device.clone(),
        depth: h.depth,
        ..super::exported::base(&a.name, "nbd", listen.to_string(), &status)
    };
    let export = Export {
        name: a.name.clone(),
        size: h.identity.size,
        min_block: h.identity.block_size,
        max_io: h.max_io,
        read_only: h.read_only,
        fast_zero: h.geo.write_same_unmap && h.geo.lbprz,
        trim: h.geo.unmap,
        cache: h.geo.cache,
        max_trim: h.max_trim,
        max_zero: h.max_zero,
        lba_status: AtomicBool::new(h.geo.lbpme),
        write_same: AtomicBool::new(h.geo.write_same),
        source: Source::Srp {
            pool: Arc::new(nbd::Pool::new(channels, relogin.clone())),
            geo: h.geo,
            depth: h.depth,
            relogin,
            timers,
        },
        status,
    };
    watch_device(h);
    Ok((export, state))
}

/// An export of a demo backend (`null:SIZE`, `mem:SIZE`), and its state file's view.
fn demo_export(a: &ServeArgs, b: &str, listen: &str) -> anyhow::Result<(Export, ExportState)> {
    let (kind, size) = parse_spec(b)?;
    tracing::warn!("serving the {b} demo backend: this is not storage");
    let source = match kind {
        DemoKind::Mem => Source::Mem(Arc::new(MemDisk::new(size))),
        DemoKind::Null => Source::Null,
    };
    let status = Arc::new(ExportStatus::new(0));
    let state = ExportState {
        target: format!("backend {b} (demo, not storage)"),
        size,
        block_size: 512,
        vendor: "srp-ublk".into(),
        product: format!("demo {b}"),
        ..super::exported::base(&a.name, "nbd", listen.to_string(), &status)
    };
    let export = Export {
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
        write_same: AtomicBool::new(true),
        source,
        status,
    };
    Ok((export, state))
}

/// The TLS setup a listener needs: required for TCP unless `--no-tls` (which is warned about),
/// refused for a unix socket.
type TlsConfig = Option<Arc<rustls::ServerConfig>>;

fn tls_config(listen: &Listen, a: &ServeArgs) -> anyhow::Result<TlsConfig> {
    let tls = match (listen, &a.tls_cert, &a.tls_key) {
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
    if let (Listen::Tcp(addr), true) = (listen, a.no_tls) {
        tracing::warn!("NBD over TCP on {addr} without TLS (--no-tls): anyone who can reach it can read and write the LUN");
    }
    Ok(tls)
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

    #[test]
    fn the_packaged_export_example_serves_and_each_commented_key_is_known() {
        let text = include_str!("../../packaging/example-export.conf");
        let dir = std::env::temp_dir().join(format!("srp-ublk-export-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("vm7.conf");
        std::fs::write(&file, text).unwrap();
        let a = read_export(file.to_str().unwrap()).unwrap();
        assert_eq!(a.name, "vm7", "the export is named after its file");
        assert!(a
            .target
            .as_deref()
            .is_some_and(|t| t.contains("dest=192.0.2.10:5555")));
        for line in text.lines().filter_map(|l| l.strip_prefix('#')) {
            if line.contains(" = ") && !line.starts_with(' ') {
                let one = format!("target = t\n{line}\n");
                super::super::conf::argv(&one, &file, &EXPORT_KEYS)
                    .unwrap_or_else(|e| panic!("{line}: {e}"));
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
