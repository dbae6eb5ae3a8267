//! The device's capacity checks, off the I/O path.

use super::{driver_has, CapacityStatus, QueueStatus};
use crate::session::{Relogin, RELOGIN_STEP};
use libublk::ctrl::UblkCtrl;
use libublk::sys;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// How often the capacity watch looks at the queues' unit attention counts and for a request.
const CAPACITY_POLL: Duration = Duration::from_millis(500);

/// The daemon's capacity checks: off the I/O path, on a thread of their own, each on a channel of
/// its own ([`Relogin::read_capacity`]).
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
    fn unit_attentions(&self) -> u64 {
        self.queues
            .iter()
            .map(|q| q.capacity_changed.load(Relaxed))
            .sum()
    }

    /// Starts the watch on a thread of its own; the flag it returns stops it.
    pub(super) fn spawn(self) -> Result<Arc<AtomicBool>, super::UblkFrontError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        std::thread::Builder::new()
            .name("capacity".into())
            .spawn(move || self.run(&stop2))
            .map_err(|source| super::UblkFrontError::Setup {
                what: "starting the capacity watch",
                source,
            })?;
        Ok(stop)
    }

    fn run(&self, stop: &AtomicBool) {
        let mut seen = self.unit_attentions();
        while !stop.load(Relaxed) {
            std::thread::sleep(CAPACITY_POLL);
            let n = self.unit_attentions();
            let asked = self.capacity.check.swap(false, Relaxed);
            if n == seen && !asked {
                continue;
            }
            seen = n;
            let why = if asked {
                "asked for"
            } else {
                "the target reported CAPACITY DATA HAS CHANGED"
            };
            let counter = match self.check(why) {
                Ok(()) => &self.capacity.checks,
                Err(()) => &self.capacity.failures,
            };
            counter.fetch_add(1, Relaxed);
        }
    }

    /// Re-reads the LUN's capacity and resizes the device to it where the kernel's ublk can
    /// (UPDATE_SIZE, Linux 6.16); elsewhere says so and records the size as pending. Err: the
    /// capacity could not be read or applied (logged).
    fn check(&self, why: &str) -> Result<(), ()> {
        let dev = format!("/dev/ublkb{}", self.dev_id);
        let cap = match self.relogin.read_capacity(RELOGIN_STEP) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("{dev}: capacity check ({why}) failed: {}", crate::Chain(&e));
                return Err(());
            }
        };
        let old = self.capacity.bytes.load(Relaxed);
        let new = cap.bytes().unwrap_or(0);
        if cap.block_len != 1 << self.block_shift {
            tracing::error!(
                "{dev}: the LUN's logical block size is now {} bytes (was {}): a device cannot \
                 change it; `srp-ublk del` and `add` it again",
                cap.block_len,
                1u32 << self.block_shift
            );
            return Err(());
        }
        if new == old {
            tracing::info!("{dev}: capacity check ({why}): unchanged, {new} bytes");
            self.capacity.pending.store(0, Relaxed);
            return Ok(());
        }
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
