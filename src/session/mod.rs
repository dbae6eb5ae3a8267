//! A session: the channels of one target (channel 0 logs in SINGLE, the others MULTI, as ib_srp does;
//! a channel whose MULTI login fails shrinks the count with a warning), and what the LUN is (TEST UNIT
//! READY, INQUIRY + VPD 0x80/0x83/0xB0/0xB2, READ CAPACITY(16), MODE SENSE caching page), mapped to
//! the parameters a block device needs. Queue depth follows the granted credits, never the reverse.

use crate::channel::block::{Geometry, WriteCache};
use crate::channel::{Channel, ChannelConfig, DataDir, ScsiCmd};
use crate::rdma::{ConnectParams, Endpoint, RdmaError};
use crate::wire::scsi::cdb::{op, opcode_supported};
use crate::wire::scsi::vpd::{self, BlockLimits, Provisioning};
use crate::wire::scsi::{Capacity, Cdb, ModeSense10, StandardInquiry};
use crate::wire::srp::{size, MultiChannelAction, ScsiLun};
use crate::wire::target::TargetSpec;
use state::{LunChanged, LunIdentity};
use std::time::Duration;

pub mod discover;
pub mod exports;
pub mod ib_discover;
pub mod ids;
mod relogin;
pub mod rport;
pub mod state;
pub mod timers;

pub use relogin::{Fresh, Relogin};

/// Send slots beyond the queue depth (CRED_RSP, AER_RSP, I_LOGOUT, task management).
pub const EXTRA_SLOTS: u16 = 4;
/// Immediate data srp-ublk asks for (ib_srp's 8 KiB).
pub const MAX_IMM_DATA: u32 = 8192;
/// Largest I/O srp-ublk issues.
pub const MAX_IO_BYTES: u32 = 512 * 1024;
/// Sizes a ublk device's default largest I/O when the target string sets no `max_sect`: this over
/// the queue depth, within [`MIN_DEFAULT_IO_BYTES`] and [`MAX_IO_BYTES`] ([`default_max_io`]). It
/// bounded what per-tag buffers pin; a queue's pool has its own bound
/// ([`crate::rdma::TagBufs::pooled`]).
pub const BUF_BUDGET_PER_QUEUE: u32 = 8 << 20;
/// The default largest I/O never goes below this, whatever the depth.
pub const MIN_DEFAULT_IO_BYTES: u32 = 64 * 1024;
const SEND_SLOT_BYTES: u32 = 512;
const RECV_BYTES: u32 = 8320;
const CMD_TIMEOUT: Duration = Duration::from_secs(30);

/// What went wrong setting a session up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// Channel 0 could not log in.
    #[error(transparent)]
    Login(#[from] RdmaError),
    /// A setup command failed.
    #[error("{what} failed on LUN {lun}")]
    Command {
        /// The command.
        what: &'static str,
        /// The LUN.
        lun: u64,
        /// How.
        #[source]
        cause: CommandFailure,
    },
    /// A login found another LUN than the one the device serves.
    #[error("LUN {lun} is not the LUN this device served")]
    NotTheLun {
        /// The LUN number.
        lun: u64,
        /// What differs.
        #[source]
        source: LunChanged,
    },
    /// The LUN is not something a block device can present.
    #[error("LUN {lun} cannot be served: {detail}")]
    Unsupported {
        /// The LUN.
        lun: u64,
        /// Why.
        detail: String,
    },
}

/// How a setup command failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandFailure {
    /// It was not carried (the channel went down, or it timed out).
    #[error("not carried")]
    Channel(#[source] crate::channel::SubmitError),
    /// The LUN answered with an error.
    #[error(
        "status {status:?}, {}errno {errno}{hint}",
        sense.map(|s| format!("sense {s}, ")).unwrap_or_default()
    )]
    Status {
        /// The SCSI status.
        status: crate::wire::scsi::ScsiStatus,
        /// Its sense data.
        sense: Option<crate::wire::scsi::Sense>,
        /// What it means to the block layer.
        errno: i32,
        /// What to check ("" or " (...)").
        hint: &'static str,
    },
    /// Its data does not parse.
    #[error("its data does not parse")]
    Parse(#[source] crate::wire::WireError),
}

