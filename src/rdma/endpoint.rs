//! One SRP channel's RDMA resources: CM id and event channel, PD, completion channel, CQ, RC QP, the
//! IU region (send slots + receive buffers) and the registered data buffers. Created by
//! [`Endpoint::connect`], owned by one thread at a time, freed in order by `Drop`.
//!
//! Facts from the userspace login prototype (shared/lab/userspace-login/NOTES.md) this relies on:
//! the RDMA/CM private data is exactly the 56-byte login; the CM's private_data_len is the whole
//! REP/REJ area, so the answer is recognised by its opcode and copied before the event is acked;
//! receives are posted before `rdma_connect`; a remote disconnect does not flush our QP, so teardown
//! always calls `rdma_disconnect` (QP to error) and drains the CQ before destroying anything.

use super::mem::{Domain, Registration};
use super::{sockaddr, RdmaError};
use crate::channel::{DataBuf, Post, TransportError};
use crate::wire::srp::{
    parse_login_reply, BufFormats, LoginRej, LoginReply, LoginReq, LoginRsp, MultiChannelAction,
};
use crate::wire::target::{RkeyScope, TargetSpec, Transport as Route, DEFAULT_INITIATOR_EXT};
use rdma_sys::*;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr::null_mut;
use std::time::Duration;

mod cm;
mod teardown;
mod transport;
mod window;

pub(crate) use cm::{event_name, set_nonblocking};
#[cfg(feature = "lab-target")]
pub(crate) use cm::{take_event, wait_readable, CmEvent};
use transport::port_state;
use window::data_access;

const WR_SEND: u64 = 1 << 32;
const WR_RECV: u64 = 2 << 32;
const WR_WINDOW: u64 = 4 << 32;
/// IB CM reject reason for a consumer-defined reject (an SRP_LOGIN_REJ is in the private data).
const IB_CM_REJ_CONSUMER_DEFINED: i32 = 28;
const SCRATCH_BYTES: usize = 64 * 1024;

/// What one channel's login needs.
#[derive(Clone, Debug)]
pub struct ConnectParams {
    /// The target.
    pub target: TargetSpec,
    /// SINGLE for a session's first channel, MULTI for the others.
    pub multi: MultiChannelAction,
    /// `req_it_iu_len`: the largest IU we will send (68 + immediate data).
    pub req_it_iu_len: u32,
    /// Ask for immediate data.
    pub immediate: bool,
    /// Send slots (ublk depth + extra slots): the send queue size.
    pub send_slots: u16,
    /// Bytes per send slot (IU headers only; immediate data is gathered from the data buffer).
    pub send_size: u32,
    /// Receive buffers to post.
    pub nr_recv: u16,
    /// Bytes per receive buffer (must cover the target's max_ti_iu_len).
    pub recv_size: u32,
    /// Transport retry count (tl_retry_count).
    pub retry_count: u8,
    /// Completion vector.
    pub comp_vector: i32,
    /// Limit for each CM step.
    pub timeout: Duration,
    /// How long the target may reach a data buffer.
    pub rkey_scope: RkeyScope,
    /// The most data segments one command may have (the send queue holds their windows'
    /// work requests).
    pub max_segments: u16,
    /// The most tags the channel's commands may name (each binds its windows by its tag): the
    /// devices' depths together when the channel serves several; 0: the send slots.
    pub tags: u16,
}

/// A route whose IPv6 destination is scoped by an interface's name (`dest=[fe80::1%eth0]:5555`)
/// with the interface's index looked up now, as ib_srp does when it parses the string; `None` when
/// there is nothing to look up.
fn with_scope(route: &Route) -> Result<Option<Route>, RdmaError> {
    let Route::RdmaCm {
        dest: SocketAddr::V6(d),
        src,
        dest_if: Some(name),
    } = *route
    else {
        return Ok(None);
    };
    let index =
        nix::net::if_::if_nametoindex(name.as_str()).map_err(|e| RdmaError::NoInterface {
            name: name.to_string(),
            detail: e.to_string(),
        })?;
    let mut d = d;
    d.set_scope_id(index);
    Ok(Some(Route::RdmaCm {
        dest: SocketAddr::V6(d),
        src,
        dest_if: Some(name),
    }))
}

