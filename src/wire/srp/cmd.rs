//! SRP_CMD: the fixed 48 bytes, an additional CDB, data-out then data-in descriptors, immediate data.
//!
//! Layout rules followed (SRP r16a 6.8, ib_srp `srp_map_data`, ib_srpt `srpt_get_desc_tbl`):
//! - `add_cdb_len` is a byte count whose low two bits are reserved; descriptors start at
//!   48 + add_cdb_len.
//! - A direct descriptor leaves the descriptor counts 0, as ib_srp sends it (LIO ignores them).
//! - An indirect descriptor is the table descriptor (the whole table, `n` x 16 bytes, in initiator
//!   memory), the total data length, then the first `count` descriptors inline; `count` goes in the
//!   descriptor count field. When `count` is less than the table's entries the target must fetch the
//!   rest by RDMA READ (the partial-table rule; ib_srp's `allow_ext_sg`).
//! - Immediate data (SRP-2, data-out only): a 4-byte length where the descriptor would be and the
//!   data itself at the `imm_data_offset` agreed at login (68), whatever the additional CDB length.

use super::layout::{RawCmd, RawDirectBuf, RawIndirectHdr};
use super::{desc_fmt, expect_opcode, opcode, size, DirectBuf, ScsiLun};
use crate::wire::{be32, need, room, WireError};
use zerocopy::{FromBytes, IntoBytes};

/// SRP_CMD task attribute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TaskAttr {
    /// SIMPLE (0), the default.
    #[default]
    Simple,
    /// HEAD OF QUEUE (1).
    HeadOfQueue,
    /// ORDERED (2).
    Ordered,
    /// ACA (4).
    Aca,
    /// Another (reserved) value.
    Other(u8),
}

impl TaskAttr {
    fn code(self) -> u8 {
        match self {
            TaskAttr::Simple => 0,
            TaskAttr::HeadOfQueue => 1,
            TaskAttr::Ordered => 2,
            TaskAttr::Aca => 4,
            TaskAttr::Other(c) => c,
        }
    }
    fn from_code(c: u8) -> Self {
        match c {
            0 => TaskAttr::Simple,
            1 => TaskAttr::HeadOfQueue,
            2 => TaskAttr::Ordered,
            4 => TaskAttr::Aca,
            c => TaskAttr::Other(c),
        }
    }
}

/// A list of direct descriptors: native (to encode) or still in wire form (decoded, not copied).
#[derive(Clone, Copy, Debug)]
pub enum DescList<'a> {
    /// Native descriptors.
    Native(&'a [DirectBuf]),
    /// `n` x 16 bytes as received.
    Wire(&'a [u8]),
}

impl<'a> DescList<'a> {
    /// Number of descriptors.
    pub fn len(&self) -> usize {
        match self {
            DescList::Native(d) => d.len(),
            DescList::Wire(b) => b.len() / size::DIRECT_DESC,
        }
    }
    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Descriptor `i`.
    pub fn get(&self, i: usize) -> Option<DirectBuf> {
        match self {
            DescList::Native(d) => d.get(i).copied(),
            DescList::Wire(b) => {
                let off = i.checked_mul(size::DIRECT_DESC)?;
                b.get(off..off + size::DIRECT_DESC)
                    .and_then(|s| DirectBuf::parse(s).ok())
            }
        }
    }
    /// The descriptors in order.
    pub fn iter(&self) -> impl Iterator<Item = DirectBuf> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }
}

impl PartialEq for DescList<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}
impl Eq for DescList<'_> {}

/// How the data of one direction is described.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataDesc<'a> {
    /// No data in this direction.
    #[default]
    None,
    /// One contiguous registered buffer.
    Direct(DirectBuf),
    /// A descriptor table.
    Indirect {
        /// Where the whole table lies in initiator memory (`len` = entries x 16).
        table: DirectBuf,
        /// Total data length over all descriptors.
        total_len: u32,
        /// The descriptors carried in the IU (all of them, or the first ones: partial table).
        inline: DescList<'a>,
    },
    /// Immediate data of `len` bytes at `imm_data_offset` (data-out only, SRP-2).
    Immediate {
        /// Bytes of immediate data.
        len: u32,
    },
}

