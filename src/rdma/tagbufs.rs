//! The data buffers of one queue, owned by its path and registered on each login.
//!
//! Two layouts. With tag buffers ([`TagBufs::budgeted`]: the NBD connections, and ublk devices
//! made without NEED_GET_DATA) every tag owns a buffer of the largest I/O (what ublk's FETCH and
//! COMMIT and the NBD connection read and write), but only its first [`TagBufs::head`] bytes are
//! registered (pinned): a command that fits goes to the target from there, a larger one through a
//! staging buffer of the shared area, its data copied in before a write or out after a read.
//! Pinned memory is then `depth x head + stages x size`, not `depth x size`. With a pool
//! ([`TagBufs::pooled`]: ublk with NEED_GET_DATA) there are no tag buffers: every command takes a
//! span of the area, which the kernel copies a write's data into and a read's out of, so a queue
//! pins the area alone, sized by a budget rather than by depth.
//!
//! The memory is shared between its owner ([`TagBufs`], the only one that makes Rust references to
//! it) and every registration of it ([`Lent`], which makes none and only keeps the memory alive):
//! a registration can never outlive the memory the HCA may write, whatever the drop order, so
//! registering is safe.

use super::mem::Lent;
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

/// The registered bytes of each tag's buffer when the largest I/O is larger: commands up to this
/// size (the ublk default's largest I/O at depth 64) are not copied. Smaller heads pin less at
/// the price of a copy per larger command on the queue's thread (measured in the lab with 64 KiB:
/// 128 KiB commands cost 300-400 us more of the daemon's CPU each, docs/bench/performance-record.md).
const HEAD: u32 = 128 << 10;
/// The registered bytes of the staging buffers together, per queue.
const STAGE_BUDGET: u32 = 2 << 20;
/// A pool's size at most, per queue: 48 commands of 128 KiB, 12 of 512 KiB, and with the
/// channel's IUs under 8 MiB pinned.
const POOL_BUDGET: u32 = 6 << 20;
/// A pool's allocation unit.
const POOL_UNIT: u32 = 4 << 10;

/// The buffers' memory: one per tag, then the area (staging buffers or the pool).
struct Mem {
    tags: Vec<PageBuf>,
    area: Option<PageBuf>,
    /// The registered prefix of each tag's buffer.
    head: usize,
}

impl Mem {
    /// The registered regions: each tag's head, then the area whole.
    fn regions(&self) -> impl Iterator<Item = (*mut u8, usize)> + '_ {
        let heads = self.tags.iter().map(|b| (b.as_mut_ptr(), self.head));
        let heads = heads.filter(|&(_, len)| len > 0);
        heads.chain(self.area.iter().map(|b| (b.as_mut_ptr(), b.len())))
    }

    /// Every buffer whole: each tag's, then the area.
    fn whole(&self) -> impl Iterator<Item = (*mut u8, usize)> + '_ {
        let tags = self.tags.iter().map(|b| (b.as_mut_ptr(), b.len()));
        tags.chain(self.area.iter().map(|b| (b.as_mut_ptr(), b.len())))
    }

    /// The number of registered heads (the area's region comes after them).
    fn heads(&self) -> usize {
        if self.head > 0 {
            self.tags.len()
        } else {
            0
        }
    }
}