/// How a login travels: the CM port space, the addresses, and which form of the login is the private
/// data. RDMA/CM (`dest=`): RDMA_PS_TCP, IP addresses, the 56-byte `srp_login_req_rdma` (the CM adds a
/// 36-byte header). IB CM (`dgid, pkey, service_id`) through librdmacm's AF_IB: RDMA_PS_IB, a
/// `sockaddr_ib` naming the GID, P_Key and SRP service id, and the full 64-byte SRP_LOGIN_REQ (no CM
/// header). The IB form needs an InfiniBand fabric, so only its bytes are tested here.
struct LoginPlan {
    port_space: rdma_port_space::Type,
    dst: libc::sockaddr_storage,
    src: Option<libc::sockaddr_storage>,
    ib: bool,
}

impl LoginPlan {
    fn for_route(route: &Route) -> Self {
        match *route {
            Route::RdmaCm { dest, src, .. } => LoginPlan {
                port_space: rdma_port_space::RDMA_PS_TCP,
                dst: sockaddr::ip_sockaddr(dest),
                src: src.map(|ip| sockaddr::ip_sockaddr(SocketAddr::new(ip, 0))),
                ib: false,
            },
            Route::IbCm {
                dgid,
                pkey,
                service_id,
            } => LoginPlan {
                port_space: sockaddr::RDMA_PS_IB,
                dst: sockaddr::ib_storage(&sockaddr::ib_sockaddr(dgid, pkey, service_id)),
                src: None,
                ib: true,
            },
        }
    }

    fn private_data(&self, login: &LoginReq) -> Vec<u8> {
        if self.ib {
            login.encode_ib().to_vec()
        } else {
            login.encode_rdma().to_vec()
        }
    }
}

/// A connected, logged-in SRP channel's RDMA resources.
pub struct Endpoint {
    ec: *mut rdma_event_channel,
    id: *mut rdma_cm_id,
    /// The device's protection domain, shared with the daemon's other channels on it.
    domain: Option<std::sync::Arc<Domain>>,
    comp: *mut ibv_comp_channel,
    /// Receives: armed before every sleep (a response wakes the queue).
    recv_cq: *mut ibv_cq,
    /// SENDs (and failed window requests): polled every pass, armed only when the engine asks
    /// (a command waits for a slot, or a lone command's SEND is its early wake-up), so a SEND
    /// completion alone does not wake a busy queue (ib_srp's send CQ never does).
    send_cq: *mut ibv_cq,
    /// Whether each CQ (receive, send) is armed and its event not read yet: arming one that is
    /// costs a system call on rxe and changes nothing.
    armed: [bool; 2],
    iu_mr: *mut ibv_mr,
    scratch_mr: *mut ibv_mr,
    /// The data buffers' registration this login binds windows to (the path holds it too).
    data: Option<Registration>,
    iu: Box<[u8]>,
    scratch: Box<[u8]>,
    send_size: usize,
    nr_send: u16,
    /// Windows per segment level: one per tag ([`ConnectParams::tags`]).
    nr_windows: u16,
    /// The most data segments of one command ([`ConnectParams::max_segments`]).
    max_segs: u16,
    recv_size: usize,
    nr_recv: u16,
    raw_wcs: Vec<ibv_wc>,
    /// Work requests queued for one post (see [`Post::flush_sends`]).
    chain: Vec<transport::Queued>,
    /// The send queue's size in work requests: the chain is posted when it holds this many.
    send_wrs: usize,
    /// A post that failed where no caller could be told (a window's invalidation): the next
    /// flush reports it.
    post_failed: Option<TransportError>,
    /// How long the target may reach a data buffer.
    scope: RkeyScope,
    /// One memory window per send slot (command scope; empty for login scope).
    windows: Vec<window::Window>,
    qp_created: bool,
    connected: bool,
    quiesced: bool,
    closed: bool,
    login: Option<LoginRsp>,
    dest: SocketAddr,
    device: String,
    /// The local port the route chose (its state says whether the link is up).
    port: u8,
    port_guid: u64,
    /// The device's uverbs node in sysfs (`/sys/class/infiniband_verbs/uverbsN`): it goes first
    /// when the device is removed.
    dev_path: std::path::PathBuf,
}

