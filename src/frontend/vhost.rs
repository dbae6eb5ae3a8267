//! vhost-user-blk: the LUN as a virtio-blk disk a VMM (QEMU's `vhost-user-blk-pci`,
//! cloud-hypervisor, crosvm) gives its guest, with no host block layer between the guest and the
//! target. Built on rust-vmm's `vhost` request handler (`handler::Conn`, with `vhost-user-backend`'s
//! rings): one thread per virtqueue, each owning its own SRP channel (`worker::Worker`), woken by
//! its queue's kick and by the worker's own epoll fd (the channel's completion channel and
//! connection manager, and a timer for the path's deadlines). The guest's memory is lent to each
//! queue's path when the VMM sends its memory table, so a request's data goes to the target from
//! the guest's own pages; the requests each queue has taken are marked in the VMM's inflight
//! region (`inflight`), so a backend started after this one takes again what this one left.

mod backend_req;
mod handler;
mod inflight;
mod request;
#[cfg(test)]
mod socket_tests;
#[cfg(test)]
mod tests;
mod translate;
mod worker;

#[cfg(feature = "test-utils")]
pub use translate::{fuzz_chain, fuzz_chain_at};
pub use worker::Counters;

use crate::channel::block::Geometry;
use crate::frontend::capacity::{CapacityStatus, ReadCapacity, Watch};
use crate::frontend::status::ExportStatus;
use crate::path::{Connect, Path};
use crate::session::Relogin;
use crate::wire::scsi::data::Capacity;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{BackendReqHandler, Error as VhostUserError, Listener};
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use worker::{Vring, Worker};

/// The longest a drain waits for its worker between passes (the worker's fd wakes it sooner).
const DRAIN_WAIT_MS: i32 = 10;

/// The most entries a virtqueue may have (what QEMU's `queue-size` allows).
const MAX_QUEUE_SIZE: u16 = 1024;

/// What the disk is, shared by the queues: fixed while it is served but for its size, which
/// follows the LUN's ([`Backend::watch_capacity`]).
#[derive(Debug)]
pub struct Device {
    /// Bytes.
    pub size: AtomicU64,
    /// The LUN's logical block size.
    pub block_size: u32,
    /// log2 of physical blocks per logical block (READ CAPACITY(16)'s LBPPBE).
    pub physical_exp: u8,
    /// The optimal transfer length in bytes (VPD B0), 0 when the LUN names none.
    pub opt_io: u32,
    /// Writes refused.
    pub read_only: bool,
    /// The LUN's block mapping (what FLUSH becomes).
    pub geo: Geometry,
    /// GET_ID's answer: the LUN's serial, at most 20 bytes.
    pub serial: Vec<u8>,
    /// The largest request the queues' own buffers take (the copied ones).
    pub max_io: u32,
    /// Segments per request (virtio's seg_max) and bytes per segment (size_max).
    pub seg_max: u32,
    /// See `seg_max`.
    pub size_max: u32,
    /// The largest DISCARD in 512-byte sectors (UNMAP's limit); 0: not offered (no UNMAP).
    pub max_discard: u32,
    /// The largest WRITE_ZEROES in sectors (WRITE SAME's limit); 0: not offered (no WRITE SAME).
    pub max_write_zeroes: u32,
    /// WRITE_ZEROES may deallocate (WRITE SAME with UNMAP, reading back zeros).
    pub write_zeroes_may_unmap: bool,
}

/// The guest's memory table as the VMM last sent it, with a generation each worker compares
/// (an atomic load per pass; the lock only when it moved).
#[derive(Default)]
struct GuestMem {
    gen: AtomicU64,
    mem: Mutex<Option<Arc<GuestMemoryMmap<()>>>>,
}

