//! The demo backends (`null:`, `mem:`) behind a ublk device: the front end measured alone.

use super::queue::QueueError;
use super::{build_ctrl, LiveInfo, QueueStatus, UblkFrontError, UblkOptions};
use crate::backend::MemDisk;
use libublk::io::{UblkDev, UblkIOCtx, UblkQueue};
use libublk::{sys, BufDesc, BufDescList, UblkIORes, UblkUringData};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

fn demo_params(size: u64, max_io: u32) -> sys::ublk_params {
    sys::ublk_params {
        types: sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD,
        basic: sys::ublk_param_basic {
            logical_bs_shift: 9,
            physical_bs_shift: 12,
            io_opt_shift: 12,
            io_min_shift: 12,
            max_sectors: max_io >> 9,
            dev_sectors: size >> 9,
            ..Default::default()
        },
        discard: sys::ublk_param_discard {
            discard_granularity: 4096,
            max_discard_sectors: u32::MAX >> 9,
            max_write_zeroes_sectors: u32::MAX >> 9,
            max_discard_segments: 1,
            ..Default::default()
        },
        ..Default::default()
    }
}

pub(super) fn serve_demo(
    size: u64,
    disk: Option<Arc<MemDisk>>,
    queues: u16,
    depth: u16,
    opts: UblkOptions,
    status: Arc<Vec<QueueStatus>>,
    on_live: impl FnOnce(LiveInfo) + Send + Sync + 'static,
) -> Result<(), UblkFrontError> {
    const MAX_IO: u32 = 512 * 1024;
    let ctrl = build_ctrl("srp-ublk-demo", opts.dev_id, queues, depth, MAX_IO, 0)?;
    let tgt_init = move |dev: &mut UblkDev| {
        dev.set_default_params(size);
        dev.tgt.params = demo_params(size, MAX_IO);
        Ok(())
    };
    let q_fn = move |qid: u16, dev: &UblkDev| {
        if let Some(st) = status.get(usize::from(qid)) {
            st.tid.store(nix::unistd::gettid().as_raw(), Relaxed);
        }
        if let Err(e) = run_demo_queue(qid, dev, disk.as_deref(), size) {
            tracing::error!("queue {qid}: {e}");
        }
    };
    let res = ctrl.run_target(tgt_init, q_fn, move |c| {
        on_live(LiveInfo {
            dev_id: c.dev_info().dev_id,
            bdev: c.get_bdev_path(),
        });
    });
    let _ = ctrl.del_dev();
    res.map(|_| ()).map_err(|source| UblkFrontError::Ublk {
        what: "running the ublk device",
        source,
    })
}

/// A demo queue: every command completes at once, from RAM or zeros.
fn run_demo_queue(
    qid: u16,
    dev: &UblkDev,
    disk: Option<&MemDisk>,
    size: u64,
) -> Result<(), QueueError> {
    let ublk = |what: &'static str| move |source| QueueError::Ublk { what, source };
    let q = UblkQueue::new(qid, dev).map_err(ublk("creating the queue"))?;
    let mut bufs = dev.alloc_queue_io_bufs();
    let q = q
        .submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs)))
        .map_err(ublk("submitting FETCH commands"))?;
    loop {
        let r = q.flush_and_wake_io_tasks(
            |data, cqe, _last| {
                if data & UblkUringData::Target as u64 != 0
                    || cqe.result() != sys::UBLK_IO_RES_OK as i32
                {
                    return;
                }
                let tag = UblkIOCtx::user_data_to_tag(data) as u16;
                let iod = q.get_iod(tag);
                let (off, len) = (iod.start_sector << 9, (iod.nr_sectors << 9) as usize);
                let buf = bufs[usize::from(tag)].as_mut_slice();
                let res = if off + len as u64 > size || len > buf.len() {
                    -libc::EIO
                } else {
                    match iod.op_flags & 0xff {
                        sys::UBLK_IO_OP_READ => {
                            match disk {
                                Some(d) => d.read(off, &mut buf[..len]),
                                None => buf[..len].fill(0),
                            }
                            len as i32
                        }
                        sys::UBLK_IO_OP_WRITE => {
                            if let Some(d) = disk {
                                d.write(off, &buf[..len]);
                            }
                            len as i32
                        }
                        sys::UBLK_IO_OP_FLUSH => 0,
                        sys::UBLK_IO_OP_DISCARD | sys::UBLK_IO_OP_WRITE_ZEROES => {
                            if let Some(d) = disk {
                                d.zero(off, len);
                            }
                            0
                        }
                        _ => -libc::EOPNOTSUPP,
                    }
                };
                let _ =
                    q.complete_io_cmd_unified(tag, BufDesc::Slice(buf), Ok(UblkIORes::Result(res)));
            },
            1,
        );
        if r.is_err() {
            return Ok(());
        }
    }
}