impl DataDesc<'_> {
    fn fmt(&self) -> u8 {
        match self {
            DataDesc::None => desc_fmt::NONE,
            DataDesc::Direct(_) => desc_fmt::DIRECT,
            DataDesc::Indirect { .. } => desc_fmt::INDIRECT,
            DataDesc::Immediate { .. } => desc_fmt::IMMEDIATE,
        }
    }
    /// Bytes this descriptor takes in the IU (not counting immediate data itself).
    fn wire_len(&self) -> usize {
        match self {
            DataDesc::None => 0,
            DataDesc::Direct(_) => size::DIRECT_DESC,
            DataDesc::Indirect { inline, .. } => {
                size::INDIRECT_HDR + inline.len() * size::DIRECT_DESC
            }
            DataDesc::Immediate { .. } => size::IMM_DESC,
        }
    }
    /// The value of the descriptor count field.
    fn count(&self) -> u8 {
        match self {
            DataDesc::Indirect { inline, .. } => inline.len() as u8,
            _ => 0,
        }
    }
    /// Data length the descriptor covers.
    pub fn data_len(&self) -> u64 {
        match self {
            DataDesc::None => 0,
            DataDesc::Direct(d) => u64::from(d.len),
            DataDesc::Indirect { total_len, .. } => u64::from(*total_len),
            DataDesc::Immediate { len } => u64::from(*len),
        }
    }
}

/// An SRP_CMD to encode (or one decoded, see [`ParsedCmd`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrpCmd<'a> {
    /// Opaque tag, echoed by the SRP_RSP.
    pub tag: u64,
    /// Logical unit.
    pub lun: ScsiLun,
    /// Task attribute.
    pub task_attr: TaskAttr,
    /// Solicited notification bits (0: the target decides).
    pub sol_not: u8,
    /// The CDB: up to 16 bytes inline, longer ones spill into the additional CDB.
    pub cdb: &'a [u8],
    /// Data-out (initiator to target) descriptor.
    pub data_out: DataDesc<'a>,
    /// Data-in (target to initiator) descriptor.
    pub data_in: DataDesc<'a>,
}

const WHAT: &str = "SRP_CMD";
/// The largest additional CDB (`add_cdb_len` is a byte with the low two bits reserved).
const MAX_ADD_CDB: usize = 252;

impl<'a> SrpCmd<'a> {
    /// A command with no data and a SIMPLE task attribute.
    pub fn new(tag: u64, lun: ScsiLun, cdb: &'a [u8]) -> Self {
        SrpCmd {
            tag,
            lun,
            task_attr: TaskAttr::Simple,
            sol_not: 0,
            cdb,
            data_out: DataDesc::None,
            data_in: DataDesc::None,
        }
    }

    /// With a data-in (read) descriptor.
    #[must_use]
    pub fn data_in(mut self, d: DataDesc<'a>) -> Self {
        self.data_in = d;
        self
    }

    /// With a data-out (write) descriptor.
    #[must_use]
    pub fn data_out(mut self, d: DataDesc<'a>) -> Self {
        self.data_out = d;
        self
    }

    fn add_cdb_len(&self) -> usize {
        self.cdb.len().saturating_sub(16).next_multiple_of(4)
    }

    /// Bytes of the IU before immediate data: 48 + additional CDB + descriptors, or `imm_data_offset`
    /// when the command carries immediate data.
    pub fn header_len(&self, imm_data_offset: usize) -> usize {
        if matches!(self.data_out, DataDesc::Immediate { .. }) {
            imm_data_offset
        } else {
            size::CMD + self.add_cdb_len() + self.data_out.wire_len() + self.data_in.wire_len()
        }
    }

    /// Encodes the IU into `out` and returns its length up to any immediate data (which the caller
    /// places at `out[imm_data_offset..]` or sends as a second gather entry). Does not allocate.
    pub fn encode(&self, out: &mut [u8], imm_data_offset: usize) -> Result<usize, WireError> {
        match self.encode_simple(out, imm_data_offset) {
            Some(n) => Ok(n),
            None => self.encode_general(out, imm_data_offset),
        }
    }

