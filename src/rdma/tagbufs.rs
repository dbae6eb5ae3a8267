//! The data buffers of one queue's tags, owned by its path and registered on each login.
//!
//! Every tag owns a buffer of the largest I/O (what ublk's FETCH and COMMIT and the NBD connection
//! read and write), but only its first [`TagBufs::head`] bytes are registered (pinned): a command
//! that fits goes to the target from there, a larger one through one of a few registered staging
//! buffers of the largest I/O, its data copied in before a write or out after a read. Pinned
//! memory per queue is then `depth x head + stages x size`, not `depth x size`.
//!
//! The memory is shared between its owner ([`TagBufs`], the only one that makes Rust references to
//! it) and every endpoint that registered it ([`Keep`], which makes none and only keeps the memory
//! alive): a registration can never outlive the memory the HCA may write, whatever the drop order,
//! so registering is safe.

use libublk::helpers::IoBuf;
use std::sync::Arc;

/// The registered bytes of each tag's buffer when the largest I/O is larger: commands up to this
/// size (the ublk default's largest I/O at depth 64) are not copied. Smaller heads pin less at
/// the price of a copy per larger command on the queue's thread (measured in the lab with 64 KiB:
/// 128 KiB commands cost 300-400 us more of the daemon's CPU each, docs/performance.md).
const HEAD: u32 = 128 << 10;
/// The registered bytes of the staging buffers together, per queue.
const STAGE_BUDGET: u32 = 2 << 20;

/// The buffers' memory: one per tag, then the staging buffers.
struct Mem {
    tags: Vec<IoBuf<u8>>,
    stages: Vec<IoBuf<u8>>,
    /// The registered prefix of each tag's buffer.
    head: usize,
}

impl Mem {
    /// The registered regions: each tag's head, then each staging buffer whole.
    fn regions(&self) -> impl Iterator<Item = (*mut u8, usize)> + '_ {
        let heads = self.tags.iter().map(|b| (b.as_mut_ptr(), self.head));
        heads.chain(self.stages.iter().map(|b| (b.as_mut_ptr(), b.len())))
    }
}

/// `depth` page-aligned buffers of `size` bytes (tag `t`'s data lives in buffer `t`), and the
/// staging buffers for commands larger than the registered head.
pub struct TagBufs {
    mem: Arc<Mem>,
    size: u32,
}

/// What an endpoint holds of the buffers it registered: the memory stays allocated until the last
/// holder is gone. Its accessors stand in for the HCA (the fake target's DMA).
#[derive(Clone)]
pub struct Keep(Arc<Mem>);

impl TagBufs {
    /// `depth` buffers of `size` bytes, each registered whole (no staging).
    pub fn new(depth: u16, size: u32) -> TagBufs {
        TagBufs::with_head(depth, size, size, 0)
    }

    /// `depth` buffers of `size` bytes under the pin budget: each registers its first 128 KiB
    /// (`HEAD`), and 2 MiB of staging buffers (`STAGE_BUDGET`; at least one, at most one per tag)
    /// take the larger commands. With `size` at most the head every buffer is registered whole.
    pub fn budgeted(depth: u16, size: u32) -> TagBufs {
        if size <= HEAD {
            return TagBufs::new(depth, size);
        }
        let stages = (STAGE_BUDGET / size).max(1).min(u32::from(depth));
        TagBufs::with_head(depth, size, HEAD, stages as u16)
    }

    /// `depth` buffers of `size` bytes whose first `head` bytes are registered, and `stages`
    /// staging buffers of `size` bytes.
    pub fn with_head(depth: u16, size: u32, head: u32, stages: u16) -> TagBufs {
        let alloc = |n: u16| (0..n).map(|_| IoBuf::new(size as usize)).collect();
        TagBufs {
            mem: Arc::new(Mem {
                tags: alloc(depth),
                stages: alloc(stages),
                head: head.min(size) as usize,
            }),
            size,
        }
    }

    /// The number of tag buffers.
    pub fn depth(&self) -> u16 {
        self.mem.tags.len() as u16
    }

    /// The size of each buffer.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The registered prefix of each tag's buffer: a command larger than this is staged.
    pub fn head(&self) -> u32 {
        self.mem.head as u32
    }

    /// The number of staging buffers.
    pub fn stages(&self) -> u16 {
        self.mem.stages.len() as u16
    }

    /// The tag buffers, as ublk's FETCH and COMMIT commands take them.
    pub fn ios(&self) -> &Vec<IoBuf<u8>> {
        &self.mem.tags
    }