/// The data buffers of `depth` tags: see the module documentation.
pub struct TagBufs {
    mem: Arc<Mem>,
    depth: u16,
    size: u32,
    /// The area's allocation unit (a staging buffer, or a pool page).
    unit: u32,
    pool: bool,
    /// The area offset of the span each tag's latest pool command took (what its commit names).
    spans: Vec<u32>,
}

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
        let bytes = size as usize * usize::from(stages);
        TagBufs {
            mem: Arc::new(Mem {
                tags: (0..depth).map(|_| PageBuf::new(size as usize)).collect(),
                area: (stages > 0).then(|| PageBuf::new(bytes)),
                head: head.min(size) as usize,
            }),
            depth,
            size,
            unit: size,
            pool: false,
            spans: Vec::new(),
        }
    }

    /// A pool for `depth` tags whose largest I/O is `size`: `depth x size` bytes, at most 6 MiB
    /// (`POOL_BUDGET`) and at least one command of `size`, in 4 KiB units.
    pub fn pooled(depth: u16, size: u32) -> TagBufs {
        let want = (u64::from(depth) * u64::from(size)).min(u64::from(POOL_BUDGET)) as u32;
        TagBufs::pool_of(depth, size, want.max(size))
    }

    /// A pool of `bytes` (rounded up to the unit) for `depth` tags whose largest I/O is `size`.
    pub fn pool_of(depth: u16, size: u32, bytes: u32) -> TagBufs {
        let bytes = bytes.max(1).div_ceil(POOL_UNIT) * POOL_UNIT;
        TagBufs {
            mem: Arc::new(Mem {
                tags: Vec::new(),
                area: Some(PageBuf::new(bytes as usize)),
                head: 0,
            }),
            depth,
            size,
            unit: POOL_UNIT,
            pool: true,
            spans: vec![0; usize::from(depth)],
        }
    }

    /// The number of tags.
    pub fn depth(&self) -> u16 {
        self.depth
    }

    /// The largest I/O.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The registered prefix of each tag's buffer: a larger command takes a span of the area
    /// (0 with a pool).
    pub fn head(&self) -> u32 {
        self.mem.head as u32
    }

    /// Whether these are a pool (no tag buffers; the kernel copies to and from the area).
    pub fn is_pool(&self) -> bool {
        self.pool
    }

    /// The area's allocation unit.
    pub fn unit(&self) -> u32 {
        self.unit
    }

    /// The number of units in the area.
    pub fn units(&self) -> u32 {
        self.mem
            .area
            .as_ref()
            .map_or(0, |a| (a.len() / self.unit as usize) as u32)
    }

    /// The index of the area's region among [`TagBufs::region_spans`].
    pub fn area_region(&self) -> usize {
        self.mem.heads()
    }

    /// Tag `tag`'s buffer as ublk's FETCH and COMMIT name it (None with a pool: a write names
    /// its span with NEED_GET_DATA, a read with its COMMIT).
    pub fn tag_span(&self, tag: u16) -> Option<(u64, u32)> {
        let b = self.mem.tags.get(usize::from(tag))?;
        Some((b.as_mut_ptr() as u64, b.len() as u32))
    }

    /// Tag `tag`'s buffer, to read a finished read's data from (empty with a pool). The HCA
    /// writes a buffer only while a command on its tag is outstanding.
    pub fn tag_data(&self, tag: u16) -> &[u8] {
        let Some(b) = self.mem.tags.get(usize::from(tag)) else {
            return &[];
        };
        // SAFETY: as in `slot`: the allocation is live and b.len() bytes long, and the only
        // mutable references to it are made by methods borrowing `self` mutably, which this
        // shared borrow excludes while it lives.
        unsafe { std::slice::from_raw_parts(b.as_mut_ptr(), b.len()) }
    }

    /// Tag `tag`'s buffer, to fill before a write is sent or to read after a read completed (empty
    /// with a pool). The HCA writes a buffer only while a command on its tag is outstanding.
    pub fn slot(&mut self, tag: u16) -> &mut [u8] {
        let Some(b) = self.mem.tags.get(usize::from(tag)) else {
            return &mut [];
        };
        // SAFETY: the allocation is live (we hold the Arc) and b.len() bytes long; every Rust
        // reference to it is made by a method borrowing `self` mutably, and a `Lent` makes none,
        // so no other reference aliases this one while it lives.
        unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr(), b.len()) }
    }

    /// `len` bytes of the area at `off` (empty when out of range). The HCA writes a span only
    /// while the command holding it is outstanding.
    pub fn area(&mut self, off: usize, len: usize) -> &mut [u8] {
        let Some(a) = &self.mem.area else {
            return &mut [];
        };
        if off.checked_add(len).is_none_or(|end| end > a.len()) {
            return &mut [];
        }
        // SAFETY: as in `slot`: off..off+len lies inside the live allocation (checked above).
        unsafe { std::slice::from_raw_parts_mut(a.as_mut_ptr().add(off), len) }
    }

    /// Tag `tag`'s first `len` bytes and the area's `len` bytes at `off`, to copy between.
    pub fn slot_and_area(&mut self, tag: u16, off: usize, len: usize) -> (&mut [u8], &mut [u8]) {
        let (Some(t), Some(a)) = (self.mem.tags.get(usize::from(tag)), &self.mem.area) else {
            return (&mut [], &mut []);
        };
        let len = len.min(t.len()).min(a.len().saturating_sub(off));
        // SAFETY: as in `slot`; the two allocations are distinct, so the two references do not
        // overlap, and both borrow `self` mutably; off+len is inside the area (clamped above).
        unsafe {
            (
                std::slice::from_raw_parts_mut(t.as_mut_ptr(), len),
                std::slice::from_raw_parts_mut(a.as_mut_ptr().add(off), len),
            )
        }
    }

    /// The address of the area's byte `off` (what ublk's NEED_GET_DATA names).
    pub fn area_addr(&self, off: usize) -> u64 {
        self.mem
            .area
            .as_ref()
            .map_or(0, |a| a.as_mut_ptr() as u64 + off as u64)
    }

    /// Notes that tag `tag`'s pool command holds the span at area offset `off`.
    pub fn set_span(&mut self, tag: u16, off: usize) {
        if let Some(s) = self.spans.get_mut(usize::from(tag)) {
            *s = off as u32;
        }
    }

    /// What ublk's COMMIT of tag `tag`'s read names as its data: the span its latest command
    /// held with a pool (never 0, which a read's commit may not name), its own buffer otherwise.
    pub fn commit_addr(&self, tag: u16) -> u64 {
        match self.mem.tags.get(usize::from(tag)) {
            Some(b) => b.as_mut_ptr() as u64,
            None => self.area_addr(self.spans.get(usize::from(tag)).map_or(0, |&s| s as usize)),
        }
    }

    /// The registered regions as descriptors see them: start address and length.
    pub fn region_spans(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.mem.regions().map(|(p, len)| (p as u64, len as u32))
    }

    /// The regions to register, in order: each tag's head (region `t` for tag `t`) when tags
    /// have one, then the area ([`TagBufs::area_region`]), lent with the memory they lie in.
    pub fn lent(&self) -> Lent {
        let regions = self
            .mem
            .regions()
            .map(|(p, len)| (p as usize, len))
            .collect();
        // SAFETY: every region lies in `mem`'s allocations (PageBufs, freed only when `mem` is
        // dropped and never resized), which the Arc keeps.
        unsafe { Lent::new(regions, self.mem.clone()) }
    }

    /// Every buffer whole (each tag's, then the area), lent with the memory: what ublk's
    /// commands may name for the kernel to copy requests' data into and out of.
    pub fn copies_lent(&self) -> Lent {
        let regions = self.mem.whole().map(|(p, len)| (p as usize, len)).collect();
        // SAFETY: as in `lent`: the regions are `mem`'s allocations whole.
        unsafe { Lent::new(regions, self.mem.clone()) }
    }
}