    /// The data path's shape -- a CDB of 1 to 16 bytes, a SIMPLE or other attribute, and no data,
    /// one direct descriptor, or immediate data-out -- written straight into `out`: the same bytes
    /// as [`SrpCmd::encode_general`], without its checks for additional CDB bytes and tables that
    /// cannot apply here. None for any other shape (or too small an `out`: the general encoder
    /// reports it).
    fn encode_simple(&self, out: &mut [u8], imm_data_offset: usize) -> Option<usize> {
        let n = self.cdb.len();
        if n == 0 || n > 16 {
            return None;
        }
        let (fmt, desc, total) = match (&self.data_out, &self.data_in) {
            (DataDesc::None, DataDesc::None) => (0, None, size::CMD),
            (DataDesc::Direct(b), DataDesc::None) => (desc_fmt::DIRECT << 4, Some(*b), 64),
            (DataDesc::None, DataDesc::Direct(b)) => (desc_fmt::DIRECT, Some(*b), 64),
            (DataDesc::Immediate { .. }, DataDesc::None)
                if imm_data_offset >= size::CMD + size::IMM_DESC =>
            {
                (desc_fmt::IMMEDIATE << 4, None, imm_data_offset)
            }
            _ => return None,
        };
        let out = out.get_mut(..total)?;
        out[..size::CMD].fill(0);
        out[0] = opcode::CMD;
        out[1] = self.sol_not;
        out[5] = fmt;
        out[8..16].copy_from_slice(&self.tag.to_be_bytes());
        out[20..28].copy_from_slice(&self.lun.0);
        out[29] = self.task_attr.code();
        out[32..32 + n].copy_from_slice(self.cdb);
        let d = &mut out[size::CMD..];
        match (desc, &self.data_out) {
            (Some(b), _) => {
                d[..8].copy_from_slice(&b.va.to_be_bytes());
                d[8..12].copy_from_slice(&b.key.to_be_bytes());
                d[12..16].copy_from_slice(&b.len.to_be_bytes());
            }
            (None, DataDesc::Immediate { len }) => {
                d[..4].copy_from_slice(&len.to_be_bytes());
                d[4..].fill(0);
            }
            _ => {}
        }
        Some(total)
    }

    /// What no layout of this command can carry: a CDB out of range, immediate data-in, an
    /// indirect descriptor whose table does not cover its inline descriptors.
    fn check(&self) -> Result<(), WireError> {
        if self.cdb.is_empty() || self.cdb.len() > 16 + MAX_ADD_CDB {
            return Err(invalid(
                "cdb length",
                self.cdb.len() as u64,
                "1 to 268 bytes",
            ));
        }
        if matches!(self.data_in, DataDesc::Immediate { .. }) {
            return Err(invalid(
                "data-in format",
                3,
                "immediate data is for data-out only",
            ));
        }
        for d in [&self.data_out, &self.data_in] {
            if let DataDesc::Indirect { table, inline, .. } = d {
                if inline.len() > 255 {
                    return Err(invalid(
                        "indirect descriptor count",
                        inline.len() as u64,
                        "<= 255",
                    ));
                }
                check_table_len(table.len, inline.len())?;
            }
        }
        Ok(())
    }

