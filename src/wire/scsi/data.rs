//! Parsers for the parameter data the initiator reads: standard INQUIRY, READ CAPACITY(16),
//! MODE SENSE(10) (header + caching page) and REPORT LUNS (SPC-5, SBC-4).

use crate::wire::srp::ScsiLun;
use crate::wire::{be16, be32, be64, need, WireError};

/// Standard INQUIRY data (SPC-5 6.7.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StandardInquiry {
    /// Peripheral qualifier (0: a logical unit is connected).
    pub qualifier: u8,
    /// Peripheral device type (0: direct access block device).
    pub device_type: u8,
    /// Removable medium.
    pub removable: bool,
    /// Version (SPC level).
    pub version: u8,
    /// Target port group support (ALUA), 0..3.
    pub tpgs: u8,
    /// Protection information supported.
    pub protect: bool,
    /// Command queueing supported.
    pub cmdque: bool,
    /// T10 vendor identification, trimmed.
    pub vendor: String,
    /// Product identification, trimmed.
    pub product: String,
    /// Product revision level, trimmed.
    pub revision: String,
}

/// ASCII field, trailing spaces and NULs removed; non-printable bytes shown as '?'.
pub(crate) fn ascii_field(b: &[u8]) -> String {
    let s: String = b
        .iter()
        .map(|&c| {
            if (0x20..0x7f).contains(&c) {
                c as char
            } else {
                '?'
            }
        })
        .collect();
    s.trim_end_matches([' ', '?']).trim_start().to_string()
}

impl StandardInquiry {
    /// Decodes at least the 36 bytes every target returns.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("standard INQUIRY data", b, 36)?;
        Ok(StandardInquiry {
            qualifier: b[0] >> 5,
            device_type: b[0] & 0x1f,
            removable: b[1] & 0x80 != 0,
            version: b[2],
            tpgs: (b[5] >> 4) & 3,
            protect: b[5] & 1 != 0,
            cmdque: b[7] & 2 != 0,
            vendor: ascii_field(&b[8..16]),
            product: ascii_field(&b[16..32]),
            revision: ascii_field(&b[32..36]),
        })
    }
    /// Whether this is a connected direct-access block device (what srp-ublk can serve).
    pub fn is_disk(&self) -> bool {
        self.qualifier == 0 && self.device_type == 0
    }
}

/// The provisioning status of an extent in GET LBA STATUS data (SBC-4 5.7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LbaProvisioning {
    /// Mapped (or, with SBC-4's status 3, mapped or unknown): holds data.
    Mapped,
    /// Deallocated: no storage behind it; reads return zeros when the LUN has LBPRZ.
    Deallocated,
    /// Anchored: storage reserved, not mapped; reads as a deallocated block does.
    Anchored,
}

/// One LBA status descriptor: `blocks` logical blocks from `lba`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LbaStatusDesc {
    /// First logical block of the extent.
    pub lba: u64,
    /// Number of logical blocks (0 ends a list: no extent is empty).
    pub blocks: u32,
    /// What the blocks are.
    pub status: LbaProvisioning,
}

/// The descriptors of GET LBA STATUS parameter data, in the order the target sent them: as many
/// as both its PARAMETER DATA LENGTH and the bytes transferred hold.
pub fn lba_status(b: &[u8]) -> Result<impl Iterator<Item = LbaStatusDesc> + '_, WireError> {
    need("GET LBA STATUS data", b, 8)?;
    // the length counts the bytes after itself
    let claimed = (be32(b, 0) as usize).saturating_add(4);
    let body = &b[8..claimed.min(b.len()).max(8)];
    Ok(body.chunks_exact(16).map(|d| LbaStatusDesc {
        lba: be64(d, 0),
        blocks: be32(d, 8),
        status: match d[12] & 0x0f {
            1 => LbaProvisioning::Deallocated,
            2 => LbaProvisioning::Anchored,
            _ => LbaProvisioning::Mapped,
        },
    }))
}

/// READ CAPACITY(16) parameter data (SBC-4 5.20.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Capacity {
    /// The last logical block address.
    pub last_lba: u64,
    /// Logical block length in bytes.
    pub block_len: u32,
    /// Protection enabled.
    pub prot_en: bool,
    /// Protection type (when enabled).
    pub p_type: u8,
    /// Logical blocks per physical block exponent.
    pub lbppbe: u8,
    /// Logical block provisioning management enabled (thin provisioning: UNMAP works).
    pub lbpme: bool,
    /// Unmapped blocks read as zeros.
    pub lbprz: bool,
    /// Lowest aligned logical block address.
    pub lowest_aligned_lba: u16,
}

