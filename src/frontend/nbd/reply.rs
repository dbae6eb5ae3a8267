//! The replies' framing that depends on what the client negotiated: simple replies, or
//! structured reply chunks.

use super::handshake::Negotiated;
use crate::wire::nbd;

/// The header of a successful read's reply of `len` bytes at `off` (the data follows it): one
/// data chunk once structured replies are on, a simple reply otherwise.
pub(super) fn read_reply_header(
    out: &mut Vec<u8>,
    neg: Negotiated,
    cookie: u64,
    off: u64,
    len: u32,
) {
    if neg.structured {
        let (flags, kind) = (nbd::chunk::FLAG_DONE, nbd::chunk::OFFSET_DATA);
        out.extend_from_slice(&nbd::chunk_header(flags, kind, cookie, 8 + len));
        out.extend_from_slice(&off.to_be_bytes());
    } else {
        out.extend_from_slice(&nbd::simple_reply(0, cookie));
    }
}

/// An error reply: a structured error chunk for a READ once structured replies are on (its success
/// is a chunk too), a simple reply otherwise.
pub(super) fn error_reply(out: &mut Vec<u8>, neg: Negotiated, read: bool, e: u32, cookie: u64) {
    if neg.structured && read && e != 0 {
        out.extend_from_slice(&nbd::error_chunk(e, cookie));
    } else {
        out.extend_from_slice(&nbd::simple_reply(e, cookie));
    }
}
