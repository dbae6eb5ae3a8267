//! NBD protocol structures (nbd `doc/proto.md`): the fixed-newstyle handshake, option requests and
//! replies (meta contexts among them), transmission requests, simple replies and structured reply
//! chunks. Big-endian on the wire; sizes asserted.

use super::{be16, be32, need, WireError};
use zerocopy::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// "NBDMAGIC".
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT".
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Option reply magic.
pub const REP_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Transmission request magic.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Simple reply magic.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Structured reply chunk magic.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// The one metadata context this server offers (allocation status).
pub const BASE_ALLOCATION: &str = "base:allocation";
/// [`BASE_ALLOCATION`]'s context id.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Handshake flags (server).
pub mod hflag {
    /// Fixed newstyle.
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    /// No 124 zero bytes after EXPORT_NAME.
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags.
pub mod cflag {
    /// Fixed newstyle.
    pub const FIXED_NEWSTYLE: u32 = 1 << 0;
    /// No zeroes.
    pub const NO_ZEROES: u32 = 1 << 1;
}

/// Transmission (per-export) flags.
pub mod tflag {
    /// The flags field is meaningful.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// Read-only export.
    pub const READ_ONLY: u16 = 1 << 1;
    /// FLUSH supported.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// FUA supported.
    pub const SEND_FUA: u16 = 1 << 3;
    /// TRIM supported.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// WRITE_ZEROES supported.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// A flush on one connection covers all of them.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// FAST_ZERO supported.
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Options.
pub mod opt {
    /// NBD_OPT_EXPORT_NAME.
    pub const EXPORT_NAME: u32 = 1;
    /// NBD_OPT_ABORT.
    pub const ABORT: u32 = 2;
    /// NBD_OPT_LIST.
    pub const LIST: u32 = 3;
    /// NBD_OPT_STARTTLS.
    pub const STARTTLS: u32 = 5;
    /// NBD_OPT_INFO.
    pub const INFO: u32 = 6;
    /// NBD_OPT_GO.
    pub const GO: u32 = 7;
    /// NBD_OPT_STRUCTURED_REPLY.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// NBD_OPT_LIST_META_CONTEXT.
    pub const LIST_META_CONTEXT: u32 = 9;
    /// NBD_OPT_SET_META_CONTEXT.
    pub const SET_META_CONTEXT: u32 = 10;
}

/// Option reply types.
pub mod rep {
    /// Acknowledge.
    pub const ACK: u32 = 1;
    /// An export (LIST).
    pub const SERVER: u32 = 2;
    /// Information (INFO/GO).
    pub const INFO: u32 = 3;
    /// A metadata context (LIST/SET_META_CONTEXT): its id and name.
    pub const META_CONTEXT: u32 = 4;
    /// Option not supported.
    pub const ERR_UNSUP: u32 = 0x8000_0001;
    /// Refused by policy.
    pub const ERR_POLICY: u32 = 0x8000_0002;
    /// Invalid option data.
    pub const ERR_INVALID: u32 = 0x8000_0003;
    /// The server requires TLS first.
    pub const ERR_TLS_REQD: u32 = 0x8000_0005;
    /// Unknown export.
    pub const ERR_UNKNOWN: u32 = 0x8000_0006;
    /// Server shutting down.
    pub const ERR_SHUTDOWN: u32 = 0x8000_0007;
}

/// NBD_INFO_* types.
pub mod info {
    /// Size and flags.
    pub const EXPORT: u16 = 0;
    /// Name.
    pub const NAME: u16 = 1;
    /// Description.
    pub const DESCRIPTION: u16 = 2;
    /// Block sizes.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Commands.
pub mod cmd {
    /// Read.
    pub const READ: u16 = 0;
    /// Write.
    pub const WRITE: u16 = 1;
    /// Disconnect.
    pub const DISC: u16 = 2;
    /// Flush.
    pub const FLUSH: u16 = 3;
    /// Trim.
    pub const TRIM: u16 = 4;
    /// Cache (read-ahead hint).
    pub const CACHE: u16 = 5;
    /// Write zeroes.
    pub const WRITE_ZEROES: u16 = 6;
    /// Block status (metadata contexts).
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags.
pub mod cmdflag {
    /// Force unit access.
    pub const FUA: u16 = 1 << 0;
    /// Zeroes must be written, not punched.
    pub const NO_HOLE: u16 = 1 << 1;
    /// BLOCK_STATUS: one extent is enough.
    pub const REQ_ONE: u16 = 1 << 3;
    /// Fail fast rather than zero slowly.
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// NBD error codes.
pub mod err {
    /// Operation not permitted.
    pub const EPERM: u32 = 1;
    /// I/O error.
    pub const EIO: u32 = 5;
    /// Out of memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid argument.
    pub const EINVAL: u32 = 22;
    /// No space.
    pub const ENOSPC: u32 = 28;
    /// Value too large (request past the end).
    pub const EOVERFLOW: u32 = 75;
    /// Not supported.
    pub const ENOTSUP: u32 = 95;
    /// Server shutting down.
    pub const ESHUTDOWN: u32 = 108;

