//! A thread's io_uring for ublk: the I/O commands of any number of device queues (each on the
//! ring's own descriptor of its device's char device) and the loop's own operations (polls, a
//! timer).
//!
//! The char devices are plain descriptors, not fixed files: a fixed file taken out of the table
//! is let go only once every command issued while it was in has completed, and the other
//! devices' FETCH commands wait for requests indefinitely, so a device stopped while the others
//! serve would never be released (its DEL_DEV would wait for ever).

use super::descs::{Descs, Iod};
use super::UblkIoError;
use crate::rdma::Lent;
use io_uring::{opcode, squeue, types, IoUring};
use libublk::sys;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A device queue on a [`Ring`]: the index its commands carry in their user data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dev(u16);

impl Dev {
    /// Its index on the ring: 0 up to the number of devices the ring was made for.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    /// The device of index `i`, for tests of what keys on devices.
    #[cfg(test)]
    pub(crate) fn from_index(i: u16) -> Dev {
        Dev(i)
    }
}

/// The device queue a ring serves: its char device, queue index and depth, and the device's
/// flags (`dev_info.flags`: how its commands are encoded).
#[derive(Clone, Copy, Debug)]
pub struct QueueSpec {
    /// `/dev/ublkcN`, open; the ring keeps a descriptor of its own for it.
    pub fd: RawFd,
    /// The queue index.
    pub qid: u16,
    /// The queue's depth (its tags).
    pub depth: u16,
    /// The device's `UBLK_F_*` flags.
    pub flags: u64,
}

/// What a completion of the ring says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cqe {
    /// A request to serve (its descriptor is [`Ring::iod`]); with NEED_GET_DATA, a write's comes
    /// once its data is in the span [`Ring::get_data`] named.
    Request {
        /// The device queue.
        dev: Dev,
        /// The request's tag.
        tag: u16,
    },
    /// A write of a NEED_GET_DATA device whose data the driver has not copied yet.
    NeedsData {
        /// The device queue.
        dev: Dev,
        /// The request's tag.
        tag: u16,
    },
    /// The command ended without a request: the device is stopping (`UBLK_IO_RES_ABORT`), or the
    /// driver refused the command.
    Ended {
        /// The device queue.
        dev: Dev,
        /// The command's tag.
        tag: u16,
        /// The driver's result: a negative errno.
        res: i32,
    },
    /// One of the loop's own operations.
    Own {
        /// The operation it was submitted as.
        op: u8,
        /// The argument it was submitted with.
        arg: u16,
        /// Its result.
        res: i32,
    },
}

/// User data: bit 63 marks the loop's own operations (op in bits 16..24, arg in 0..16); a ublk
/// command has its device in bits 16..32, its tag in 0..16, and bit 32 set for NEED_GET_DATA.
const OWN: u64 = 1 << 63;
const GET_DATA: u64 = 1 << 32;

fn own_data(op: u8, arg: u16) -> u64 {
    OWN | u64::from(op) << 16 | u64::from(arg)
}

fn cmd_data(dev: Dev, tag: u16, get_data: bool) -> u64 {
    let kind = if get_data { GET_DATA } else { 0 };
    kind | u64::from(dev.0) << 16 | u64::from(tag)
}

/// One device queue's state on the ring.
struct DevQueue {
    /// The ring's own descriptor of the device's char device, which its commands name.
    file: OwnedFd,
    descs: Descs,
    qid: u16,
    depth: u16,
    /// Commands are ioctl-encoded (`UBLK_F_CMD_IOCTL_ENCODE`), or the legacy plain numbers.
    ioctl: bool,
    /// The memory the driver may copy requests' data into and out of, start and end sorted.
    spans: Vec<(u64, u64)>,
    /// Keeps that memory while the driver may use it (as long as the ring).
    _mem: Lent,
    /// Commands the driver holds.
    inflight: u32,
    /// The driver aborted a command: the device is stopping and gets no more.
    stopping: bool,
}

impl DevQueue {
    /// Whether `len` bytes at `addr` lie inside the lent memory.
    fn lent(&self, addr: u64, len: u32) -> bool {
        let i = self.spans.partition_point(|&(start, _)| start <= addr);
        i > 0
            && addr
                .checked_add(u64::from(len))
                .is_some_and(|end| end <= self.spans[i - 1].1)
    }
}

/// A thread's ublk ring: see the module documentation.
pub struct Ring {
    ring: IoUring,
    queues: Vec<Option<DevQueue>>,
    /// The timer's duration, read by the kernel as it takes the Timeout SQE (boxed: the SQE
    /// points at it while the ring may move).
    tick: Box<types::Timespec>,
}

