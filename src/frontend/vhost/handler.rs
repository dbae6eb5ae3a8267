//! One VMM connection's vhost-user requests, answered for the [`Backend`] under rust-vmm
//! `vhost`'s request handler: the features, the memory table, the rings (each served by a thread
//! of its own waiting on the ring's kick, its worker's fd and an exit event), the configuration
//! space, and the inflight region ([`super::inflight`]), which vhost-user-backend's own handler
//! refuses: that is why this one exists.

use super::inflight::Inflight;
use super::worker::Vring;
use super::Backend;
use crate::path::{Connect, Path};
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserSingleMemoryRegion, VhostUserVirtioFeatures,
    VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{
    Backend as BackendChannel, Error as VuError, GpuBackend, Result as VuResult,
    VhostUserBackendReqHandlerMut,
};
use vhost::VhostUserMemoryRegionBase;
use vhost_user_backend::VringT;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::QueueT;
use vm_memory::GuestRegionMmap;
use vm_memory::{GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Where a memory region sits in the VMM's own address space: ring addresses come as the VMM's.
struct Mapping {
    vmm: u64,
    size: u64,
    gpa: u64,
}

const ID_EXIT: u64 = 0;
const ID_WORKER: u64 = 1;
const ID_KICK: u64 = 2;

/// A ring's thread and what it waits on.
struct QueueThread {
    epoll: Arc<Epoll>,
    exit: EventFd,
    /// The kick fd in the epoll now: there only while the ring is started and enabled.
    kick: Option<RawFd>,
    join: Option<JoinHandle<()>>,
}

/// One VMM connection (see the module documentation). Its threads end when it is dropped.
pub(super) struct Conn<C: Connect> {
    backend: Arc<Backend<C>>,
    owned: bool,
    acked_features: u64,
    acked_protocol: u64,
    mem: GuestMemoryAtomic<GuestMemoryMmap<()>>,
    mappings: Vec<Mapping>,
    vrings: Vec<Vring>,
    threads: Vec<QueueThread>,
    inflight: Option<Arc<Inflight>>,
}

fn io_err(e: impl std::error::Error + Send + Sync + 'static) -> VuError {
    VuError::ReqHandlerError(std::io::Error::other(e))
}

/// What this backend does not do; the VMM is told so.
fn unsupported<T>() -> VuResult<T> {
    Err(VuError::InvalidOperation("not supported by srp-ublk"))
}

impl<C: Connect + Send + 'static> Conn<C>
where
    Path<C>: Send,
{
    /// A connection's state and its rings' threads. What the last connection left with the
    /// target is answered first (or given up after a minute): its buffers are the guest's.
    pub(super) fn new(backend: Arc<Backend<C>>) -> std::io::Result<Conn<C>> {
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let queues = backend.workers.len();
        let mut vrings = Vec::with_capacity(queues);
        let mut threads = Vec::with_capacity(queues);
        for q in 0..queues {
            let vring =
                Vring::new(mem.clone(), backend.max_queue_size()).map_err(std::io::Error::other)?;
            // the last connection's requests are answered to no ring (a reconnecting VMM's
            // inflight region has them), but finished before this one's rings start
            let wfd = {
                let mut w = backend.worker(q);
                w.new_connection();
                w.fd()
            };
            backend.drain(q, &vring, "a new VMM connection takes the queue");
            let epoll = Arc::new(Epoll::new()?);
            let exit = EventFd::new(EFD_NONBLOCK)?;
            let ev = |id| EpollEvent::new(EventSet::IN, id);
            epoll.ctl(ControlOperation::Add, exit.as_raw_fd(), ev(ID_EXIT))?;
            epoll.ctl(ControlOperation::Add, wfd, ev(ID_WORKER))?;
            let (b, v, e) = (backend.clone(), vring.clone(), epoll.clone());
            let join = std::thread::Builder::new()
                .name(format!("vhost-q{q}"))
                .spawn(move || run(&b, q, &v, &e))?;
            vrings.push(vring);
            threads.push(QueueThread {
                epoll,
                exit,
                kick: None,
                join: Some(join),
            });
        }
        Ok(Conn {
            backend,
            owned: false,
            acked_features: 0,
            acked_protocol: 0,
            mem,
            mappings: Vec::new(),
            vrings,
            threads,
            inflight: None,
        })
    }

    fn vring(&self, index: u32) -> VuResult<&Vring> {
        self.vrings.get(index as usize).ok_or(VuError::InvalidParam)
    }

    /// The ring's kick in its thread's epoll while it is started and enabled, out otherwise.
    fn update_kick(&mut self, q: usize) -> VuResult<()> {
        let want = {
            let s = self.vrings[q].get_ref();
            let on = s.get_queue().ready() && s.is_enabled();
            s.get_kick().as_ref().filter(|_| on).map(|k| k.as_raw_fd())
        };
        let t = &mut self.threads[q];
        if t.kick == want {
            return Ok(());
        }
        if let Some(old) = t.kick.take() {
            // a kick fd replaced was closed, which took it out of the epoll already
            let _ = t
                .epoll
                .ctl(ControlOperation::Delete, old, EpollEvent::default());
        }
        if let Some(fd) = want {
            // level-triggered: a kick that came before the ring started wakes the thread now
            t.epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, ID_KICK),
                )
                .map_err(VuError::ReqHandlerError)?;
        }
        t.kick = want;
        Ok(())
    }

    /// A ring with its kick starts; with an inflight region, what an earlier backend took from it
    /// and never used is taken again first.
    fn start_if_ready(&mut self, q: usize) -> VuResult<()> {
        let waiting = {
            let s = self.vrings[q].get_ref();
            !s.get_queue().ready() && s.get_kick().is_some()
        };
        if !waiting {
            return Ok(());
        }
        if let Some(region) = &self.inflight {
            if let Some(state) = region.queue(q) {
                let (heads, counter) = state.resume(&self.vrings[q]).map_err(|e| {
                    tracing::error!("{e}");
                    io_err(e)
                })?;
                if !heads.is_empty() {
                    tracing::info!(
                        "queue {q}: {} request(s) the last backend took and did not answer are \
                         taken again",
                        heads.len()
                    );
                }
                self.backend.worker(q).track(region.clone(), heads, counter);
            }
        } else {
            tracing::info!(
                "queue {q}: the VMM gave no inflight region: a server that stops with requests \
                 outstanding leaves the next one no record of them (the ring resumes at its used \
                 index: one may be lost, another answered twice); stop the VM before the server"
            );
        }
        tracing::debug!("queue {q}: the ring starts");
        self.vrings[q].set_queue_ready(true);
        self.update_kick(q)
    }

    fn vmm_to_gpa(&self, va: u64) -> VuResult<u64> {
        self.mappings
            .iter()
            .find(|m| va >= m.vmm && va - m.vmm < m.size)
            .map(|m| va - m.vmm + m.gpa)
            .ok_or(VuError::InvalidParam)
    }
}

