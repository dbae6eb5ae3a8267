//! The device's capacity checks ([`crate::frontend::capacity`]), taken by ublk's UPDATE_SIZE.

use super::{driver_has, CapacityStatus, QueueStatus};
use crate::frontend::capacity::Watch;
use crate::session::{Relogin, RELOGIN_STEP};
use crate::wire::scsi::data::Capacity;
use libublk::ctrl::UblkCtrl;
use libublk::sys;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// The daemon's capacity checks for one device.
pub(super) struct CapacityWatch {
    pub(super) dev_id: u32,
    pub(super) relogin: Relogin,
    /// The device's size in logical blocks, as its queues bound I/O by it.
    pub(super) blocks: Arc<AtomicU64>,
    pub(super) queues: Arc<Vec<QueueStatus>>,
    pub(super) capacity: Arc<CapacityStatus>,
    pub(super) block_shift: u32,
}

impl CapacityWatch {
    /// Starts the watch on a thread of its own; the flag it returns stops it.
    pub(super) fn spawn(self) -> Result<Arc<AtomicBool>, super::UblkFrontError> {
        let queues = self.queues.clone();
        let relogin = self.relogin.clone();
        let watch = Watch {
            name: format!("/dev/ublkb{}", self.dev_id),
            block_len: 1 << self.block_shift,
            capacity: self.capacity.clone(),
            unit_attentions: Box::new(move || {
                queues
                    .iter()
                    .map(|q| q.capacity_changed.load(Relaxed))
                    .sum()
            }),
            read: Box::new(move || relogin.read_capacity(RELOGIN_STEP)),
            apply: Box::new(move |old, cap, why| self.resize(old, cap, why)),
        };
        watch
            .spawn()
            .map_err(|source| super::UblkFrontError::Setup {
                what: "starting the capacity watch",
                source,
            })
    }

    /// Resizes the device to the LUN's new capacity where the kernel's ublk can (UPDATE_SIZE,
    /// Linux 6.16); elsewhere says so and records the size as pending.
    fn resize(&self, old: u64, cap: &Capacity, why: &str) -> Result<(), ()> {
        let dev = format!("/dev/ublkb{}", self.dev_id);
        let new = cap.bytes().unwrap_or(0);
        if !driver_has(sys::UBLK_F_UPDATE_SIZE) {
            tracing::warn!(
                "{dev}: the LUN's capacity changed from {old} to {new} bytes ({why}), but this \
                 kernel's ublk cannot resize a live device (UPDATE_SIZE, Linux 6.16): the device \
                 stays at {old} bytes; `srp-ublk del` and `add` it again for the new size"
            );
            self.capacity.pending.store(new, Relaxed);
            return Ok(());
        }
        let blocks = cap.blocks();
        // growing, the queues take the new blocks before the kernel can send them; shrinking,
        // only once the kernel has stopped sending the old ones
        let before = self.blocks.load(Relaxed);
        self.blocks.store(blocks.max(before), Relaxed);
        let r = UblkCtrl::new_simple(self.dev_id as i32).and_then(|c| c.update_size(new));
        if let Err(e) = r {
            self.blocks.store(before, Relaxed);
            tracing::warn!("{dev}: resizing from {old} to {new} bytes ({why}) failed: {e}");
            self.capacity.pending.store(new, Relaxed);
            return Err(());
        }
        self.blocks.store(blocks, Relaxed);
        self.capacity.bytes.store(new, Relaxed);
        self.capacity.pending.store(0, Relaxed);
        tracing::warn!("{dev}: resized from {old} to {new} bytes ({why})");
        Ok(())
    }
}