    /// The NBD error for a (positive) errno from the block mapping or the target.
    pub fn from_errno(e: i32) -> u32 {
        match e {
            1 => EPERM,
            12 => ENOMEM,
            22 => EINVAL,
            28 => ENOSPC,
            30 => EPERM,
            75 => EOVERFLOW,
            95 => ENOTSUP,
            108 => ESHUTDOWN,
            _ => EIO,
        }
    }
}

/// A transmission request (28 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
struct RawRequest {
    magic: U32,
    flags: U16,
    kind: U16,
    cookie: U64,
    offset: U64,
    length: U32,
}
const _: () = assert!(core::mem::size_of::<RawRequest>() == 28);

/// The size of a transmission request header.
pub const REQUEST_LEN: usize = 28;
/// The size of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;

/// A decoded transmission request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Command flags.
    pub flags: u16,
    /// Command type.
    pub kind: u16,
    /// Opaque cookie (handle) echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub length: u32,
}

impl Request {
    /// Decodes the 28-byte request header; a bad magic is an error (the connection must close).
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let (r, _) = RawRequest::ref_from_prefix(b).map_err(|_| WireError::Truncated {
            what: "NBD request",
            need: REQUEST_LEN,
            got: b.len(),
        })?;
        if r.magic.get() != REQUEST_MAGIC {
            return Err(WireError::Invalid {
                what: "NBD request",
                field: "magic",
                value: u64::from(r.magic.get()),
                rule: "must be 0x25609513",
            });
        }
        Ok(Request {
            flags: r.flags.get(),
            kind: r.kind.get(),
            cookie: r.cookie.get(),
            offset: r.offset.get(),
            length: r.length.get(),
        })
    }

