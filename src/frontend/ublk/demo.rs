//! The demo backends (`null:`, `mem:`) behind a ublk device: the front end measured alone.

use super::queue::QueueError;
use super::{build_ctrl, LiveInfo, QueueStatus, UblkFrontError, UblkOptions};
use crate::backend::MemDisk;
use libublk::io::{
    UblkBatchBuffers, UblkBatchCompletion, UblkBatchConfig, UblkBatchQueue, UblkDev, UblkIOCtx,
    UblkQueue,
};
use libublk::{sys, BufDesc, BufDescList, UblkError, UblkIORes, UblkUringData};
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

/// A demo device's size (bytes), queues and depth, and whether its queues use ublk's batch I/O
/// commands.
pub(super) struct DemoShape {
    pub size: u64,
    pub queues: u16,
    pub depth: u16,
    pub batch: bool,
}

pub(super) fn serve_demo(
    shape: DemoShape,
    disk: Option<Arc<MemDisk>>,
    opts: UblkOptions,
    status: Arc<Vec<QueueStatus>>,
    on_live: impl FnOnce(LiveInfo) + Send + Sync + 'static,
) -> Result<(), UblkFrontError> {
    const MAX_IO: u32 = 512 * 1024;
    let DemoShape {
        size,
        queues,
        depth,
        batch,
    } = shape;
    let flags = if batch {
        u64::from(sys::UBLK_F_BATCH_IO)
    } else {
        0
    };
    let ctrl = build_ctrl("srp-ublk-demo", opts.dev_id, queues, depth, MAX_IO, flags)?;
    let tgt_init = move |dev: &mut UblkDev| {
        dev.set_default_params(size);
        dev.tgt.params = demo_params(size, MAX_IO);
        Ok(())
    };
    let q_fn = move |qid: u16, dev: &UblkDev| {
        if let Some(st) = status.get(usize::from(qid)) {
            st.tid.store(nix::unistd::gettid().as_raw(), Relaxed);
        }
        let run = if batch {
            run_demo_queue_batch
        } else {
            run_demo_queue
        };
        if let Err(e) = run(qid, dev, disk.as_deref(), size) {
            tracing::error!("queue {qid}: {}", crate::Chain(&e));
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

/// One demo command on `buf`, the tag's buffer: its result for ublk (bytes, 0 or -errno).
fn demo_io(iod: &sys::ublksrv_io_desc, buf: &mut [u8], disk: Option<&MemDisk>, size: u64) -> i32 {
    let (off, len) = (iod.start_sector << 9, (iod.nr_sectors << 9) as usize);
    if off + len as u64 > size || len > buf.len() {
        return -libc::EIO;
    }
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
}

/// A demo queue: every command completes at once, from RAM or zeros.
fn run_demo_queue(
    qid: u16,
    dev: &UblkDev,
    disk: Option<&MemDisk>,
    size: u64,
) -> Result<(), QueueError> {
    let q = UblkQueue::new(qid, dev).map_err(QueueError::ublk("creating the queue"))?;
    let mut bufs = dev.alloc_queue_io_bufs();
    let q = q
        .submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs)))
        .map_err(QueueError::ublk("submitting FETCH commands"))?;
    loop {
        let r = q.flush_and_wake_io_tasks(
            |data, cqe, _last| {
                if data & UblkUringData::Target as u64 != 0
                    || cqe.result() != sys::UBLK_IO_RES_OK as i32
                {
                    return;
                }
                let tag = UblkIOCtx::user_data_to_tag(data) as u16;
                let buf = bufs[usize::from(tag)].as_mut_slice();
                let res = demo_io(q.get_iod(tag), buf, disk, size);
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

/// A demo queue on ublk's batch I/O commands (UBLK_F_BATCH_IO): commands arrive in groups from a
/// multishot fetch and their results go back in groups, one io_uring command each way per group
/// instead of one per I/O.
fn run_demo_queue_batch(
    qid: u16,
    dev: &UblkDev,
    disk: Option<&MemDisk>,
    size: u64,
) -> Result<(), QueueError> {
    let q = UblkQueue::new(qid, dev).map_err(QueueError::ublk("creating the queue"))?;
    let bufs = UblkBatchBuffers::IoBufs(dev.alloc_queue_io_bufs());
    let mut batch = UblkBatchQueue::new(&q, bufs, UblkBatchConfig::new())
        .map_err(QueueError::ublk("setting up batch I/O"))?;
    let mut done: Vec<UblkBatchCompletion> = Vec::new();
    loop {
        let mut failed = None;
        let r = q.flush_and_wake_io_tasks(
            |_data, cqe, _last| {
                let handled = batch.handle_cqe(cqe, |batch, tags| {
                    for &tag in tags {
                        let buf = batch.io_buf_mut(tag).ok_or(UblkError::InvalidVal)?;
                        let res = demo_io(q.get_iod(tag), buf.as_mut_slice(), disk, size);
                        done.push(UblkBatchCompletion::new(tag, res));
                    }
                    Ok(())
                });
                if let Err(e) = handled {
                    failed = Some(e);
                }
            },
            1,
        );
        if let Some(e) = failed {
            return Err(QueueError::ublk("handling a batch")(e));
        }
        // all commit slots busy: keep the results for the next pass
        if !done.is_empty()
            && batch
                .try_submit_completions(&done)
                .map_err(QueueError::ublk("committing a batch"))?
        {
            done.clear();
        }
        let stopped = batch
            .try_begin_shutdown()
            .map_err(QueueError::ublk("stopping the batch queue"))?;
        // the queue is down (the device is being deleted) or every fetch buffer is back
        if r.is_err() || (stopped && batch.is_shutdown_complete()) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iod(op: u32, sector: u64, sectors: u32) -> sys::ublksrv_io_desc {
        sys::ublksrv_io_desc {
            op_flags: op,
            nr_sectors: sectors,
            start_sector: sector,
            ..Default::default()
        }
    }

    #[test]
    fn demo_io_serves_ram_and_zeros_and_refuses_what_it_cannot() {
        let disk = MemDisk::new(1 << 20);
        let mut buf = vec![0xabu8; 8192];
        let w = iod(sys::UBLK_IO_OP_WRITE, 8, 8);
        assert_eq!(demo_io(&w, &mut buf, Some(&disk), 1 << 20), 4096);
        let mut back = vec![0u8; 8192];
        let r = iod(sys::UBLK_IO_OP_READ, 8, 8);
        assert_eq!(demo_io(&r, &mut back, Some(&disk), 1 << 20), 4096);
        assert!(
            back[..4096].iter().all(|&b| b == 0xab),
            "mem: reads what was written"
        );
        let mut zeros = vec![0xffu8; 4096];
        assert_eq!(demo_io(&r, &mut zeros, None, 1 << 20), 4096);
        assert!(zeros.iter().all(|&b| b == 0), "null: reads zeros");
        let past_end = iod(sys::UBLK_IO_OP_READ, 2047, 8);
        assert_eq!(
            demo_io(&past_end, &mut back, Some(&disk), 1 << 20),
            -libc::EIO
        );
        let too_big = iod(sys::UBLK_IO_OP_READ, 0, 32);
        assert_eq!(
            demo_io(&too_big, &mut back, None, 1 << 20),
            -libc::EIO,
            "larger than the tag's buffer"
        );
        let zero = iod(sys::UBLK_IO_OP_WRITE_ZEROES, 8, 8);
        assert_eq!(demo_io(&zero, &mut back, Some(&disk), 1 << 20), 0);
        assert_eq!(demo_io(&r, &mut back, Some(&disk), 1 << 20), 4096);
        assert!(back[..4096].iter().all(|&b| b == 0), "write zeroes zeroed");
        assert_eq!(
            demo_io(&iod(0x7f, 0, 1), &mut back, None, 1 << 20),
            -libc::EOPNOTSUPP
        );
    }
}
