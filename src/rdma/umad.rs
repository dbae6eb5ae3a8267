//! The kernel's user MAD interface (`/dev/infiniband/umadN`, `<rdma/ib_user_mad.h>`): send an SA or
//! Device Management request on the port's GSI QP and read its answer, as libibumad does for
//! srp_daemon. No libibumad: two ioctls (ENABLE_PKEY, REGISTER_AGENT), `write` and `read` with
//! the 64-byte `ib_user_mad_hdr` in front of each MAD.

use crate::wire::mad::MAD_SIZE;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zerocopy::big_endian::{U16 as B16, U32 as B32};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// What went wrong talking MADs. Messages say what to check.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UmadError {
    /// No InfiniBand port to discover through.
    #[error("{0}")]
    NoPort(String),
    /// A system call failed.
    #[error("{op} on {path}")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The umad device.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The request went unanswered (the kernel's retries included).
    #[error("no answer from LID {lid:#x} to {what} within {ms} ms ({tries} tries)")]
    Timeout {
        /// The request.
        what: &'static str,
        /// Where it went.
        lid: u16,
        /// The wait per try.
        ms: u32,
        /// Tries.
        tries: u32,
    },
    /// The answer did not decode, or said no.
    #[error("{what} from LID {lid:#x}")]
    Answer {
        /// The request.
        what: &'static str,
        /// Where it went.
        lid: u16,
        /// Why the answer is unusable.
        source: crate::wire::WireError,
    },
    /// The kernel reported a failed send or receive.
    #[error("{what} to LID {lid:#x} failed: status {status}")]
    Status {
        /// The request.
        what: &'static str,
        /// Where it went.
        lid: u16,
        /// The errno-like status of `ib_user_mad_hdr`.
        status: u32,
    },
}

/// Why a port cannot ask a subnet manager.
#[derive(Debug, thiserror::Error)]
pub enum PortUnusable {
    /// A RoCE or iWARP port: no subnet manager.
    #[error("{device} port {port} is {link_layer} (RoCE/iWARP)")]
    NotInfiniBand {
        /// The RDMA device.
        device: String,
        /// Its port.
        port: u8,
        /// Its link layer (sysfs `link_layer`).
        link_layer: String,
    },
    /// An InfiniBand port that is not up.
    #[error("{device} port {port} is {state}")]
    NotActive {
        /// The RDMA device.
        device: String,
        /// Its port.
        port: u8,
        /// Its state (sysfs `state`).
        state: String,
    },
}

/// `struct ib_user_mad_hdr` (the P_Key index form, after IB_USER_MAD_ENABLE_PKEY): 64 bytes.
/// The bookkeeping fields are host order, the addressing fields network order, as in the header.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UserMadHdr {
    /// The agent id REGISTER_AGENT returned.
    pub id: u32,
    /// 0, or ETIMEDOUT for a request that got no answer.
    pub status: u32,
    /// How long the kernel waits for the answer to a request (0: none expected).
    pub timeout_ms: u32,
    /// How often the kernel sends the request again before giving up.
    pub retries: u32,
    /// Received: the MAD's length.
    pub length: u32,
    /// Destination QP (1: GSI).
    pub qpn: B32,
    /// Q_Key (0x80010000 for GSI).
    pub qkey: B32,
    /// Destination LID.
    pub lid: B16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub path_bits: u8,
    /// 1 when a GRH is used.
    pub grh_present: u8,
    /// GID index of the GRH.
    pub gid_index: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// GRH traffic class.
    pub traffic_class: u8,
    /// GRH destination GID.
    pub gid: [u8; 16],
    /// GRH flow label.
    pub flow_label: B32,
    /// P_Key index to send with.
    pub pkey_index: u16,
    /// Reserved.
    pub reserved: [u8; 6],
}
const _: () = assert!(core::mem::size_of::<UserMadHdr>() == 64);

/// The GSI QP's well-known Q_Key.
pub const GSI_QKEY: u32 = 0x8001_0000;

