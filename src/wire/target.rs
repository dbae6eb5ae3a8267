//! Target strings in the syntax SRP users already have.
//!
//! - ib_srp's `add_target` strings (`drivers/infiniband/ulp/srp/ib_srp.c`, `srp_parse_options`): every
//!   option, the same validity rules, the same two mandatory sets (`id_ext,ioc_guid,dgid,pkey,
//!   service_id` for the IB CM, `id_ext,ioc_guid,dest` for RDMA/CM).
//! - The lines `srp_daemon -o` prints, which are such strings.
//! - `/etc/srp_daemon.conf` rule lines (`a`/`d`, conditions, options appended on allow; first match
//!   wins; no match allows, as srp_daemon does).
//!
//! srp-ublk adds two keys, `lun=N` (the LUN to attach; ib_srp scans every LUN instead) and
//! `rkey_scope=command|login` (how long the target may reach a buffer, [`RkeyScope`]), and reads `#`
//! to the end of a line as a comment, so a `srp-ublk discover` line (string, then `# vendor ...`)
//! is a valid `--target` as printed.
//!
//! Errors quote the offending token and say what was expected.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// SRP r16a I/O class (the default): port ids are ext || guid.
pub const IO_CLASS_REV16A: u16 = 0x0100;
/// SRP r10 I/O class: port id halves swapped.
pub const IO_CLASS_REV10: u16 = 0xff00;
/// The initiator_ext srp-ublk logs in with when the target string sets none. The kernel's ib_srp
/// uses 0, and a SINGLE login from the same initiator port id tears the other's session down, so
/// srp-ublk's default differs: both initiators can share a port and a target.
pub const DEFAULT_INITIATOR_EXT: u64 = 1;
/// The kernel's SG_MAX_SEGMENTS, ib_srp's limit for sg_tablesize.
pub const SG_MAX_SEGMENTS: u32 = 2048;

/// A target string that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad target string: '{token}': {problem}")]
pub struct TargetError {
    /// The token (or a summary of what is missing).
    pub token: String,
    /// What was expected.
    pub problem: String,
}

fn err(token: &str, problem: impl Into<String>) -> TargetError {
    TargetError {
        token: token.to_string(),
        problem: problem.into(),
    }
}

/// Options beyond the target's identity, with ib_srp's names. `None` means ib_srp's default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetOptions {
    /// Maximum sectors per command.
    pub max_sect: Option<u32>,
    /// Maximum commands per LUN.
    pub max_cmd_per_lun: Option<u32>,
    /// Maximum commands the target can queue.
    pub target_can_queue: Option<u32>,
    /// I/O class: 0x0100 (r16a) or 0xff00 (r10).
    pub io_class: Option<u16>,
    /// initiator_ext: the first half of our initiator port id.
    pub initiator_ext: Option<u64>,
    /// Descriptors carried inside an SRP_CMD (1..=255).
    pub cmd_sg_entries: Option<u32>,
    /// Whether the target may fetch descriptor tables that do not fit in the IU.
    pub allow_ext_sg: Option<bool>,
    /// Maximum scatter/gather entries per command.
    pub sg_tablesize: Option<u32>,
    /// Completion vector.
    pub comp_vector: Option<u32>,
    /// Transport retry count (2..=7).
    pub tl_retry_count: Option<u32>,
    /// Commands in flight per channel.
    pub queue_size: Option<u32>,
    /// Maximum initiator-to-target IU size.
    pub max_it_iu_size: Option<u32>,
    /// Number of channels.
    pub ch_count: Option<u32>,
    /// How long the target may reach a data buffer (srp-ublk's key; `None`: [`RkeyScope::Command`]).
    pub rkey_scope: Option<RkeyScope>,
}

/// How long, and how much of, a data buffer the target can reach by RDMA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RkeyScope {
    /// One command's byte range, in the one direction the command moves data, from the SRP_CMD's
    /// send until its response (a memory window bound per command, as ib_srp's
    /// `register_always=Y` registers per command).
    #[default]
    Command,
    /// Every tag buffer, both directions, for the whole login (one registration per buffer;
    /// cheaper, but a late or stray RDMA lands in whatever the buffer holds then).
    Login,
}

impl RkeyScope {
    /// The key's value in a target string.
    pub fn as_str(self) -> &'static str {
        match self {
            RkeyScope::Command => "command",
            RkeyScope::Login => "login",
        }
    }
}

impl fmt::Display for RkeyScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RkeyScope {
    type Err = TargetError;

    fn from_str(s: &str) -> Result<Self, TargetError> {
        match s {
            "command" => Ok(RkeyScope::Command),
            "login" => Ok(RkeyScope::Login),
            _ => Err(err(
                s,
                "expected command (the target reaches a buffer only while its command is \
                 outstanding) or login (every buffer for the whole login)",
            )),
        }
    }
}