impl Ring {
    /// A ring of `sq` submission and `cq` completion entries for up to `devices` device queues.
    /// With cooperative task running, ublk's new requests and the polls' completions become
    /// visible only after the thread enters the kernel; the task-run flag says when such work is
    /// waiting ([`Ring::needs_enter`]), so a loop spinning on something else needs no system call
    /// per pass.
    pub fn new(sq: u32, cq: u32, devices: u16) -> Result<Ring, UblkIoError> {
        let ring = IoUring::builder()
            .setup_cqsize(cq)
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(sq)
            .map_err(|source| UblkIoError::Ring {
                what: "creating the queue's io_uring",
                source,
            })?;
        Ok(Ring {
            ring,
            queues: (0..devices).map(|_| None).collect(),
            tick: Box::new(types::Timespec::new()),
        })
    }

    /// Serves queue `spec` on this ring, its data in `mem` (whatever the driver copies requests'
    /// data into or out of lies there): maps its descriptors and keeps a descriptor of its char
    /// device. The FETCH commands are the caller's ([`Ring::fetch`]).
    pub fn add_queue(&mut self, spec: &QueueSpec, mem: Lent) -> Result<Dev, UblkIoError> {
        let slot = self
            .queues
            .iter()
            .position(Option::is_none)
            .ok_or(UblkIoError::Full {
                devices: self.queues.len(),
            })?;
        let descs = Descs::map(spec.fd, spec.qid, spec.depth)?;
        let raw =
            nix::fcntl::fcntl(spec.fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(0)).map_err(|e| {
                UblkIoError::Ring {
                    what: "taking a descriptor of the device for the io_uring",
                    source: e.into(),
                }
            })?;
        // SAFETY: `raw` is the descriptor F_DUPFD_CLOEXEC just made; nothing else owns it.
        let file = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut spans: Vec<(u64, u64)> = mem
            .regions()
            .map(|(a, l)| (a, a.saturating_add(l as u64)))
            .collect();
        spans.sort_unstable();
        self.queues[slot] = Some(DevQueue {
            file,
            descs,
            qid: spec.qid,
            depth: spec.depth,
            ioctl: spec.flags & u64::from(sys::UBLK_F_CMD_IOCTL_ENCODE) != 0,
            spans,
            _mem: mem,
            inflight: 0,
            stopping: false,
        });
        Ok(Dev(slot as u16))
    }

    /// Tag `tag`'s request as the driver described it.
    pub fn iod(&self, dev: Dev, tag: u16) -> Option<Iod> {
        self.queue(dev).ok()?.descs.get(tag)
    }

    /// FETCH for `tag`: the driver hands the tag's next request over, copying a write's data to
    /// `data` first (None: nothing, with NEED_GET_DATA).
    pub fn fetch(
        &mut self,
        dev: Dev,
        tag: u16,
        data: Option<(u64, u32)>,
    ) -> Result<(), UblkIoError> {
        self.ublk_cmd(dev, tag, sys::UBLK_U_IO_FETCH_REQ, 0, data, false)
    }

    /// COMMIT_AND_FETCH for `tag`: completes its request with `res` (bytes done or a negative
    /// errno), copying a read's data from `data` first, and fetches the next one into `data`.
    pub fn commit(
        &mut self,
        dev: Dev,
        tag: u16,
        res: i32,
        data: Option<(u64, u32)>,
    ) -> Result<(), UblkIoError> {
        self.ublk_cmd(
            dev,
            tag,
            sys::UBLK_U_IO_COMMIT_AND_FETCH_REQ,
            res,
            data,
            false,
        )
    }

    /// NEED_GET_DATA for `tag`: the driver copies the write's data to `data` and hands the
    /// request over ([`Cqe::Request`]).
    pub fn get_data(&mut self, dev: Dev, tag: u16, data: (u64, u32)) -> Result<(), UblkIoError> {
        self.ublk_cmd(dev, tag, sys::UBLK_U_IO_NEED_GET_DATA, 0, Some(data), true)
    }

    /// Lets go of device queue `dev`, which has stopped ([`Ring::is_done`]: none of its
    /// commands is out): its descriptor of the char device is closed and its request
    /// descriptors unmapped, so the ring holds nothing that keeps the device from being deleted.
    /// Its index may serve another device later.
    pub fn remove_queue(&mut self, dev: Dev) -> Result<(), UblkIoError> {
        if !self.is_done(dev) {
            return Err(UblkIoError::Busy { dev: dev.0 });
        }
        self.queues[usize::from(dev.0)] = None;
        Ok(())
    }