    /// Encodes the request (for tests and clients).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let r = RawRequest {
            magic: REQUEST_MAGIC.into(),
            flags: self.flags.into(),
            kind: self.kind.into(),
            cookie: self.cookie.into(),
            offset: self.offset.into(),
            length: self.length.into(),
        };
        let mut o = [0u8; REQUEST_LEN];
        o.copy_from_slice(r.as_bytes());
        o
    }
}

/// A simple reply header.
pub fn simple_reply(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut o = [0u8; SIMPLE_REPLY_LEN];
    o[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    o[4..8].copy_from_slice(&error.to_be_bytes());
    o[8..16].copy_from_slice(&cookie.to_be_bytes());
    o
}

/// Structured reply chunk types and flags.
pub mod chunk {
    /// The last chunk of the reply.
    pub const FLAG_DONE: u16 = 1;
    /// NBD_REPLY_TYPE_OFFSET_DATA: offset, then data.
    pub const OFFSET_DATA: u16 = 1;
    /// NBD_REPLY_TYPE_BLOCK_STATUS: context id, then (length, flags) descriptors.
    pub const BLOCK_STATUS: u16 = 5;
    /// NBD_REPLY_TYPE_ERROR: error, message length, message.
    pub const ERROR: u16 = (1 << 15) + 1;
}

/// Length of a structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;

/// A structured reply chunk header for `len` bytes of payload.
pub fn chunk_header(flags: u16, kind: u16, cookie: u64, len: u32) -> [u8; CHUNK_HEADER_LEN] {
    let mut o = [0u8; CHUNK_HEADER_LEN];
    o[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    o[4..6].copy_from_slice(&flags.to_be_bytes());
    o[6..8].copy_from_slice(&kind.to_be_bytes());
    o[8..16].copy_from_slice(&cookie.to_be_bytes());
    o[16..20].copy_from_slice(&len.to_be_bytes());
    o
}

/// The final NBD_REPLY_TYPE_ERROR chunk of a reply (no message).
pub fn error_chunk(error: u32, cookie: u64) -> [u8; CHUNK_HEADER_LEN + 6] {
    let mut o = [0u8; CHUNK_HEADER_LEN + 6];
    o[..CHUNK_HEADER_LEN].copy_from_slice(&chunk_header(chunk::FLAG_DONE, chunk::ERROR, cookie, 6));
    o[CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + 4].copy_from_slice(&error.to_be_bytes());
    o
}

/// base:allocation extent flags (NBD_STATE_*); 0 is allocated data.
pub mod state {
    /// Unallocated: a hole.
    pub const HOLE: u32 = 1 << 0;
    /// Reads as zeros.
    pub const ZERO: u32 = 1 << 1;
}

/// Appends the final NBD_REPLY_TYPE_BLOCK_STATUS chunk of a reply to `out`: `extents` as
/// (length, [`state`] flags), in order, for context `id`.
pub fn block_status_chunk(out: &mut Vec<u8>, cookie: u64, id: u32, extents: &[(u32, u32)]) {
    let len = 4 + 8 * extents.len() as u32;
    out.extend_from_slice(&chunk_header(
        chunk::FLAG_DONE,
        chunk::BLOCK_STATUS,
        cookie,
        len,
    ));
    out.extend_from_slice(&id.to_be_bytes());
    for (n, flags) in extents {
        out.extend_from_slice(&n.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
    }
}

/// LIST_META_CONTEXT / SET_META_CONTEXT option data: the export and the queries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaContextRequest {
    /// Export name.
    pub name: String,
    /// Context queries (e.g. "base:allocation", or "base:" for every base context).
    pub queries: Vec<String>,
}

/// A length-prefixed string of NBD option data at `*at`, moving `*at` past it.
fn prefixed(b: &[u8], at: &mut usize, what: &'static str) -> Result<String, WireError> {
    need(what, b, *at + 4)?;
    let n = be32(b, *at) as usize;
    let end = (*at + 4)
        .checked_add(n)
        .filter(|&e| e <= b.len())
        .ok_or(WireError::Truncated {
            what,
            need: (*at + 4).saturating_add(n),
            got: b.len(),
        })?;
    let s = String::from_utf8_lossy(&b[*at + 4..end]).into_owned();
    *at = end;
    Ok(s)
}

impl MetaContextRequest {
    /// Decodes the option data, checking every length against it.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let what = "NBD meta context request";
        let mut at = 0usize;
        let name = prefixed(b, &mut at, "NBD meta context export name")?;
        need(what, b, at + 4)?;
        let n = be32(b, at) as usize;
        at += 4;
        // each query takes at least its 4-byte length: a count the data cannot hold is refused
        if n > (b.len() - at) / 4 {
            return Err(WireError::Invalid {
                what,
                field: "query count",
                value: n as u64,
                rule: "must fit the option length",
            });
        }
        let queries = (0..n)
            .map(|_| prefixed(b, &mut at, "NBD meta context query"))
            .collect::<Result<Vec<_>, _>>()?;
        if at != b.len() {
            return Err(WireError::Invalid {
                what,
                field: "length",
                value: b.len() as u64,
                rule: "must end with the last query",
            });
        }
        Ok(MetaContextRequest { name, queries })
    }

    /// Whether a query selects [`BASE_ALLOCATION`]: by name, or all of the `base:` namespace
    /// (which LIST allows).
    pub fn selects_allocation(q: &str, list: bool) -> bool {
        q == BASE_ALLOCATION || (list && q == "base:")
    }
}

/// The server's first 18 bytes: NBDMAGIC, IHAVEOPT, handshake flags.
pub fn server_greeting() -> [u8; 18] {
    let mut o = [0u8; 18];
    o[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    o[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    o[16..18].copy_from_slice(&(hflag::FIXED_NEWSTYLE | hflag::NO_ZEROES).to_be_bytes());
    o
}

/// An option request header: IHAVEOPT, option, length (16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    /// The option.
    pub option: u32,
    /// Length of the option data that follows.
    pub length: u32,
}

impl OptionHeader {
    /// Decodes the 16-byte header; a bad magic is an error.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("NBD option header", b, 16)?;
        let magic = u64::from_be_bytes(b[0..8].try_into().expect("8 bytes"));
        if magic != IHAVEOPT {
            return Err(WireError::Invalid {
                what: "NBD option header",
                field: "magic",
                value: magic,
                rule: "must be IHAVEOPT",
            });
        }
        Ok(OptionHeader {
            option: be32(b, 8),
            length: be32(b, 12),
        })
    }
}

/// An option reply: header and data.
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut o = Vec::with_capacity(20 + data.len());
    o.extend_from_slice(&REP_MAGIC.to_be_bytes());
    o.extend_from_slice(&option.to_be_bytes());
    o.extend_from_slice(&kind.to_be_bytes());
    o.extend_from_slice(&(data.len() as u32).to_be_bytes());
    o.extend_from_slice(data);
    o
}

/// NBD_INFO_EXPORT payload: size and transmission flags.
pub fn info_export(size: u64, flags: u16) -> [u8; 12] {
    let mut o = [0u8; 12];
    o[0..2].copy_from_slice(&info::EXPORT.to_be_bytes());
    o[2..10].copy_from_slice(&size.to_be_bytes());
    o[10..12].copy_from_slice(&flags.to_be_bytes());
    o
}

/// NBD_INFO_BLOCK_SIZE payload.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> [u8; 14] {
    let mut o = [0u8; 14];
    o[0..2].copy_from_slice(&info::BLOCK_SIZE.to_be_bytes());
    o[2..6].copy_from_slice(&min.to_be_bytes());
    o[6..10].copy_from_slice(&preferred.to_be_bytes());
    o[10..14].copy_from_slice(&max.to_be_bytes());
    o
}