    /// Any SRP_CMD, every field checked (see [`SrpCmd::encode`]).
    fn encode_general(&self, out: &mut [u8], imm_data_offset: usize) -> Result<usize, WireError> {
        self.check()?;
        let add = self.add_cdb_len();
        let desc_end = size::CMD + add + self.data_out.wire_len() + self.data_in.wire_len();
        let total = self.header_len(imm_data_offset);
        if total < desc_end {
            return Err(invalid(
                "imm_data_offset",
                imm_data_offset as u64,
                "immediate data must start after the CDB and descriptors",
            ));
        }
        room(WHAT, out, total)?;

        let mut cdb = [0u8; 16];
        let n = self.cdb.len().min(16);
        cdb[..n].copy_from_slice(&self.cdb[..n]);
        let raw = RawCmd {
            opcode: opcode::CMD,
            sol_not: self.sol_not,
            buf_fmt: (self.data_out.fmt() << 4) | self.data_in.fmt(),
            data_out_desc_cnt: self.data_out.count(),
            data_in_desc_cnt: self.data_in.count(),
            tag: self.tag.into(),
            lun: self.lun.0,
            task_attr: self.task_attr.code(),
            add_cdb_len: add as u8,
            cdb,
            ..Default::default()
        };
        out[..size::CMD].copy_from_slice(raw.as_bytes());
        let mut off = size::CMD;
        if add > 0 {
            let extra = &self.cdb[16..];
            out[off..off + extra.len()].copy_from_slice(extra);
            out[off + extra.len()..off + add].fill(0);
            off += add;
        }
        for d in [&self.data_out, &self.data_in] {
            off = write_desc(out, off, d);
        }
        // padding between the descriptors and immediate data (none without immediate data)
        if off < total {
            out[off..total].fill(0);
        }
        Ok(total)
    }
}

fn write_desc(out: &mut [u8], mut off: usize, d: &DataDesc<'_>) -> usize {
    match d {
        DataDesc::None => {}
        DataDesc::Direct(b) => {
            out[off..off + 16].copy_from_slice(b.to_raw().as_bytes());
            off += 16;
        }
        DataDesc::Indirect {
            table,
            total_len,
            inline,
        } => {
            let hdr = RawIndirectHdr {
                table_desc: table.to_raw(),
                len: (*total_len).into(),
            };
            out[off..off + size::INDIRECT_HDR].copy_from_slice(hdr.as_bytes());
            off += size::INDIRECT_HDR;
            for b in inline.iter() {
                out[off..off + 16].copy_from_slice(b.to_raw().as_bytes());
                off += 16;
            }
        }
        DataDesc::Immediate { len } => {
            out[off..off + 4].copy_from_slice(&len.to_be_bytes());
            off += 4;
        }
    }
    off
}

/// A decoded SRP_CMD: the command and, if it carries any, its immediate data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParsedCmd<'a> {
    /// The command; indirect descriptor lists borrow the received bytes.
    pub cmd: SrpCmd<'a>,
    /// Immediate data (empty unless data-out is immediate).
    pub immediate: &'a [u8],
}

impl<'a> ParsedCmd<'a> {
    /// Decodes an SRP_CMD, checking every length against the IU (SRP r16a 6.8).
    pub fn parse(iu: &'a [u8], imm_data_offset: usize) -> Result<Self, WireError> {
        need(WHAT, iu, size::CMD)?;
        expect_opcode(WHAT, iu, opcode::CMD)?;
        let (raw, _) = RawCmd::ref_from_prefix(iu).map_err(|_| WireError::Truncated {
            what: WHAT,
            need: size::CMD,
            got: iu.len(),
        })?;
        let add = usize::from(raw.add_cdb_len & !3);
        let cdb_end = size::CMD + add;
        need(WHAT, iu, cdb_end)?;
        let cdb = &iu[32..cdb_end];
        let mut off = cdb_end;
        let (data_out, o) =
            parse_desc(iu, off, raw.buf_fmt >> 4, raw.data_out_desc_cnt, "data-out")?;
        off = o;
        let (data_in, o) = parse_desc(iu, off, raw.buf_fmt & 0xf, raw.data_in_desc_cnt, "data-in")?;
        off = o;
        let mut immediate: &[u8] = &[];
        if let DataDesc::Immediate { len } = data_out {
            if imm_data_offset < off {
                return Err(invalid(
                    "imm_data_offset",
                    imm_data_offset as u64,
                    "immediate data overlaps the descriptors",
                ));
            }
            let end = imm_data_offset
                .checked_add(len as usize)
                .ok_or_else(|| invalid("immediate data length", u64::from(len), "overflows"))?;
            need("SRP_CMD immediate data", iu, end)?;
            immediate = &iu[imm_data_offset..end];
        }
        Ok(ParsedCmd {
            cmd: SrpCmd {
                tag: raw.tag.get(),
                lun: ScsiLun(raw.lun),
                task_attr: TaskAttr::from_code(raw.task_attr),
                sol_not: raw.sol_not,
                cdb,
                data_out,
                data_in,
            },
            immediate,
        })
    }
}

