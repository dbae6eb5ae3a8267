//! Block operations (what ublk and NBD ask for) mapped to SCSI commands, in one place for both front
//! ends: READ/WRITE -> READ(16)/WRITE(16), FLUSH -> SYNCHRONIZE CACHE(16), DISCARD -> UNMAP,
//! WRITE_ZEROES -> WRITE SAME(16) of a zeroed block (UNMAP bit when allowed), as the kernel's sd
//! driver does, or WRITE(16) of zeros where the LUN has no WRITE SAME; FUA and FLUSH follow the
//! LUN's write cache ([`WriteCache`]).

use super::{DataBuf, DataDir, ScsiCmd};
use crate::wire::scsi::sense::errno;
use crate::wire::scsi::{encode_unmap_params, Cdb, UnmapRange};
use crate::wire::srp::ScsiLun;

/// A block-layer operation on byte offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockOp {
    /// Read into the buffer.
    Read,
    /// Write from the buffer; `fua` forces it to stable media.
    Write {
        /// Force unit access.
        fua: bool,
    },
    /// Flush the volatile cache.
    Flush,
    /// Deallocate a range.
    Discard,
    /// Zero a range; `may_unmap` lets the target deallocate instead.
    WriteZeroes {
        /// Deallocation allowed.
        may_unmap: bool,
    },
    /// Zero a range by writing zeros from the (zeroed) buffer: WRITE_ZEROES on a LUN without
    /// WRITE SAME ([`Geometry::write_same`]), as the kernel and qemu fall back. At most one
    /// buffer's worth.
    ZeroWrite,
    /// Ask which blocks of a range are mapped (GET LBA STATUS into the buffer; the answer may
    /// cover less than the range, and is shorter than the buffer: see [`LBA_STATUS_BYTES`]).
    LbaStatus,
}

/// How much GET LBA STATUS data is asked for: the header and 255 descriptors.
pub const LBA_STATUS_BYTES: u32 = 8 + 255 * 16;

/// The LUN's write cache as MODE SENSE reports it (caching page WCE, DPOFUA in the device-specific
/// parameter), and the one rule both front ends follow for a block layer's FLUSH and FUA, as sd
/// does: a LUN without a volatile cache needs neither (a completed write is durable, and SBC targets
/// such as LIO refuse the FUA bit there); with a cache, FUA is the WRITE's FUA bit when the LUN has
/// DPOFUA, else the write followed by SYNCHRONIZE CACHE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WriteCache {
    /// A volatile write cache is enabled (WCE).
    pub enabled: bool,
    /// The LUN honours the FUA bit (DPOFUA).
    pub dpofua: bool,
}

/// How a write that must be durable when it completes (FUA) is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuaWrite {
    /// WRITE(16) with the FUA bit.
    FuaBit,
    /// A plain WRITE(16), then SYNCHRONIZE CACHE before the write is reported done.
    ThenSync,
    /// A plain WRITE(16): the LUN has no volatile cache.
    Plain,
}

impl WriteCache {
    /// What state files written before the cache was recorded imply: the FUA bit was always sent.
    pub const LEGACY: WriteCache = WriteCache {
        enabled: true,
        dpofua: true,
    };

    /// Whether FLUSH means anything (SYNCHRONIZE CACHE); without a volatile cache it completes at once.
    pub fn flushes(self) -> bool {
        self.enabled
    }

    /// How a FUA write is carried out.
    pub fn fua_write(self) -> FuaWrite {
        match (self.enabled, self.dpofua) {
            (false, _) => FuaWrite::Plain,
            (true, true) => FuaWrite::FuaBit,
            (true, false) => FuaWrite::ThenSync,
        }
    }
}

fn legacy_cache() -> WriteCache {
    WriteCache::LEGACY
}

fn yes() -> bool {
    true
}