/// The data of NBD_OPT_INFO / NBD_OPT_GO: an export name and the info types asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name (may be empty: the default export).
    pub name: String,
    /// NBD_INFO_* types requested.
    pub requests: Vec<u16>,
}

impl InfoRequest {
    /// Decodes INFO/GO option data, checking every length against the data.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("NBD_OPT_GO data", b, 4)?;
        let nlen = be32(b, 0) as usize;
        let name_end =
            4usize
                .checked_add(nlen)
                .filter(|&e| e <= b.len())
                .ok_or(WireError::Truncated {
                    what: "NBD_OPT_GO export name",
                    need: 4usize.saturating_add(nlen),
                    got: b.len(),
                })?;
        need("NBD_OPT_GO info count", b, name_end + 2)?;
        let n = usize::from(be16(b, name_end));
        let list = &b[name_end + 2..];
        if list.len() != n * 2 {
            return Err(WireError::Invalid {
                what: "NBD_OPT_GO",
                field: "information request count",
                value: n as u64,
                rule: "must match the option length",
            });
        }
        Ok(InfoRequest {
            name: String::from_utf8_lossy(&b[4..name_end]).into_owned(),
            requests: list
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip_and_bad_magic() {
        let r = Request {
            flags: cmdflag::FUA,
            kind: cmd::WRITE,
            cookie: 7,
            offset: 4096,
            length: 512,
        };
        let b = r.encode();
        assert_eq!(&b[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(Request::parse(&b).unwrap(), r);
        let mut bad = b;
        bad[0] = 0;
        assert!(Request::parse(&bad).is_err());
        assert!(Request::parse(&b[..27]).is_err());
    }

    #[test]
    fn greeting_and_replies() {
        let g = server_greeting();
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(&g[16..18], &[0, 3]);
        let r = simple_reply(err::EIO, 0x1122);
        assert_eq!(&r[0..4], &[0x67, 0x44, 0x66, 0x98]);
        assert_eq!(&r[4..8], &[0, 0, 0, 5]);
        let o = option_reply(opt::GO, rep::ACK, &[]);
        assert_eq!(o.len(), 20);
        assert_eq!(&o[0..8], &REP_MAGIC.to_be_bytes());
        assert_eq!(info_export(1 << 20, 1).len(), 12);
    }

    #[test]
    fn meta_context_requests_and_chunks() {
        let mut d = 3u32.to_be_bytes().to_vec();
        d.extend_from_slice(b"vm0");
        d.extend_from_slice(&2u32.to_be_bytes());
        for q in ["base:allocation", "qemu:dirty-bitmap:x"] {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        let r = MetaContextRequest::parse(&d).unwrap();
        assert_eq!(r.name, "vm0");
        assert_eq!(r.queries, ["base:allocation", "qemu:dirty-bitmap:x"]);
        assert!(MetaContextRequest::selects_allocation("base:", true));
        assert!(!MetaContextRequest::selects_allocation("base:", false));
        // a count the data cannot hold, a query running past the end, trailing bytes
        let mut big = d[..7].to_vec();
        big.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(MetaContextRequest::parse(&big).is_err());
        assert!(MetaContextRequest::parse(&d[..d.len() - 1]).is_err());
        let mut long = d.clone();
        long.push(0);
        assert!(MetaContextRequest::parse(&long).is_err());
        assert!(MetaContextRequest::parse(&[0, 0]).is_err());
        let h = chunk_header(chunk::FLAG_DONE, chunk::OFFSET_DATA, 7, 520);
        assert_eq!(&h[0..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!((be16(&h, 4), be16(&h, 6), be32(&h, 16)), (1, 1, 520));
        let e = error_chunk(22, 7);
        assert_eq!((be16(&e, 6), be32(&e, 16), be32(&e, 20)), (0x8001, 6, 22));
        let mut b = Vec::new();
        block_status_chunk(
            &mut b,
            7,
            BASE_ALLOCATION_ID,
            &[(4096, 0), (512, state::HOLE)],
        );
        assert_eq!((be16(&b, 6), be32(&b, 16), b.len()), (5, 20, 40));
        assert_eq!((be32(&b, 20), be32(&b, 24), be32(&b, 28)), (1, 4096, 0));
        assert_eq!((be32(&b, 32), be32(&b, 36)), (512, 1));
    }

    #[test]
    fn go_data() {
        let mut d = vec![0, 0, 0, 3];
        d.extend_from_slice(b"lun");
        d.extend_from_slice(&[0, 1, 0, 3]);
        let g = InfoRequest::parse(&d).unwrap();
        assert_eq!(
            g,
            InfoRequest {
                name: "lun".into(),
                requests: vec![3]
            }
        );
        assert!(InfoRequest::parse(&d[..8]).is_err());
        let mut bad = d.clone();
        bad[3] = 200; // name length past the end
        assert!(InfoRequest::parse(&bad).is_err());
        assert!(InfoRequest::parse(&[0xff, 0xff, 0xff, 0xff]).is_err());
        let h = OptionHeader::parse(&[
            b'I', b'H', b'A', b'V', b'E', b'O', b'P', b'T', 0, 0, 0, 7, 0, 0, 0, 9,
        ])
        .unwrap();
        assert_eq!(
            h,
            OptionHeader {
                option: opt::GO,
                length: 9
            }
        );
    }
}