/// What the caller asks for.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Channels (= queues); None: the online CPUs, at most [`DEFAULT_CHANNELS`], capped by the
    /// target string's ch_count.
    pub channels: Option<u16>,
    /// Queue depth wanted per channel (capped by the credits the target grants).
    pub depth: u16,
    /// The LUN.
    pub lun: u64,
    /// Other LUNs of the same target port the channels carry too, a device each (one daemon per
    /// port): each channel holds every device's queue depth of tags, its credits shared.
    pub more_luns: Vec<u64>,
    /// Limit for each CM step.
    pub timeout: Duration,
    /// Join the I_T nexus another live device (another LUN of the same target) already has: log
    /// channel 0 in with MULTI too. A SINGLE login tears down every channel of the nexus, as SRP
    /// r16a says and LIO does.
    pub share_nexus: bool,
    /// The most data segments one command may have (1 for a block device's and NBD's buffers;
    /// more for a guest's memory, which the vhost-user front end hands over as it is).
    pub max_segments: u16,
}

/// What the LUN is.
#[derive(Clone, Debug)]
pub struct LunInfo {
    /// The LUN number.
    pub lun: u64,
    /// Standard INQUIRY data.
    pub inquiry: StandardInquiry,
    /// VPD 0x80 unit serial number.
    pub serial: Option<String>,
    /// The persistent identifier udev's scsi_id would build (ID_SERIAL / multipath WWID).
    pub wwid: Option<String>,
    /// READ CAPACITY(16).
    pub capacity: Capacity,
    /// VPD 0xB0.
    pub limits: Option<BlockLimits>,
    /// VPD 0xB2.
    pub provisioning: Option<Provisioning>,
    /// Volatile write cache enabled (caching page WCE).
    pub write_cache: bool,
    /// The target honours FUA (DPOFUA).
    pub fua: bool,
    /// Write protected.
    pub read_only: bool,
    /// WRITE SAME(16) is implemented: false where REPORT SUPPORTED OPERATION CODES says it is not
    /// (as sd asks before it uses WRITE SAME); true where the LUN cannot say.
    pub write_same: bool,
}

impl LunInfo {
    /// log2 of the logical block size.
    pub fn block_shift(&self) -> u32 {
        self.capacity.block_len.trailing_zeros()
    }
    /// The geometry the block mapping needs.
    pub fn geometry(&self) -> Geometry {
        let lbp = self.provisioning.unwrap_or_default();
        Geometry {
            block_shift: self.block_shift(),
            blocks: self.capacity.blocks(),
            unmap: self.capacity.lbpme && lbp.lbpu,
            write_same_unmap: self.capacity.lbpme && lbp.lbpws,
            cache: self.write_cache(),
            lbpme: self.capacity.lbpme,
            lbprz: self.capacity.lbprz,
            write_same: self.write_same,
        }
    }
    /// What tells this LUN from another (a new login must find the same).
    pub fn identity(&self) -> LunIdentity {
        LunIdentity {
            wwid: self.wwid.clone(),
            serial: self.serial.clone(),
            size: self.size(),
            block_size: self.capacity.block_len,
        }
    }
    /// The write cache (what FUA and FLUSH become, for both front ends).
    pub fn write_cache(&self) -> WriteCache {
        WriteCache {
            enabled: self.write_cache,
            dpofua: self.fua,
        }
    }
    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.capacity.bytes().unwrap_or(0)
    }
    /// Largest I/O in bytes: the target string's max_sect if it has one, else the front end's
    /// `default` (for ublk [`default_max_io`]); never above srp-ublk's maximum or the LUN's Block
    /// Limits.
    pub fn max_io_bytes(&self, max_sect: Option<u32>, default: u32) -> u32 {
        let mut m = match max_sect {
            Some(s) => MAX_IO_BYTES.min(s.saturating_mul(512)),
            None => default.min(MAX_IO_BYTES),
        };
        if let Some(l) = self.limits {
            if l.max_xfer_len > 0 {
                m = m.min(l.max_xfer_len.saturating_mul(self.capacity.block_len));
            }
        }
        // at least one block, whole blocks
        let bs = self.capacity.block_len;
        (m / bs).max(1) * bs
    }
    /// Largest WRITE SAME in blocks: Block Limits' MAXIMUM WRITE SAME LENGTH, else one I/O's worth
    /// (`max_io` bytes).
    pub fn max_write_same_blocks(&self, max_io: u32) -> u32 {
        self.limits
            .map(|l| l.max_write_same_len)
            .filter(|&n| n > 0)
            .map_or(max_io / self.capacity.block_len, |n| {
                n.min(u64::from(u32::MAX >> 1)) as u32
            })
    }
    /// Largest UNMAP in blocks (0: none).
    pub fn max_unmap_blocks(&self) -> u32 {
        if !self.geometry().unmap {
            return 0;
        }
        match self.limits {
            Some(l) if l.max_unmap_lba_count > 0 && l.max_unmap_lba_count != u32::MAX => {
                l.max_unmap_lba_count
            }
            _ => u32::MAX >> 9,
        }
    }
}