/// A parsed target: identity, how to reach it, options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    /// id_ext (identifier extension of the target port).
    pub id_ext: u64,
    /// ioc_guid (I/O controller GUID).
    pub ioc_guid: u64,
    /// How the login travels (RDMA/CM when `dest=` is given, as in ib_srp; else the IB CM).
    pub transport: Transport,
    /// Everything else.
    pub opts: TargetOptions,
    /// The LUN (`lun=N`, an srp-ublk extension), when the string names one.
    pub lun: Option<u64>,
}

/// How the login travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// RDMA/CM (RoCE, iWARP, IB with IP addressing): `dest=ip:port`.
    RdmaCm {
        /// Where the target listens (an IPv6 scope given by name is in `dest_if`, its scope id 0
        /// until the interface is looked up at login).
        dest: SocketAddr,
        /// Local address to bind, if given.
        src: Option<IpAddr>,
        /// The interface an IPv6 link-local `dest` is scoped by, when named
        /// (`dest=[fe80::1%eth0]:5555`, as ib_srp accepts).
        dest_if: Option<IfName>,
    },
    /// The IB CM: `dgid`, `pkey`, `service_id`.
    IbCm {
        /// Destination GID.
        dgid: [u8; 16],
        /// Partition key.
        pkey: u16,
        /// Service id.
        service_id: u64,
    },
}

const KNOWN: &str = "id_ext, ioc_guid, dgid, pkey, service_id, dest, src, max_sect, \
    max_cmd_per_lun, target_can_queue, io_class, initiator_ext, cmd_sg_entries, allow_ext_sg, \
    sg_tablesize, comp_vector, tl_retry_count, queue_size, max_it_iu_size, ch_count, lun, rkey_scope";

/// kstrtoull(.., 16): optional 0x, 1 to 16 hex digits.
fn parse_hex_u64(tok: &str, v: &str) -> Result<u64, TargetError> {
    let digits = v
        .strip_prefix("0x")
        .or_else(|| v.strip_prefix("0X"))
        .unwrap_or(v);
    if digits.is_empty() || digits.len() > 16 || !digits.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(err(
            tok,
            "expected up to 16 hex digits (e.g. 000000fffe770001)",
        ));
    }
    u64::from_str_radix(digits, 16).map_err(|_| err(tok, "expected up to 16 hex digits"))
}

/// A P_Key as ib_srp (match_hex) and srp_daemon's rules (strtoul(.., 16)) take it: hex, optional
/// 0x, at most ffff (srp_daemon would keep the low 16 bits of a larger one; refused here).
fn parse_pkey(tok: &str, v: &str) -> Result<u16, TargetError> {
    let digits = v
        .strip_prefix("0x")
        .or_else(|| v.strip_prefix("0X"))
        .unwrap_or(v);
    digits
        .bytes()
        .all(|c| c.is_ascii_hexdigit())
        .then(|| u64::from_str_radix(digits, 16).ok())
        .flatten()
        .and_then(|p| u16::try_from(p).ok())
        .ok_or_else(|| err(tok, "expected a 16-bit hex P_Key (e.g. ffff)"))
}

/// match_int with a lower and upper bound.
fn parse_int(tok: &str, v: &str, min: u32, max: u32) -> Result<u32, TargetError> {
    let n: i64 = v
        .parse()
        .map_err(|_| err(tok, "expected a decimal number"))?;
    if n < i64::from(min) || n > i64::from(max) {
        return Err(err(tok, format!("must be between {min} and {max}")));
    }
    Ok(n as u32)
}

fn parse_dgid(tok: &str, v: &str) -> Result<[u8; 16], TargetError> {
    if v.len() != 32 || !v.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(err(
            tok,
            "expected a GID of exactly 32 hex digits (e.g. fe800000000000000002c90300a0b1c2)",
        ));
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&v[2 * i..2 * i + 2], 16).map_err(|_| err(tok, "bad hex"))?;
    }
    Ok(g)
}

/// A network interface's name (at most 15 bytes, as the kernel's IFNAMSIZ allows).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IfName {
    len: u8,
    name: [u8; 15],
}

impl IfName {
    /// A name the kernel could give an interface: 1 to 15 bytes, no '/', ':', '%', blank or NUL.
    pub fn new(s: &str) -> Option<IfName> {
        let ok = !s.is_empty()
            && s.len() <= 15
            && s != "."
            && s != ".."
            && s.bytes()
                .all(|c| c.is_ascii_graphic() && !b"/:%[]".contains(&c));
        if !ok {
            return None;
        }
        let mut name = [0u8; 15];
        name[..s.len()].copy_from_slice(s.as_bytes());
        Some(IfName {
            len: s.len() as u8,
            name,
        })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // built from a &str of ASCII bytes
        std::str::from_utf8(&self.name[..usize::from(self.len)]).unwrap_or("")
    }
}