fn parse_desc<'a>(
    iu: &'a [u8],
    off: usize,
    fmt: u8,
    count: u8,
    dir: &'static str,
) -> Result<(DataDesc<'a>, usize), WireError> {
    match fmt {
        desc_fmt::NONE => Ok((DataDesc::None, off)),
        desc_fmt::DIRECT => {
            need("SRP_CMD direct descriptor", iu, off + 16)?;
            let (r, _) =
                RawDirectBuf::ref_from_prefix(&iu[off..]).map_err(|_| WireError::Truncated {
                    what: WHAT,
                    need: off + 16,
                    got: iu.len(),
                })?;
            Ok((DataDesc::Direct(DirectBuf::from_raw(r)), off + 16))
        }
        desc_fmt::INDIRECT => {
            let list_off = off + size::INDIRECT_HDR;
            let end = list_off + usize::from(count) * size::DIRECT_DESC;
            need("SRP_CMD indirect descriptor", iu, end)?;
            let (h, _) =
                RawIndirectHdr::ref_from_prefix(&iu[off..]).map_err(|_| WireError::Truncated {
                    what: WHAT,
                    need: end,
                    got: iu.len(),
                })?;
            let table = DirectBuf::from_raw(&h.table_desc);
            check_table_len(table.len, usize::from(count))?;
            let inline = DescList::Wire(&iu[list_off..end]);
            Ok((
                DataDesc::Indirect {
                    table,
                    total_len: h.len.get(),
                    inline,
                },
                end,
            ))
        }
        desc_fmt::IMMEDIATE if dir == "data-out" => {
            need("SRP_CMD immediate descriptor", iu, off + 4)?;
            Ok((DataDesc::Immediate { len: be32(iu, off) }, off + 4))
        }
        other => Err(WireError::Invalid {
            what: WHAT,
            field: if dir == "data-out" {
                "data-out format"
            } else {
                "data-in format"
            },
            value: u64::from(other),
            rule: "0 none, 1 direct, 2 indirect, 3 immediate (data-out only)",
        }),
    }
}

/// An indirect descriptor's table length: whole direct descriptors, at least the `inline` ones.
fn check_table_len(len: u32, inline: usize) -> Result<(), WireError> {
    let len_bytes = len as usize;
    if len_bytes % size::DIRECT_DESC != 0 || len_bytes < inline * size::DIRECT_DESC {
        return Err(invalid(
            "indirect table length",
            u64::from(len),
            "a multiple of 16 covering at least the inline descriptors",
        ));
    }
    Ok(())
}

