//! A vhost-user-blk server over the in-process fake SRP target, its disk a file: the front end's
//! own code (the vhost-user handler, a worker and channel per queue, the guest's buffers lent to
//! the target as they are) without an RDMA device, for a VMM on a host that has none.
//! tests/lab/vm/run.sh boots QEMU on it with QEMU's default vhost-user-blk options and checks the
//! file the guest wrote.
//!
//! `vhost_fake SOCKET FILE QUEUES` serves until it is killed; `SRP_UBLK_LOG` sets the log filter
//! (default `info`).

use anyhow::{bail, Context};
use srp_ublk::channel::block::{Geometry, WriteCache};
use srp_ublk::channel::fake::FakeTarget;
use srp_ublk::channel::{send_slots, Channel, ChannelConfig};
use srp_ublk::frontend::vhost::{self, Backend, Device};
use srp_ublk::path::fake::FakeRelogin;
use srp_ublk::path::Path;
use srp_ublk::rdma::TagBufs;
use srp_ublk::session::rport::Rport;
use srp_ublk::session::timers::Timers;
use std::io::Write;
use std::sync::Arc;

/// Commands per queue.
const DEPTH: u16 = 32;
/// The largest request the queues' own buffers take (the copied ones).
const MAX_IO: u32 = 128 << 10;
/// Data segments a command may carry, as `serve --vhost-user-blk` asks of a target.
const SEGMENTS: u16 = 32;

fn main() -> anyhow::Result<()> {
    let filter = std::env::var("SRP_UBLK_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [sock, file, queues] = &args[..] else {
        bail!("usage: vhost_fake SOCKET FILE QUEUES");
    };
    let queues: u16 = queues.parse().context("QUEUES: a number")?;
    let disk = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .with_context(|| format!("opening {file}"))?;
    let size = disk.metadata()?.len();
    let mut paths = Vec::new();
    for q in 0..queues {
        let mut t = FakeTarget::new(0, 512, send_slots(DEPTH, 4), DEPTH + 8)
            .with_fds()
            .with_file(disk.try_clone()?);
        t.max_segs = SEGMENTS;
        let ch = Channel::new(t, ChannelConfig::fake(DEPTH));
        let bufs = TagBufs::new(DEPTH, MAX_IO);
        let rport = Rport::new(Timers::default());
        paths.push(Path::new(
            ch,
            FakeRelogin,
            bufs,
            rport,
            format!("queue {q}"),
        )?);
    }
    let seg_max = paths.first().map_or(1, |p| p.max_segments());
    let geo = Geometry {
        block_shift: 9,
        blocks: size / 512,
        unmap: true,
        write_same_unmap: false,
        // a write cache: the guest's FLUSHes become SYNCHRONIZE CACHE
        cache: WriteCache {
            enabled: true,
            dpofua: false,
        },
        lbpme: false,
        lbprz: false,
        write_same: true,
    };
    let dev = Device {
        size: size.into(),
        block_size: 512,
        physical_exp: 0,
        opt_io: 0,
        read_only: false,
        geo,
        serial: b"SRPFAKE0001".to_vec(),
        max_io: MAX_IO,
        seg_max: u32::from(seg_max),
        size_max: (MAX_IO / u32::from(seg_max) / 4096).max(1) * 4096,
        max_discard: 2048,
        max_write_zeroes: 2048,
        write_zeroes_may_unmap: false,
    };
    let backend = Arc::new(Backend::new(dev, paths)?);
    vhost::serve(std::path::Path::new(sock), None, backend, || {
        println!("serving vhost-user-blk on {sock}: {file}, {size} bytes, {queues} queue(s)");
        let _ = std::io::stdout().flush();
    })?;
    Ok(())
}