impl std::fmt::Debug for IfName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl std::fmt::Display for IfName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[IPv6%IFNAME]:PORT`: the address and port, and the interface named as its scope.
fn scoped_by_name(v: &str) -> Option<(SocketAddr, IfName)> {
    let (inner, port) = v.strip_prefix('[')?.split_once("]:")?;
    let (ip, scope) = inner.split_once('%')?;
    if scope.bytes().all(|c| c.is_ascii_digit()) {
        return None; // a numeric scope id: SocketAddr parses it
    }
    let ip: std::net::Ipv6Addr = ip.parse().ok()?;
    let port: u16 = port.parse().ok()?;
    Some((SocketAddr::new(IpAddr::V6(ip), port), IfName::new(scope)?))
}

/// `ip:port`, `[ipv6]:port` or `[ipv6%interface]:port`; the port is mandatory (as in ib_srp).
fn parse_dest(tok: &str, v: &str) -> Result<(SocketAddr, Option<IfName>), TargetError> {
    if let Ok(sa) = v.parse::<SocketAddr>() {
        return Ok((sa, None));
    }
    if let Some((sa, name)) = scoped_by_name(v) {
        return Ok((sa, Some(name)));
    }
    if v.parse::<IpAddr>().is_ok()
        || v.trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok()
    {
        return Err(err(
            tok,
            "the port is missing: use dest=IP:PORT (LIO's RDMA/CM port is often 5555)",
        ));
    }
    Err(err(
        tok,
        "expected IP:PORT, [IPv6]:PORT or [IPv6%INTERFACE]:PORT",
    ))
}

fn parse_src(tok: &str, v: &str) -> Result<IpAddr, TargetError> {
    if let Ok(ip) = v
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        return Ok(ip);
    }
    v.parse::<SocketAddr>()
        .map(|s| s.ip())
        .map_err(|_| err(tok, "expected an IP address"))
}

impl TargetOptions {
    /// Applies one `key=value` option; returns false if `key` is not an option of this kind.
    fn apply(&mut self, tok: &str, key: &str, v: &str) -> Result<bool, TargetError> {
        let pos = |min| parse_int(tok, v, min, i32::MAX as u32);
        match key {
            "max_sect" => self.max_sect = Some(pos(1)?),
            "max_cmd_per_lun" => self.max_cmd_per_lun = Some(pos(1)?),
            "target_can_queue" => self.target_can_queue = Some(pos(1)?),
            "queue_size" => self.queue_size = Some(pos(1)?),
            "ch_count" => self.ch_count = Some(pos(1)?),
            "comp_vector" => self.comp_vector = Some(pos(0)?),
            "max_it_iu_size" => self.max_it_iu_size = Some(pos(0)?),
            "cmd_sg_entries" => self.cmd_sg_entries = Some(parse_int(tok, v, 1, 255)?),
            "sg_tablesize" => self.sg_tablesize = Some(parse_int(tok, v, 1, SG_MAX_SEGMENTS)?),
            "tl_retry_count" => self.tl_retry_count = Some(parse_int(tok, v, 2, 7)?),
            "allow_ext_sg" => {
                let n: i64 = v.parse().map_err(|_| err(tok, "expected 0 or 1"))?;
                self.allow_ext_sg = Some(n != 0);
            }
            "initiator_ext" => self.initiator_ext = Some(parse_hex_u64(tok, v)?),
            "rkey_scope" => {
                self.rkey_scope = Some(v.parse().map_err(|e: TargetError| err(tok, e.problem))?)
            }
            "io_class" => {
                let digits = v.trim_start_matches("0x").trim_start_matches("0X");
                let c = u32::from_str_radix(digits, 16).map_err(|_| err(tok, "expected hex"))?;
                if c != u32::from(IO_CLASS_REV10) && c != u32::from(IO_CLASS_REV16A) {
                    return Err(err(
                        tok,
                        "unknown I/O class: use 100 (SRP r16a) or ff00 (SRP r10)",
                    ));
                }
                self.io_class = Some(c as u16);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// `key=value` pairs of the options that are set, in ib_srp's order.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        let mut num = |k: &'static str, o: Option<u32>| {
            if let Some(n) = o {
                v.push((k, n.to_string()));
            }
        };
        num("max_sect", self.max_sect);
        num("max_cmd_per_lun", self.max_cmd_per_lun);
        num("target_can_queue", self.target_can_queue);
        if let Some(c) = self.io_class {
            v.push(("io_class", format!("{c:x}")));
        }
        if let Some(e) = self.initiator_ext {
            v.push(("initiator_ext", format!("{e:016x}")));
        }
        let mut num = |k: &'static str, o: Option<u32>| {
            if let Some(n) = o {
                v.push((k, n.to_string()));
            }
        };
        num("cmd_sg_entries", self.cmd_sg_entries);
        num("allow_ext_sg", self.allow_ext_sg.map(u32::from));
        num("sg_tablesize", self.sg_tablesize);
        num("comp_vector", self.comp_vector);
        num("tl_retry_count", self.tl_retry_count);
        num("queue_size", self.queue_size);
        num("max_it_iu_size", self.max_it_iu_size);
        num("ch_count", self.ch_count);
        if let Some(r) = self.rkey_scope {
            v.push(("rkey_scope", r.to_string()));
        }
        v
    }
}

/// The keys that name a target port, as ib_srp and srp_daemon spell them: in an add_target
/// string they say whom to log in to, in a rules file which targets a rule selects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetKeys {
    /// id_ext.
    pub id_ext: Option<u64>,
    /// ioc_guid.
    pub ioc_guid: Option<u64>,
    /// dgid.
    pub dgid: Option<[u8; 16]>,
    /// pkey.
    pub pkey: Option<u16>,
    /// service_id.
    pub service_id: Option<u64>,
}

impl TargetKeys {
    /// Takes one `key=value` token if `key` is one of these; false if it is not.
    fn take(&mut self, tok: &str, key: &str, v: &str) -> Result<bool, TargetError> {
        match key {
            "id_ext" => self.id_ext = Some(parse_hex_u64(tok, v)?),
            "ioc_guid" => self.ioc_guid = Some(parse_hex_u64(tok, v)?),
            "dgid" => self.dgid = Some(parse_dgid(tok, v)?),
            "pkey" => self.pkey = Some(parse_pkey(tok, v)?),
            "service_id" => self.service_id = Some(parse_hex_u64(tok, v)?),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// An add_target string's keys as given, before the mandatory ones are checked.
#[derive(Default)]
struct Keys {
    ids: TargetKeys,
    dest: Option<(SocketAddr, Option<IfName>)>,
    src: Option<IpAddr>,
    lun: Option<u64>,
    opts: TargetOptions,
}

impl Keys {
    /// Takes one `key=value` token; a later value replaces an earlier one, as in ib_srp.
    fn apply(&mut self, tok: &str, key: &str, v: &str) -> Result<(), TargetError> {
        match key {
            _ if self.ids.take(tok, key, v)? => {}
            "dest" => self.dest = Some(parse_dest(tok, v)?),
            "src" => self.src = Some(parse_src(tok, v)?),
            "lun" => {
                let lun = v.parse::<u64>().map_err(|_| {
                    err(
                        tok,
                        "expected a LUN number (as Linux numbers them, e.g. lun=0)",
                    )
                })?;
                self.lun = Some(lun);
            }
            _ if self.opts.apply(tok, key, v)? => {}
            _ => return Err(err(tok, format!("unknown option; known keys: {KNOWN}"))),
        }
        Ok(())
    }

    /// The target, once the identity and one way to reach it are there; `s` is the whole string
    /// (for the error).
    fn into_spec(self, s: &str) -> Result<TargetSpec, TargetError> {
        let ids = self.ids;
        let (Some(id_ext), Some(ioc_guid)) = (ids.id_ext, ids.ioc_guid) else {
            return Err(err(s, "id_ext and ioc_guid are mandatory"));
        };
        let transport = match (self.dest, ids.dgid, ids.pkey, ids.service_id) {
            (Some((dest, dest_if)), ..) => Transport::RdmaCm {
                dest,
                src: self.src,
                dest_if,
            },
            (None, Some(dgid), Some(pkey), Some(service_id)) => Transport::IbCm {
                dgid,
                pkey,
                service_id,
            },
            _ => {
                return Err(err(
                    s,
                    "missing where to connect: give dest=IP:PORT (RDMA/CM) or dgid, pkey and \
                     service_id (IB CM)",
                ))
            }
        };
        Ok(TargetSpec {
            id_ext,
            ioc_guid,
            transport,
            opts: self.opts,
            lun: self.lun,
        })
    }
}

impl TargetSpec {
    /// Parses an ib_srp `add_target` string (or an `srp_daemon -o` line). Options are separated by
    /// commas or newlines; empty ones are skipped; a later value replaces an earlier one, as in
    /// ib_srp. `#` starts a comment that runs to the end of its line.
    pub fn parse(s: &str) -> Result<Self, TargetError> {
        let uncommented: Vec<&str> = s
            .lines()
            .map(|l| l.split_once('#').map_or(l, |(a, _)| a))
            .collect();
        let s = uncommented.join("\n");
        let mut keys = Keys::default();
        for tok in s
            .split([',', '\n'])
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            let Some((key, v)) = tok.split_once('=') else {
                return Err(err(tok, format!("expected key=value; known keys: {KNOWN}")));
            };
            if v.is_empty() {
                return Err(err(tok, format!("the value of {key} is missing")));
            }
            keys.apply(tok, key, v)?;
        }
        keys.into_spec(s.trim())
    }

    fn rev10(&self) -> bool {
        self.opts.io_class == Some(IO_CLASS_REV10)
    }

    /// The SRP target port id: id_ext || ioc_guid (r16a), swapped for io_class ff00 (r10).
    pub fn target_port_id(&self) -> [u8; 16] {
        let (a, b) = if self.rev10() {
            (self.ioc_guid, self.id_ext)
        } else {
            (self.id_ext, self.ioc_guid)
        };
        pair(a, b)
    }

    /// The SRP initiator port id for a local port GUID: initiator_ext || port GUID (r16a),
    /// swapped for r10. `default_ext` is used when the string sets no initiator_ext.
    pub fn initiator_port_id(&self, port_guid: u64, default_ext: u64) -> [u8; 16] {
        let ext = self.opts.initiator_ext.unwrap_or(default_ext);
        if self.rev10() {
            pair(port_guid, ext)
        } else {
            pair(ext, port_guid)
        }
    }

    /// Whether logins to `self` and `other` form the same I_T nexus (same target port, same way
    /// there, same initiator_ext), whatever their other options and LUNs: a SINGLE login to one
    /// tears down the other's channels.
    pub fn same_nexus(&self, other: &TargetSpec) -> bool {
        let ext = |t: &TargetSpec| t.opts.initiator_ext.unwrap_or(DEFAULT_INITIATOR_EXT);
        self.target_port_id() == other.target_port_id()
            && self.transport == other.transport
            && ext(self) == ext(other)
            && self.rev10() == other.rev10()
    }

    /// Adds options (an srp_daemon.conf allow rule's, or the CLI's) on top of this target.
    pub fn with_options(&self, opts: &str) -> Result<Self, TargetError> {
        let mut s = self.clone();
        for raw in opts.split([',', '\n']) {
            let tok = raw.trim();
            if tok.is_empty() {
                continue;
            }
            let (k, v) = tok
                .split_once('=')
                .ok_or_else(|| err(tok, "expected key=value"))?;
            if !s.opts.apply(tok, k, v)? {
                return Err(err(tok, "not a per-target option"));
            }
        }
        Ok(s)
    }
}

