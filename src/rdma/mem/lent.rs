//! Memory lent to the memory layer for registration: its regions and the owner that keeps them
//! allocated, at the same addresses, for as long as any holder of the [`Lent`] lives. Only this
//! layer makes one, from memory whose owner it knows: a queue's buffers ([`crate::rdma::TagBufs`])
//! or a guest's RAM as the vhost-user front end mapped it ([`Lent::guest`]).

use std::any::Any;
use std::sync::Arc;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MemoryRegionAddress};

/// Regions of memory and what keeps them allocated.
#[derive(Clone)]
pub struct Lent {
    /// Start address and length of each region, in order.
    regions: Arc<[(usize, usize)]>,
    /// The owner: the memory stays allocated, at these addresses, while it lives.
    _owner: Arc<dyn Any + Send + Sync>,
}

impl Lent {
    /// `regions` of memory `owner` keeps allocated at those addresses while it lives.
    ///
    /// # Safety
    /// Every region lies inside an allocation `owner` owns, which neither moves nor is freed
    /// while `owner` lives, and nothing frees or remaps it through another handle.
    pub(in crate::rdma) unsafe fn new(
        regions: Vec<(usize, usize)>,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Lent {
        Lent {
            regions: regions.into(),
            _owner: owner,
        }
    }

    /// Every region of a guest's memory, as the vhost-user front end mapped it (shared with the
    /// VMM); the mapping stays while this lives.
    pub fn guest(mem: Arc<GuestMemoryMmap<()>>) -> Lent {
        let regions = mem
            .iter()
            .filter_map(|r| {
                let host = r.get_host_address(MemoryRegionAddress(0)).ok()?;
                Some((host as usize, r.len() as usize))
            })
            .collect();
        // SAFETY: each region is one of `mem`'s mappings, which `mem` unmaps only when it is
        // dropped (GuestMemoryMmap owns its MmapRegions); the Arc keeps it alive.
        unsafe { Lent::new(regions, mem) }
    }

    /// The regions: start address and length, in order.
    pub fn regions(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.regions.iter().map(|&(a, l)| (a as u64, l))
    }

    /// The number of regions.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// Where the region holding `addr..addr+len` has that range, if one does.
    #[cfg(any(test, feature = "test-utils"))]
    fn find(&self, addr: u64, len: usize) -> Option<*mut u8> {
        self.regions.iter().find_map(|&(start, size)| {
            let off = usize::try_from(addr).ok()?.checked_sub(start)?;
            (off.checked_add(len)? <= size).then_some((start + off) as *mut u8)
        })
    }

    /// Copies `len` bytes at `addr` out of the regions (an RDMA READ by a simulated target);
    /// None when the range is not inside one region.
    ///
    /// # Safety
    /// No Rust reference to those bytes lives during the call: the owner has lent them to a
    /// command (as the HCA reads a buffer only while its command is outstanding).
    #[cfg(any(test, feature = "test-utils"))]
    pub unsafe fn dma_read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let at = self.find(addr, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: at..at+len lies inside a live region (checked by `find`; the owner we hold
        // keeps it), and no reference to it lives (the caller's promise).
        unsafe { std::ptr::copy_nonoverlapping(at, out.as_mut_ptr(), len) };
        Some(out)
    }

    /// Copies `data` into the regions at `addr` (an RDMA WRITE by a simulated target); false
    /// when the range is not inside one region.
    ///
    /// # Safety
    /// As for [`Lent::dma_read`]: no Rust reference to those bytes lives during the call.
    #[cfg(any(test, feature = "test-utils"))]
    pub unsafe fn dma_write(&self, addr: u64, data: &[u8]) -> bool {
        let Some(at) = self.find(addr, data.len()) else {
            return false;
        };
        // SAFETY: as in `dma_read`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at, data.len()) };
        true
    }
}