impl UserMadHdr {
    /// The header of a request from `agent` to the GSI QP of `lid`.
    pub fn request(agent: u32, lid: u16, pkey_index: u16, timeout_ms: u32, retries: u32) -> Self {
        let mut h = Self::new_zeroed();
        (h.id, h.timeout_ms, h.retries) = (agent, timeout_ms, retries);
        (h.qpn, h.qkey, h.lid) = (1.into(), GSI_QKEY.into(), lid.into());
        h.pkey_index = pkey_index;
        h
    }
}

/// `struct ib_user_mad_reg_req` (28 bytes with its tail padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
struct RegReq {
    id: u32,
    method_mask: [u32; 4],
    qpn: u8,
    mgmt_class: u8,
    mgmt_class_version: u8,
    oui: [u8; 3],
    rmpp_version: u8,
    pad: u8,
}
const _: () = assert!(core::mem::size_of::<RegReq>() == 28);

const IB_IOCTL_MAGIC: u64 = 0x1b;
/// _IOWR(0x1b, 1, struct ib_user_mad_reg_req)
const REGISTER_AGENT: u64 = 3 << 30 | 28 << 16 | IB_IOCTL_MAGIC << 8 | 1;
/// _IO(0x1b, 3)
const ENABLE_PKEY: u64 = IB_IOCTL_MAGIC << 8 | 3;

/// The local end of discovery: an InfiniBand port, its LID, its subnet manager's LID and its P_Keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalPort {
    /// RDMA device name.
    pub device: String,
    /// Port number.
    pub port: u8,
    /// The port's LID.
    pub lid: u16,
    /// The subnet manager's LID (SA requests go there).
    pub sm_lid: u16,
    /// The port's P_Key table (index, P_Key), zeros left out.
    pub pkeys: Vec<(u16, u16)>,
}

/// An open umad device with an SA and a DM agent registered.
pub struct Umad {
    file: File,
    path: String,
    sa_agent: u32,
    dm_agent: u32,
    /// The port.
    pub local: LocalPort,
    /// Wait for each answer (srp_daemon's -t, 5000 ms).
    pub timeout_ms: u32,
    /// Tries per request (srp_daemon's -r, 3).
    pub tries: u32,
}

/// Which agent a request goes out on.
#[derive(Clone, Copy, Debug)]
pub enum Agent {
    /// Subnet administration (class 3).
    Sa,
    /// Device management (class 6).
    Dm,
}

impl UmadError {
    /// System call `op` on the umad device at `path` failed with `source`.
    fn os(path: &str, op: &'static str, source: std::io::Error) -> Self {
        UmadError::Os {
            op,
            path: path.to_string(),
            source,
        }
    }
}