fn pair(a: u64, b: u64) -> [u8; 16] {
    let mut o = [0u8; 16];
    o[..8].copy_from_slice(&a.to_be_bytes());
    o[8..].copy_from_slice(&b.to_be_bytes());
    o
}

/// Formats 16 port-id bytes as 32 hex digits.
pub fn hex16(b: &[u8; 16]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl fmt::Display for TargetSpec {
    /// The normalized string: 16-digit lowercase hex as srp_daemon prints, options in ib_srp order.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "id_ext={:016x},ioc_guid={:016x}",
            self.id_ext, self.ioc_guid
        )?;
        match self.transport {
            Transport::IbCm {
                dgid,
                pkey,
                service_id,
            } => write!(
                f,
                ",dgid={},pkey={pkey:04x},service_id={service_id:016x}",
                hex16(&dgid)
            )?,
            Transport::RdmaCm { dest, src, dest_if } => {
                match (dest, dest_if) {
                    (SocketAddr::V6(d), Some(n)) => {
                        write!(f, ",dest=[{}%{n}]:{}", d.ip(), d.port())?
                    }
                    _ => write!(f, ",dest={dest}")?,
                }
                if let Some(s) = src {
                    write!(f, ",src={s}")?;
                }
            }
        }
        for (k, v) in self.opts.pairs() {
            write!(f, ",{k}={v}")?;
        }
        if let Some(l) = self.lun {
            write!(f, ",lun={l}")?;
        }
        Ok(())
    }
}