impl Capacity {
    /// Decodes the parameter data (12 bytes at least; the rest read as zero when cut short).
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("READ CAPACITY(16) data", b, 12)?;
        let at = |i: usize| b.get(i).copied().unwrap_or(0);
        Ok(Capacity {
            last_lba: be64(b, 0),
            block_len: be32(b, 8),
            prot_en: at(12) & 1 != 0,
            p_type: (at(12) >> 1) & 7,
            lbppbe: at(13) & 0x0f,
            lbpme: at(14) & 0x80 != 0,
            lbprz: at(14) & 0x40 != 0,
            lowest_aligned_lba: u16::from_be_bytes([at(14) & 0x3f, at(15)]),
        })
    }
    /// Number of logical blocks (saturating; a last LBA of u64::MAX is not a real disk).
    pub fn blocks(&self) -> u64 {
        self.last_lba.saturating_add(1)
    }
    /// Size in bytes, if it fits u64.
    pub fn bytes(&self) -> Option<u64> {
        self.blocks().checked_mul(u64::from(self.block_len))
    }
    /// Physical block length in bytes (logical << lbppbe), if sane.
    pub fn physical_block_len(&self) -> Option<u32> {
        self.block_len.checked_shl(u32::from(self.lbppbe))
    }
    /// Whether the logical block length is one a block device can have (a power of two from 512
    /// to 64 KiB).
    pub fn block_len_ok(&self) -> bool {
        self.block_len.is_power_of_two() && (512..=65536).contains(&self.block_len)
    }
}

/// MODE SENSE(10) parameter data: the header and the mode pages (SPC-5 7.5.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeSense10<'a> {
    /// Medium type.
    pub medium_type: u8,
    /// Write protected (device-specific parameter bit 7 for disks).
    pub write_protect: bool,
    /// DPOFUA: the device honours DPO and FUA.
    pub dpofua: bool,
    /// The mode pages after the block descriptors.
    pub pages: &'a [u8],
}

/// The caching mode page (0x08) bits srp-ublk uses (SBC-4 6.5.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CachingPage {
    /// Write cache enabled: writes may sit in a volatile cache until SYNCHRONIZE CACHE.
    pub wce: bool,
    /// Read cache disabled.
    pub rcd: bool,
}

/// The caching mode page code.
pub const CACHING_PAGE: u8 = 0x08;

impl<'a> ModeSense10<'a> {
    /// Decodes the 8-byte header, skips the block descriptors, bounds the pages by the mode data
    /// length and by what was transferred.
    pub fn parse(b: &'a [u8]) -> Result<Self, WireError> {
        need("MODE SENSE(10) header", b, 8)?;
        let data_len = usize::from(be16(b, 0)) + 2;
        let end = b.len().min(data_len);
        let bd_len = usize::from(be16(b, 6));
        let start = (8 + bd_len).min(end);
        Ok(ModeSense10 {
            medium_type: b[2],
            write_protect: b[3] & 0x80 != 0,
            dpofua: b[3] & 0x10 != 0,
            pages: &b[start..end.max(start)],
        })
    }

    /// The bytes of mode page `code` (subpage 0), header included, if present and complete.
    pub fn page(&self, code: u8) -> Option<&'a [u8]> {
        let p = self.pages;
        let mut off = 0usize;
        while off + 2 <= p.len() {
            let spf = p[off] & 0x40 != 0;
            let (hdr, len) = if spf {
                if off + 4 > p.len() {
                    return None;
                }
                (4, usize::from(be16(p, off + 2)))
            } else {
                (2, usize::from(p[off + 1]))
            };
            let next = off + hdr + len;
            if !spf && p[off] & 0x3f == code {
                return p.get(off..next);
            }
            off = next;
        }
        None
    }

    /// The caching page, if the target returned it.
    pub fn caching(&self) -> Option<CachingPage> {
        let pg = self.page(CACHING_PAGE)?;
        let b2 = *pg.get(2)?;
        Some(CachingPage {
            wce: b2 & 0x04 != 0,
            rcd: b2 & 0x01 != 0,
        })
    }
}

/// REPORT LUNS parameter data (SPC-5 6.33.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportLuns<'a> {
    /// The LUN list length the target reported, in bytes; more than was transferred means the
    /// allocation length was too small.
    pub list_len: u32,
    entries: &'a [u8],
}

