//! Inflight I/O tracking (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD): shared memory the backend makes,
//! the VMM keeps across a backend's restart (kill -9, `srp-ublk upgrade`) and gives the next
//! backend, in which each queue marks the requests it took from its ring until they are used.
//! The next backend takes the marked ones again, in the order they were taken, before the ring's
//! new ones: nothing the guest sent is lost, and nothing used is answered twice.
//!
//! The layout is the one docs/interop/vhost-user.rst gives for split rings ("Inflight I/O
//! tracking"), as libvhost-user writes it: per queue a 16-byte header (`features` u64, `version`
//! u16, `desc_num` u16, `last_batch_head` u16, `used_idx` u16) and a 16-byte state per
//! descriptor (`inflight` u8, 5 bytes padding, `next` u16, `counter` u64), the queue's part
//! rounded up to 64 bytes. All access goes through vm-memory's volatile slice, bounds-checked.

use super::worker::Vring;
use super::MAX_QUEUE_SIZE;
use std::fs::File;
use std::os::fd::OwnedFd;
use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::mmap::MmapRegion;
use vm_memory::{Bytes, FileOffset, VolatileMemory, VolatileSlice};

const HEADER: usize = 16;
const DESC: usize = 16;
const VERSION: u16 = 1;
/// The offsets in a queue's header and in a descriptor's state.
const H_VERSION: usize = 8;
const H_DESC_NUM: usize = 10;
const H_LAST_BATCH: usize = 12;
const H_USED_IDX: usize = 14;
const D_INFLIGHT: usize = 0;
const D_COUNTER: usize = 8;

/// An inflight region the backend refuses.
#[derive(Debug, thiserror::Error)]
pub enum InflightError {
    /// The VMM named a size no queue has.
    #[error(
        "the VMM's inflight region names {queues} queue(s) of {queue_size} entries: refused (the \
         device has 1 to {max_queues} queues of at most {max_size} entries)",
        max_size = MAX_QUEUE_SIZE
    )]
    Geometry {
        /// Queues named.
        queues: u16,
        /// Entries per queue named.
        queue_size: u16,
        /// The device's queues.
        max_queues: usize,
    },
    /// The region's file is shorter than the VMM says (a mapping of it would end in SIGBUS).
    #[error(
        "the VMM's inflight region ({size} bytes at offset {offset}) is past the end of its file \
         ({file_len} bytes) or smaller than {queues} queue(s) of {queue_size} entries need"
    )]
    Short {
        /// Bytes named.
        size: u64,
        /// Where in the file.
        offset: u64,
        /// The file's length.
        file_len: u64,
        /// Queues named.
        queues: u16,
        /// Entries per queue named.
        queue_size: u16,
    },
    /// A queue's part names another ring size than the ring has now.
    #[error(
        "queue {queue}'s inflight state is for a ring of {region} entries, the ring has {ring}: \
         its requests cannot be taken again (was the VM's queue-size changed?)"
    )]
    RingSize {
        /// The queue.
        queue: usize,
        /// The region's `desc_num`.
        region: u16,
        /// The ring's size.
        ring: u16,
    },
    /// Making, sizing or mapping the region failed.
    #[error("the inflight region")]
    Io(#[source] std::io::Error),
}

/// Bytes a queue's part takes.
fn per_queue(queue_size: u16) -> usize {
    (HEADER + DESC * usize::from(queue_size)).next_multiple_of(64)
}

/// The region, mapped (shared with the VMM).
pub struct Inflight {
    map: MmapRegion<()>,
    queues: u16,
    queue_size: u16,
}

impl Inflight {
    /// A new zeroed region for `queues` queues of `queue_size` entries (GET_INFLIGHT_FD), and its
    /// file for the VMM.
    pub fn create(
        queues: u16,
        queue_size: u16,
        max_queues: usize,
    ) -> Result<(Inflight, File), InflightError> {
        check(queues, queue_size, max_queues)?;
        let size = usize::from(queues) * per_queue(queue_size);
        let fd: OwnedFd = nix::sys::memfd::memfd_create(
            c"srp-ublk-inflight",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
        )
        .map_err(|e| InflightError::Io(e.into()))?;
        let file = File::from(fd);
        file.set_len(size as u64).map_err(InflightError::Io)?;
        let region = Inflight::map(&file, 0, size, queues, queue_size)?;
        for q in 0..usize::from(queues) {
            let s = region.queue_slice(q);
            let _ = s.write_obj(VERSION, H_VERSION);
            let _ = s.write_obj(queue_size, H_DESC_NUM);
        }
        Ok((region, file))
    }

    /// The region the VMM kept (SET_INFLIGHT_FD): `size` bytes at `offset` of `file`.
    pub fn open(
        file: File,
        offset: u64,
        size: u64,
        queues: u16,
        queue_size: u16,
        max_queues: usize,
    ) -> Result<Inflight, InflightError> {
        check(queues, queue_size, max_queues)?;
        let file_len = file.metadata().map_err(InflightError::Io)?.len();
        let need = (usize::from(queues) * per_queue(queue_size)) as u64;
        if size < need || offset.checked_add(size).is_none_or(|end| end > file_len) {
            return Err(InflightError::Short {
                size,
                offset,
                file_len,
                queues,
                queue_size,
            });
        }
        Inflight::map(&file, offset, need as usize, queues, queue_size)
    }

