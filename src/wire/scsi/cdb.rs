//! CDB builders for the commands srp-ublk sends (SBC-4, SPC-5). Each returns a fixed-size [`Cdb`]
//! by value: no allocation on the I/O path.

use crate::wire::{room, WireError};

/// Operation codes.
pub mod op {
    /// TEST UNIT READY.
    pub const TEST_UNIT_READY: u8 = 0x00;
    /// INQUIRY.
    pub const INQUIRY: u8 = 0x12;
    /// READ(10).
    pub const READ_10: u8 = 0x28;
    /// WRITE(10).
    pub const WRITE_10: u8 = 0x2a;
    /// SYNCHRONIZE CACHE(10).
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    /// UNMAP.
    pub const UNMAP: u8 = 0x42;
    /// MODE SENSE(10).
    pub const MODE_SENSE_10: u8 = 0x5a;
    /// READ(16).
    pub const READ_16: u8 = 0x88;
    /// WRITE(16).
    pub const WRITE_16: u8 = 0x8a;
    /// SYNCHRONIZE CACHE(16).
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    /// WRITE SAME(16).
    pub const WRITE_SAME_16: u8 = 0x93;
    /// SERVICE ACTION IN(16) (READ CAPACITY(16) is service action 0x10).
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    /// REPORT LUNS.
    pub const REPORT_LUNS: u8 = 0xa0;
    /// MAINTENANCE IN (REPORT SUPPORTED OPERATION CODES is service action 0x0c).
    pub const MAINTENANCE_IN: u8 = 0xa3;
}

/// REPORT SUPPORTED OPERATION CODES service action (MAINTENANCE IN).
pub const SAI_REPORT_SUPPORTED_OPCODES: u8 = 0x0c;

/// READ CAPACITY(16) service action.
pub const SAI_READ_CAPACITY_16: u8 = 0x10;
/// GET LBA STATUS(16) service action.
pub const SAI_GET_LBA_STATUS: u8 = 0x12;
/// FUA bit in byte 1 of READ/WRITE(10/16).
pub const FUA: u8 = 0x08;

/// A CDB of up to 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cdb {
    bytes: [u8; 16],
    len: u8,
}

impl Cdb {
    fn new(len: u8, opcode: u8) -> Self {
        let mut bytes = [0u8; 16];
        bytes[0] = opcode;
        Cdb { bytes, len }
    }
    /// The CDB bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
    /// The operation code.
    pub fn opcode(&self) -> u8 {
        self.bytes[0]
    }
    fn put(&mut self, off: usize, v: &[u8]) {
        self.bytes[off..off + v.len()].copy_from_slice(v);
    }

    /// TEST UNIT READY.
    pub fn test_unit_ready() -> Self {
        Cdb::new(6, op::TEST_UNIT_READY)
    }

    /// INQUIRY: standard data (`page` None) or a VPD page.
    pub fn inquiry(page: Option<u8>, alloc_len: u16) -> Self {
        let mut c = Cdb::new(6, op::INQUIRY);
        if let Some(p) = page {
            c.bytes[1] = 0x01; // EVPD
            c.bytes[2] = p;
        }
        c.put(3, &alloc_len.to_be_bytes());
        c
    }

    /// READ(16) of `blocks` logical blocks at `lba`.
    pub fn read16(lba: u64, blocks: u32, fua: bool) -> Self {
        rw16(op::READ_16, lba, blocks, fua)
    }

    /// WRITE(16) of `blocks` logical blocks at `lba`.
    pub fn write16(lba: u64, blocks: u32, fua: bool) -> Self {
        rw16(op::WRITE_16, lba, blocks, fua)
    }

    /// READ(10); the LBA must fit 32 bits and the length 16 bits.
    pub fn read10(lba: u64, blocks: u32, fua: bool) -> Result<Self, WireError> {
        rw10(op::READ_10, lba, blocks, fua)
    }

    /// WRITE(10); the LBA must fit 32 bits and the length 16 bits.
    pub fn write10(lba: u64, blocks: u32, fua: bool) -> Result<Self, WireError> {
        rw10(op::WRITE_10, lba, blocks, fua)
    }

    /// SYNCHRONIZE CACHE(10) of a range (0, 0 = the whole medium).
    pub fn sync_cache10(lba: u32, blocks: u16) -> Self {
        let mut c = Cdb::new(10, op::SYNCHRONIZE_CACHE_10);
        c.put(2, &lba.to_be_bytes());
        c.put(7, &blocks.to_be_bytes());
        c
    }

    /// SYNCHRONIZE CACHE(16) of a range (0, 0 = the whole medium).
    pub fn sync_cache16(lba: u64, blocks: u32) -> Self {
        let mut c = Cdb::new(16, op::SYNCHRONIZE_CACHE_16);
        c.put(2, &lba.to_be_bytes());
        c.put(10, &blocks.to_be_bytes());
        c
    }

    /// UNMAP with a parameter list of `param_len` bytes (see [`encode_unmap_params`]).
    pub fn unmap(param_len: u16) -> Self {
        let mut c = Cdb::new(10, op::UNMAP);
        c.put(7, &param_len.to_be_bytes());
        c
    }