/// What the LUN supports, from its INQUIRY/VPD/READ CAPACITY/MODE SENSE data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Geometry {
    /// log2 of the logical block size.
    pub block_shift: u32,
    /// Number of logical blocks.
    pub blocks: u64,
    /// UNMAP supported (VPD 0xB2 LBPU).
    pub unmap: bool,
    /// WRITE SAME(16) with UNMAP supported (VPD 0xB2 LBPWS).
    pub write_same_unmap: bool,
    /// The write cache: what FUA and FLUSH become.
    #[serde(default = "legacy_cache")]
    pub cache: WriteCache,
    /// Thin provisioned (READ CAPACITY(16) LBPME): GET LBA STATUS may tell mapped blocks from
    /// deallocated ones.
    #[serde(default)]
    pub lbpme: bool,
    /// Deallocated blocks read as zeros (LBPRZ).
    #[serde(default)]
    pub lbprz: bool,
    /// WRITE SAME(16) is to be used for WRITE_ZEROES: not where REPORT SUPPORTED OPERATION CODES
    /// says the LUN lacks it (LIO's ramdisk backstore, for one, announces a MAXIMUM WRITE SAME
    /// LENGTH and refuses the command), nor once the LUN refused it. Otherwise zeros are written
    /// ([`BlockOp::ZeroWrite`]). State files from before it was recorded: WRITE SAME, as then.
    #[serde(default = "yes")]
    pub write_same: bool,
}

/// Builds the SCSI command for `op` on `len` bytes at byte `offset` of logical unit `lun`. `buf` is the tag's registered
/// buffer and `scratch` its bytes: UNMAP's parameter list and WRITE SAME's zero block are written
/// there. A FUA write gets the FUA bit only where [`WriteCache::fua_write`] says so; the
/// SYNCHRONIZE CACHE of [`FuaWrite::ThenSync`] is the caller's next command. Errors are errnos for
/// the block layer.
pub fn to_scsi(
    lun: ScsiLun,
    op: BlockOp,
    offset: u64,
    len: u32,
    geo: &Geometry,
    buf: DataBuf,
    scratch: &mut [u8],
) -> Result<ScsiCmd, i32> {
    let flush = || ScsiCmd {
        lun,
        cdb: Cdb::sync_cache16(0, 0),
        data: DataDir::None,
    };
    if let BlockOp::Flush = op {
        return Ok(flush());
    }
    let (lba, blocks) = geo.extent(offset, len)?;
    match op {
        BlockOp::Read | BlockOp::Write { .. } | BlockOp::ZeroWrite if len > buf.len => {
            Err(errno::EINVAL)
        }
        BlockOp::Read => Ok(ScsiCmd {
            lun,
            cdb: Cdb::read16(lba, blocks, false),
            data: DataDir::In(buf.prefix(len)),
        }),
        BlockOp::Write { fua } => Ok(ScsiCmd {
            lun,
            cdb: Cdb::write16(
                lba,
                blocks,
                fua && geo.cache.fua_write() == FuaWrite::FuaBit,
            ),
            data: DataDir::Out(buf.prefix(len)),
        }),
        BlockOp::Discard => {
            if !geo.unmap {
                return Err(errno::EOPNOTSUPP);
            }
            let n = encode_unmap_params(scratch, &[UnmapRange { lba, blocks }])
                .map_err(|_| errno::EINVAL)?;
            Ok(ScsiCmd {
                lun,
                cdb: Cdb::unmap(n as u16),
                data: DataDir::Out(buf.prefix(n as u32)),
            })
        }
        BlockOp::WriteZeroes { may_unmap } => {
            let bs = 1usize << geo.block_shift;
            let zero = scratch.get_mut(..bs).ok_or(errno::EINVAL)?;
            zero.fill(0);
            let unmap = may_unmap && geo.write_same_unmap;
            Ok(ScsiCmd {
                lun,
                cdb: Cdb::write_same16(lba, blocks, unmap, false),
                data: DataDir::Out(buf.prefix(bs as u32)),
            })
        }
        BlockOp::ZeroWrite => {
            scratch
                .get_mut(..len as usize)
                .ok_or(errno::EINVAL)?
                .fill(0);
            Ok(ScsiCmd {
                lun,
                cdb: Cdb::write16(lba, blocks, false),
                data: DataDir::Out(buf.prefix(len)),
            })
        }
        BlockOp::LbaStatus => {
            if !geo.lbpme {
                return Err(errno::EOPNOTSUPP);
            }
            let alloc = LBA_STATUS_BYTES.min(buf.len);
            Ok(ScsiCmd {
                lun,
                cdb: Cdb::get_lba_status(lba, alloc),
                data: DataDir::In(buf.prefix(alloc)),
            })
        }
        BlockOp::Flush => Ok(flush()),
    }
}