fn sysfs(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn parse_num(s: &str) -> Option<u16> {
    match s.strip_prefix("0x") {
        Some(h) => u16::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Port `port` of RDMA device `dev` from sysfs, or why it cannot ask a subnet manager.
fn ib_port(device: String, port: u8) -> Result<LocalPort, PortUnusable> {
    let pdir = PathBuf::from(format!("/sys/class/infiniband/{device}/ports/{port}"));
    let link_layer = sysfs(&pdir.join("link_layer")).unwrap_or_default();
    let state = sysfs(&pdir.join("state")).unwrap_or_default();
    if link_layer != "InfiniBand" {
        return Err(PortUnusable::NotInfiniBand {
            device,
            port,
            link_layer,
        });
    }
    if !state.contains("ACTIVE") {
        return Err(PortUnusable::NotActive {
            device,
            port,
            state,
        });
    }
    let num = |file: &str| sysfs(&pdir.join(file)).and_then(|s| parse_num(&s));
    let mut pkeys = Vec::new();
    for i in 0u16..64 {
        match num(&format!("pkeys/{i}")) {
            Some(0) => {}
            Some(k) => pkeys.push((i, k)),
            None => break,
        }
    }
    Ok(LocalPort {
        device,
        port,
        lid: num("lid").unwrap_or(0),
        sm_lid: num("sm_lid").unwrap_or(0),
        pkeys,
    })
}

/// Finds the umad device of `want` (`DEVICE[:PORT]`), or of the first InfiniBand port that is up.
/// RoCE and iWARP ports are refused: they have no subnet manager to ask.
pub fn find_port(want: Option<&str>) -> Result<(PathBuf, LocalPort), UmadError> {
    let (want_dev, want_port) = match want.map(|w| w.split_once(':').unwrap_or((w, ""))) {
        Some((d, p)) => (Some(d), p.parse::<u8>().ok()),
        None => (None, None),
    };
    let mut seen = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir("/sys/class/infiniband_mad")
        .map_err(|_| {
            UmadError::NoPort(
                "no /sys/class/infiniband_mad: load ib_umad (modprobe ib_umad) and check that an \
                 RDMA device exists"
                    .into(),
            )
        })?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("umad"))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    for d in dirs {
        let (Some(dev), Some(port)) = (sysfs(&d.join("ibdev")), sysfs(&d.join("port"))) else {
            continue;
        };
        let Ok(port) = port.parse::<u8>() else {
            continue;
        };
        if want_dev.is_some_and(|w| w != dev) || want_port.is_some_and(|w| w != port) {
            continue;
        }
        let name = d.file_name().map(|n| n.to_owned()).unwrap_or_default();
        match ib_port(dev, port) {
            Ok(local) => return Ok((Path::new("/dev/infiniband").join(name), local)),
            Err(why) => seen.push(why.to_string()),
        }
    }
    let what = want.map_or("an active InfiniBand port".to_string(), |w| {
        format!("'{w}'")
    });
    Err(UmadError::NoPort(if seen.is_empty() {
        format!("found no umad device for {what} (is ib_umad loaded?)")
    } else {
        format!(
            "found no usable port for {what}: {}. InfiniBand discovery asks the subnet manager; \
             for targets reached over RoCE or iWARP use `srp-ublk discover --dest IP[:PORT]`",
            seen.join(", ")
        )
    }))
}

impl Umad {
    /// Opens the umad device of `want` (see [`find_port`]) and registers the two agents.
    pub fn open(want: Option<&str>) -> Result<Umad, UmadError> {
        let (path, local) = find_port(want)?;
        let p = path.display().to_string();
        let os = |op, source| UmadError::os(&p, op, source);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| os("open", e))?;
        // SAFETY: ENABLE_PKEY takes no argument; the fd is open.
        if unsafe { libc::ioctl(file.as_raw_fd(), ENABLE_PKEY as _) } < 0 {
            return Err(os(
                "IB_USER_MAD_ENABLE_PKEY",
                std::io::Error::last_os_error(),
            ));
        }
        let mut u = Umad {
            file,
            path: p.clone(),
            sa_agent: 0,
            dm_agent: 0,
            local,
            timeout_ms: 5000,
            tries: 3,
        };
        u.sa_agent = u
            .register(
                crate::wire::mad::CLASS_SA,
                crate::wire::mad::SA_CLASS_VERSION,
                1,
            )
            .map_err(|e| os("registering the SA agent", e))?;
        u.dm_agent = u
            .register(
                crate::wire::mad::CLASS_DM,
                crate::wire::mad::DM_CLASS_VERSION,
                0,
            )
            .map_err(|e| os("registering the DM agent", e))?;
        Ok(u)
    }

    fn register(&mut self, class: u8, version: u8, rmpp: u8) -> std::io::Result<u32> {
        let mut r = RegReq::new_zeroed();
        (r.qpn, r.mgmt_class, r.mgmt_class_version, r.rmpp_version) = (1, class, version, rmpp);
        // SAFETY: REGISTER_AGENT reads and writes a 28-byte ib_user_mad_reg_req, which `r` is.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), REGISTER_AGENT as _, &mut r) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(r.id)
    }

    /// Sends `mad` to `lid` on `agent` with P_Key index `pkey_index` and returns the answer's MAD
    /// (longer than 256 bytes for a multi-segment SA table).
    pub fn query(
        &mut self,
        agent: Agent,
        lid: u16,
        pkey_index: u16,
        mad: &[u8; MAD_SIZE],
        what: &'static str,
    ) -> Result<Vec<u8>, UmadError> {
        let id = match agent {
            Agent::Sa => self.sa_agent,
            Agent::Dm => self.dm_agent,
        };
        let tid = u64::from_be_bytes(mad[8..16].try_into().unwrap_or_default());
        let hdr = UserMadHdr::request(
            id,
            lid,
            pkey_index,
            self.timeout_ms,
            self.tries.saturating_sub(1),
        );
        let mut out = Vec::with_capacity(64 + MAD_SIZE);
        out.extend_from_slice(hdr.as_bytes());
        out.extend_from_slice(mad);
        self.file
            .write_all(&out)
            .map_err(|e| UmadError::os(&self.path, "write", e))?;
        self.answer(id, tid, lid, what)
    }

    /// Reads until the answer to transaction `tid` on agent `id` arrives (answers to other agents
    /// or to older requests are skipped), or the kernel's tries and a second more have passed.
    fn answer(
        &mut self,
        id: u32,
        tid: u64,
        lid: u16,
        what: &'static str,
    ) -> Result<Vec<u8>, UmadError> {
        let timed_out = || UmadError::Timeout {
            what,
            lid,
            ms: self.timeout_ms,
            tries: self.tries,
        };
        let deadline = Instant::now()
            + Duration::from_millis(u64::from(self.timeout_ms) * u64::from(self.tries) + 1000);
        let mut buf = vec![0u8; 64 + (1 << 18)];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !readable(&self.file, left) {
                return Err(timed_out());
            }
            let n = self
                .file
                .read(&mut buf)
                .map_err(|e| UmadError::os(&self.path, "read", e))?;
            let Ok((h, _)) = UserMadHdr::read_from_prefix(&buf[..n]) else {
                continue;
            };
            let body = &buf[64..n];
            let got_tid = body
                .get(8..16)
                .map(|b| u64::from_be_bytes(b.try_into().unwrap_or_default()));
            if h.id != id || got_tid != Some(tid) {
                continue; // another agent's, or an older request's
            }
            return match h.status {
                0 => Ok(body.to_vec()),
                s if s == libc::ETIMEDOUT as u32 => Err(timed_out()),
                status => Err(UmadError::Status { what, lid, status }),
            };
        }
    }
}