    /// Whether the device stopped: the driver aborted its commands and holds none.
    pub fn is_done(&self, dev: Dev) -> bool {
        self.queue(dev).is_ok_and(|q| q.stopping && q.inflight == 0)
    }

    fn queue(&self, dev: Dev) -> Result<&DevQueue, UblkIoError> {
        let q = self.queues.get(usize::from(dev.0)).and_then(Option::as_ref);
        q.ok_or(UblkIoError::NoDevice { dev: dev.0 })
    }

    /// Queues one ublk command (nothing once the device is stopping: the driver takes no more).
    fn ublk_cmd(
        &mut self,
        dev: Dev,
        tag: u16,
        op: u32,
        res: i32,
        data: Option<(u64, u32)>,
        get_data: bool,
    ) -> Result<(), UblkIoError> {
        let q = self
            .queues
            .get_mut(usize::from(dev.0))
            .and_then(Option::as_mut)
            .ok_or(UblkIoError::NoDevice { dev: dev.0 })?;
        if tag >= q.depth {
            return Err(UblkIoError::NoTag {
                tag,
                depth: q.depth,
            });
        }
        let addr = match data {
            Some((addr, len)) if !q.lent(addr, len) => {
                return Err(UblkIoError::NotLent { tag, addr, len })
            }
            Some((addr, _)) => addr,
            None => 0,
        };
        if q.stopping {
            return Ok(());
        }
        // struct ublksrv_io_cmd: q_id, tag, result, addr
        let mut cmd = [0u8; 16];
        cmd[0..2].copy_from_slice(&q.qid.to_ne_bytes());
        cmd[2..4].copy_from_slice(&tag.to_ne_bytes());
        cmd[4..8].copy_from_slice(&res.to_ne_bytes());
        cmd[8..16].copy_from_slice(&addr.to_ne_bytes());
        let op = if q.ioctl { op } else { op & 0xff };
        q.inflight += 1;
        let sqe = opcode::UringCmd16::new(types::Fd(q.file.as_raw_fd()), op)
            .cmd(cmd)
            .build()
            .user_data(cmd_data(dev, tag, get_data));
        // the data address was checked against the lent memory, which the ring keeps
        self.push(sqe);
        Ok(())
    }

    /// A poll for input on `fd`, completing as [`Cqe::Own`] with `op` and `arg`.
    pub fn poll_add(&mut self, fd: RawFd, op: u8, arg: u16) {
        let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(own_data(op, arg));
        self.push(sqe);
    }

    /// Cancels the operation submitted with `op` and `arg`; the cancel completes as `cancel_op`.
    pub fn cancel(&mut self, op: u8, arg: u16, cancel_op: u8) {
        let sqe = opcode::AsyncCancel::new(own_data(op, arg))
            .build()
            .user_data(own_data(cancel_op, arg));
        self.push(sqe);
    }

    /// A timer completing as `op` after `after`.
    pub fn timeout(&mut self, after: Duration, op: u8) {
        *self.tick = after.into();
        let sqe = opcode::Timeout::new(&*self.tick)
            .build()
            .user_data(own_data(op, 0));
        self.push(sqe);
    }