/// A ring's thread: a pass of its worker at each kick (while the ring is enabled) and each time
/// the worker's own fd is ready, until the exit event.
fn run<C: Connect>(backend: &Backend<C>, q: usize, vring: &Vring, epoll: &Epoll) {
    let mut evs = [EpollEvent::default(); 4];
    loop {
        let n = match epoll.wait(-1, &mut evs) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::error!("queue {q}: waiting for its events: {e}; the queue stops");
                return;
            }
        };
        let mut pass = false;
        for e in &evs[..n] {
            match e.data() {
                ID_EXIT => return,
                ID_KICK => pass |= vring.read_kick().unwrap_or(false),
                _ => pass = true,
            }
        }
        if pass {
            backend.pass(q, vring);
        }
    }
}

impl<C: Connect> Drop for Conn<C> {
    fn drop(&mut self) {
        for t in &mut self.threads {
            let _ = t.exit.write(1);
            if let Some(j) = t.join.take() {
                let _ = j.join();
            }
        }
    }
}

impl<C: Connect + Send + 'static> VhostUserBackendReqHandlerMut for Conn<C>
where
    Path<C>: Send,
{
    fn set_owner(&mut self) -> VuResult<()> {
        if self.owned {
            return Err(VuError::InvalidOperation("already claimed"));
        }
        self.owned = true;
        Ok(())
    }

    fn reset_owner(&mut self) -> VuResult<()> {
        self.owned = false;
        self.acked_features = 0;
        self.acked_protocol = 0;
        Ok(())
    }

    fn reset_device(&mut self) -> VuResult<()> {
        for q in 0..self.vrings.len() {
            self.vrings[q].set_enabled(false);
            self.update_kick(q)?;
        }
        self.acked_features = 0;
        Ok(())
    }

    fn get_features(&mut self) -> VuResult<u64> {
        Ok(self.backend.features())
    }

    fn set_features(&mut self, features: u64) -> VuResult<()> {
        let extra = features & !self.backend.features();
        if extra != 0 {
            // a VMM that reconnects keeps the features the guest acked from the last server
            tracing::warn!(
                "the VMM acked features the device does not offer ({extra:#x}): refused; is this \
                 the disk (LUN, options) the VM was started with?"
            );
            return Err(VuError::InvalidParam);
        }
        self.acked_features = features;
        // without PROTOCOL_FEATURES every ring is enabled at once (vhost-user's "Ring states")
        if features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() == 0 {
            for q in 0..self.vrings.len() {
                self.vrings[q].set_enabled(true);
                self.update_kick(q)?;
            }
        }
        let event_idx = features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        for v in &self.vrings {
            v.set_queue_event_idx(event_idx);
        }
        self.backend.set_event_idx(event_idx);
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        postcopy: Option<bool>,
    ) -> VuResult<Option<Vec<VhostUserMemoryRegionBase>>> {
        if postcopy.is_some() {
            return unsupported();
        }
        let mut regions = Vec::with_capacity(ctx.len());
        let mut mappings = Vec::with_capacity(ctx.len());
        for (r, file) in ctx.iter().zip(files) {
            let region =
                GuestRegionMmap::new(r.mmap_region(file)?, GuestAddress(r.guest_phys_addr))
                    .ok_or(VuError::InvalidParam)?;
            regions.push(region);
            mappings.push(Mapping {
                vmm: r.user_addr,
                size: r.memory_size,
                gpa: r.guest_phys_addr,
            });
        }
        // overlapping regions are refused here
        let mem = GuestMemoryMmap::from_regions(regions).map_err(io_err)?;
        super::check_regions(&mem).map_err(|e| {
            tracing::error!("{e}");
            io_err(e)
        })?;
        self.mem
            .lock()
            .map_err(|_| VuError::InvalidOperation("the memory table's lock is poisoned"))?
            .replace(mem);
        self.backend.take_memory(self.mem.memory().into_inner());
        self.mappings = mappings;
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> VuResult<()> {
        let max = u32::from(self.backend.max_queue_size());
        let vring = self.vring(index)?;
        if num == 0 || num > max {
            tracing::warn!("the VMM asked for {num} entries in ring {index}: refused (1 to {max})");
            return Err(VuError::InvalidParam);
        }
        vring.set_queue_size(num as u16);
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> VuResult<()> {
        let (desc, avail, used) = (
            self.vmm_to_gpa(descriptor)?,
            self.vmm_to_gpa(available)?,
            self.vmm_to_gpa(used)?,
        );
        let vring = self.vring(index)?;
        vring
            .set_queue_info(desc, avail, used)
            .map_err(|_| VuError::InvalidParam)?;
        // the used index is the guest's (after a guest reboot it starts again at 0)
        let idx = vring.queue_used_idx().map_err(|_| VuError::InvalidParam)?;
        vring.set_queue_next_used(idx);
        Ok(())
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> VuResult<()> {
        self.vring(index)?.set_queue_next_avail(base as u16);
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> VuResult<VhostUserVringState> {
        // the ring stops: the requests the target has are answered first
        self.vring(index)?.set_queue_ready(false);
        self.update_kick(index as usize)?;
        let vring = self.vring(index)?;
        self.backend.drain(index as usize, vring, "the ring stops");
        let next_avail = vring.queue_next_avail();
        vring.set_kick(None);
        vring.set_call(None);
        Ok(VhostUserVringState::new(index, u32::from(next_avail)))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let q = usize::from(index);
        let vring = self.vring(u32::from(index))?.clone();
        // the old kick leaves the epoll before its file closes: the new one may get its number,
        // and would then look watched already
        if let Some(old) = self.threads[q].kick.take() {
            let t = &self.threads[q];
            let _ = t
                .epoll
                .ctl(ControlOperation::Delete, old, EpollEvent::default());
        }
        vring.set_kick(fd);
        self.start_if_ready(q)?;
        self.update_kick(q)
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        self.vring(u32::from(index))?.set_call(fd);
        self.start_if_ready(usize::from(index))
    }

    fn set_vring_err(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        self.vring(u32::from(index))?.set_err(fd);
        Ok(())
    }

    fn get_protocol_features(&mut self) -> VuResult<VhostUserProtocolFeatures> {
        Ok(self.backend.protocol_features())
    }

    fn set_protocol_features(&mut self, features: u64) -> VuResult<()> {
        self.acked_protocol = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> VuResult<u64> {
        Ok(self.vrings.len() as u64)
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> VuResult<()> {
        if self.acked_features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() == 0 {
            return Err(VuError::InactiveFeature(
                VhostUserVirtioFeatures::PROTOCOL_FEATURES,
            ));
        }
        self.vring(index)?.set_enabled(enable);
        self.update_kick(index as usize)
    }

    fn get_config(&mut self, offset: u32, size: u32, _: VhostUserConfigFlags) -> VuResult<Vec<u8>> {
        Ok(self.backend.get_config(offset, size))
    }

    fn set_config(&mut self, offset: u32, buf: &[u8], _: VhostUserConfigFlags) -> VuResult<()> {
        self.backend.set_config(offset, buf);
        Ok(())
    }

    fn set_backend_req_fd(&mut self, _channel: BackendChannel) {}

    fn set_gpu_socket(&mut self, _gpu: GpuBackend) -> VuResult<()> {
        unsupported()
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> VuResult<File> {
        unsupported()
    }

    fn get_inflight_fd(&mut self, msg: &VhostUserInflight) -> VuResult<(VhostUserInflight, File)> {
        let (region, file) = Inflight::create(msg.num_queues, msg.queue_size, self.vrings.len())
            .map_err(|e| {
                tracing::error!("{e}");
                io_err(e)
            })?;
        let size = file.metadata().map_err(VuError::ReqHandlerError)?.len();
        self.inflight = Some(Arc::new(region));
        tracing::info!(
            "inflight region made for the VMM: {} queue(s) of {} entries, {size} bytes",
            msg.num_queues,
            msg.queue_size
        );
        let reply = VhostUserInflight {
            mmap_size: size,
            mmap_offset: 0,
            num_queues: msg.num_queues,
            queue_size: msg.queue_size,
        };
        Ok((reply, file))
    }

    fn set_inflight_fd(&mut self, msg: &VhostUserInflight, file: File) -> VuResult<()> {
        let region = Inflight::open(
            file,
            msg.mmap_offset,
            msg.mmap_size,
            msg.num_queues,
            msg.queue_size,
            self.vrings.len(),
        )
        .map_err(|e| {
            tracing::error!("{e}");
            io_err(e)
        })?;
        tracing::info!(
            "the VMM's inflight region: {} queue(s) of {} entries; requests taken and not \
             answered before are taken again when the rings start",
            msg.num_queues,
            msg.queue_size
        );
        self.inflight = Some(Arc::new(region));
        Ok(())
    }

    fn get_max_mem_slots(&mut self) -> VuResult<u64> {
        unsupported()
    }

    fn add_mem_region(
        &mut self,
        _region: &VhostUserSingleMemoryRegion,
        _fd: File,
        _postcopy: Option<bool>,
    ) -> VuResult<Option<VhostUserMemoryRegionBase>> {
        unsupported()
    }

    fn remove_mem_region(&mut self, _region: &VhostUserSingleMemoryRegion) -> VuResult<()> {
        unsupported()
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> VuResult<Option<File>> {
        unsupported()
    }

    fn check_device_state(&mut self) -> VuResult<()> {
        unsupported()
    }

    fn get_shmem_config(&mut self) -> VuResult<VhostUserShMemConfig> {
        unsupported()
    }

    fn set_log_base(&mut self, _log: &VhostUserLog, _file: File) -> VuResult<()> {
        unsupported()
    }
}