// SAFETY: the verbs and CM objects behind these pointers may be used from any thread (libibverbs and
// librdmacm are thread-safe); an Endpoint is owned and used by one thread at a time (it is moved from
// the thread that logs in to the queue thread that runs it, never shared), and its buffers are owned.
unsafe impl Send for Endpoint {}

impl Endpoint {
    fn empty(dest: SocketAddr) -> Self {
        Endpoint {
            ec: null_mut(),
            id: null_mut(),
            domain: None,
            comp: null_mut(),
            recv_cq: null_mut(),
            send_cq: null_mut(),
            armed: [false; 2],
            iu_mr: null_mut(),
            scratch_mr: null_mut(),
            data: None,
            iu: Box::new([]),
            scratch: Box::new([]),
            send_size: 0,
            nr_send: 0,
            nr_windows: 0,
            max_segs: 1,
            recv_size: 0,
            nr_recv: 0,
            raw_wcs: Vec::new(),
            chain: Vec::new(),
            send_wrs: 0,
            post_failed: None,
            scope: RkeyScope::default(),
            windows: Vec::new(),
            qp_created: false,
            connected: false,
            quiesced: false,
            closed: false,
            login: None,
            dest,
            device: String::new(),
            port: 0,
            port_guid: 0,
            dev_path: std::path::PathBuf::new(),
        }
    }

    /// An endpoint that never logged in: closed, holding nothing. A channel put on one starts
    /// down and gets its first real endpoint from a reconnect -- the daemon that takes a device
    /// over after its RDMA device went away ([`crate::session::detached_channels`]) begins so.
    pub fn detached(device: &str) -> Endpoint {
        let mut ep = Endpoint::empty(SocketAddr::from(([0, 0, 0, 0], 0)));
        ep.closed = true;
        ep.device = device.to_string();
        ep
    }

    /// Logs one channel in. Blocks for at most a few times `p.timeout`.
    pub fn connect(p: &ConnectParams) -> Result<Endpoint, RdmaError> {
        let scoped;
        let p = match with_scope(&p.target.transport)? {
            Some(t) => {
                scoped = ConnectParams {
                    target: crate::wire::target::TargetSpec {
                        transport: t,
                        ..p.target.clone()
                    },
                    ..p.clone()
                };
                &scoped
            }
            None => p,
        };
        let dest = match p.target.transport {
            Route::RdmaCm { dest, .. } => dest,
            // IB CM targets have no IP address; messages name them 0.0.0.0:0
            Route::IbCm { .. } => SocketAddr::from(([0, 0, 0, 0], 0)),
        };
        let mut ep = Endpoint::empty(dest);
        let r = {
            let _l = super::lifecycle();
            ep.open(p)
        };
        // a failed login is torn down (by the drop) outside the lock, which close() takes
        r.map(|_| ep)
    }

    fn open(&mut self, p: &ConnectParams) -> Result<(), RdmaError> {
        let plan = LoginPlan::for_route(&p.target.transport);
        self.create_id(&plan)?;
        let (ctx, port) = self.resolve(&plan, p.timeout)?;
        self.note_port(ctx, port)?;
        self.scope = p.rkey_scope;
        self.create_queues(ctx, p)?;
        self.post_ius(p)?;
        self.log_in(p, &plan)
    }

