//! Vital product data pages (SPC-5 7.7, SBC-4 6.6): 0x00 supported pages, 0x80 unit serial number,
//! 0x83 device identification, 0xB0 block limits, 0xB2 logical block provisioning.

use super::data::ascii_field;
use crate::wire::{be16, be32, be64, need, WireError};

/// VPD page codes.
pub mod page {
    /// Supported VPD pages.
    pub const SUPPORTED: u8 = 0x00;
    /// Unit serial number.
    pub const SERIAL: u8 = 0x80;
    /// Device identification.
    pub const DEVICE_ID: u8 = 0x83;
    /// Block limits.
    pub const BLOCK_LIMITS: u8 = 0xb0;
    /// Logical block provisioning.
    pub const LBP: u8 = 0xb2;
}

/// Checks the 4-byte VPD header and returns the page body, bounded by the page length and by what
/// was transferred.
pub fn page_body(b: &[u8], code: u8) -> Result<&[u8], WireError> {
    need("VPD page header", b, 4)?;
    if b[1] != code {
        return Err(WireError::Invalid {
            what: "VPD page",
            field: "page code",
            value: u64::from(b[1]),
            rule: "must be the page asked for",
        });
    }
    let len = usize::from(be16(b, 2));
    Ok(&b[4..b.len().min(4 + len)])
}

/// VPD 0x00: the pages the target supports.
pub fn supported_pages(b: &[u8]) -> Result<&[u8], WireError> {
    page_body(b, page::SUPPORTED)
}

/// VPD 0x80: the unit serial number, trimmed.
pub fn serial_number(b: &[u8]) -> Result<String, WireError> {
    Ok(ascii_field(page_body(b, page::SERIAL)?))
}

/// Designator types (SPC-5 table 588).
pub mod designator {
    /// Vendor specific.
    pub const VENDOR: u8 = 0;
    /// T10 vendor ID based.
    pub const T10: u8 = 1;
    /// EUI-64 based.
    pub const EUI64: u8 = 2;
    /// NAA.
    pub const NAA: u8 = 3;
    /// Relative target port identifier.
    pub const REL_TGT_PORT: u8 = 4;
    /// Target port group.
    pub const TGT_PORT_GROUP: u8 = 5;
    /// Logical unit group.
    pub const LU_GROUP: u8 = 6;
    /// MD5 logical unit identifier.
    pub const MD5: u8 = 7;
    /// SCSI name string.
    pub const SCSI_NAME: u8 = 8;
}

/// One designation descriptor of VPD 0x83.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Designator<'a> {
    /// Protocol identifier (meaningful when PIV is set).
    pub protocol: u8,
    /// Code set: 1 binary, 2 ASCII, 3 UTF-8.
    pub code_set: u8,
    /// Protocol identifier valid.
    pub piv: bool,
    /// Association: 0 logical unit, 1 target port, 2 target device.
    pub association: u8,
    /// Designator type (see [`designator`]).
    pub kind: u8,
    /// The identifier bytes.
    pub id: &'a [u8],
}

impl Designator<'_> {
    /// The identifier as text: lowercase hex for binary designators, trimmed text otherwise.
    pub fn text(&self) -> String {
        if self.code_set == 1 {
            self.id.iter().map(|b| format!("{b:02x}")).collect()
        } else {
            let end = self
                .id
                .iter()
                .position(|&c| c == 0)
                .unwrap_or(self.id.len());
            ascii_field(&self.id[..end])
        }
    }
}

/// VPD 0x83: iterates the designation descriptors; a descriptor running past the page ends the list.
pub fn designators(b: &[u8]) -> Result<impl Iterator<Item = Designator<'_>>, WireError> {
    let body = page_body(b, page::DEVICE_ID)?;
    let mut off = 0usize;
    Ok(std::iter::from_fn(move || {
        let hdr = body.get(off..off + 4)?;
        let len = usize::from(hdr[3]);
        let id = body.get(off + 4..off + 4 + len)?;
        off += 4 + len;
        Some(Designator {
            protocol: hdr[0] >> 4,
            code_set: hdr[0] & 0x0f,
            piv: hdr[1] & 0x80 != 0,
            association: (hdr[1] >> 4) & 3,
            kind: hdr[1] & 0x0f,
            id,
        })
    }))
}

