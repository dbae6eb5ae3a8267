//! What the fake target does with a command: READ(16) into the initiator's buffers, WRITE(16),
//! WRITE SAME(16) and UNMAP from them, through direct or inline indirect descriptors; against its
//! RAM disk or a file.

use super::{sense, FakeTarget};
use crate::wire::scsi::cdb::op;
use crate::wire::srp::{DataDesc, DirectBuf, SrpCmd};
use std::ops::Range;
use std::os::unix::fs::FileExt;

/// The buffers a data descriptor names, in order: a direct one, or an indirect one's inline
/// descriptors (whose table must be inline whole, as LIO's ib_srpt wants); None for none or an
/// indirect descriptor with descriptors left out of the IU.
pub(super) fn direct_bufs(d: &DataDesc<'_>) -> Option<Vec<DirectBuf>> {
    match d {
        DataDesc::Direct(b) => Some(vec![*b]),
        DataDesc::Indirect {
            table,
            total_len,
            inline,
        } => {
            let all: Vec<DirectBuf> = (0..inline.len()).filter_map(|i| inline.get(i)).collect();
            let sum: u64 = all.iter().map(|b| u64::from(b.len)).sum();
            let whole = table.len as usize == all.len() * 16 && sum == u64::from(*total_len);
            whole.then_some(all)
        }
        _ => None,
    }
}

impl FakeTarget {
    /// This target with `file` for its disk instead of a RAM disk: targets given the same file
    /// (one per queue, each its own handle) reach the same blocks, as a LUN's channels do, and
    /// what was written is in the file afterwards.
    pub fn with_file(mut self, file: std::fs::File) -> Self {
        self.file = Some(file);
        self
    }

    /// The disk's length in bytes.
    fn disk_len(&self) -> u64 {
        match &self.file {
            Some(f) => f.metadata().map_or(0, |m| m.len()),
            None => self.disk.len() as u64,
        }
    }

    /// Bytes `r` of the disk; None when its file cannot be read.
    fn disk_read(&self, r: Range<usize>) -> Option<Vec<u8>> {
        match &self.file {
            Some(f) => {
                let mut b = vec![0; r.len()];
                f.read_exact_at(&mut b, r.start as u64).ok().map(|_| b)
            }
            None => Some(self.disk[r].to_vec()),
        }
    }

    /// Writes `data` at byte `at` of the disk; false when its file cannot be written.
    fn disk_write(&mut self, at: usize, data: &[u8]) -> bool {
        match &self.file {
            Some(f) => f.write_all_at(data, at as u64).is_ok(),
            None => {
                self.disk[at..at + data.len()].copy_from_slice(data);
                true
            }
        }
    }

    /// A 16-byte CDB's LBA and block count.
    fn lba_blocks(cdb: &[u8]) -> (u64, u32) {
        let lba = u64::from_be_bytes(cdb[2..10].try_into().expect("8 bytes"));
        let n = u32::from_be_bytes(cdb[10..14].try_into().expect("4 bytes"));
        (lba, n)
    }

    /// The disk's byte range of `n` blocks at `lba`, if they are on the disk.
    fn range(&self, lba: u64, n: u32) -> Option<Range<usize>> {
        let bs = u64::from(self.block);
        let end = (lba + u64::from(n)) * bs;
        (end <= self.disk_len()).then(|| (lba * bs) as usize..end as usize)
    }

    /// READ(16): the blocks RDMA-written to the initiator's buffer, then GOOD.
    pub(super) fn read_16(&mut self, c: &SrpCmd) -> Vec<u8> {
        let (lba, n) = Self::lba_blocks(c.cdb);
        let Some(r) = self.range(lba, n) else {
            return self.respond(c.tag, 2, &sense(5, 0x21, 0), 0, 0);
        };
        let Some(descs) = direct_bufs(&c.data_in) else {
            return self.respond(c.tag, 2, &sense(5, 0x24, 0), 0, 0);
        };
        let Some(blocks) = self.disk_read(r) else {
            return self.respond(c.tag, 2, &sense(3, 0x11, 0), 0, 0);
        };
        // the blocks go into the descriptors in order, each filled before the next
        let mut data = &blocks[..];
        for d in descs {
            let n = (d.len as usize).min(data.len());
            if !self.dma_write(d.key, d.va, d.len, &data[..n]) {
                return self.respond(c.tag, 2, &sense(0x0b, 0x47, 0), 0, 0);
            }
            data = &data[n..];
        }
        self.respond(c.tag, 0, &[], 0, 0)
    }

    /// WRITE(16), WRITE SAME(16) and UNMAP: the data-out (immediate, or RDMA-read from the
    /// initiator's buffer) written, repeated per block, or the range zeroed.
    pub(super) fn write(&mut self, c: &SrpCmd, immediate: &[u8]) -> Vec<u8> {
        let data: Vec<u8> = match direct_bufs(&c.data_out) {
            _ if matches!(c.data_out, DataDesc::Immediate { .. }) => immediate.to_vec(),
            Some(descs) => {
                let mut all = Vec::new();
                for d in descs {
                    match self.dma_read(d.key, d.va, d.len) {
                        Some(m) => all.extend_from_slice(&m),
                        None => return self.respond(c.tag, 2, &sense(0x0b, 0x47, 0), 0, 0),
                    }
                }
                all
            }
            None => return self.respond(c.tag, 2, &sense(5, 0x24, 0), 0, 0),
        };
        let (lba, n) = if c.cdb[0] == op::UNMAP {
            let lba = u64::from_be_bytes(data[8..16].try_into().expect("8 bytes"));
            let n = u32::from_be_bytes(data[16..20].try_into().expect("4 bytes"));
            (lba, n)
        } else {
            Self::lba_blocks(c.cdb)
        };
        let Some(r) = self.range(lba, n) else {
            return self.respond(c.tag, 2, &sense(5, 0x21, 0), 0, 0);
        };
        let bs = self.block as usize;
        let blocks = match c.cdb[0] {
            op::WRITE_16 => data[..r.len()].to_vec(),
            op::UNMAP => vec![0; r.len()],
            _ => data[..bs].repeat(r.len() / bs),
        };
        if !self.disk_write(r.start, &blocks) {
            return self.respond(c.tag, 2, &sense(3, 0x0c, 0), 0, 0);
        }
        self.respond(c.tag, 0, &[], 0, 0)
    }
}