impl<'a> ReportLuns<'a> {
    /// Decodes the header and bounds the list by what was transferred.
    pub fn parse(b: &'a [u8]) -> Result<Self, WireError> {
        need("REPORT LUNS data", b, 8)?;
        let list_len = be32(b, 0);
        let avail = (b.len() - 8).min(list_len as usize) / 8 * 8;
        Ok(ReportLuns {
            list_len,
            entries: &b[8..8 + avail],
        })
    }
    /// Whether the whole list was transferred.
    pub fn complete(&self) -> bool {
        self.entries.len() as u64 >= u64::from(self.list_len)
    }
    /// The LUNs transferred.
    pub fn luns(&self) -> impl Iterator<Item = ScsiLun> + 'a {
        self.entries.chunks_exact(8).map(|c| {
            let mut l = [0u8; 8];
            l.copy_from_slice(c);
            ScsiLun(l)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lba_desc(lba: u64, blocks: u32, status: u8) -> Vec<u8> {
        let mut d = lba.to_be_bytes().to_vec();
        d.extend_from_slice(&blocks.to_be_bytes());
        d.extend_from_slice(&[status, 0, 0, 0]);
        d
    }

    #[test]
    fn lba_status_reads_as_many_descriptors_as_length_and_transfer_hold() {
        let mut b = vec![0, 0, 0, 4 + 3 * 16, 0, 0, 0, 0];
        b.extend(lba_desc(8, 16, 0));
        b.extend(lba_desc(24, 100, 1));
        b.extend(lba_desc(124, 4, 2));
        let all: Vec<_> = lba_status(&b).unwrap().collect();
        assert_eq!(all.len(), 3);
        assert_eq!(
            all[1],
            LbaStatusDesc {
                lba: 24,
                blocks: 100,
                status: LbaProvisioning::Deallocated
            }
        );
        assert_eq!(all[2].status, LbaProvisioning::Anchored);
        // cut short by the transfer, or by the length field; a reserved status is data
        assert_eq!(lba_status(&b[..8 + 16 + 5]).unwrap().count(), 1);
        b[3] = 4 + 16;
        assert_eq!(lba_status(&b).unwrap().count(), 1);
        b[3] = 0xff;
        b[8 + 12] = 7;
        let first = lba_status(&b).unwrap().next().unwrap();
        assert_eq!(first.status, LbaProvisioning::Mapped);
        assert!(lba_status(&b[..7]).is_err());
        assert_eq!(lba_status(&[0u8; 8]).unwrap().count(), 0);
    }

    #[test]
    fn lio_standard_inquiry() {
        let mut b = [0u8; 36];
        b[2] = 6;
        b[3] = 2;
        b[4] = 31;
        b[7] = 2;
        b[8..16].copy_from_slice(b"LIO-ORG ");
        b[16..32].copy_from_slice(b"RAMDISK-MCP     ");
        b[32..36].copy_from_slice(b"4.0 ");
        let i = StandardInquiry::parse(&b).unwrap();
        assert!(i.is_disk() && i.cmdque);
        assert_eq!(
            (i.vendor.as_str(), i.product.as_str(), i.revision.as_str()),
            ("LIO-ORG", "RAMDISK-MCP", "4.0")
        );
        assert!(StandardInquiry::parse(&b[..35]).is_err());
    }

    #[test]
    fn capacity_of_the_lab_lun() {
        // 524288 blocks x 512 B = 256 MiB (userspace-login NOTES step 3)
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&524287u64.to_be_bytes());
        b[8..12].copy_from_slice(&512u32.to_be_bytes());
        b[13] = 3;
        b[14] = 0xc0;
        let c = Capacity::parse(&b).unwrap();
        assert_eq!(c.bytes(), Some(256 << 20));
        assert_eq!(c.physical_block_len(), Some(4096));
        assert!(c.lbpme && c.lbprz && c.block_len_ok());
        assert!(Capacity::parse(&b[..11]).is_err());
        let short = Capacity::parse(&b[..12]).unwrap();
        assert!(!short.lbpme);
        let huge = Capacity {
            last_lba: u64::MAX,
            ..c
        };
        assert_eq!(huge.bytes(), None);
        assert!(!Capacity {
            block_len: 520,
            ..c
        }
        .block_len_ok());
    }

    #[test]
    fn mode_sense_caching_and_wp() {
        // header (8) + caching page 0x08 len 0x12 with WCE
        let mut b = vec![0u8; 8 + 20];
        let n = (b.len() - 2) as u16;
        b[0..2].copy_from_slice(&n.to_be_bytes());
        b[3] = 0x90; // WP + DPOFUA
        b[8] = 0x08;
        b[9] = 0x12;
        b[10] = 0x04;
        let m = ModeSense10::parse(&b).unwrap();
        assert!(m.write_protect && m.dpofua);
        assert_eq!(
            m.caching(),
            Some(CachingPage {
                wce: true,
                rcd: false
            })
        );
        // a page cut short by the allocation length is absent, not misread
        let m = ModeSense10::parse(&b[..10]).unwrap();
        assert_eq!(m.caching(), None);
        // a block descriptor length past the end leaves no pages
        b[6..8].copy_from_slice(&0xffffu16.to_be_bytes());
        assert_eq!(ModeSense10::parse(&b).unwrap().caching(), None);
    }

    #[test]
    fn report_luns_bounded() {
        let mut b = vec![0u8; 8 + 24];
        b[0..4].copy_from_slice(&32u32.to_be_bytes()); // 4 LUNs, only 3 transferred
        b[9] = 0;
        b[17] = 1;
        b[25] = 2;
        let r = ReportLuns::parse(&b).unwrap();
        assert!(!r.complete());
        let luns: Vec<u64> = r.luns().map(|l| l.to_int()).collect();
        assert_eq!(luns, vec![0, 1, 2]);
        assert!(ReportLuns::parse(&b[..7]).is_err());
    }
}