    /// The CM event channel (non-blocking) and id.
    fn create_id(&mut self, plan: &LoginPlan) -> Result<(), RdmaError> {
        // SAFETY: plain constructor; null is checked.
        self.ec = unsafe { rdma_create_event_channel() };
        if self.ec.is_null() {
            return Err(RdmaError::Os {
                op: "rdma_create_event_channel",
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "{} (is rdma_ucm loaded and /dev/infiniband/rdma_cm present?)",
                        std::io::Error::last_os_error()
                    ),
                ),
            });
        }
        // SAFETY: ec is a valid event channel (checked above).
        set_nonblocking(unsafe { (*self.ec).fd })?;
        let mut id = null_mut();
        // SAFETY: ec is valid; id is an out-parameter.
        if unsafe { rdma_create_id(self.ec, &mut id, null_mut(), plan.port_space) } != 0 {
            return Err(RdmaError::os("rdma_create_id"));
        }
        self.id = id;
        Ok(())
    }

    /// Resolves the address and route; returns the device context and port the route chose.
    fn resolve(
        &mut self,
        plan: &LoginPlan,
        tmo: Duration,
    ) -> Result<(*mut ibv_context, u8), RdmaError> {
        let dest = self.dest;
        let tmo_ms = tmo.as_millis().min(i32::MAX as u128) as i32;
        self.resolve_addr(plan, tmo)?;
        // SAFETY: id is valid and its address is resolved.
        if unsafe { rdma_resolve_route(self.id, tmo_ms) } != 0 {
            return Err(RdmaError::Unreachable {
                dest,
                detail: format!("rdma_resolve_route: {}", std::io::Error::last_os_error()),
            });
        }
        self.expect_event(
            "route resolution",
            rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
            tmo,
        )?;

        // the device and port the route chose: every verbs object goes on this context
        // SAFETY: after ROUTE_RESOLVED, id->verbs and id->port_num are set by librdmacm.
        let (ctx, port) = unsafe { ((*self.id).verbs, (*self.id).port_num) };
        if ctx.is_null() {
            return Err(RdmaError::Unreachable {
                dest,
                detail: "no RDMA device on the route".into(),
            });
        }
        Ok((ctx, port))
    }

    /// Notes the device and port the route chose (for messages, removal and link checks) and its
    /// GUID (the initiator port id); a port that is down fails the login at once.
    fn note_port(&mut self, ctx: *mut ibv_context, port: u8) -> Result<(), RdmaError> {
        let dest = self.dest;
        // SAFETY: ctx is a valid device context whose device's dev_path is a NUL-terminated array.
        self.dev_path = unsafe {
            let p = std::ffi::CStr::from_ptr((*(*ctx).device).dev_path.as_ptr());
            std::path::PathBuf::from(p.to_string_lossy().into_owned())
        };
        // SAFETY: ctx is a valid device context; ibv_get_device_name returns a static C string.
        self.device = unsafe {
            let name = ibv_get_device_name((*ctx).device);
            if name.is_null() {
                String::from("?")
            } else {
                std::ffi::CStr::from_ptr(name)
                    .to_string_lossy()
                    .into_owned()
            }
        };
        // A login sent through a port that is down goes nowhere, and CM messages sent while the
        // port is down can leave the port's CM unable to log anyone in later (seen with rxe): say so
        // and let the caller try again later.
        if let Some(state) = port_state(&self.device, port) {
            if !state.contains("ACTIVE") {
                return Err(RdmaError::Unreachable {
                    dest,
                    detail: format!("local RDMA port {}/{port} is {state}", self.device),
                });
            }
        }
        // SAFETY: ibv_gid is a plain union of bytes; all-zero is valid.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: ctx/port are valid; gid is an out-parameter.
        if unsafe { ibv_query_gid(ctx, port, 0, &mut gid) } != 0 {
            return Err(RdmaError::os("ibv_query_gid"));
        }
        // SAFETY: reading the raw bytes of the union is always valid.
        let raw = unsafe { gid.raw };
        self.port_guid = u64::from_be_bytes(raw[8..16].try_into().expect("8 bytes"));
        self.port = port;

        Ok(())
    }

    /// The PD, completion channel (non-blocking), CQ and RC QP on the route's device.
    fn create_queues(&mut self, ctx: *mut ibv_context, p: &ConnectParams) -> Result<(), RdmaError> {
        // SAFETY: id is valid and its route resolved (ctx is its device's context).
        let domain = unsafe { Domain::of(self.id, &self.device) }?;
        let pd = domain.pd();
        self.domain = Some(domain);
        // SAFETY: ctx is valid.
        self.comp = unsafe { ibv_create_comp_channel(ctx) };
        if self.comp.is_null() {
            return Err(RdmaError::os("ibv_create_comp_channel"));
        }
        // SAFETY: comp is valid.
        set_nonblocking(unsafe { (*self.comp).fd })?;
        self.max_segs = p.max_segments.max(1);
        self.send_wrs =
            usize::from(p.send_slots) * window::wrs_per_command(p.rkey_scope, self.max_segs);
        for (cq, cqe) in [
            (&mut self.send_cq, self.send_wrs as i32),
            (&mut self.recv_cq, i32::from(p.nr_recv)),
        ] {
            // SAFETY: ctx and comp are valid; cq_context is unused (null).
            *cq = unsafe { ibv_create_cq(ctx, cqe, null_mut(), self.comp, p.comp_vector) };
            if cq.is_null() {
                return Err(RdmaError::os("ibv_create_cq"));
            }
        }
        // SAFETY: ibv_qp_init_attr is a plain C struct; all-zero is a valid starting value.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = self.send_cq;
        attr.recv_cq = self.recv_cq;
        attr.cap.max_send_wr = self.send_wrs as u32;
        attr.cap.max_recv_wr = u32::from(p.nr_recv);
        attr.cap.max_send_sge = 2;
        attr.cap.max_recv_sge = 1;
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        // SENDs ask for their completion; window requests report only failures
        attr.sq_sig_all = 0;
        // SAFETY: id (route resolved), pd (on id's device) and attr (with a valid CQ) are valid.
        if unsafe { rdma_create_qp(self.id, pd, &mut attr) } != 0 {
            return Err(RdmaError::os("rdma_create_qp"));
        }
        self.qp_created = true;

        Ok(())
    }

    /// The IU region and the scratch buffer, registered, with every receive posted (before the
    /// connect: the target may send as soon as it accepts).
    fn post_ius(&mut self, p: &ConnectParams) -> Result<(), RdmaError> {
        self.send_size = p.send_size as usize;
        self.nr_send = p.send_slots;
        self.nr_windows = p.tags.max(p.send_slots);
        self.recv_size = p.recv_size as usize;
        self.nr_recv = p.nr_recv;
        let iu_len =
            self.send_size * usize::from(self.nr_send) + self.recv_size * usize::from(self.nr_recv);
        self.iu = vec![0u8; iu_len].into_boxed_slice();
        let iu_ptr = self.iu.as_mut_ptr();
        self.iu_mr = self.reg(iu_ptr, iu_len, ibv_access_flags::IBV_ACCESS_LOCAL_WRITE)?;
        self.scratch = vec![0u8; SCRATCH_BYTES].into_boxed_slice();
        let scratch_ptr = self.scratch.as_mut_ptr();
        self.scratch_mr = self.reg(scratch_ptr, SCRATCH_BYTES, data_access(self.scope))?;
        self.alloc_windows(self.nr_windows)?;
        // SAFETY: ibv_wc is a plain C struct; all-zero values are valid placeholders.
        self.raw_wcs = (0..32).map(|_| unsafe { std::mem::zeroed() }).collect();
        self.chain = Vec::with_capacity(self.send_wrs);
        for idx in 0..self.nr_recv {
            self.post_recv(idx).map_err(|e| RdmaError::Os {
                op: "ibv_post_recv",
                source: std::io::Error::other(e),
            })?;
        }

        Ok(())
    }

    /// Sends the SRP_LOGIN_REQ as the CM's private data and reads the answer.
    fn log_in(&mut self, p: &ConnectParams, plan: &LoginPlan) -> Result<(), RdmaError> {
        let (dest, tmo) = (self.dest, p.timeout);
        let login = LoginReq {
            tag: 0,
            req_it_iu_len: p.req_it_iu_len,
            req_buf_fmt: BufFormats::DIRECT_INDIRECT,
            multi_channel: p.multi,
            immed_requested: p.immediate,
            imm_data_offset: crate::wire::srp::size::IMM_DATA_OFFSET as u16,
            initiator_port_id: p
                .target
                .initiator_port_id(self.port_guid, DEFAULT_INITIATOR_EXT),
            target_port_id: p.target.target_port_id(),
        };
        let private = plan.private_data(&login);
        // SAFETY: rdma_conn_param is a plain C struct; all-zero is valid before the fields are set.
        let mut cp: rdma_conn_param = unsafe { std::mem::zeroed() };
        cp.private_data = private.as_ptr() as *const libc::c_void;
        cp.private_data_len = private.len() as u8;
        cp.responder_resources = 4;
        cp.initiator_depth = 4;
        cp.flow_control = 1;
        cp.retry_count = p.retry_count.min(7);
        cp.rnr_retry_count = 7;
        // SAFETY: id has a QP; cp and the private data it points to live across the call (copied).
        if unsafe { rdma_connect(self.id, &mut cp) } != 0 {
            return Err(RdmaError::os("rdma_connect"));
        }
        let ev = self.next_event("the login answer", tmo)?;
        match ev.kind {
            rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED => {
                self.connected = true;
                match parse_login_reply(&ev.private) {
                    Ok(LoginReply::Accepted(rsp)) => self.check_login(rsp),
                    Ok(LoginReply::Rejected(rej)) => Err(self.rejected(rej)),
                    Err(source) => Err(RdmaError::BadLoginReply { dest, source }),
                }
            }
            rdma_cm_event_type::RDMA_CM_EVENT_REJECTED
                if ev.status == IB_CM_REJ_CONSUMER_DEFINED =>
            {
                match parse_login_reply(&ev.private) {
                    Ok(LoginReply::Rejected(rej)) => Err(self.rejected(rej)),
                    Ok(LoginReply::Accepted(_)) | Err(_) => Err(RdmaError::NoListener {
                        dest,
                        detail: "consumer-defined reject without an SRP_LOGIN_REJ".into(),
                    }),
                }
            }
            rdma_cm_event_type::RDMA_CM_EVENT_REJECTED => Err(RdmaError::NoListener {
                dest,
                detail: format!("IB CM reject reason {}", ev.status),
            }),
            rdma_cm_event_type::RDMA_CM_EVENT_UNREACHABLE => Err(RdmaError::Unreachable {
                dest,
                detail: event_name(ev.kind),
            }),
            k => Err(RdmaError::NoListener {
                dest,
                detail: format!("{} ({})", event_name(k), ev.status),
            }),
        }
    }

    fn rejected(&self, rej: LoginRej) -> RdmaError {
        RdmaError::LoginRejected {
            reason: rej.reason,
            dest: self.dest,
        }
    }

    fn check_login(&mut self, rsp: LoginRsp) -> Result<(), RdmaError> {
        if rsp.max_ti_iu_len as usize > self.recv_size {
            return Err(RdmaError::Incompatible {
                dest: self.dest,
                detail: format!(
                    "target sends IUs up to {} bytes (max_ti_iu_len) but receive buffers are {}",
                    rsp.max_ti_iu_len, self.recv_size
                ),
            });
        }
        if rsp.req_lim_delta < 2 {
            return Err(RdmaError::Incompatible {
                dest: self.dest,
                detail: format!(
                    "target granted {} credits (req_lim); at least 2 are needed",
                    rsp.req_lim_delta
                ),
            });
        }
        self.login = Some(rsp);
        Ok(())
    }

    fn reg(
        &self,
        ptr: *mut u8,
        len: usize,
        access: ibv_access_flags,
    ) -> Result<*mut ibv_mr, RdmaError> {
        let domain = self
            .domain
            .as_ref()
            .ok_or_else(|| RdmaError::os("ibv_reg_mr"))?;
        // SAFETY: ptr..ptr+len is memory this Endpoint owns (the IU region, the scratch buffer),
        // registered until `close`, which frees it only after deregistering.
        unsafe { domain.reg_mr(ptr, len, access) }
    }

    /// A 64 KiB registered buffer owned by the endpoint, for setup commands (INQUIRY, ...).
    pub fn scratch(&mut self) -> (DataBuf, &mut [u8]) {
        // SAFETY: scratch_mr is the valid MR of `scratch`, registered in `open`.
        let (lkey, rkey) = unsafe { ((*self.scratch_mr).lkey, (*self.scratch_mr).rkey) };
        let b = DataBuf {
            addr: self.scratch.as_ptr() as u64,
            len: SCRATCH_BYTES as u32,
            lkey,
            rkey,
        };
        (b, &mut self.scratch)
    }

    /// The LOGIN_RSP the target accepted with.
    pub fn login(&self) -> LoginRsp {
        self.login
            .expect("an Endpoint exists only after a successful login")
    }

    /// The local RDMA device name (e.g. rxe0).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The local port GUID (the second half of our initiator port id).
    pub fn port_guid(&self) -> u64 {
        self.port_guid
    }

    /// The CM event channel's fd (readable when the target disconnects us); None once closed.
    pub fn cm_fd(&self) -> Option<RawFd> {
        if self.ec.is_null() {
            return None;
        }
        // SAFETY: ec is valid until close() nulls it.
        Some(unsafe { (*self.ec).fd })
    }

    fn slot_range(&self, slot: u16) -> std::ops::Range<usize> {
        let s = usize::from(slot) * self.send_size;
        s..s + self.send_size
    }

    fn recv_range(&self, idx: u16) -> std::ops::Range<usize> {
        let s = usize::from(self.nr_send) * self.send_size + usize::from(idx) * self.recv_size;
        s..s + self.recv_size
    }
}