/// A zeroed, page-aligned heap buffer of a fixed length, freed on drop. Its bytes are reached
/// only through raw pointers ([`TagBufs`] makes the references), so the HCA and the kernel may
/// write them while it is shared.
struct PageBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a PageBuf owns its allocation and makes no reference to it; the pointer is as good on
// any thread.
unsafe impl Send for PageBuf {}
// SAFETY: as for Send: `&PageBuf` gives out the pointer alone.
unsafe impl Sync for PageBuf {}

impl PageBuf {
    /// Page alignment: what DMA and ublk's copies expect.
    const ALIGN: usize = 4096;

    /// `len` zeroed bytes (at least one, as an allocation must be).
    fn new(len: usize) -> PageBuf {
        // a length no allocation can have fails as an allocation of it would
        let Some(layout) = Self::layout(len) else {
            std::alloc::handle_alloc_error(Layout::new::<u8>())
        };
        // SAFETY: the layout has a non-zero size (`layout` rounds 0 up to 1).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout)
        };
        PageBuf { ptr, len }
    }

    fn layout(len: usize) -> Option<Layout> {
        Layout::from_size_align(len.max(1), Self::ALIGN).ok()
    }

    fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        if let Some(layout) = Self::layout(self.len) {
            // SAFETY: allocated in `new` with this layout (`new` made it from the same length),
            // freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
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
        assert_eq!((b.head(), b.units(), mib(&b)), (128 << 10, 0, 8.0));
        // NBD's and max_sect=1024's 512 KiB: 128 KiB heads and four 512 KiB staging buffers,
        // 10 MiB where every buffer whole would pin 32 MiB
        let b = TagBufs::budgeted(64, 512 << 10);
        assert_eq!((b.head(), b.units(), mib(&b)), (128 << 10, 4, 10.0));
        // 256 KiB: eight; never more staging buffers than tags
        assert_eq!(TagBufs::budgeted(64, 256 << 10).units(), 8);
        assert_eq!(TagBufs::budgeted(2, 256 << 10).units(), 2);
        assert_eq!(TagBufs::budgeted(0, 512 << 10).units(), 0);
        // a pool: the area alone, by the budget and never less than one command
        let b = TagBufs::pooled(64, 128 << 10);
        assert_eq!(
            (b.head(), b.units(), b.area_region(), mib(&b)),
            (0, 1536, 0, 6.0)
        );
        assert_eq!(mib(&TagBufs::pooled(64, 512 << 10)), 6.0);
        assert_eq!(mib(&TagBufs::pooled(8, 64 << 10)), 0.5);
        assert_eq!(mib(&TagBufs::pooled(1, 1 << 20)), 1.0);
        assert!(b.tag_span(0).is_none());
    }

    #[test]
    fn a_target_reaches_a_tags_head_and_the_staging_buffers_only() {
        let b = TagBufs::with_head(2, 64 << 10, 8 << 10, 1);
        let k = b.lent();
        // SAFETY: this test makes no reference to the buffers' memory
        let write = |addr, data: &[u8]| unsafe { k.dma_write(addr, data) };
        // SAFETY: as for `write`
        let read = |addr, len| unsafe { k.dma_read(addr, len) };
        let spans: Vec<(u64, u32)> = b.region_spans().collect();
        assert_eq!(spans.len(), 3);
        let (tag0, stage) = (spans[0].0, spans[2].0);
        assert_eq!((spans[0].1, spans[2].1), (8 << 10, 64 << 10));
        assert!(write(tag0, &[1; 8 << 10]));
        assert!(!write(tag0 + 1, &[1; 8 << 10]), "past the head");
        assert!(read(tag0 + (8 << 10), 1).is_none(), "the unregistered tail");
        assert!(write(stage, &[2; 64 << 10]));
        assert_eq!(read(stage + 100, 3), Some(vec![2; 3]));
    }
}