/// The backend the daemon serves: the device and a worker per queue (each over a path that logs
/// in with `C`: the RDMA session in production, the fake target in tests).
pub struct Backend<C: Connect = Relogin> {
    dev: Arc<Device>,
    workers: Vec<Mutex<Worker<C>>>,
    outstanding: Vec<Arc<AtomicU16>>,
    mem: GuestMem,
    event_idx: AtomicBool,
    status: Arc<ExportStatus>,
    /// The connected VMM's backend channel, when it gave one ([`backend_req`]).
    channel: Arc<Mutex<Option<UnixStream>>>,
    capacity: Arc<CapacityStatus>,
}

/// A memory table region the backend refuses.
#[derive(Debug, thiserror::Error)]
#[error(
    "the VMM's memory region {index} (guest address {gpa:#x}, {len} bytes at offset {offset} of \
     its file) lies past the end of that file ({file_len} bytes): refused (a guest access there \
     would kill the server); the VMM's connection is ended"
)]
pub struct RegionPastEof {
    /// Its place in the table.
    pub index: usize,
    /// Its guest physical address.
    pub gpa: u64,
    /// Its length.
    pub len: u64,
    /// Where it starts in its file.
    pub offset: u64,
    /// The file's length.
    pub file_len: u64,
}

/// Checks that every file-backed region of a memory table lies inside its file: a mapping past a
/// file's end is made without complaint, and the first access there is SIGBUS.
fn check_regions(mem: &GuestMemoryMmap<()>) -> Result<(), RegionPastEof> {
    for (index, r) in mem.iter().enumerate() {
        let Some(f) = r.file_offset() else { continue };
        let file_len = f.file().metadata().map_or(0, |m| m.len());
        let (offset, len) = (f.start(), r.len());
        if offset.checked_add(len).is_none_or(|end| end > file_len) {
            return Err(RegionPastEof {
                index,
                gpa: r.start_addr().0,
                len,
                offset,
                file_len,
            });
        }
    }
    Ok(())
}

