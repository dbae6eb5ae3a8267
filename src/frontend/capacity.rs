//! A LUN's capacity checks, off the I/O path: a thread of their own that re-reads the capacity when
//! a queue met CAPACITY DATA HAS CHANGED or when asked (SIGHUP, `srp-ublk resize`), and has the
//! front end take a capacity that changed (the ublk device's UPDATE_SIZE, vhost-user-blk's
//! configuration change to the VMM).

use crate::session::SessionError;
use crate::wire::scsi::data::Capacity;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// How often the watch looks at the queues' unit attention counts and for a request.
const POLL: Duration = Duration::from_millis(500);

/// The device's size, kept by its capacity checks (the `capacity` thread): a check runs when a
/// queue meets CAPACITY DATA HAS CHANGED and when asked (`check`: SIGHUP, `srp-ublk resize`).
#[derive(Debug, Default)]
pub struct CapacityStatus {
    /// Ask for a check now.
    pub check: AtomicBool,
    /// Checks done (`srp-ublk resize` waits for it or `failures` to move).
    pub checks: AtomicU64,
    /// Checks that could not read the capacity or apply it (the log says why).
    pub failures: AtomicU64,
    /// The device's size in bytes.
    pub bytes: AtomicU64,
    /// A size the LUN has that the device could not take (no UPDATE_SIZE in this kernel's ublk);
    /// 0: none.
    pub pending: AtomicU64,
}

/// Re-reads the LUN's capacity (READ CAPACITY(16) on a channel of its own).
pub type ReadCapacity = Box<dyn FnMut() -> Result<Capacity, SessionError> + Send>;
/// The CAPACITY DATA HAS CHANGED unit attentions the device's queues have met so far.
pub type UnitAttentions = Box<dyn Fn() -> u64 + Send>;
/// Has the front end take a capacity that differs from the device's size (`old` bytes), for the
/// reason given; it updates `CapacityStatus::bytes` or `pending` and logs what it did. Err: the
/// capacity could not be applied (logged).
pub type Apply = Box<dyn FnMut(u64, &Capacity, &str) -> Result<(), ()> + Send>;

/// A device's capacity checks, started by [`Watch::spawn`].
pub struct Watch {
    /// The device, as its log lines name it (`/dev/ublkb3`).
    pub name: String,
    /// The device's logical block size, which a LUN cannot change under it.
    pub block_len: u32,
    /// Its size and counters.
    pub capacity: Arc<CapacityStatus>,
    /// See [`UnitAttentions`].
    pub unit_attentions: UnitAttentions,
    /// See [`ReadCapacity`].
    pub read: ReadCapacity,
    /// See [`Apply`].
    pub apply: Apply,
}

impl Watch {
    /// Starts the checks on a thread of their own; the flag it returns stops them.
    pub fn spawn(self) -> std::io::Result<Arc<AtomicBool>> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        std::thread::Builder::new()
            .name("capacity".into())
            .spawn(move || self.run(&stop2))?;
        Ok(stop)
    }

    fn run(mut self, stop: &AtomicBool) {
        let mut seen = (self.unit_attentions)();
        while !stop.load(Relaxed) {
            std::thread::sleep(POLL);
            let n = (self.unit_attentions)();
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

    /// One check: the capacity read, compared, and handed to the front end when it changed.
    fn check(&mut self, why: &str) -> Result<(), ()> {
        let dev = &self.name;
        let cap = match (self.read)() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("{dev}: capacity check ({why}) failed: {}", crate::Chain(&e));
                return Err(());
            }
        };
        let old = self.capacity.bytes.load(Relaxed);
        let new = cap.bytes().unwrap_or(0);
        if cap.block_len != self.block_len {
            tracing::error!(
                "{dev}: the LUN's logical block size is now {} bytes (was {}): a device cannot \
                 change it; stop it and start it again",
                cap.block_len,
                self.block_len
            );
            return Err(());
        }
        if new == old {
            tracing::info!("{dev}: capacity check ({why}): unchanged, {new} bytes");
            self.capacity.pending.store(0, Relaxed);
            return Ok(());
        }
        (self.apply)(old, &cap, why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn capacity(blocks: u64, block_len: u32) -> Capacity {
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&(blocks - 1).to_be_bytes());
        b[8..].copy_from_slice(&block_len.to_be_bytes());
        Capacity::parse(&b).expect("12 bytes")
    }

    /// A watch whose LUN has `read`'s capacities in turn, recording what it applied.
    fn watch(reads: Vec<Capacity>, status: Arc<CapacityStatus>) -> Arc<Mutex<Vec<(u64, u64)>>> {
        let applied = Arc::new(Mutex::new(Vec::new()));
        let log = applied.clone();
        let mut reads = reads.into_iter();
        let st = status.clone();
        let w = Watch {
            name: "test".into(),
            block_len: 512,
            capacity: status,
            unit_attentions: Box::new(|| 0),
            read: Box::new(move || Ok(reads.next().expect("a read asked for"))),
            apply: Box::new(move |old, cap, _| {
                let new = cap.bytes().unwrap_or(0);
                log.lock().unwrap().push((old, new));
                st.bytes.store(new, Relaxed);
                Ok(())
            }),
        };
        w.spawn().expect("the thread starts");
        applied
    }

    fn wait_for(status: &CapacityStatus, checks: u64, failures: u64) {
        let t = std::time::Instant::now();
        while status.checks.load(Relaxed) < checks || status.failures.load(Relaxed) < failures {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no check: {status:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_changed_capacity_is_applied_an_unchanged_one_is_not_and_a_new_block_size_fails() {
        let status = Arc::new(CapacityStatus::default());
        status.bytes.store(1 << 20, Relaxed);
        let applied = watch(
            vec![
                capacity(2048, 512),
                capacity(4096, 512),
                capacity(512, 4096),
            ],
            status.clone(),
        );
        status.check.store(true, Relaxed);
        wait_for(&status, 1, 0);
        assert!(
            applied.lock().unwrap().is_empty(),
            "unchanged: nothing applied"
        );
        status.check.store(true, Relaxed);
        wait_for(&status, 2, 0);
        assert_eq!(*applied.lock().unwrap(), vec![(1 << 20, 2 << 20)]);
        status.check.store(true, Relaxed);
        wait_for(&status, 2, 1);
        assert_eq!(
            applied.lock().unwrap().len(),
            1,
            "a new block size is not applied"
        );
        assert_eq!(status.bytes.load(Relaxed), 2 << 20);
    }
}
