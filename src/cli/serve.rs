//! `srp-ublk serve --nbd ...`: serve a target's LUN (or a demo backend) as an NBD export, in the
//! foreground (run it under systemd, or with `&`). One SRP channel per concurrent connection.

use anyhow::{bail, Context};
use clap::Args;
use srp_ublk::backend::{parse_spec, DemoKind, MemDisk};
use srp_ublk::frontend::nbd::{self, Export, Listen, Source};
use srp_ublk::session::Session;
use srp_ublk::wire::target::TargetSpec;
use std::io::Write;
use std::sync::{Arc, Mutex};

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
}

/// Runs `serve`.
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let listen = match &a.nbd {
        Some(s) => Listen::parse(s).map_err(anyhow::Error::msg)?,
        None => Listen::Unix(srp_ublk::session::state::run_dir().join(format!("{}.sock", a.name))),
    };
    let export = match (&a.target, &a.backend) {
        (Some(t), None) => {
            let target = TargetSpec::parse(t)?;
            let timers = a.timer_args.timers()?;
            let s = Session::open(&target, &a.session.options(Some(&target))?)?;
            let geo = s.lun.geometry();
            let max_io = s.lun.max_io_bytes(target.opts.max_sect);
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
                source: Source::Srp {
                    pool: Arc::new(Mutex::new(s.channels)),
                    geo,
                    depth: s.depth,
                    relogin: s.relogin.clone(),
                    timers,
                },
            }
        }
        (None, Some(b)) => {
            let (kind, size) = parse_spec(b).map_err(anyhow::Error::msg)?;
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
    nbd::serve(&listen, Arc::new(export), || {
        println!("serving NBD export '{name}' on {where_}");
        let _ = std::io::stdout().flush();
    })
    .with_context(|| format!("cannot serve on {where_}"))
}