/// The logical unit's best designator for a persistent name: NAA, then EUI-64, then SCSI name
/// string, then T10 vendor ID (the order udev's scsi_id prefers).
pub fn preferred_lu_designator(b: &[u8]) -> Result<Option<Designator<'_>>, WireError> {
    let rank = |k: u8| match k {
        designator::NAA => 0,
        designator::EUI64 => 1,
        designator::SCSI_NAME => 2,
        designator::T10 => 3,
        _ => 9,
    };
    Ok(designators(b)?
        .filter(|d| d.association == 0 && rank(d.kind) < 9 && !d.id.is_empty())
        .min_by_key(|d| rank(d.kind)))
}

/// The identifier string udev's `scsi_id` builds from a designator (ID_SERIAL, the dm-multipath
/// WWID): the designator type as one hex digit, then the identifier (e.g. "36001405..." for NAA).
pub fn scsi_id_serial(d: &Designator<'_>) -> String {
    format!("{:x}{}", d.kind, d.text())
}

/// VPD 0xB0 block limits; fields the page does not reach read as 0 (no limit reported).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlockLimits {
    /// Optimal transfer length granularity (blocks).
    pub opt_xfer_granularity: u16,
    /// Maximum transfer length (blocks; 0 = no limit).
    pub max_xfer_len: u32,
    /// Optimal transfer length (blocks).
    pub opt_xfer_len: u32,
    /// Maximum UNMAP LBA count (blocks).
    pub max_unmap_lba_count: u32,
    /// Maximum UNMAP block descriptor count.
    pub max_unmap_desc_count: u32,
    /// Optimal unmap granularity (blocks).
    pub unmap_granularity: u32,
    /// Unmap granularity alignment, when valid.
    pub unmap_alignment: Option<u32>,
    /// Maximum WRITE SAME length (blocks; 0 = no limit reported).
    pub max_write_same_len: u64,
}

impl BlockLimits {
    /// Decodes VPD 0xB0.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let body = page_body(b, page::BLOCK_LIMITS)?;
        // `u32_at(p)` reads the u32 at page offset p (SBC-4 table 236); the body starts at page offset 4
        let u32_at = |p: usize| body.get(p - 4..p).map(|s| be32(s, 0)).unwrap_or(0);
        let align = u32_at(32);
        Ok(BlockLimits {
            opt_xfer_granularity: body.get(2..4).map(|s| be16(s, 0)).unwrap_or(0),
            max_xfer_len: u32_at(8),
            opt_xfer_len: u32_at(12),
            max_unmap_lba_count: u32_at(20),
            max_unmap_desc_count: u32_at(24),
            unmap_granularity: u32_at(28),
            unmap_alignment: (align & 0x8000_0000 != 0).then_some(align & 0x7fff_ffff),
            max_write_same_len: body.get(32..40).map(|s| be64(s, 0)).unwrap_or(0),
        })
    }
}

/// VPD 0xB2 logical block provisioning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Provisioning {
    /// UNMAP supported.
    pub lbpu: bool,
    /// WRITE SAME(16) with UNMAP supported.
    pub lbpws: bool,
    /// WRITE SAME(10) with UNMAP supported.
    pub lbpws10: bool,
    /// What unmapped blocks read as (0: unspecified, 1: zeros).
    pub lbprz: u8,
    /// Anchored LBAs supported.
    pub anc_sup: bool,
    /// Provisioning type: 0 full, 1 resource, 2 thin.
    pub provisioning_type: u8,
}