/// A rules file line that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rules line {line}: '{token}': {problem}")]
pub struct RuleError {
    /// 1-based line number.
    pub line: usize,
    /// The offending token.
    pub token: String,
    /// What was expected.
    pub problem: String,
}

/// One srp_daemon.conf rule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    /// 1-based line number in the file.
    pub line: usize,
    /// `a` (allow) or `d` (disallow).
    pub allow: bool,
    /// Conditions: every key given must match the target's.
    pub when: TargetKeys,
    /// Options appended to matching targets (allow rules only), as `key=value,...`.
    pub options: String,
}

impl Rule {
    /// Whether every condition of the rule holds for `t`.
    pub fn matches(&self, t: &TargetSpec) -> bool {
        let (dgid, pkey, service_id) = match t.transport {
            Transport::IbCm {
                dgid,
                pkey,
                service_id,
            } => (Some(dgid), Some(pkey), Some(service_id)),
            Transport::RdmaCm { .. } => (None, None, None),
        };
        let w = &self.when;
        w.id_ext.is_none_or(|v| v == t.id_ext)
            && w.ioc_guid.is_none_or(|v| v == t.ioc_guid)
            && w.dgid.is_none_or(|v| Some(v) == dgid)
            && w.service_id.is_none_or(|v| Some(v) == service_id)
            && w.pkey.is_none_or(|v| Some(v) == pkey)
    }