fn invalid(field: &'static str, value: u64, rule: &'static str) -> WireError {
    WireError::Invalid {
        what: WHAT,
        field,
        value,
        rule,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const READ16: [u8; 16] = [0x88, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0];

    #[test]
    fn direct_read_layout_matches_ib_srp() {
        let d = DirectBuf {
            va: 0x1122_3344_5566_7788,
            key: 0xaabb_ccdd,
            len: 4096,
        };
        let cmd = SrpCmd::new(0x1000, ScsiLun::from_int(0), &READ16).data_in(DataDesc::Direct(d));
        let mut buf = [0xffu8; 128];
        let n = cmd.encode(&mut buf, 68).unwrap();
        assert_eq!(n, 64);
        assert_eq!(buf[0], 0x02);
        assert_eq!(buf[5], 0x01, "data-in direct in the low nibble");
        assert_eq!(
            (buf[6], buf[7]),
            (0, 0),
            "ib_srp leaves direct descriptor counts 0"
        );
        assert_eq!(&buf[8..16], &0x1000u64.to_be_bytes());
        assert_eq!(&buf[16..20], &[0; 4]);
        assert_eq!(buf[29], 0);
        assert_eq!(buf[31], 0);
        assert_eq!(&buf[32..48], &READ16);
        assert_eq!(&buf[48..56], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(&buf[56..60], &0xaabb_ccddu32.to_be_bytes());
        assert_eq!(&buf[60..64], &4096u32.to_be_bytes());
        let p = ParsedCmd::parse(&buf[..n], 68).unwrap();
        assert_eq!(p.cmd, cmd);
    }

    #[test]
    fn immediate_write_puts_len_after_cdb_and_data_at_offset() {
        let cdb = [0x8au8; 16];
        let cmd =
            SrpCmd::new(7, ScsiLun::from_int(1), &cdb).data_out(DataDesc::Immediate { len: 8 });
        let mut buf = [0xeeu8; 76];
        let n = cmd.encode(&mut buf, 68).unwrap();
        assert_eq!(n, 68);
        assert_eq!(buf[5], 0x30);
        assert_eq!(&buf[48..52], &8u32.to_be_bytes());
        assert_eq!(
            &buf[52..68],
            &[0; 16],
            "padding up to imm_data_offset is zeroed"
        );
        buf[68..76].copy_from_slice(b"ABCDEFGH");
        let p = ParsedCmd::parse(&buf, 68).unwrap();
        assert_eq!(p.immediate, b"ABCDEFGH");
        // with a 32-byte CDB the length moves to 64, the data stays at 68
        let long = [0x7fu8; 32];
        let cmd =
            SrpCmd::new(7, ScsiLun::from_int(1), &long).data_out(DataDesc::Immediate { len: 4 });
        let mut buf = [0u8; 72];
        assert_eq!(cmd.encode(&mut buf, 68).unwrap(), 68);
        assert_eq!(buf[31], 16);
        assert_eq!(&buf[64..68], &4u32.to_be_bytes());
    }

    #[test]
    fn indirect_partial_table() {
        let descs = [
            DirectBuf {
                va: 0x1000,
                key: 1,
                len: 512,
            },
            DirectBuf {
                va: 0x3000,
                key: 1,
                len: 512,
            },
        ];
        // a 4-entry table in memory, 2 carried inline
        let table = DirectBuf {
            va: 0x9000,
            key: 2,
            len: 64,
        };
        let d = DataDesc::Indirect {
            table,
            total_len: 2048,
            inline: DescList::Native(&descs),
        };
        let cmd = SrpCmd::new(9, ScsiLun::from_int(0), &READ16).data_out(d);
        let mut buf = [0u8; 256];
        let n = cmd.encode(&mut buf, 68).unwrap();
        assert_eq!(n, 48 + 20 + 32);
        assert_eq!(buf[5], 0x20);
        assert_eq!(buf[6], 2, "data-out count = descriptors inline");
        assert_eq!(&buf[48..56], &0x9000u64.to_be_bytes());
        assert_eq!(&buf[60..64], &64u32.to_be_bytes());
        assert_eq!(&buf[64..68], &2048u32.to_be_bytes());
        let p = ParsedCmd::parse(&buf[..n], 68).unwrap();
        assert_eq!(p.cmd, cmd);
        // a table shorter than its inline part, or not whole descriptors, is refused both ways
        let table_len = |r: Result<(), WireError>| match r {
            Err(WireError::Invalid { field, value, .. }) => Some((field, value)),
            _ => None,
        };
        for len in [16u32, 40] {
            let bad = DataDesc::Indirect {
                table: DirectBuf { len, ..table },
                total_len: 1024,
                inline: DescList::Native(&descs),
            };
            let cmd = SrpCmd::new(9, ScsiLun::default(), &READ16).data_out(bad);
            let mut out = [0u8; 256];
            let want = Some(("indirect table length", u64::from(len)));
            assert_eq!(table_len(cmd.encode(&mut out, 68).map(|_| ())), want);
            buf[60..64].copy_from_slice(&len.to_be_bytes());
            assert_eq!(table_len(ParsedCmd::parse(&buf[..n], 68).map(|_| ())), want);
        }
    }

    #[test]
    fn refuses_what_cannot_be_encoded() {
        let mut buf = [0u8; 64];
        assert!(SrpCmd::new(1, ScsiLun::default(), &[])
            .encode(&mut buf, 68)
            .is_err());
        let cmd =
            SrpCmd::new(1, ScsiLun::default(), &READ16).data_in(DataDesc::Immediate { len: 1 });
        assert!(cmd.encode(&mut buf, 68).is_err());
        let cmd = SrpCmd::new(1, ScsiLun::default(), &READ16)
            .data_in(DataDesc::Direct(DirectBuf::default()));
        assert!(matches!(
            cmd.encode(&mut buf[..63], 68),
            Err(WireError::NoRoom { .. })
        ));
        // immediate data cannot start inside the descriptors
        let cmd =
            SrpCmd::new(1, ScsiLun::default(), &READ16).data_out(DataDesc::Immediate { len: 1 });
        assert!(cmd.encode(&mut buf, 50).is_err());
    }

    proptest::proptest! {
        /// The data path's encoder writes exactly what the general one does, for every shape it
        /// takes, whatever was in the slot before.
        #[test]
        fn the_simple_encoder_writes_what_the_general_one_does(
            tag: u64, lun: [u8; 8], attr in 0u8..6, sol_not: u8,
            cdb in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..=16),
            shape in 0u8..4, va: u64, key: u32, len: u32, imm_off in 52usize..80, junk: u8,
        ) {
            let b = DirectBuf { va, key, len };
            let mut cmd = SrpCmd::new(tag, ScsiLun(lun), &cdb);
            (cmd.task_attr, cmd.sol_not) = (TaskAttr::from_code(attr), sol_not);
            let cmd = match shape {
                0 => cmd,
                1 => cmd.data_out(DataDesc::Direct(b)),
                2 => cmd.data_in(DataDesc::Direct(b)),
                _ => cmd.data_out(DataDesc::Immediate { len }),
            };
            let (mut fast, mut general) = ([junk; 128], [junk; 128]);
            let n = cmd.encode_simple(&mut fast, imm_off);
            proptest::prop_assert!(n.is_some());
            let m = cmd.encode_general(&mut general, imm_off).unwrap();
            proptest::prop_assert_eq!(n, Some(m));
            proptest::prop_assert_eq!(&fast[..m], &general[..m]);
        }
    }

    #[test]
    fn the_simple_encoder_leaves_other_shapes_to_the_general_one() {
        let d = DirectBuf::default();
        let mut buf = [0u8; 128];
        let long = [0u8; 32];
        let both = SrpCmd::new(1, ScsiLun::default(), &READ16)
            .data_out(DataDesc::Direct(d))
            .data_in(DataDesc::Direct(d));
        let long_cdb = SrpCmd::new(1, ScsiLun::default(), &long);
        let imm =
            SrpCmd::new(1, ScsiLun::default(), &READ16).data_out(DataDesc::Immediate { len: 1 });
        assert!(both.encode_simple(&mut buf, 68).is_none());
        assert!(long_cdb.encode_simple(&mut buf, 68).is_none());
        assert!(
            imm.encode_simple(&mut buf, 50).is_none(),
            "bad offset: the general one says why"
        );
        assert!(imm.encode_simple(&mut buf[..60], 68).is_none());
    }

    #[test]
    fn parse_rejects_bad_formats_and_short_ius() {
        let mut iu = [0u8; 48];
        iu[0] = 2;
        iu[5] = 0x04; // data-in format 4 does not exist
        assert!(ParsedCmd::parse(&iu, 68).is_err());
        iu[5] = 0x03; // immediate data-in
        assert!(ParsedCmd::parse(&iu, 68).is_err());
        iu[5] = 0x01; // direct descriptor missing
        assert!(matches!(
            ParsedCmd::parse(&iu, 68),
            Err(WireError::Truncated { .. })
        ));
        iu[5] = 0x30; // immediate descriptor missing
        assert!(ParsedCmd::parse(&iu, 68).is_err());
    }
}