    /// Adds `sqe` to the submission queue, submitting what is there first when it is full.
    fn push(&mut self, sqe: squeue::Entry) {
        loop {
            // SAFETY: every pointer an SQE of this ring carries stays valid until the kernel has
            // taken it: a ublk command's data address lies in memory the ring keeps lent (checked
            // in `ublk_cmd`), a timer's duration is the ring's boxed `tick`, and polls and
            // cancels carry no pointer.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return;
            }
            if self.ring.submit().is_err() {
                std::thread::yield_now();
            }
        }
    }

    /// Submits what is queued and waits for `want` completions. An interrupted or busy wait
    /// (a signal, a full completion queue) is not an error: the caller reaps and comes back.
    pub fn enter(&mut self, want: usize) -> Result<(), UblkIoError> {
        match self.ring.submit_and_wait(want) {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                ) =>
            {
                Ok(())
            }
            Err(source) => Err(UblkIoError::Ring {
                what: "waiting on the io_uring",
                source,
            }),
        }
    }

    /// The next completion, if any.
    pub fn reap(&mut self) -> Option<Cqe> {
        let cqe = self.ring.completion().next()?;
        let (data, res) = (cqe.user_data(), cqe.result());
        if data & OWN != 0 {
            return Some(Cqe::Own {
                op: (data >> 16) as u8,
                arg: data as u16,
                res,
            });
        }
        let (dev, tag) = (Dev((data >> 16) as u16), data as u16);
        if let Some(q) = self
            .queues
            .get_mut(usize::from(dev.0))
            .and_then(Option::as_mut)
        {
            q.inflight = q.inflight.saturating_sub(1);
            q.stopping |= res == sys::UBLK_IO_RES_ABORT;
        }
        Some(match res {
            0 => Cqe::Request { dev, tag },
            1 if data & GET_DATA == 0 => Cqe::NeedsData { dev, tag },
            res => Cqe::Ended { dev, tag, res },
        })
    }

    /// Whether the ring has SQEs to submit, CQEs to reap or task work the kernel runs on the
    /// next enter.
    pub fn needs_enter(&mut self) -> bool {
        let mut sq = self.ring.submission();
        sq.sync();
        if !sq.is_empty() || sq.taskrun() || sq.cq_overflow() {
            return true;
        }
        drop(sq);
        !self.ring.completion().is_empty()
    }

    /// Whether the kernel took every SQE pushed so far.
    pub fn sq_drained(&mut self) -> bool {
        let mut sq = self.ring.submission();
        sq.sync();
        sq.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::TagBufs;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// A file standing in for a ublk char device: its first page holds queue 0's descriptors
    /// (tag 1: a 4 KiB WRITE at sector 8), and commands on it end with the file's refusal.
    fn fake_cdev() -> std::fs::File {
        let mut f = tempfile_in_tmp();
        let mut page = vec![0u8; 4096];
        page[24..28].copy_from_slice(&sys::UBLK_IO_OP_WRITE.to_ne_bytes());
        page[28..32].copy_from_slice(&8u32.to_ne_bytes());
        page[32..40].copy_from_slice(&8u64.to_ne_bytes());
        f.write_all(&page).unwrap();
        f
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("srp-ublk-ring-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        f
    }

    #[test]
    fn a_command_names_only_lent_memory_and_its_own_tags_and_device() {
        let Ok(mut ring) = Ring::new(8, 16, 1) else {
            eprintln!("SKIPPED: io_uring is not available here");
            return;
        };
        let cdev = fake_cdev();
        let bufs = TagBufs::new(2, 8192);
        let spec = QueueSpec {
            fd: cdev.as_raw_fd(),
            qid: 0,
            depth: 2,
            flags: 0,
        };
        let dev = ring.add_queue(&spec, bufs.copies_lent()).unwrap();
        let want = Iod {
            op_flags: sys::UBLK_IO_OP_WRITE,
            nr_sectors: 8,
            start_sector: 8,
        };
        assert_eq!(ring.iod(dev, 1), Some(want));
        assert_eq!((want.len(), want.offset()), (4096, 4096));
        assert_eq!(ring.iod(dev, 2), None, "past the depth");
        let (addr, len) = bufs.tag_span(1).unwrap();
        assert_eq!(len, 8192);
        let refused = |r: Result<(), UblkIoError>| r.unwrap_err().to_string();
        assert!(refused(ring.fetch(dev, 0, Some((addr + 1, len))))
            .contains("not in the queue's buffers"));
        assert!(
            refused(ring.fetch(dev, 0, Some((0x1000, 1)))).contains("not in the queue's buffers")
        );
        assert!(refused(ring.fetch(dev, 2, None)).contains("past the queue's depth 2"));
        assert!(refused(ring.fetch(Dev(1), 0, None)).contains("no device 1"));
        let full = ring.add_queue(&spec, bufs.copies_lent());
        assert!(matches!(full, Err(UblkIoError::Full { devices: 1 })));
        // a good command goes to the file, which refuses it: it ends with no request
        ring.fetch(dev, 1, Some((addr, len))).unwrap();
        ring.timeout(Duration::from_millis(1), 9);
        ring.enter(2).unwrap();
        let mut seen = Vec::new();
        while let Some(c) = ring.reap() {
            seen.push(c);
        }
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen
            .iter()
            .any(|c| matches!(c, Cqe::Ended { dev: d, tag: 1, res } if *d == dev && *res < 0)));
        assert!(seen
            .iter()
            .any(|c| matches!(c, Cqe::Own { op: 9, arg: 0, .. })));
        assert!(!ring.is_done(dev), "a refusal is not an abort");
    }

    #[test]
    fn user_data_keeps_the_loops_own_operations_apart_from_ublk_commands() {
        let d = own_data(5, 0xbeef);
        assert_ne!(d & OWN, 0);
        assert_eq!(((d >> 16) as u8, d as u16), (5, 0xbeef));
        let c = cmd_data(Dev(3), 63, true);
        assert_eq!(c & OWN, 0);
        assert_eq!(
            ((c >> 16) as u16, c as u16, c & GET_DATA != 0),
            (3, 63, true)
        );
        assert_eq!(cmd_data(Dev(0xffff), 0xffff, false) & GET_DATA, 0);
    }
}