impl Geometry {
    /// The blocks `len` bytes at `offset` cover, as (LBA, count): EINVAL unless both are whole
    /// blocks and `len` is not 0, EIO past the LUN's end.
    #[inline]
    fn extent(&self, offset: u64, len: u32) -> Result<(u64, u32), i32> {
        let bs_mask = (1u64 << self.block_shift) - 1;
        if offset & bs_mask != 0 || u64::from(len) & bs_mask != 0 || len == 0 {
            return Err(errno::EINVAL);
        }
        let lba = offset >> self.block_shift;
        let blocks = len >> self.block_shift;
        if lba
            .checked_add(u64::from(blocks))
            .is_none_or(|end| end > self.blocks)
        {
            return Err(errno::EIO);
        }
        Ok((lba, blocks))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::wire::scsi::cdb::op;

    /// A thin 512 MiB LUN of 512-byte blocks with every feature (other modules' tests use it too).
    pub(crate) const GEO: Geometry = Geometry {
        block_shift: 9,
        blocks: 1 << 20,
        unmap: true,
        write_same_unmap: true,
        cache: WriteCache::LEGACY,
        lbpme: true,
        lbprz: true,
        write_same: true,
    };
    const BUF: DataBuf = DataBuf {
        addr: 0x1000,
        len: 1 << 20,
        lkey: 1,
        rkey: 2,
    };

    #[test]
    fn read_write_map_to_16_byte_cdbs() {
        let mut s = vec![0u8; 4096];
        let r = to_scsi(
            ScsiLun::default(),
            BlockOp::Read,
            4096,
            8192,
            &GEO,
            BUF,
            &mut s,
        )
        .unwrap();
        assert_eq!(r.cdb.opcode(), op::READ_16);
        assert_eq!(&r.cdb.as_slice()[2..10], &8u64.to_be_bytes());
        assert_eq!(r.data, DataDir::In(DataBuf { len: 8192, ..BUF }));
        let w = to_scsi(
            ScsiLun::default(),
            BlockOp::Write { fua: true },
            0,
            512,
            &GEO,
            BUF,
            &mut s,
        )
        .unwrap();
        assert_eq!(w.cdb.as_slice()[1], 0x08);
        assert!(matches!(w.data, DataDir::Out(b) if b.len == 512));
        let f = to_scsi(ScsiLun::default(), BlockOp::Flush, 0, 0, &GEO, BUF, &mut s).unwrap();
        assert_eq!(f.cdb.opcode(), op::SYNCHRONIZE_CACHE_16);
    }

    #[test]
    fn fua_follows_the_write_cache() {
        let mut s = vec![0u8; 4096];
        let cases = [
            (false, false, FuaWrite::Plain, 0),
            (false, true, FuaWrite::Plain, 0),
            (true, true, FuaWrite::FuaBit, 0x08),
            (true, false, FuaWrite::ThenSync, 0),
        ];
        for (enabled, dpofua, plan, bit) in cases {
            let cache = WriteCache { enabled, dpofua };
            assert_eq!(cache.fua_write(), plan, "{cache:?}");
            assert_eq!(cache.flushes(), enabled);
            let geo = Geometry { cache, ..GEO };
            let w = to_scsi(
                ScsiLun::default(),
                BlockOp::Write { fua: true },
                0,
                512,
                &geo,
                BUF,
                &mut s,
            )
            .unwrap();
            assert_eq!(w.cdb.as_slice()[1], bit, "{cache:?}");
            let w = to_scsi(
                ScsiLun::default(),
                BlockOp::Write { fua: false },
                0,
                512,
                &geo,
                BUF,
                &mut s,
            )
            .unwrap();
            assert_eq!(w.cdb.as_slice()[1], 0);
        }
    }

    #[test]
    fn geometry_of_an_older_state_file_keeps_the_fua_bit() {
        let g: Geometry = serde_json::from_str(
            r#"{"block_shift":9,"blocks":8,"unmap":false,"write_same_unmap":false}"#,
        )
        .unwrap();
        assert_eq!(g.cache, WriteCache::LEGACY);
    }

    #[test]
    fn discard_and_zeroes_use_the_scratch_buffer() {
        let mut s = vec![0xffu8; 4096];
        let d = to_scsi(
            ScsiLun::default(),
            BlockOp::Discard,
            512,
            1024,
            &GEO,
            BUF,
            &mut s,
        )
        .unwrap();
        assert_eq!(d.cdb.opcode(), op::UNMAP);
        assert_eq!(&s[8..16], &1u64.to_be_bytes());
        assert_eq!(&s[16..20], &2u32.to_be_bytes());
        let z = to_scsi(
            ScsiLun::default(),
            BlockOp::WriteZeroes { may_unmap: true },
            0,
            4096,
            &GEO,
            BUF,
            &mut s,
        )
        .unwrap();
        assert_eq!(z.cdb.as_slice()[..2], [op::WRITE_SAME_16, 0x08]);
        assert!(s[..512].iter().all(|&b| b == 0));
        let no_unmap = Geometry {
            unmap: false,
            write_same_unmap: false,
            ..GEO
        };
        assert_eq!(
            to_scsi(
                ScsiLun::default(),
                BlockOp::Discard,
                0,
                512,
                &no_unmap,
                BUF,
                &mut s
            ),
            Err(errno::EOPNOTSUPP)
        );
        let z = to_scsi(
            ScsiLun::default(),
            BlockOp::WriteZeroes { may_unmap: true },
            0,
            512,
            &no_unmap,
            BUF,
            &mut s,
        )
        .unwrap();
        assert_eq!(z.cdb.as_slice()[1], 0);
    }

    #[test]
    fn zero_write_writes_a_zeroed_buffer_of_its_length() {
        let mut s = vec![0xffu8; 8192];
        let buf = DataBuf { len: 8192, ..BUF };
        let z = to_scsi(
            ScsiLun::default(),
            BlockOp::ZeroWrite,
            4096,
            8192,
            &GEO,
            buf,
            &mut s,
        )
        .unwrap();
        assert_eq!(z.cdb.opcode(), op::WRITE_16);
        assert_eq!(&z.cdb.as_slice()[2..10], &8u64.to_be_bytes());
        assert_eq!(&z.cdb.as_slice()[10..14], &16u32.to_be_bytes());
        assert_eq!(z.data, DataDir::Out(buf));
        assert!(s.iter().all(|&b| b == 0));
        assert_eq!(
            to_scsi(
                ScsiLun::default(),
                BlockOp::ZeroWrite,
                0,
                16384,
                &GEO,
                buf,
                &mut s
            ),
            Err(errno::EINVAL),
            "longer than the buffer"
        );
    }

    #[test]
    fn geometry_of_an_older_state_file_keeps_write_same() {
        let g: Geometry = serde_json::from_str(
            r#"{"block_shift":9,"blocks":8,"unmap":false,"write_same_unmap":false}"#,
        )
        .unwrap();
        assert!(g.write_same);
    }

    #[test]
    fn lba_status_asks_a_thin_lun_only() {
        let mut s = vec![0u8; 4096];
        let g = to_scsi(
            ScsiLun::default(),
            BlockOp::LbaStatus,
            8192,
            1 << 20,
            &GEO,
            BUF,
            &mut s,
        )
        .unwrap();
        assert_eq!(g.cdb.as_slice()[..2], [op::SERVICE_ACTION_IN_16, 0x12]);
        assert_eq!(&g.cdb.as_slice()[2..10], &16u64.to_be_bytes());
        assert_eq!(&g.cdb.as_slice()[10..14], &LBA_STATUS_BYTES.to_be_bytes());
        assert_eq!(
            g.data,
            DataDir::In(DataBuf {
                len: LBA_STATUS_BYTES,
                ..BUF
            })
        );
        let thick = Geometry {
            lbpme: false,
            ..GEO
        };
        assert_eq!(
            to_scsi(
                ScsiLun::default(),
                BlockOp::LbaStatus,
                0,
                512,
                &thick,
                BUF,
                &mut s
            ),
            Err(errno::EOPNOTSUPP)
        );
    }

    #[test]
    fn refuses_misaligned_and_out_of_range() {
        let mut s = vec![0u8; 4096];
        assert_eq!(
            to_scsi(ScsiLun::default(), BlockOp::Read, 1, 512, &GEO, BUF, &mut s),
            Err(errno::EINVAL)
        );
        assert_eq!(
            to_scsi(ScsiLun::default(), BlockOp::Read, 0, 100, &GEO, BUF, &mut s),
            Err(errno::EINVAL)
        );
        assert_eq!(
            to_scsi(
                ScsiLun::default(),
                BlockOp::Read,
                (1 << 29) - 512,
                1024,
                &GEO,
                BUF,
                &mut s
            ),
            Err(errno::EIO)
        );
        assert_eq!(
            to_scsi(
                ScsiLun::default(),
                BlockOp::Read,
                0,
                2 << 20,
                &GEO,
                BUF,
                &mut s
            ),
            Err(errno::EINVAL)
        );
    }
}