/// What went wrong serving.
#[derive(Debug, thiserror::Error)]
pub enum VhostError {
    /// A worker's epoll or timer could not be made.
    #[error("setting up queue {queue}'s event loop")]
    Worker {
        /// The queue.
        queue: usize,
        /// The system call's error.
        #[source]
        source: std::io::Error,
    },
    /// A VMM connection's queue threads could not be started.
    #[error("starting the queue threads of a VMM's connection")]
    Connection(#[source] std::io::Error),
    /// The socket could not be made.
    #[error(transparent)]
    Socket(#[from] crate::frontend::socket::SocketError),
    /// The vhost-user daemon failed.
    #[error("vhost-user on {path}: {detail}")]
    Daemon {
        /// The socket.
        path: String,
        /// What vhost-user-backend said (its error type is not `std::error::Error` + Sync).
        detail: String,
    },
}

impl<C: Connect> Backend<C> {
    /// A backend over `paths`, one per queue.
    pub fn new(dev: Device, paths: Vec<Path<C>>) -> Result<Backend<C>, VhostError> {
        let dev = Arc::new(dev);
        let capacity = Arc::new(CapacityStatus::default());
        capacity.bytes.store(dev.size.load(Relaxed), Relaxed);
        let status = Arc::new(ExportStatus::new(paths.len()));
        let mut workers = Vec::new();
        for (queue, p) in paths.into_iter().enumerate() {
            let w = Worker::new(queue as u16, p, dev.clone(), status.clone())
                .map_err(|source| VhostError::Worker { queue, source })?;
            workers.push(w);
        }
        Ok(Backend {
            outstanding: workers.iter().map(|w| w.outstanding.clone()).collect(),
            workers: workers.into_iter().map(Mutex::new).collect(),
            dev,
            mem: GuestMem::default(),
            event_idx: AtomicBool::new(false),
            status,
            channel: Arc::default(),
            capacity,
        })
    }

    /// The VMM connections and each queue's counters, for `srp-ublk list` and `stats`.
    pub fn status(&self) -> Arc<ExportStatus> {
        self.status.clone()
    }

    /// The disk's size and its capacity checks (SIGHUP asks for one).
    pub fn capacity(&self) -> Arc<CapacityStatus> {
        self.capacity.clone()
    }

    /// Starts the disk's capacity checks ([`crate::frontend::capacity`]): `read` re-reads the
    /// LUN's capacity when a queue meets CAPACITY DATA HAS CHANGED or a check is asked for; a new
    /// one becomes the disk's size, and the connected VMM is told its configuration changed (it
    /// reads it again and interrupts the guest, which then sees the new size). The flag returned
    /// stops the checks.
    pub fn watch_capacity(
        &self,
        name: String,
        read: ReadCapacity,
    ) -> std::io::Result<Arc<AtomicBool>> {
        let status = self.status.clone();
        let log_name = name.clone();
        let (dev, capacity, channel) = (
            self.dev.clone(),
            self.capacity.clone(),
            self.channel.clone(),
        );
        let apply = move |old: u64, cap: &Capacity, why: &str| {
            let new = cap.bytes().unwrap_or(0);
            // shrinking, the queues refuse what lies past the new end from now on
            dev.size.store(new, Relaxed);
            capacity.bytes.store(new, Relaxed);
            let told = channel
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(backend_req::send_config_change);
            match told {
                Some(Ok(())) => tracing::warn!(
                    "{name}: resized from {old} to {new} bytes ({why}); the VMM is told, and the \
                     guest sees the new size"
                ),
                Some(Err(e)) => tracing::warn!(
                    "{name}: resized from {old} to {new} bytes ({why}), but the VMM's backend \
                     channel failed ({e}): the guest sees the new size once its VMM reconnects"
                ),
                None => tracing::warn!(
                    "{name}: resized from {old} to {new} bytes ({why}); no VMM that takes \
                     configuration changes (VHOST_USER_PROTOCOL_F_BACKEND_REQ) is connected: a \
                     guest sees the new size when its VMM next connects"
                ),
            }
            Ok(())
        };
        Watch {
            name: log_name,
            block_len: self.dev.block_size,
            capacity: self.capacity.clone(),
            unit_attentions: Box::new(move || {
                status
                    .queues
                    .iter()
                    .map(|q| q.capacity_changed.load(Relaxed))
                    .sum()
            }),
            read,
            apply: Box::new(apply),
        }
        .spawn()
    }

    /// Looks at the connection's next message before the request handler takes it, keeping the
    /// backend channel a SET_BACKEND_REQ_FD gives ([`backend_req`]); each message's name is in
    /// the debug log (the control path only: no message comes per I/O).
    fn look_at_next_message(&self, sock: &UnixStream) {
        match backend_req::peek(sock) {
            Ok(p) => {
                if let Some(r) = p.request {
                    match FrontendReq::try_from(r) {
                        Ok(req) => tracing::debug!("the VMM sends {req:?}"),
                        Err(_) => tracing::debug!("the VMM sends request {r}, unknown"),
                    }
                }
                if let Some(ch) = p.channel {
                    *self.channel.lock().unwrap_or_else(|e| e.into_inner()) = Some(ch);
                }
            }
            // the handler meets the same error on its read and ends the connection
            Err(e) => tracing::debug!("looking at the VMM's next message: {e}"),
        }
    }

    fn worker(&self, q: usize) -> std::sync::MutexGuard<'_, Worker<C>> {
        self.workers[q].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The virtio-blk configuration space (`struct virtio_blk_config`, little-endian).
    fn config(&self) -> Vec<u8> {
        let d = &self.dev;
        let mut c = vec![0u8; std::mem::size_of::<virtio_blk_config>()];
        c[0..8].copy_from_slice(&(d.size.load(Relaxed) / 512).to_le_bytes());
        c[8..12].copy_from_slice(&d.size_max.to_le_bytes());
        c[12..16].copy_from_slice(&d.seg_max.to_le_bytes());
        c[20..24].copy_from_slice(&d.block_size.to_le_bytes());
        c[24] = d.physical_exp;
        c[26..28].copy_from_slice(&1u16.to_le_bytes());
        c[28..32].copy_from_slice(&(d.opt_io / d.block_size).to_le_bytes());
        // writeback: the LUN's volatile cache (a guest then sends FLUSH; without one a completed
        // write is durable)
        c[32] = u8::from(d.geo.cache.flushes());
        c[34..36].copy_from_slice(&(self.workers.len() as u16).to_le_bytes());
        // one range per request; a discard aligned to the logical block
        let sectors_per_block = d.block_size / 512;
        c[36..40].copy_from_slice(&d.max_discard.to_le_bytes());
        c[40..44].copy_from_slice(&1u32.to_le_bytes());
        c[44..48].copy_from_slice(&sectors_per_block.to_le_bytes());
        c[48..52].copy_from_slice(&d.max_write_zeroes.to_le_bytes());
        c[52..56].copy_from_slice(&1u32.to_le_bytes());
        c[56] = u8::from(d.write_zeroes_may_unmap);
        c
    }
}

impl<C: Connect> Backend<C> {
    fn max_queue_size(&self) -> u16 {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        let mut f = 1 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_INDIRECT_DESC
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | 1 << VIRTIO_BLK_F_SIZE_MAX
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_BLK_F_BLK_SIZE
            | 1 << VIRTIO_BLK_F_TOPOLOGY
            | 1 << VIRTIO_BLK_F_FLUSH
            | 1 << VIRTIO_BLK_F_CONFIG_WCE
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if self.workers.len() > 1 {
            f |= 1 << VIRTIO_BLK_F_MQ;
        }
        if self.dev.read_only {
            f |= 1 << VIRTIO_BLK_F_RO;
        }
        if self.dev.max_discard > 0 && !self.dev.read_only {
            f |= 1 << VIRTIO_BLK_F_DISCARD;
        }
        if self.dev.max_write_zeroes > 0 && !self.dev.read_only {
            f |= 1 << VIRTIO_BLK_F_WRITE_ZEROES;
        }
        f
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::INFLIGHT_SHMFD
            | VhostUserProtocolFeatures::BACKEND_REQ
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Relaxed);
    }

    fn set_config(&self, offset: u32, buf: &[u8]) {
        // the writeback byte is the only writable field; the LUN's cache is the target's to set
        // (MODE SELECT), so the byte keeps the LUN's value (a Linux guest reads it back after
        // writing it)
        if offset == 32 && buf.first() != Some(&u8::from(self.dev.geo.cache.flushes())) {
            tracing::warn!(
                "the guest asked to turn the LUN's write cache {}: that is the target's setting, \
                 left as it is",
                if buf.first() == Some(&0) { "off" } else { "on" }
            );
        }
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let mut c = self.config();
        c.resize((offset + size) as usize, 0);
        c[offset as usize..].to_vec()
    }

    /// A memory table the connection checked: the queues lend it to their paths at their next
    /// pass.
    fn take_memory(&self, m: Arc<GuestMemoryMmap<()>>) {
        // a table comes at each connection and whenever the guest's memory changes (hot-plug)
        let bytes: u64 = m.iter().map(|r| r.len()).sum();
        tracing::info!(
            "the VMM's memory table: {} region(s), {} MiB; the queues register it before their \
             next request",
            m.num_regions(),
            bytes >> 20
        );
        *self.mem.mem.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
        self.mem.gen.fetch_add(1, Relaxed);
    }

    /// Serves queue `q`'s completions until it has nothing with the target (a minute at most):
    /// the VMM stops the ring (GET_VRING_BASE, which must come after the ring's last used
    /// entry), or a new connection is to take over the guest's buffers; `why` says which, for the
    /// log. `vring` is not taken from: it is stopped, or not started yet.
    fn drain(&self, q: usize, vring: &Vring, why: &str) {
        let Some(out) = self.outstanding.get(q) else {
            return;
        };
        let n = out.load(Relaxed);
        if n == 0 {
            return;
        }
        tracing::debug!("queue {q}: {why}: waiting for {n} request(s) the target has");
        let deadline = Instant::now() + Duration::from_secs(60);
        while out.load(Relaxed) > 0 && Instant::now() < deadline {
            self.pass(q, vring);
            // each pass ends with the completion channel armed and the next deadline on the timer
            self.worker(q).wait(DRAIN_WAIT_MS);
        }
        match out.load(Relaxed) {
            0 => tracing::debug!("queue {q}: the target answered what it had"),
            n => tracing::warn!(
                "queue {q}: {n} request(s) still with the target after a minute; going on \
                 without waiting for them"
            ),
        }
    }

    /// One pass of queue `q`'s worker over its ring (the memory table lent first when it moved).
    fn pass(&self, q: usize, vring: &Vring) {
        let gen = self.mem.gen.load(Relaxed);
        let mut w = self.worker(q);
        let mem = w.needs_memory(gen).then(|| {
            let m = self.mem.mem.lock().unwrap_or_else(|e| e.into_inner());
            (gen, m.clone())
        });
        w.pass(vring, mem);
    }
}

/// Serves the backend on the vhost-user socket `path` (made as an NBD export's is: private, or
/// open to `group`; a stale socket replaced, nothing else), one VMM connection after another,
/// until the process ends; `ready` runs once the socket listens.
pub fn serve<C: Connect + Send + 'static>(
    path: &std::path::Path,
    group: Option<u32>,
    backend: Arc<Backend<C>>,
    ready: impl FnOnce(),
) -> Result<(), VhostError>
where
    Path<C>: Send,
{
    let err = |detail: String| VhostError::Daemon {
        path: path.display().to_string(),
        detail,
    };
    let listener = Listener::from(crate::frontend::socket::bind_unix(path, group)?);
    ready();
    let queues = backend.workers.len();
    loop {
        let stream = match listener.accept() {
            Ok(Some(s)) => s,
            Ok(None) => continue,
            Err(e) => return Err(err(format!("accepting a VMM: {e}"))),
        };
        tracing::info!("a VMM connected to {}", path.display());
        // no memory table until the VMM sends its own, no backend channel until it gives one
        *backend.mem.mem.lock().unwrap_or_else(|e| e.into_inner()) = None;
        backend.mem.gen.fetch_add(1, Relaxed);
        let peek = stream.try_clone().map_err(VhostError::Connection)?;
        let conn = handler::Conn::new(backend.clone()).map_err(VhostError::Connection)?;
        let mut requests = BackendReqHandler::from_stream(stream, Arc::new(Mutex::new(conn)));
        let ended = {
            let _counted = backend.status.connected();
            loop {
                backend.look_at_next_message(&peek);
                if let Err(e) = requests.handle_request() {
                    break e;
                }
            }
        };
        // the connection's threads end with it
        drop(requests);
        *backend.channel.lock().unwrap_or_else(|e| e.into_inner()) = None;
        match ended {
            VhostUserError::Disconnected | VhostUserError::PartialMessage => {
                tracing::info!("the VMM disconnected from {} ({ended})", path.display())
            }
            e => tracing::warn!("the VMM's connection on {} ended: {e}", path.display()),
        }
        for q in 0..queues {
            let c = backend.worker(q).counters();
            tracing::info!(
                "queue {q}: {} requests, {} MiB zero copy, {} MiB copied, {} errors, {} in several segments",
                c.requests,
                c.zero_copy_bytes >> 20,
                c.copied_bytes >> 20,
                c.errors,
                c.indirect
            );
        }
    }
}