    /// WRITE SAME(16); with `unmap` the target may deallocate, with `ndob` no data-out buffer is sent
    /// (the blocks read back as zeros).
    pub fn write_same16(lba: u64, blocks: u32, unmap: bool, ndob: bool) -> Self {
        let mut c = Cdb::new(16, op::WRITE_SAME_16);
        c.bytes[1] = if unmap { 0x08 } else { 0 } | if ndob { 0x01 } else { 0 };
        c.put(2, &lba.to_be_bytes());
        c.put(10, &blocks.to_be_bytes());
        c
    }

    /// READ CAPACITY(16).
    pub fn read_capacity16(alloc_len: u32) -> Self {
        let mut c = Cdb::new(16, op::SERVICE_ACTION_IN_16);
        c.bytes[1] = SAI_READ_CAPACITY_16;
        c.put(10, &alloc_len.to_be_bytes());
        c
    }

    /// GET LBA STATUS(16) from `lba` (SBC-4 5.7): the provisioning status of the blocks from
    /// there on, in at most `alloc_len` bytes of parameter data.
    pub fn get_lba_status(lba: u64, alloc_len: u32) -> Self {
        let mut c = Cdb::new(16, op::SERVICE_ACTION_IN_16);
        c.bytes[1] = SAI_GET_LBA_STATUS;
        c.put(2, &lba.to_be_bytes());
        c.put(10, &alloc_len.to_be_bytes());
        c
    }

    /// MODE SENSE(10) of `page`/`subpage`, current values, block descriptors disabled.
    pub fn mode_sense10(page: u8, subpage: u8, alloc_len: u16) -> Self {
        let mut c = Cdb::new(10, op::MODE_SENSE_10);
        c.bytes[1] = 0x08; // DBD
        c.bytes[2] = page & 0x3f; // PC = 0: current values
        c.bytes[3] = subpage;
        c.put(7, &alloc_len.to_be_bytes());
        c
    }

    /// REPORT SUPPORTED OPERATION CODES for one operation code without service action
    /// (REPORTING OPTIONS 001b, SPC-5 6.35): the answer's SUPPORT field says whether the LUN
    /// implements `opcode` ([`opcode_supported`]).
    pub fn report_opcode(opcode: u8, alloc_len: u32) -> Self {
        let mut c = Cdb::new(12, op::MAINTENANCE_IN);
        c.bytes[1] = SAI_REPORT_SUPPORTED_OPCODES;
        c.bytes[2] = 0x01;
        c.bytes[3] = opcode;
        c.put(6, &alloc_len.to_be_bytes());
        c
    }

    /// REPORT LUNS with SELECT REPORT `select` (0: all logical units the initiator may access).
    pub fn report_luns(select: u8, alloc_len: u32) -> Self {
        let mut c = Cdb::new(12, op::REPORT_LUNS);
        c.bytes[2] = select;
        c.put(6, &alloc_len.to_be_bytes());
        c
    }
}

fn rw16(opcode: u8, lba: u64, blocks: u32, fua: bool) -> Cdb {
    let mut c = Cdb::new(16, opcode);
    if fua {
        c.bytes[1] = FUA;
    }
    c.put(2, &lba.to_be_bytes());
    c.put(10, &blocks.to_be_bytes());
    c
}

fn rw10(opcode: u8, lba: u64, blocks: u32, fua: bool) -> Result<Cdb, WireError> {
    let lba32 = u32::try_from(lba).map_err(|_| WireError::Invalid {
        what: "READ/WRITE(10)",
        field: "lba",
        value: lba,
        rule: "must fit 32 bits; use the 16-byte CDB",
    })?;
    let n16 = u16::try_from(blocks).map_err(|_| WireError::Invalid {
        what: "READ/WRITE(10)",
        field: "transfer length",
        value: u64::from(blocks),
        rule: "must fit 16 bits; use the 16-byte CDB",
    })?;
    let mut c = Cdb::new(10, opcode);
    if fua {
        c.bytes[1] = FUA;
    }
    c.put(2, &lba32.to_be_bytes());
    c.put(7, &n16.to_be_bytes());
    Ok(c)
}

/// One UNMAP block descriptor: `blocks` logical blocks from `lba`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnmapRange {
    /// First logical block.
    pub lba: u64,
    /// Number of logical blocks.
    pub blocks: u32,
}