/// A logged-in session.
pub struct Session {
    /// The target.
    pub target: TargetSpec,
    /// One channel per queue.
    pub channels: Vec<Channel<Endpoint>>,
    /// The LUN.
    pub lun: LunInfo,
    /// The other LUNs the channels serve ([`SessionOptions::more_luns`]), in that order.
    pub more_luns: Vec<LunInfo>,
    /// The queue depth every channel serves (each device's).
    pub depth: u16,
    /// The local RDMA device the channels use.
    pub rdma_device: String,
    /// How a queue logs its channel in again.
    pub relogin: Relogin,
}

/// A logged-in SRP channel over RDMA: what a session gives each front end queue or connection.
pub type SrpChannel = Channel<Endpoint>;

/// One CM step of a reconnect attempt at most: shorter than a first login's limit, so that a
/// channel waiting on a dead fabric still meets its fast_io_fail and dev_loss deadlines between
/// attempts.
pub const RELOGIN_STEP: Duration = Duration::from_secs(5);

fn connect_params(
    target: &TargetSpec,
    multi: MultiChannelAction,
    depth: u16,
    timeout: Duration,
) -> ConnectParams {
    let req_it_iu_len = match target.opts.max_it_iu_size {
        Some(m) if m > 0 => m.clamp(
            size::IMM_DATA_OFFSET as u32,
            size::IMM_DATA_OFFSET as u32 + MAX_IMM_DATA,
        ),
        _ => size::IMM_DATA_OFFSET as u32 + MAX_IMM_DATA,
    };
    ConnectParams {
        target: target.clone(),
        multi,
        req_it_iu_len,
        immediate: true,
        send_slots: crate::channel::send_slots(depth, EXTRA_SLOTS),
        send_size: SEND_SLOT_BYTES,
        nr_recv: depth + 16,
        recv_size: RECV_BYTES,
        retry_count: target.opts.tl_retry_count.unwrap_or(7) as u8,
        comp_vector: target.opts.comp_vector.unwrap_or(0) as i32,
        timeout,
        rkey_scope: target.opts.rkey_scope.unwrap_or_default(),
        max_segments: 1,
        tags: 0,
    }
}

fn channel_config(ep: &Endpoint, depth: u16, lun: u64, req_it_iu_len: u32) -> ChannelConfig {
    let l = ep.login();
    let max_imm = if l.immed_supported() {
        l.max_it_iu_len
            .min(req_it_iu_len)
            .saturating_sub(size::IMM_DATA_OFFSET as u32)
    } else {
        0
    };
    ChannelConfig {
        depth,
        send_depth: depth,
        extra_slots: EXTRA_SLOTS,
        lun: ScsiLun::from_int(lun),
        req_lim: l.req_lim_delta,
        max_imm,
        imm_data_offset: size::IMM_DATA_OFFSET,
        max_it_iu_len: l.max_it_iu_len.min(req_it_iu_len),
        max_retries: 5,
    }
}

/// Channels a session asks for when the command line names no count: at most this many, and no
/// more than the online CPUs. ib_srp's default is max(4 x NUMA nodes, the HCA's completion
/// vectors), at most the online CPUs, per target port and shared by its LUNs; srp-ublk's channels
/// (and their registered pools) are per LUN device, so a host with many LUNs and CPUs would
/// otherwise hold LUNs x CPUs channels. Four is ib_srp's floor on a one-node host; `--queues` (or
/// `queues=` in a target file) raises it for a LUN whose queues `srp-ublk stats` shows busy.
pub const DEFAULT_CHANNELS: u16 = 4;