fn readable(f: &File, t: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: f.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = t.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_mad_hdr_bytes() {
        // ib_user_mad_hdr: id, status, timeout_ms, retries, length (host u32); qpn, qkey (be32);
        // lid (be16); sl, path_bits, grh_present, gid_index, hop_limit, traffic_class; gid[16];
        // flow_label (be32); pkey_index (u16); reserved[6]
        let h = UserMadHdr::request(7, 0x0042, 3, 5000, 2);
        let b = h.as_bytes();
        assert_eq!(b.len(), 64);
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()), 7);
        assert_eq!(u32::from_ne_bytes(b[8..12].try_into().unwrap()), 5000);
        assert_eq!(u32::from_ne_bytes(b[12..16].try_into().unwrap()), 2);
        assert_eq!(&b[20..24], &[0, 0, 0, 1], "qpn 1 (GSI), big-endian");
        assert_eq!(&b[24..28], &[0x80, 0x01, 0, 0], "GSI Q_Key");
        assert_eq!(&b[28..30], &[0, 0x42], "LID, big-endian");
        assert_eq!(
            u16::from_ne_bytes(b[56..58].try_into().unwrap()),
            3,
            "pkey_index at 56"
        );
    }

    #[test]
    fn ioctl_numbers() {
        // as <rdma/ib_user_mad.h> computes them on x86-64 and arm64
        assert_eq!(REGISTER_AGENT, 0xc01c_1b01);
        assert_eq!(ENABLE_PKEY, 0x1b03);
        let r = RegReq::new_zeroed();
        assert_eq!(r.as_bytes().len(), 28);
    }
}
