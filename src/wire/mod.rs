//! The wire protocol: bytes in, typed values out, and back. No I/O, no allocation on the per-I/O path.
//!
//! - [`srp`]: SRP information units (T10 SRP r16a / SRP-2, Linux `include/scsi/srp.h`).
//! - [`scsi`]: SCSI CDBs, the parameter data the initiator reads (INQUIRY, VPD, READ CAPACITY, MODE SENSE,
//!   REPORT LUNS) and sense decoding into what the block layer should do.
//! - [`mad`]: InfiniBand SA and Device Management MADs for SRP target discovery (srp_daemon's).
//! - [`nbd`]: the NBD handshake, requests and replies.
//! - [`target`]: ib_srp `add_target` strings, `srp_daemon -o` lines and `srp_daemon.conf` rules.
//!
//! Every decoder is total: any byte string yields a value or a [`WireError`], never a panic.

pub mod mad;
pub mod nbd;
pub mod scsi;
pub mod srp;
pub mod target;

/// What went wrong turning bytes into a value (or a value into bytes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The input ends before the structure does.
    #[error("{what}: truncated, need {need} bytes, got {got}")]
    Truncated {
        /// The structure being decoded.
        what: &'static str,
        /// Bytes the structure needs.
        need: usize,
        /// Bytes available.
        got: usize,
    },
    /// The opcode byte names another IU than the one expected.
    #[error("{what}: expected opcode {expected:#04x}, got {got:#04x}")]
    WrongOpcode {
        /// The IU being decoded.
        what: &'static str,
        /// Its opcode.
        expected: u8,
        /// The opcode found.
        got: u8,
    },
    /// An opcode no SRP IU has (or one the peer must never send us).
    #[error("unknown or unexpected SRP opcode {opcode:#04x} ({who})")]
    UnexpectedOpcode {
        /// The opcode found.
        opcode: u8,
        /// Which side's IUs were expected.
        who: &'static str,
    },
    /// A field holds a value the protocol does not allow.
    #[error("{what}: {field} = {value:#x} is invalid: {rule}")]
    Invalid {
        /// The structure being decoded or encoded.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// The output buffer cannot hold the encoded structure.
    #[error("{what}: output buffer too small, need {need} bytes, have {have}")]
    NoRoom {
        /// The structure being encoded.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
}

/// Checks that `buf` holds at least `need` bytes.
#[inline]
pub(crate) fn need(what: &'static str, buf: &[u8], need: usize) -> Result<(), WireError> {
    if buf.len() < need {
        return Err(WireError::Truncated {
            what,
            need,
            got: buf.len(),
        });
    }
    Ok(())
}

/// Checks that an output buffer has room for `need` bytes.
#[inline]
pub(crate) fn room(what: &'static str, out: &[u8], need: usize) -> Result<(), WireError> {
    if out.len() < need {
        return Err(WireError::NoRoom {
            what,
            need,
            have: out.len(),
        });
    }
    Ok(())
}

/// Reads a big-endian u16 at `off` (the caller has checked the length).
#[inline]
pub(crate) fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

/// Reads a big-endian u32 at `off` (the caller has checked the length).
#[inline]
pub(crate) fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Reads a big-endian u64 at `off` (the caller has checked the length).
#[inline]
pub(crate) fn be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}

/// Test helper: bytes from hex text (whitespace ignored).
#[cfg(test)]
pub(crate) fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}