#[allow(dead_code)]
fn _assert_send() {
    fn is_send<T: Send>() {}
    is_send::<Endpoint>();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_plan_per_route() {
        let login = LoginReq {
            tag: 0,
            req_it_iu_len: 8260,
            req_buf_fmt: BufFormats::DIRECT_INDIRECT,
            multi_channel: MultiChannelAction::Single,
            immed_requested: true,
            imm_data_offset: 68,
            initiator_port_id: [1; 16],
            target_port_id: [2; 16],
        };
        let cm = TargetSpec::parse("id_ext=1,ioc_guid=2,dest=10.77.0.1:5555").unwrap();
        let plan = LoginPlan::for_route(&cm.transport);
        assert_eq!(plan.port_space, rdma_port_space::RDMA_PS_TCP);
        assert_eq!(plan.private_data(&login).len(), 56);
        assert_eq!(plan.dst.ss_family, libc::AF_INET as libc::sa_family_t);
        let ib = TargetSpec::parse(
            "id_ext=1,ioc_guid=2,dgid=fe800000000000000002c90200402bd5,pkey=ffff,\
             service_id=200100a0b81146a1",
        )
        .unwrap();
        let plan = LoginPlan::for_route(&ib.transport);
        assert_eq!(plan.port_space, 0x013f, "RDMA_PS_IB");
        assert_eq!(plan.dst.ss_family, sockaddr::AF_IB);
        let pd = plan.private_data(&login);
        assert_eq!(pd.len(), 64);
        assert_eq!(pd[0], 0x00, "the IB form starts with the opcode");
        assert_eq!(&pd[48..64], &[2; 16]);
    }

    /// An interface named as the IPv6 scope is looked up as ib_srp does; one the host lacks is an
    /// error naming it.
    #[test]
    fn an_interface_scope_becomes_its_index() {
        use crate::wire::target::TargetSpec;
        let t = TargetSpec::parse("id_ext=1,ioc_guid=1,dest=[fe80::1%lo]:5555").unwrap();
        let lo = nix::net::if_::if_nametoindex("lo").unwrap();
        let Some(Route::RdmaCm { dest, .. }) = with_scope(&t.transport).unwrap() else {
            panic!("no scope looked up")
        };
        assert!(matches!(dest, SocketAddr::V6(d) if d.scope_id() == lo && d.port() == 5555));
        let t = TargetSpec::parse("id_ext=1,ioc_guid=1,dest=[fe80::1%nosuchif0]:5555").unwrap();
        let e = with_scope(&t.transport).unwrap_err().to_string();
        assert!(e.contains("interface 'nosuchif0'"), "{e}");
        let t = TargetSpec::parse("id_ext=1,ioc_guid=1,dest=10.0.0.1:5555").unwrap();
        assert!(with_scope(&t.transport).unwrap().is_none());
    }

    /// Without an RDMA device (the host), connecting fails with an error naming the cause, not a
    /// panic.
    #[test]
    fn connect_without_rdma_reports_an_error() {
        let target = TargetSpec::parse("id_ext=1,ioc_guid=1,dest=127.0.0.1:5555").unwrap();
        let p = ConnectParams {
            target,
            multi: MultiChannelAction::Single,
            req_it_iu_len: 8260,
            immediate: true,
            send_slots: 8,
            send_size: 512,
            nr_recv: 8,
            recv_size: 8320,
            retry_count: 7,
            rkey_scope: RkeyScope::Command,
            max_segments: 1,
            comp_vector: 0,
            timeout: Duration::from_millis(500),
            tags: 0,
        };
        let e = Endpoint::connect(&p).err().expect("no RDMA here");
        assert!(!e.to_string().is_empty());
    }
}