/// Encodes the UNMAP parameter list (SBC-4 5.32.2): an 8-byte header and 16 bytes per range.
/// Returns the list length to put in the CDB.
pub fn encode_unmap_params(out: &mut [u8], ranges: &[UnmapRange]) -> Result<usize, WireError> {
    let desc_len = ranges
        .len()
        .checked_mul(16)
        .filter(|&l| l <= 0xffff - 8)
        .ok_or(WireError::Invalid {
            what: "UNMAP parameter list",
            field: "ranges",
            value: ranges.len() as u64,
            rule: "at most 4095 ranges fit one list",
        })?;
    let total = 8 + desc_len;
    room("UNMAP parameter list", out, total)?;
    out[0..2].copy_from_slice(&((total - 2) as u16).to_be_bytes());
    out[2..4].copy_from_slice(&(desc_len as u16).to_be_bytes());
    out[4..8].fill(0);
    for (i, r) in ranges.iter().enumerate() {
        let o = 8 + 16 * i;
        out[o..o + 8].copy_from_slice(&r.lba.to_be_bytes());
        out[o + 8..o + 12].copy_from_slice(&r.blocks.to_be_bytes());
        out[o + 12..o + 16].fill(0);
    }
    Ok(total)
}

/// What a one-command REPORT SUPPORTED OPERATION CODES answer says of its operation code
/// (byte 1's SUPPORT field): `Some(true)` implemented (011b per the standard, 101b vendor
/// specific), `Some(false)` not (001b), `None` when the LUN cannot say (000b, reserved values, a
/// short answer).
pub fn opcode_supported(data: &[u8]) -> Option<bool> {
    match data.get(1)? & 0x07 {
        0b011 | 0b101 => Some(true),
        0b001 => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_16() {
        let c = Cdb::read16(0x0102_0304_0506_0708, 8, false);
        assert_eq!(
            c.as_slice(),
            &[0x88, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 8, 0, 0]
        );
        let w = Cdb::write16(1, 0x10000, true);
        assert_eq!(w.as_slice()[..2], [0x8a, 0x08]);
        assert_eq!(w.as_slice()[10..14], [0, 1, 0, 0]);
    }

    #[test]
    fn read_write_10_limits() {
        let c = Cdb::read10(0x1234, 16, true).unwrap();
        assert_eq!(c.as_slice(), &[0x28, 0x08, 0, 0, 0x12, 0x34, 0, 0, 16, 0]);
        assert!(Cdb::write10(1 << 32, 1, false).is_err());
        assert!(Cdb::write10(0, 0x1_0000, false).is_err());
    }

    #[test]
    fn control_cdbs() {
        assert_eq!(Cdb::test_unit_ready().as_slice(), &[0; 6]);
        assert_eq!(Cdb::inquiry(None, 96).as_slice(), &[0x12, 0, 0, 0, 96, 0]);
        assert_eq!(
            Cdb::inquiry(Some(0x83), 0x200).as_slice(),
            &[0x12, 1, 0x83, 2, 0, 0]
        );
        let rc = Cdb::read_capacity16(32);
        assert_eq!(
            rc.as_slice(),
            &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0]
        );
        assert_eq!(
            Cdb::get_lba_status(0x0102, 2056).as_slice(),
            &[0x9e, 0x12, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 8, 8, 0, 0]
        );
        assert_eq!(
            Cdb::mode_sense10(0x08, 0, 0xfc).as_slice(),
            &[0x5a, 0x08, 0x08, 0, 0, 0, 0, 0, 0xfc, 0]
        );
        assert_eq!(
            Cdb::report_luns(0, 4096).as_slice(),
            &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0]
        );
        assert_eq!(Cdb::sync_cache16(0, 0).as_slice()[0], 0x91);
        assert_eq!(Cdb::sync_cache10(0, 0).as_slice().len(), 10);
        let ws = Cdb::write_same16(8, 16, true, true);
        assert_eq!(ws.as_slice()[..2], [0x93, 0x09]);
        assert_eq!(
            Cdb::unmap(24).as_slice(),
            &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0]
        );
    }

    #[test]
    fn unmap_params() {
        let mut b = [0xffu8; 40];
        let n = encode_unmap_params(
            &mut b,
            &[
                UnmapRange {
                    lba: 0x10,
                    blocks: 8,
                },
                UnmapRange {
                    lba: 0x100,
                    blocks: 1,
                },
            ],
        )
        .unwrap();
        assert_eq!(n, 40);
        assert_eq!(&b[..8], &[0, 38, 0, 32, 0, 0, 0, 0]);
        assert_eq!(
            &b[8..24],
            &[0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 8, 0, 0, 0, 0]
        );
        assert!(encode_unmap_params(&mut b[..39], &[UnmapRange { lba: 0, blocks: 1 }; 2]).is_err());
    }

    #[test]
    fn report_opcode_asks_for_one_command() {
        let c = Cdb::report_opcode(op::WRITE_SAME_16, 64);
        assert_eq!(
            c.as_slice(),
            &[0xa3, 0x0c, 0x01, 0x93, 0, 0, 0, 0, 0, 64, 0, 0]
        );
        assert_eq!(opcode_supported(&[0, 0x03, 0, 16]), Some(true));
        assert_eq!(
            opcode_supported(&[0, 0x85, 0, 16]),
            Some(true),
            "CTDP set, vendor"
        );
        assert_eq!(opcode_supported(&[0, 0x01, 0, 0]), Some(false));
        assert_eq!(opcode_supported(&[0, 0x00]), None);
        assert_eq!(opcode_supported(&[0]), None);
    }
}
