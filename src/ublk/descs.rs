//! A device queue's I/O descriptors: the array the ublk driver writes each request's operation,
//! sectors and flags into before it completes the tag's FETCH (or COMMIT_AND_FETCH), mapped
//! read-only from the device's char device.

use super::UblkIoError;
use libublk::sys;
use std::os::fd::RawFd;
use std::ptr::NonNull;

/// One request as the driver describes it (`struct ublksrv_io_desc`), copied out of the mapping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Iod {
    /// The operation (`UBLK_IO_OP_*`, the low 8 bits) and its flags (`UBLK_IO_F_*`).
    pub op_flags: u32,
    /// The request's length in 512-byte sectors.
    pub nr_sectors: u32,
    /// Its first sector.
    pub start_sector: u64,
}

impl Iod {
    /// The operation (`UBLK_IO_OP_*`).
    pub fn op(&self) -> u32 {
        self.op_flags & 0xff
    }

    /// The request's length in bytes.
    pub fn len(&self) -> u32 {
        self.nr_sectors << 9
    }

    /// Whether the request moves no data.
    pub fn is_empty(&self) -> bool {
        self.nr_sectors == 0
    }

    /// Its first byte.
    pub fn offset(&self) -> u64 {
        self.start_sector << 9
    }
}

// the layout the driver writes: 24 bytes per tag (include/uapi/linux/ublk_cmd.h)
const _: () = assert!(std::mem::size_of::<sys::ublksrv_io_desc>() == 24);

/// The mapped descriptors of one device queue.
pub(super) struct Descs {
    base: NonNull<sys::ublksrv_io_desc>,
    depth: u16,
    /// The mapping's length.
    len: usize,
}

// SAFETY: the mapping is read-only shared memory owned by this value alone; reads of it are
// copies (`Descs::get`), so moving it to another thread moves nothing that aliases.
unsafe impl Send for Descs {}

impl Descs {
    /// Maps queue `qid`'s descriptors (`depth` of them) from the device's char device `fd`.
    pub(super) fn map(fd: RawFd, qid: u16, depth: u16) -> Result<Descs, UblkIoError> {
        let page = page_size();
        let len = (usize::from(depth) * 24).div_ceil(page).max(1) * page;
        // each queue's array sits at its own offset, as room for the deepest queue
        let stride = (sys::UBLK_MAX_QUEUE_DEPTH as usize * 24).div_ceil(page) * page;
        let off = sys::UBLKSRV_CMD_BUF_OFFSET as usize + usize::from(qid) * stride;
        // SAFETY: a new read-only shared mapping of the char device at an address the kernel
        // picks: it aliases no Rust memory; its result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(UblkIoError::MapDescs {
                qid,
                source: std::io::Error::last_os_error(),
            });
        }
        let base = NonNull::new(p.cast()).ok_or(UblkIoError::MapDescs {
            qid,
            source: std::io::Error::from_raw_os_error(libc::EFAULT),
        })?;
        Ok(Descs { base, depth, len })
    }

    /// Tag `tag`'s descriptor as the driver wrote it last (None past the depth).
    pub(super) fn get(&self, tag: u16) -> Option<Iod> {
        if tag >= self.depth {
            return None;
        }
        // SAFETY: tag < depth, so the element lies inside the mapping (len >= depth x 24),
        // which lives as long as `self`. The driver writes a descriptor before it completes the
        // tag's command, and the CQE that said so was read with acquire ordering; a volatile
        // read copies it without making a reference to memory another party writes.
        let d = unsafe { std::ptr::read_volatile(self.base.as_ptr().add(usize::from(tag))) };
        Some(Iod {
            op_flags: d.op_flags,
            nr_sectors: d.nr_sectors,
            start_sector: d.start_sector,
        })
    }
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of `len` bytes, unmapped once; nothing borrows it
        // (`get` copies).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The system's page size.
fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system; it touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}