    /// One rule from its line `t` (trimmed, not a comment), line number `line`.
    fn parse(line: usize, t: &str) -> Result<Rule, RuleError> {
        let e = |token: &str, problem: &str| RuleError {
            line,
            token: token.into(),
            problem: problem.into(),
        };
        let mut chars = t.chars();
        let allow = match chars.next() {
            Some('a' | 'A') => true,
            Some('d' | 'D') => false,
            _ => return Err(e(t, "a rule starts with 'a' (allow) or 'd' (disallow)")),
        };
        let rest = chars.as_str();
        if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
            return Err(e(t, "expected blanks after 'a' or 'd'"));
        }
        let mut rule = Rule {
            line,
            allow,
            ..Default::default()
        };
        let mut opts = Vec::new();
        for tok in rest.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = tok
                .split_once('=')
                .ok_or_else(|| e(tok, "expected key=value"))?;
            rule.take(tok, k, v, &mut opts)
                .map_err(|x| e(tok, &x.problem))?;
        }
        rule.options = opts.join(",");
        Ok(rule)
    }

    /// Takes one `key=value` token: a condition, or (allow rules) an option, checked now as
    /// srp_daemon does and kept in `opts`.
    fn take(
        &mut self,
        tok: &str,
        k: &str,
        v: &str,
        opts: &mut Vec<String>,
    ) -> Result<(), TargetError> {
        match k {
            _ if self.when.take(tok, k, v)? => {}
            k if RULE_OPTIONS.contains(&k) => {
                if !self.allow {
                    return Err(err(tok, "options belong to allow ('a') rules"));
                }
                TargetOptions::default().apply(tok, k, v)?;
                opts.push(tok.to_string());
            }
            _ => {
                return Err(err(
                    tok,
                    format!(
                        "unknown key; conditions are id_ext, ioc_guid, dgid, service_id, pkey; \
                         options are {}",
                        RULE_OPTIONS.join(", ")
                    ),
                ))
            }
        }
        Ok(())
    }
}

/// The options srp_daemon lets an allow rule append (`parse_other_option`), and srp-ublk's `rkey_scope`.
const RULE_OPTIONS: [&str; 9] = [
    "allow_ext_sg",
    "cmd_sg_entries",
    "comp_vector",
    "max_cmd_per_lun",
    "max_sect",
    "queue_size",
    "rkey_scope",
    "sg_tablesize",
    "tl_retry_count",
];

/// An srp_daemon.conf rules file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules(pub Vec<Rule>);

impl Rules {
    /// Parses the file: `#` comments and blank lines skipped; each rule is `a` or `d`, blanks, then
    /// comma-separated `key=value` conditions and (allow rules) options.
    pub fn parse(text: &str) -> Result<Self, RuleError> {
        let rules = text
            .lines()
            .enumerate()
            .map(|(i, line)| (i + 1, line.trim()))
            .filter(|(_, t)| !t.is_empty() && !t.starts_with('#'))
            .map(|(ln, t)| Rule::parse(ln, t))
            .collect::<Result<_, _>>()?;
        Ok(Rules(rules))
    }

    /// The first rule that matches `t`, or None (srp_daemon then allows the target unchanged).
    pub fn first_match(&self, t: &TargetSpec) -> Option<&Rule> {
        self.0.iter().find(|r| r.matches(t))
    }