/// The depth and channel count to ask for: `opts`' (the online CPUs, at most
/// [`DEFAULT_CHANNELS`], when it names no count), capped by the target string's queue_size and
/// ch_count as ib_srp caps them.
fn wanted(target: &TargetSpec, opts: &SessionOptions) -> (u16, u16) {
    let depth = opts.depth.clamp(1, 4096).min(
        target
            .opts
            .queue_size
            .map_or(4096, |q| q.clamp(1, 4096) as u16),
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u16;
    let ch_count = target
        .opts
        .ch_count
        .map_or(u16::MAX, |c| c.min(u32::from(u16::MAX)) as u16);
    let channels = opts.channels.unwrap_or(cpus.min(DEFAULT_CHANNELS));
    (depth, channels.min(ch_count).max(1))
}

impl Session {
    /// Largest I/O of a ublk device over this session (its tag buffers' size): the target
    /// string's max_sect, else [`default_max_io`] for the session's depth.
    pub fn ublk_max_io(&self) -> u32 {
        self.lun_max_io(&self.lun)
    }

    /// [`Session::ublk_max_io`] of a device for `lun`, one of the session's LUNs.
    pub fn lun_max_io(&self, lun: &LunInfo) -> u32 {
        lun.max_io_bytes(self.target.opts.max_sect, default_max_io(self.depth))
    }

    /// Logs in every channel and interrogates the LUN.
    pub fn open(target: &TargetSpec, opts: &SessionOptions) -> Result<Session, SessionError> {
        let (want_depth, want_ch) = wanted(target, opts);
        let first = if opts.share_nexus {
            MultiChannelAction::Multi
        } else {
            MultiChannelAction::Single
        };
        let mut p0 = connect_params(target, first, want_depth, opts.timeout);
        p0.max_segments = opts.max_segments.max(1);
        // every device's tags at the most depth the credits may give: the windows are per tag
        let devices = 1 + opts.more_luns.len();
        p0.tags = u16::try_from(usize::from(want_depth) * devices).unwrap_or(u16::MAX);
        let ep0 = Endpoint::connect(&p0)?;
        tracing::info!(
            "channel 0 logged in via {}: req_lim {}, max_it_iu_len {}, immediate data {}",
            ep0.device(),
            ep0.login().req_lim_delta,
            ep0.login().max_it_iu_len,
            ep0.login().immed_supported()
        );
        let mut eps = vec![ep0];
        for i in 1..want_ch {
            let p = ConnectParams {
                multi: MultiChannelAction::Multi,
                ..p0.clone()
            };
            match Endpoint::connect(&p) {
                Ok(ep) => eps.push(ep),
                Err(e) => {
                    tracing::warn!("channel {i} of {want_ch} did not log in ({e}); continuing with {i} channels");
                    break;
                }
            }
        }
        // depth follows the credits: one is kept back for task management
        let depth = eps
            .iter()
            .map(|e| (e.login().req_lim_delta - 1).clamp(1, i32::from(want_depth)) as u16)
            .min()
            .unwrap_or(1);
        // every device's tags on each channel; the sends stay what the login was sized for
        let tags = u16::try_from(usize::from(depth) * devices).unwrap_or(u16::MAX);
        let mut channels: Vec<Channel<Endpoint>> = eps
            .into_iter()
            .map(|ep| {
                let cfg = channel_config(&ep, depth, opts.lun, p0.req_it_iu_len).with_tags(tags);
                Channel::new(ep, cfg)
            })
            .collect();
        let lun = interrogate(&mut channels[0], opts.lun)?;
        let more_luns = opts
            .more_luns
            .iter()
            .map(|&l| interrogate(&mut channels[0], l))
            .collect::<Result<Vec<_>, _>>()?;
        let rdma_device = channels[0].transport().device().to_string();
        let mut relogin = Relogin::new(target, opts.lun, depth, opts.timeout)
            .with_segments(opts.max_segments)
            .with_tags(tags);
        if first == MultiChannelAction::Single {
            relogin = relogin.owning_nexus(target);
        }
        Ok(Session {
            target: target.clone(),
            channels,
            lun,
            more_luns,
            depth,
            rdma_device,
            relogin,
        })
    }
}

/// `queues` channels that have never logged in, each down on a detached endpoint of `device`
/// (the RDMA device the previous daemon used, for messages): what a daemon serves first when it
/// takes a device over from one whose RDMA device went away. It knows the LUN from the device's
/// state file, so nothing needs the target before the queues start; each channel logs in with its
/// first reconnect, under the transport-class timers, as any channel that went down does. Each
/// holds `tags` tags (a port daemon's devices together; `depth` for one device).
pub fn detached_channels(
    device: &str,
    queues: u16,
    depth: u16,
    lun: u64,
    tags: u16,
) -> Vec<Channel<Endpoint>> {
    (0..queues)
        .map(|_| {
            let cfg = ChannelConfig {
                depth,
                send_depth: depth,
                extra_slots: EXTRA_SLOTS,
                lun: ScsiLun::from_int(lun),
                req_lim: 0,
                max_imm: 0,
                imm_data_offset: size::IMM_DATA_OFFSET,
                // the target the device was served from accepted what srp-ublk asks for
                max_it_iu_len: size::IMM_DATA_OFFSET as u32 + MAX_IMM_DATA,
                max_retries: 5,
            }
            .with_tags(tags);
            let mut ch = Channel::new(Endpoint::detached(device), cfg);
            ch.declare_down(crate::channel::DownReason::Handover {
                device: device.to_string(),
            });
            ch
        })
        .collect()
}

/// Runs one data-in command on an idle channel into its scratch buffer; returns the bytes.
fn data_in(
    ch: &mut Channel<Endpoint>,
    what: &'static str,
    lun: u64,
    cdb: Cdb,
    alloc: u32,
) -> Result<Vec<u8>, SessionError> {
    let (buf, _) = ch.transport().scratch();
    let cmd = ScsiCmd {
        lun: ScsiLun::from_int(lun),
        cdb,
        data: DataDir::In(buf.prefix(alloc)),
    };
    let o = ch
        .execute(0, cmd, CMD_TIMEOUT)
        .map_err(|e| SessionError::Command {
            what,
            lun,
            cause: CommandFailure::Channel(e),
        })?;
    match o.bytes(alloc) {
        Ok(n) => Ok(ch.transport().scratch().1[..n as usize].to_vec()),
        Err(errno) => Err(SessionError::Command {
            what,
            lun,
            cause: CommandFailure::Status {
                status: o.status,
                sense: o.sense,
                errno,
                hint: "",
            },
        }),
    }
}

/// INQUIRY for VPD page `page` (at most `alloc` bytes); `None` when the LUN does not answer it
/// (every VPD page srp-ublk reads is optional, so the error itself is not kept).
fn vpd_page(ch: &mut Channel<Endpoint>, lun: u64, page: u8, alloc: u16) -> Option<Vec<u8>> {
    let cdb = Cdb::inquiry(Some(page), alloc);
    data_in(ch, "INQUIRY VPD", lun, cdb, u32::from(alloc)).ok()
}

/// The LUN's name from a VPD 0x83 page: its preferred designator, as scsi_id spells it.
fn lu_name(page: &[u8]) -> Option<String> {
    vpd::preferred_lu_designator(page)
        .ok()
        .flatten()
        .map(|d| vpd::scsi_id_serial(&d))
}

/// What identifies the LUN a channel reaches: VPD 0x83's designator (as scsi_id names it), VPD
/// 0x80's serial where the LUN has one, and READ CAPACITY(16).
fn lun_identity(ch: &mut Channel<Endpoint>, lun: u64) -> Result<LunIdentity, SessionError> {
    let wwid = vpd_page(ch, lun, vpd::page::DEVICE_ID, 1024).and_then(|b| lu_name(&b));
    let serial =
        vpd_page(ch, lun, vpd::page::SERIAL, 255).and_then(|b| vpd::serial_number(&b).ok());
    let cap = capacity16(ch, lun)?;
    Ok(LunIdentity {
        wwid,
        serial,
        size: cap.bytes().unwrap_or(0),
        block_size: cap.block_len,
    })
}

/// Asks the LUN what it is.
pub fn interrogate(ch: &mut Channel<Endpoint>, lun: u64) -> Result<LunInfo, SessionError> {
    test_unit_ready(ch, lun)?;
    let inquiry = standard_inquiry(ch, lun)?;
    let vpd = VpdPages::read(ch, lun);
    let capacity = read_capacity(ch, lun)?;
    let (write_cache, fua, read_only) = caching(ch, lun);
    let write_same = supports(ch, lun, op::WRITE_SAME_16).unwrap_or(true);
    Ok(LunInfo {
        lun,
        inquiry,
        serial: vpd.serial,
        wwid: vpd.wwid,
        capacity,
        limits: vpd.limits,
        provisioning: vpd.provisioning,
        write_cache,
        fua,
        read_only,
        write_same,
    })
}

/// Whether the LUN implements `opcode` (REPORT SUPPORTED OPERATION CODES); `None` where it does
/// not answer that command or cannot say.
fn supports(ch: &mut Channel<Endpoint>, lun: u64, opcode: u8) -> Option<bool> {
    let cdb = Cdb::report_opcode(opcode, 64);
    let b = data_in(ch, "REPORT SUPPORTED OPERATION CODES", lun, cdb, 64).ok()?;
    opcode_supported(&b)
}

fn test_unit_ready(ch: &mut Channel<Endpoint>, lun: u64) -> Result<(), SessionError> {
    let tur = ScsiCmd {
        lun: ScsiLun::from_int(lun),
        cdb: Cdb::test_unit_ready(),
        data: DataDir::None,
    };
    let o = ch
        .execute(0, tur, CMD_TIMEOUT)
        .map_err(|e| SessionError::Command {
            what: "TEST UNIT READY",
            lun,
            cause: CommandFailure::Channel(e),
        })?;
    if o.errno != 0 {
        return Err(SessionError::Command {
            what: "TEST UNIT READY",
            lun,
            cause: CommandFailure::Status {
                status: o.status,
                sense: o.sense,
                errno: o.errno,
                hint: " (is the LUN mapped in the target's ACL?)",
            },
        });
    }
    Ok(())
}

/// Standard INQUIRY: only a connected disk (peripheral type 0) is served.
fn standard_inquiry(ch: &mut Channel<Endpoint>, lun: u64) -> Result<StandardInquiry, SessionError> {
    let std_inq = data_in(ch, "INQUIRY", lun, Cdb::inquiry(None, 96), 96)?;
    let inquiry = StandardInquiry::parse(&std_inq).map_err(|e| SessionError::Command {
        what: "INQUIRY",
        lun,
        cause: CommandFailure::Parse(e),
    })?;
    if !inquiry.is_disk() {
        return Err(SessionError::Unsupported {
            lun,
            detail: format!(
                "peripheral qualifier {} type {:#x} is not a connected disk (type 0)",
                inquiry.qualifier, inquiry.device_type
            ),
        });
    }
    Ok(inquiry)
}

/// What the optional VPD pages say; a page the LUN does not list, or that fails, is left out.
struct VpdPages {
    serial: Option<String>,
    wwid: Option<String>,
    limits: Option<BlockLimits>,
    provisioning: Option<Provisioning>,
}

impl VpdPages {
    fn read(ch: &mut Channel<Endpoint>, lun: u64) -> VpdPages {
        let supported = vpd_page(ch, lun, vpd::page::SUPPORTED, 255)
            .and_then(|b| vpd::supported_pages(&b).ok().map(<[u8]>::to_vec))
            .unwrap_or_default();
        let mut page = |page: u8, alloc: u16| {
            if supported.contains(&page) {
                vpd_page(ch, lun, page, alloc)
            } else {
                None
            }
        };
        VpdPages {
            serial: page(vpd::page::SERIAL, 255).and_then(|b| vpd::serial_number(&b).ok()),
            wwid: page(vpd::page::DEVICE_ID, 1024).and_then(|b| lu_name(&b)),
            limits: page(vpd::page::BLOCK_LIMITS, 64).and_then(|b| BlockLimits::parse(&b).ok()),
            provisioning: page(vpd::page::LBP, 64).and_then(|b| Provisioning::parse(&b).ok()),
        }
    }
}

/// READ CAPACITY(16), parsed.
fn capacity16(ch: &mut Channel<Endpoint>, lun: u64) -> Result<Capacity, SessionError> {
    let cap = data_in(ch, "READ CAPACITY(16)", lun, Cdb::read_capacity16(32), 32)?;
    Capacity::parse(&cap).map_err(|e| SessionError::Command {
        what: "READ CAPACITY(16)",
        lun,
        cause: CommandFailure::Parse(e),
    })
}

/// READ CAPACITY(16), with a block size the block layer takes.
fn read_capacity(ch: &mut Channel<Endpoint>, lun: u64) -> Result<Capacity, SessionError> {
    let capacity = capacity16(ch, lun)?;
    if !capacity.block_len_ok() {
        return Err(SessionError::Unsupported {
            lun,
            detail: format!(
                "logical block size {} is not a power of two from 512 to 65536",
                capacity.block_len
            ),
        });
    }
    Ok(capacity)
}

/// (write cache enabled, DPOFUA, write protected) from MODE SENSE(10)'s caching page. Without
/// the page a volatile cache is assumed: flushes are then sent, which is safe.
fn caching(ch: &mut Channel<Endpoint>, lun: u64) -> (bool, bool, bool) {
    let Ok(b) = data_in(
        ch,
        "MODE SENSE(10)",
        lun,
        Cdb::mode_sense10(0x08, 0, 252),
        252,
    ) else {
        return (true, false, false);
    };
    match ModeSense10::parse(&b) {
        Ok(m) => (
            m.caching().is_some_and(|c| c.wce),
            m.dpofua,
            m.write_protect,
        ),
        _ => (true, false, false),
    }
}

/// The largest I/O when the target string sets none: the buffer budget over the depth, rounded down
/// to a power of two, within [`MIN_DEFAULT_IO_BYTES`]..=[`MAX_IO_BYTES`].
pub fn default_max_io(depth: u16) -> u32 {
    let per_tag = BUF_BUDGET_PER_QUEUE / u32::from(depth.max(1));
    let pow2 = if per_tag == 0 {
        0
    } else {
        1 << per_tag.ilog2()
    };
    pow2.clamp(MIN_DEFAULT_IO_BYTES, MAX_IO_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_setup_command_names_the_command_the_lun_and_then_its_cause() {
        let e = SessionError::Command {
            what: "TEST UNIT READY",
            lun: 3,
            cause: CommandFailure::Status {
                status: crate::wire::scsi::ScsiStatus::CheckCondition,
                sense: None,
                errno: libc::EIO,
                hint: " (is the LUN mapped in the target's ACL?)",
            },
        };
        assert_eq!(e.to_string(), "TEST UNIT READY failed on LUN 3");
        assert_eq!(
            crate::Chain(&e).to_string(),
            "TEST UNIT READY failed on LUN 3: status CheckCondition, errno 5 (is the LUN mapped in \
             the target's ACL?)"
        );
    }

    #[test]
    fn the_default_largest_io_keeps_a_queue_within_its_buffer_budget() {
        assert_eq!(default_max_io(16), 512 * 1024);
        assert_eq!(default_max_io(64), 128 * 1024);
        assert_eq!(default_max_io(128), 64 * 1024);
        // a depth that is not a power of two rounds the buffer down, never over the budget
        assert_eq!(default_max_io(100), 64 * 1024);
        assert_eq!(default_max_io(48), 128 * 1024);
        // the floor and the ceiling
        assert_eq!(default_max_io(1024), MIN_DEFAULT_IO_BYTES);
        assert_eq!(default_max_io(1), MAX_IO_BYTES);
        assert_eq!(default_max_io(0), MAX_IO_BYTES);
        for depth in [1u16, 2, 16, 32, 48, 64, 100, 127, 128] {
            let io = default_max_io(depth);
            assert!(u64::from(io) * u64::from(depth) <= u64::from(BUF_BUDGET_PER_QUEUE));
        }
    }

    #[test]
    fn the_default_channel_count_stays_bounded_and_ch_count_caps_any() {
        let opts = |channels| SessionOptions {
            channels,
            depth: 64,
            lun: 0,
            more_luns: Vec::new(),
            timeout: Duration::from_secs(1),
            share_nexus: false,
            max_segments: 1,
        };
        let plain = TargetSpec::parse("id_ext=1,ioc_guid=1,dest=192.0.2.1:5555").unwrap();
        let capped =
            TargetSpec::parse("id_ext=1,ioc_guid=1,dest=192.0.2.1:5555,ch_count=2,queue_size=32")
                .unwrap();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u16;
        assert_eq!(wanted(&plain, &opts(None)).1, cpus.min(DEFAULT_CHANNELS));
        assert_eq!(
            wanted(&plain, &opts(Some(16))),
            (64, 16),
            "--queues is taken as given"
        );
        assert_eq!(
            wanted(&capped, &opts(Some(16))),
            (32, 2),
            "ch_count and queue_size cap"
        );
        assert_eq!(wanted(&plain, &opts(Some(0))).1, 1);
    }
}