    fn map(
        file: &File,
        offset: u64,
        size: usize,
        queues: u16,
        queue_size: u16,
    ) -> Result<Inflight, InflightError> {
        let f = file.try_clone().map_err(InflightError::Io)?;
        let map = MmapRegion::from_file(FileOffset::new(f, offset), size)
            .map_err(|e| InflightError::Io(std::io::Error::other(e)))?;
        Ok(Inflight {
            map,
            queues,
            queue_size,
        })
    }

    fn queue_slice(&self, q: usize) -> VolatileSlice<'_, ()> {
        let n = per_queue(self.queue_size);
        let all = self.map.as_volatile_slice();
        // in bounds: the mapping holds `queues` parts and `q` is below that (checked by callers)
        all.subslice(q * n, n).unwrap_or(all)
    }

    /// Queue `q`'s part, when the region has one.
    pub fn queue(&self, q: usize) -> Option<QueueState<'_>> {
        (q < usize::from(self.queues)).then(|| QueueState {
            q,
            s: self.queue_slice(q),
            size: self.queue_size,
        })
    }
}

fn check(queues: u16, queue_size: u16, max_queues: usize) -> Result<(), InflightError> {
    if queues == 0
        || usize::from(queues) > max_queues
        || queue_size == 0
        || queue_size > MAX_QUEUE_SIZE
    {
        return Err(InflightError::Geometry {
            queues,
            queue_size,
            max_queues,
        });
    }
    Ok(())
}

/// One queue's part of the region.
pub struct QueueState<'a> {
    q: usize,
    s: VolatileSlice<'a, ()>,
    size: u16,
}

impl QueueState<'_> {
    fn desc(&self, head: u16) -> usize {
        HEADER + DESC * usize::from(head % self.size)
    }

    /// Request `head` taken from the ring, as the `counter`-th.
    pub fn taken(&self, head: u16, counter: u64) {
        let d = self.desc(head);
        let _ = self.s.write_obj(counter, d + D_COUNTER);
        let _ = self.s.write_obj(1u8, d + D_INFLIGHT);
    }

    /// Request `head` is about to be put in the used ring.
    pub fn using(&self, head: u16) {
        let _ = self.s.write_obj(head, H_LAST_BATCH);
    }

    /// Request `head` is in the used ring, whose index is now `used_idx`.
    pub fn used(&self, head: u16, used_idx: u16) {
        let _ = self.s.write_obj(0u8, self.desc(head) + D_INFLIGHT);
        let _ = self.s.write_obj(used_idx, H_USED_IDX);
    }

    /// The heads marked as taken and not used, in the order they were taken, with the last one's
    /// number.
    fn taken_order(&self) -> Vec<(u64, u16)> {
        let mut taken: Vec<(u64, u16)> = (0..self.size)
            .filter(|&h| self.s.read_obj::<u8>(self.desc(h) + D_INFLIGHT).ok() == Some(1))
            .map(|h| (self.s.read_obj(self.desc(h) + D_COUNTER).unwrap_or(0), h))
            .collect();
        taken.sort_unstable();
        taken
    }

    /// The heads marked as taken and not used, in the order they were taken.
    #[cfg(test)]
    pub fn marked(&self) -> Vec<u16> {
        self.taken_order().into_iter().map(|t| t.1).collect()
    }

    /// At the ring's start: the requests an earlier backend took and never used, in the order it
    /// took them, with the counter to go on from; the ring's indexes set past them.
    pub fn resume(&self, vring: &Vring) -> Result<(Vec<u16>, u64), InflightError> {
        let ring = vring.get_ref().get_queue().size();
        let region: u16 = self.s.read_obj(H_DESC_NUM).unwrap_or(0);
        if region != ring || region != self.size {
            return Err(InflightError::RingSize {
                queue: self.q,
                region,
                ring,
            });
        }
        let used = vring.queue_used_idx().unwrap_or(0);
        let recorded: u16 = self.s.read_obj(H_USED_IDX).unwrap_or(0);
        if recorded != used {
            // the last request went into the used ring before the backend could say so
            let last: u16 = self.s.read_obj(H_LAST_BATCH).unwrap_or(0);
            let _ = self.s.write_obj(0u8, self.desc(last) + D_INFLIGHT);
            let _ = self.s.write_obj(used, H_USED_IDX);
        }
        let taken = self.taken_order();
        tracing::debug!(
            "queue {}: inflight region: used index {used} (recorded {recorded}), {} taken and not \
             used",
            self.q,
            taken.len()
        );
        let counter = taken.last().map_or(0, |t| t.0);
        vring.set_queue_next_used(used);
        vring.set_queue_next_avail(used.wrapping_add(taken.len() as u16));
        Ok((taken.into_iter().map(|t| t.1).collect(), counter))
    }
}