    /// Applies the rules: None if a disallow rule matches, else the target with the allow rule's
    /// options appended.
    pub fn apply(&self, t: &TargetSpec) -> Result<Option<TargetSpec>, TargetError> {
        match self.first_match(t) {
            Some(r) if !r.allow => Ok(None),
            Some(r) => t.with_options(&r.options).map(Some),
            None => Ok(Some(t.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn lun_key_and_comments() {
        let t = super::TargetSpec::parse(
            "id_ext=000000fffe770001,ioc_guid=000000fffe770001,dest=10.77.0.1:5555,lun=2 \
             # LIO-ORG RAMDISK-MCP 16 MiB wwn=naa.6001405",
        )
        .unwrap();
        assert_eq!(t.lun, Some(2));
        assert_eq!(
            t.to_string(),
            "id_ext=000000fffe770001,ioc_guid=000000fffe770001,dest=10.77.0.1:5555,lun=2"
        );
        let other_lun = super::TargetSpec::parse(
            "id_ext=000000fffe770001,ioc_guid=000000fffe770001,dest=10.77.0.1:5555,lun=0,queue_size=8",
        )
        .unwrap();
        assert!(
            t.same_nexus(&other_lun),
            "LUNs and options do not change the nexus"
        );
        let other_ext = other_lun.with_options("initiator_ext=2").unwrap();
        assert!(!t.same_nexus(&other_ext));
        let e = super::TargetSpec::parse("id_ext=1,ioc_guid=1,dest=1.2.3.4:5,lun=x").unwrap_err();
        assert!(e.problem.contains("LUN"), "{e}");
        // a comment line of its own, and options on the next
        let t = super::TargetSpec::parse("# from discover\nid_ext=1,ioc_guid=2\ndest=1.2.3.4:5")
            .unwrap();
        assert_eq!((t.id_ext, t.ioc_guid, t.lun), (1, 2, None));
    }

    use super::*;

    const LAB: &str = "id_ext=000000fffe770001,ioc_guid=000000fffe770001,dest=10.77.0.1:5555";

    #[test]
    fn lab_string_and_port_ids() {
        let t = TargetSpec::parse(LAB).unwrap();
        assert_eq!(t.to_string(), LAB);
        assert!(matches!(t.transport, Transport::RdmaCm { src: None, .. }));
        assert_eq!(
            hex16(&t.target_port_id()),
            "000000fffe770001000000fffe770001"
        );
        assert_eq!(
            hex16(&t.initiator_port_id(0x0000_00ff_fe77_0001, 0)),
            "0000000000000000000000fffe770001"
        );
        let r10 = t.with_options("io_class=ff00,initiator_ext=2").unwrap();
        assert_eq!(
            hex16(&r10.initiator_port_id(0xaa, 0)),
            "00000000000000aa0000000000000002"
        );
    }

    #[test]
    fn srp_daemon_output_line_and_every_option() {
        let line = "id_ext=200100A0B81146A1,ioc_guid=0002c90200402bd4,\
                    dgid=fe800000000000000002c90200402bd5,pkey=ffff,service_id=200100a0b81146a1\n";
        let t = TargetSpec::parse(line).unwrap();
        assert_eq!(t.id_ext, 0x2001_00a0_b811_46a1);
        assert!(matches!(t.transport, Transport::IbCm { pkey: 0xffff, .. }));
        let all = format!(
            "{LAB},src=10.77.0.2,max_sect=2048,max_cmd_per_lun=64,target_can_queue=128,io_class=100,\
             initiator_ext=0x1,cmd_sg_entries=12,allow_ext_sg=1,sg_tablesize=128,comp_vector=0,\
             tl_retry_count=7,queue_size=64,max_it_iu_size=8276,ch_count=2"
        );
        let t = TargetSpec::parse(&all).unwrap();
        assert_eq!(t.opts.queue_size, Some(64));
        assert_eq!(t.opts.initiator_ext, Some(1));
        assert!(
            matches!(t.transport, Transport::RdmaCm { src: Some(ip), .. } if ip.to_string() == "10.77.0.2")
        );
        // normalized form parses back to the same target
        assert_eq!(TargetSpec::parse(&t.to_string()).unwrap(), t);
        let v6 = TargetSpec::parse("id_ext=1,ioc_guid=2,dest=[fe80::1]:5555").unwrap();
        assert_eq!(TargetSpec::parse(&v6.to_string()).unwrap(), v6);
    }

    #[test]
    fn an_ipv6_dest_scoped_by_an_interface_name() {
        let t = TargetSpec::parse("id_ext=1,ioc_guid=1,dest=[fe80::2%eth0]:5555").unwrap();
        let Transport::RdmaCm { dest, dest_if, .. } = t.transport else {
            panic!("not RDMA/CM")
        };
        assert_eq!(dest, "[fe80::2]:5555".parse::<SocketAddr>().unwrap());
        assert_eq!(dest_if.map(|n| n.to_string()).as_deref(), Some("eth0"));
        assert!(t.to_string().contains(",dest=[fe80::2%eth0]:5555"), "{t}");
        assert_eq!(TargetSpec::parse(&t.to_string()).unwrap(), t);
        // a numeric scope is the address's own
        let t = TargetSpec::parse("id_ext=1,ioc_guid=1,dest=[fe80::2%3]:5555").unwrap();
        assert!(
            matches!(t.transport, Transport::RdmaCm { dest: SocketAddr::V6(d), dest_if: None, .. } if d.scope_id() == 3)
        );
        for bad in [
            "[fe80::2%]:5555",
            "[fe80::2%a/b]:5555",
            "[fe80::2%0123456789abcdef]:5555",
            "[fe80::2%eth0]",
        ] {
            let s = format!("id_ext=1,ioc_guid=1,dest={bad}");
            assert!(TargetSpec::parse(&s).is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn errors_quote_the_token() {
        let cases = [
            ("id_ext=1,ioc_guid=zz,dest=10.0.0.1:5555", "ioc_guid=zz"),
            ("id_ext=1,ioc_guid=2,dest=10.0.0.1", "port is missing"),
            ("id_ext=1,ioc_guid=2", "missing where to connect"),
            ("ioc_guid=2,dest=10.0.0.1:1", "mandatory"),
            (
                "id_ext=1,ioc_guid=2,dest=10.0.0.1:1,tl_retry_count=9",
                "tl_retry_count=9",
            ),
            (
                "id_ext=1,ioc_guid=2,dest=10.0.0.1:1,cmd_sg_entries=0",
                "between 1 and 255",
            ),
            (
                "id_ext=1,ioc_guid=2,dest=10.0.0.1:1,io_class=5",
                "unknown I/O class",
            ),
            (
                "id_ext=1,ioc_guid=2,dest=10.0.0.1:1,bogus=1",
                "unknown option",
            ),
            (
                "id_ext=1,ioc_guid=2,dest=10.0.0.1:1,queue_size=",
                "value of queue_size is missing",
            ),
            (
                "id_ext=11111111111111111,ioc_guid=2,dest=1.2.3.4:1",
                "16 hex digits",
            ),
            (
                "id_ext=1,ioc_guid=2,dgid=fe80,pkey=ffff,service_id=1",
                "32 hex digits",
            ),
            ("id_ext=1,ioc_guid=2,dest=1.2.3.4:1,queue_size", "key=value"),
        ];
        for (s, want) in cases {
            let e = TargetSpec::parse(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
    }

    #[test]
    fn rules_file() {
        let text = "## example\n\
                    d\tdgid=fe800000000000000002c90200402bd5\n\
                    a       ioc_guid=00a0b80200402bd7,queue_size=128,max_cmd_per_lun=128\n\
                    a  id_ext=200500A0B81146A1,ioc_guid=00a0b80200402bef\n\
                    \n\
                    d\n";
        let r = Rules::parse(text).unwrap();
        assert_eq!(r.0.len(), 4);
        let ib = |ioc: &str, dgid: &str| {
            TargetSpec::parse(&format!(
                "id_ext=200500a0b81146a1,ioc_guid={ioc},dgid={dgid},pkey=ffff,service_id=1"
            ))
            .unwrap()
        };
        let blocked = ib("00a0b80200402bd7", "fe800000000000000002c90200402bd5");
        assert_eq!(r.apply(&blocked).unwrap(), None);
        let tuned = r
            .apply(&ib("00a0b80200402bd7", "fe800000000000000002c90200402bd6"))
            .unwrap()
            .unwrap();
        assert_eq!(tuned.opts.queue_size, Some(128));
        assert!(r
            .apply(&ib("00a0b80200402bef", "fe800000000000000002c90200402bd6"))
            .unwrap()
            .is_some());
        assert_eq!(
            r.apply(&ib("0000000000000001", "fe800000000000000002c90200402bd6"))
                .unwrap(),
            None
        );
        // no rules: everything allowed
        assert!(Rules::default().apply(&blocked).unwrap().is_some());
    }

    #[test]
    fn pkey_with_or_without_0x_in_strings_and_rules() {
        let ib = |pkey: &str| {
            TargetSpec::parse(&format!(
                "id_ext=1,ioc_guid=2,dgid=fe800000000000000002c90200402bd5,pkey={pkey},service_id=3"
            ))
        };
        for ok in ["ffff", "0xffff", "0XFFFF", "00ffff", "7fff"] {
            let t = ib(ok).unwrap();
            let Transport::IbCm { pkey, .. } = t.transport else {
                panic!("{ok}: not IB CM");
            };
            assert_eq!(
                pkey,
                u16::from_str_radix(ok.trim_start_matches("0x").trim_start_matches("0X"), 16)
                    .unwrap(),
                "{ok}"
            );
        }
        for bad in ["10000", "0x", "fffg", "+fff", "-1"] {
            let e = ib(bad).unwrap_err().to_string();
            assert!(e.contains("16-bit hex P_Key"), "{bad}: {e}");
        }
        // srp_daemon reads a rule's pkey with strtoul(.., 16): 0x is allowed there too
        let r = Rules::parse("d pkey=0xffff\na\n").unwrap();
        assert_eq!(r.0[0].when.pkey, Some(0xffff));
        assert_eq!(r.apply(&ib("ffff").unwrap()).unwrap(), None);
        assert!(r.apply(&ib("7fff").unwrap()).unwrap().is_some());
        let e = Rules::parse("a\nd pkey=12345\n").unwrap_err();
        assert_eq!((e.line, e.token.as_str()), (2, "pkey=12345"));
    }

    #[test]
    fn rules_errors_name_line_and_token() {
        let e = Rules::parse("# c\nx id_ext=1\n").unwrap_err();
        assert_eq!(e.line, 2);
        let e = Rules::parse("a ioc_guid=xyz\n").unwrap_err();
        assert!(e.to_string().contains("ioc_guid=xyz"), "{e}");
        let e = Rules::parse("d queue_size=4\n").unwrap_err();
        assert!(e.problem.contains("allow"));
        let e = Rules::parse("a tl_retry_count=1\n").unwrap_err();
        assert!(e.to_string().contains("between 2 and 7"));
        assert!(Rules::parse("aid_ext=1").is_err());
    }
}