    /// Tag `tag`'s buffer, to fill before a write is sent or to read after a read completed. The
    /// HCA writes a buffer only while a command on its tag is outstanding.
    pub fn slot(&mut self, tag: u16) -> &mut [u8] {
        let b = &self.mem.tags[usize::from(tag)];
        // SAFETY: the allocation is live (we hold the Arc) and b.len() bytes long; every Rust
        // reference to it is made here or through `ios`, both borrowing `self` (mutably here), and
        // a `Keep` makes none, so no other reference aliases this one while it lives.
        unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr(), b.len()) }
    }

    /// Tag `tag`'s first `len` bytes and staging buffer `stage`'s, to copy between. The HCA
    /// writes a staging buffer only while the command it was taken for is outstanding.
    pub fn slot_and_stage(&mut self, tag: u16, stage: u16, len: usize) -> (&mut [u8], &mut [u8]) {
        let (t, s) = (
            &self.mem.tags[usize::from(tag)],
            &self.mem.stages[usize::from(stage)],
        );
        let len = len.min(t.len()).min(s.len());
        // SAFETY: as in `slot`; the two allocations are distinct, so the two references do not
        // overlap, and both borrow `self` mutably.
        unsafe {
            (
                std::slice::from_raw_parts_mut(t.as_mut_ptr(), len),
                std::slice::from_raw_parts_mut(s.as_mut_ptr(), len),
            )
        }
    }

    /// The regions to register, in order: each tag's head (region `t` for tag `t`), then each
    /// staging buffer (region `depth + s`).
    pub(super) fn regions(&self) -> impl Iterator<Item = (*mut u8, usize)> + '_ {
        self.mem.regions()
    }

    /// The registered regions (each tag's head, then each staging buffer) as descriptors see
    /// them: start address and length.
    pub fn region_spans(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.regions().map(|(p, len)| (p as u64, len as u32))
    }

    /// A holder for an endpoint that registers these buffers.
    pub fn keep(&self) -> Keep {
        Keep(self.mem.clone())
    }
}

impl Keep {
    /// The number of registered regions (each tag's head and each staging buffer).
    pub fn regions(&self) -> usize {
        self.0.tags.len() + self.0.stages.len()
    }

    /// Where the registered range holding `addr..addr+len` starts, if one does.
    fn find(&self, addr: u64, len: usize) -> Option<*mut u8> {
        self.0.regions().find_map(|(start, size)| {
            let off = addr.checked_sub(start as u64)? as usize;
            (off.checked_add(len)? <= size).then_some(start.wrapping_add(off))
        })
    }

    /// Copies `len` bytes at `addr` out of the buffers (an RDMA READ by a simulated target); None
    /// when the range is not inside one registered region.
    pub fn dma_read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let at = self.find(addr, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: at..at+len lies inside a live allocation we hold (checked by `find`); a byte
        // copy into our own vector, as the HCA's DMA would read the memory.
        unsafe { std::ptr::copy_nonoverlapping(at, out.as_mut_ptr(), len) };
        Some(out)
    }

    /// Copies `data` into the buffers at `addr` (an RDMA WRITE by a simulated target); false when
    /// the range is not inside one registered region.
    pub fn dma_write(&self, addr: u64, data: &[u8]) -> bool {
        let Some(at) = self.find(addr, data.len()) else {
            return false;
        };
        // SAFETY: as in `dma_read`; the owner makes no reference to a buffer while its command is
        // outstanding (the only time a target writes it), as with the HCA.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at, data.len()) };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_budget() {
        // what a login registers (pins)
        let mib = |b: &TagBufs| {
            let pinned: u64 = b.region_spans().map(|(_, len)| u64::from(len)).sum();
            pinned as f64 / f64::from(1 << 20)
        };
        // the ublk default (depth 64, 128 KiB requests) fits the head: registered whole
        let b = TagBufs::budgeted(64, 128 << 10);
        assert_eq!((b.head(), b.stages(), mib(&b)), (128 << 10, 0, 8.0));
        // NBD's and max_sect=1024's 512 KiB: 128 KiB heads and four 512 KiB staging buffers,
        // 10 MiB where every buffer whole would pin 32 MiB
        let b = TagBufs::budgeted(64, 512 << 10);
        assert_eq!((b.head(), b.stages(), mib(&b)), (128 << 10, 4, 10.0));
        // 256 KiB: eight; never more staging buffers than tags
        assert_eq!(TagBufs::budgeted(64, 256 << 10).stages(), 8);
        assert_eq!(TagBufs::budgeted(2, 256 << 10).stages(), 2);
        assert_eq!(TagBufs::budgeted(0, 512 << 10).stages(), 0);
    }

    #[test]
    fn a_target_reaches_a_tags_head_and_the_staging_buffers_only() {
        let b = TagBufs::with_head(2, 64 << 10, 8 << 10, 1);
        let k = b.keep();
        let spans: Vec<(u64, u32)> = b.region_spans().collect();
        assert_eq!(spans.len(), 3);
        let (tag0, stage) = (spans[0].0, spans[2].0);
        assert_eq!((spans[0].1, spans[2].1), (8 << 10, 64 << 10));
        assert!(k.dma_write(tag0, &[1; 8 << 10]));
        assert!(!k.dma_write(tag0 + 1, &[1; 8 << 10]), "past the head");
        assert!(
            k.dma_read(tag0 + (8 << 10), 1).is_none(),
            "the unregistered tail"
        );
        assert!(k.dma_write(stage, &[2; 64 << 10]));
        assert_eq!(k.dma_read(stage + 100, 3), Some(vec![2; 3]));
    }
}
