//! `srp-ublk serve --vhost-user-blk PATH --target ...`: the LUN as a vhost-user-blk disk for a VMM,
//! in the foreground. One SRP channel per virtqueue (`--queues`); the guest's memory goes to the
//! target as it is, registered with the RDMA device once per memory table.

use super::serve::ServeArgs;
use anyhow::Context;
use srp_ublk::frontend::vhost::{self, Backend, Device};
use srp_ublk::path::Path;
use srp_ublk::rdma::TagBufs;
use srp_ublk::session::exports::ExportState;
use srp_ublk::session::rport::Rport;
use srp_ublk::session::{Session, MAX_IO_BYTES, RELOGIN_STEP};
use srp_ublk::wire::target::TargetSpec;
use std::io::Write;
use std::sync::Arc;

/// Data segments a command may carry: what a 512-byte send slot holds inline is fewer (27), and
/// the channel takes the smaller.
const SEGMENTS: u16 = 32;
/// virtio-blk's GET_ID answer, at most.
const ID_BYTES: usize = 20;
/// The largest DISCARD or WRITE_ZEROES offered, in 512-byte sectors: 1 GiB, one command's work.
const MAX_RANGE: u64 = (1 << 30) / 512;

/// Runs `serve --vhost-user-blk`.
pub fn run(a: &ServeArgs, socket: &std::path::Path) -> anyhow::Result<()> {
    let t = a
        .target
        .as_deref()
        .context("--vhost-user-blk serves an SRP LUN: give --target")?;
    super::logging::name_lines(&format!("vhost-user-blk {}", socket.display()));
    let target = a.session.apply(TargetSpec::parse(t)?);
    let timers = a.timer_args.timers()?;
    let group = a.socket_group()?;
    let mut opts = a.session.options(Some(&target))?;
    opts.max_segments = SEGMENTS;
    let s = Session::open(&target, &opts)?;
    let max_io = s.lun.max_io_bytes(target.opts.max_sect, MAX_IO_BYTES);
    let bs = s.lun.capacity.block_len;
    let mut paths = Vec::new();
    for (q, ch) in s.channels.into_iter().enumerate() {
        let bufs = TagBufs::budgeted(s.depth, max_io);
        let name = format!("vhost-user-blk queue {q}");
        paths.push(Path::new(
            ch,
            s.relogin.clone(),
            bufs,
            Rport::new(timers),
            name,
        )?);
    }
    let seg_max = paths.first().map_or(1, |p| p.max_segments());
    let geo = s.lun.geometry();
    // DISCARD and WRITE_ZEROES where the LUN has UNMAP and WRITE SAME, at most 1 GiB a command
    let sectors = |blocks: u32| (u64::from(blocks) * u64::from(bs) / 512).min(MAX_RANGE) as u32;
    let max_discard = if geo.unmap {
        sectors(s.lun.max_unmap_blocks())
    } else {
        0
    };
    let max_write_zeroes = if geo.write_same {
        sectors(s.lun.max_write_same_blocks(max_io))
    } else {
        0
    };
    let mut serial = s.lun.serial.clone().unwrap_or_default().into_bytes();
    serial.truncate(ID_BYTES);
    let dev = Device {
        size: s.lun.size().into(),
        block_size: bs,
        physical_exp: s.lun.capacity.lbppbe,
        opt_io: s
            .lun
            .limits
            .map_or(0, |l| l.opt_xfer_len.saturating_mul(bs)),
        read_only: s.lun.read_only,
        geo,
        serial,
        max_io,
        seg_max: u32::from(seg_max),
        // a request of seg_max segments fits the queue's own buffers when it must be copied
        size_max: (max_io / u32::from(seg_max) / 4096).max(1) * 4096,
        max_discard,
        max_write_zeroes,
        write_zeroes_may_unmap: geo.write_same_unmap && geo.lbprz,
    };
    tracing::info!(
        "serving LUN {} ({} {}, {} bytes) as vhost-user-blk over {} queue(s): seg_max {}, size_max {}",
        s.lun.lun,
        s.lun.inquiry.vendor,
        s.lun.inquiry.product,
        s.lun.size(),
        paths.len(),
        dev.seg_max,
        dev.size_max
    );
    super::daemon::protect_from_reclaim();
    let relogin = s.relogin.for_lun(s.lun.lun);
    let backend = Arc::new(Backend::new(dev, paths)?);
    let _checks = backend
        .watch_capacity(
            format!("vhost-user-blk {}", socket.display()),
            Box::new(move || relogin.read_capacity(RELOGIN_STEP)),
        )
        .context("starting the capacity checks")?;
    super::exported::check_capacity_on_hup(backend.capacity());
    super::exported::upgrade_on_usr2();
    let status = backend.status();
    let listen = socket.display().to_string();
    let state = ExportState {
        target: target.to_string(),
        lun: s.lun.lun,
        size: s.lun.size(),
        block_size: bs,
        read_only: s.lun.read_only,
        vendor: s.lun.inquiry.vendor.clone(),
        product: s.lun.inquiry.product.clone(),
        wwid: s.lun.wwid.clone(),
        rdma_device: s.rdma_device.clone(),
        depth: s.depth,
        max_connections: 1,
        ..super::exported::base(&a.name, "vhost-user-blk", listen, &status)
    };
    vhost::serve(socket, group, backend, || {
        println!("serving vhost-user-blk on {}", socket.display());
        let _ = std::io::stdout().flush();
        super::exported::publish(state, status);
    })
    .with_context(|| format!("cannot serve vhost-user-blk on {}", socket.display()))
}
