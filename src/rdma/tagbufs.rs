//! The data buffers of one queue's tags, owned by its path and registered on each login.
//!
//! The memory is shared between its owner ([`TagBufs`], the only one that makes Rust references to
//! it) and every endpoint that registered it ([`Keep`], which makes none and only keeps the memory
//! alive): a registration can never outlive the memory the HCA may write, whatever the drop order,
//! so registering is safe.

use libublk::helpers::IoBuf;
use std::sync::Arc;

/// `depth` page-aligned buffers of `size` bytes: tag `t`'s data lives in buffer `t`.
pub struct TagBufs {
    mem: Arc<Vec<IoBuf<u8>>>,
    size: u32,
}

/// What an endpoint holds of the buffers it registered: the memory stays allocated until the last
/// holder is gone. Its accessors stand in for the HCA (the fake target's DMA).
#[derive(Clone)]
pub struct Keep(Arc<Vec<IoBuf<u8>>>);

impl TagBufs {
    /// `depth` buffers of `size` bytes each, zeroed.
    pub fn new(depth: u16, size: u32) -> TagBufs {
        TagBufs {
            mem: Arc::new(
                (0..depth)
                    .map(|_| IoBuf::new(size as usize))
                    .collect::<Vec<_>>(),
            ),
            size,
        }
    }

    /// The number of buffers.
    pub fn depth(&self) -> u16 {
        self.mem.len() as u16
    }

    /// The size of each buffer.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The buffers, as ublk's FETCH and COMMIT commands take them.
    pub fn ios(&self) -> &Vec<IoBuf<u8>> {
        &self.mem
    }

    /// Tag `tag`'s buffer, to fill before a write is sent or to read after a read completed. The
    /// HCA writes a buffer only while a command on its tag is outstanding.
    pub fn slot(&mut self, tag: u16) -> &mut [u8] {
        let b = &self.mem[usize::from(tag)];
        // SAFETY: the allocation is live (we hold the Arc) and b.len() bytes long; every Rust
        // reference to it is made here or through `ios`, both borrowing `self` (mutably here), and
        // a `Keep` makes none, so no other reference aliases this one while it lives.
        unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr(), b.len()) }
    }

    /// Where tag `tag`'s buffer starts and how long it is (for a registration).
    pub(super) fn span(&self, tag: u16) -> (*mut u8, usize) {
        let b = &self.mem[usize::from(tag)];
        (b.as_mut_ptr(), b.len())
    }

    /// A holder for an endpoint that registers these buffers.
    pub fn keep(&self) -> Keep {
        Keep(self.mem.clone())
    }
}

impl Keep {
    /// The buffer holding `addr..addr+len`, and the offset of `addr` in it.
    fn find(&self, addr: u64, len: usize) -> Option<(&IoBuf<u8>, usize)> {
        self.0.iter().find_map(|b| {
            let start = b.as_ptr() as u64;
            let off = addr.checked_sub(start)? as usize;
            (off.checked_add(len)? <= b.len()).then_some((b, off))
        })
    }

    /// Copies `len` bytes at `addr` out of the buffers (an RDMA READ by a simulated target); None
    /// when the range is not inside one buffer.
    pub fn dma_read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let (b, off) = self.find(addr, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: off+len lies inside the live allocation `b` (checked by `find`); a byte copy into
        // our own vector, as the HCA's DMA would read the memory.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr().add(off), out.as_mut_ptr(), len) };
        Some(out)
    }

    /// Copies `data` into the buffers at `addr` (an RDMA WRITE by a simulated target); false when
    /// the range is not inside one buffer.
    pub fn dma_write(&self, addr: u64, data: &[u8]) -> bool {
        let Some((b, off)) = self.find(addr, data.len()) else {
            return false;
        };
        // SAFETY: as in `dma_read`; the owner makes no reference to a tag's buffer while its
        // command is outstanding (the only time a target writes it), as with the HCA.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), b.as_mut_ptr().add(off), data.len())
        };
        true
    }
}