impl Provisioning {
    /// Decodes VPD 0xB2.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let body = page_body(b, page::LBP)?;
        need("VPD 0xB2 body", body, 2)?;
        let f = body[1];
        Ok(Provisioning {
            lbpu: f & 0x80 != 0,
            lbpws: f & 0x40 != 0,
            lbpws10: f & 0x20 != 0,
            lbprz: (f >> 2) & 7,
            anc_sup: f & 0x02 != 0,
            provisioning_type: body.get(2).map(|b| b & 7).unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vpd(code: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![0, code];
        v.extend_from_slice(&(body.len() as u16).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn serial_and_supported() {
        assert_eq!(
            serial_number(&vpd(0x80, b"1f8ea5b2-ad2a  ")).unwrap(),
            "1f8ea5b2-ad2a"
        );
        assert_eq!(
            supported_pages(&vpd(0, &[0, 0x80, 0x83])).unwrap(),
            &[0, 0x80, 0x83]
        );
        assert!(serial_number(&vpd(0x83, b"x")).is_err());
        // a page length past the transfer is bounded by the transfer
        let mut p = vpd(0x80, b"abc");
        p[3] = 200;
        assert_eq!(serial_number(&p).unwrap(), "abc");
    }

    #[test]
    fn lio_device_identification() {
        // NAA 6 (LU), T10 vendor ID (LU), relative target port (port association)
        let mut body = vec![0x01, 0x03, 0x00, 0x10];
        body.extend_from_slice(&[
            0x60, 0x01, 0x40, 0x5a, 0xbc, 0xde, 0xf0, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde,
            0xf0, 0x12,
        ]);
        body.extend_from_slice(&[0x02, 0x01, 0x00, 0x08]);
        body.extend_from_slice(b"LIO-ORG ");
        body.extend_from_slice(&[0x61, 0x94, 0x00, 0x04, 0, 0, 0, 1]);
        let page = vpd(0x83, &body);
        let all: Vec<_> = designators(&page).unwrap().collect();
        assert_eq!(all.len(), 3);
        assert_eq!(all[2].association, 1);
        let best = preferred_lu_designator(&page).unwrap().unwrap();
        assert_eq!(best.kind, designator::NAA);
        assert_eq!(scsi_id_serial(&best), "36001405abcdef0123456789abcdef012");
        assert_eq!(all[1].text(), "LIO-ORG");
        // a descriptor running past the page is dropped
        let mut cut = page.clone();
        cut.truncate(page.len() - 2);
        assert_eq!(designators(&cut).unwrap().count(), 2);
    }

    #[test]
    fn block_limits_and_provisioning() {
        let mut body = vec![0u8; 0x3c];
        body[8 - 4..12 - 4].copy_from_slice(&2048u32.to_be_bytes()); // max transfer at page offset 8
        body[20 - 4..24 - 4].copy_from_slice(&8192u32.to_be_bytes()); // max unmap LBA count at 20
        body[32 - 4..36 - 4].copy_from_slice(&0x8000_0001u32.to_be_bytes()); // alignment at 32
        body[36 - 4..44 - 4].copy_from_slice(&65535u64.to_be_bytes()); // max write same at 36
        let l = BlockLimits::parse(&vpd(0xb0, &body)).unwrap();
        assert_eq!(l.max_xfer_len, 2048);
        assert_eq!(l.max_unmap_lba_count, 8192);
        assert_eq!(l.unmap_alignment, Some(1));
        assert_eq!(l.max_write_same_len, 65535);
        // a short page: absent fields are 0
        let s = BlockLimits::parse(&vpd(0xb0, &body[..8])).unwrap();
        assert_eq!((s.max_xfer_len, s.max_unmap_lba_count), (2048, 0));
        let p = Provisioning::parse(&vpd(0xb2, &[0, 0xe4, 0x02, 0])).unwrap();
        assert!(p.lbpu && p.lbpws && p.lbpws10);
        assert_eq!((p.lbprz, p.provisioning_type), (1, 2));
        assert!(Provisioning::parse(&vpd(0xb2, &[0])).is_err());
    }
}
