//! A virtio-blk request as a descriptor chain carries it, parsed before anything is executed: the
//! 16-byte header (type, sector) at the front, the status byte at the very end, and the data in
//! between, each part wherever the driver put it (a descriptor may hold the header and data, or
//! data and the status, as the virtio spec allows).

use vm_memory::{Address, Bytes, GuestAddress, GuestMemory};

/// `VIRTIO_BLK_T_*`.
pub(super) mod kind {
    pub const IN: u32 = 0;
    pub const OUT: u32 = 1;
    pub const FLUSH: u32 = 4;
    pub const GET_ID: u32 = 8;
    pub const DISCARD: u32 = 11;
    pub const WRITE_ZEROES: u32 = 13;
}

/// `VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP`: the range may be deallocated (reading back zeros).
pub(super) const UNMAP: u32 = 1;

/// `VIRTIO_BLK_S_*`.
pub(super) mod status {
    pub const OK: u8 = 0;
    pub const IOERR: u8 = 1;
    pub const UNSUPP: u8 = 2;
}

/// The header's length (`struct virtio_blk_outhdr`).
const HEADER: u32 = 16;

/// One data range of guest memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Range {
    pub addr: GuestAddress,
    pub len: u32,
}

/// A request's data direction and ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Request {
    /// The chain's head (what the used ring names).
    pub head: u16,
    /// `VIRTIO_BLK_T_*`.
    pub kind: u32,
    /// The first 512-byte sector.
    pub sector: u64,
    /// The data, in order.
    pub data: Vec<Range>,
    /// Whether the data ranges are device-writable (the driver reads them).
    pub writable: bool,
    /// Where the status byte goes.
    pub status: GuestAddress,
}

impl Request {
    /// The data's length.
    pub fn len(&self) -> u64 {
        self.data.iter().map(|r| u64::from(r.len)).sum()
    }
}

/// Why a chain is not a request the device can answer.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum ChainError {
    /// Shorter than a header and a status byte.
    #[error("a descriptor chain of {0} bytes cannot hold a request's header and status")]
    Short(u64),
    /// The status byte is in a descriptor the device may not write.
    #[error("the status byte is in a device-readable descriptor")]
    ReadOnlyStatus,
    /// The data mixes device-readable and device-writable descriptors.
    #[error("the request's data mixes device-readable and device-writable descriptors")]
    MixedData,
    /// The chain never ends where the ring says it may: it loops, is longer than the queue, or
    /// names a descriptor past the table (or an indirect table outside guest memory).
    #[error("the descriptor chain loops or runs past the descriptor table")]
    Unterminated,
    /// The header could not be read from guest memory.
    #[error("the request's header is outside guest memory")]
    Header,
}

/// The descriptors (address, length, device-writable) of the chain whose head is `head` in the
/// split ring's descriptor table at `table` of `size` entries, read from guest memory: for a
/// request taken again from the inflight region (the ring's own iterator starts only from the
/// available ring). An indirect descriptor is followed once (a table of at most 65535 entries,
/// as rust-vmm's own iterator allows); a chain longer than its table, or a descriptor outside the
/// table or guest memory, is [`ChainError::Unterminated`].
pub(super) fn chain_at<M: GuestMemory + ?Sized>(
    mem: &M,
    table: GuestAddress,
    size: u16,
    head: u16,
) -> Result<Vec<(GuestAddress, u32, bool)>, ChainError> {
    const NEXT: u16 = 1;
    const WRITE: u16 = 2;
    const INDIRECT: u16 = 4;
    let (mut table, mut size, mut i) = (table, u32::from(size), u32::from(head));
    let mut descs = Vec::new();
    let mut indirect = false;
    let mut left = size;
    loop {
        if i >= size || left == 0 {
            return Err(ChainError::Unterminated);
        }
        left -= 1;
        let at = table
            .checked_add(u64::from(i) * 16)
            .ok_or(ChainError::Unterminated)?;
        let d: virtio_queue::desc::split::Descriptor =
            mem.read_obj(at).map_err(|_| ChainError::Unterminated)?;
        if d.flags() & INDIRECT != 0 {
            // one indirect table, as the head (a driver puts nothing beside it)
            let entries = d.len() / 16;
            if indirect
                || !descs.is_empty()
                || d.len() % 16 != 0
                || entries == 0
                || entries > u32::from(u16::MAX)
            {
                return Err(ChainError::Unterminated);
            }
            indirect = true;
            (table, size, i) = (d.addr(), entries, 0);
            left = size;
            continue;
        }
        descs.push((d.addr(), d.len(), d.flags() & WRITE != 0));
        if d.flags() & NEXT == 0 {
            return Ok(descs);
        }
        i = u32::from(d.next());
    }
}

/// Parses a chain given as its descriptors (address, length, device-writable) into a request.
pub(super) fn parse<M: GuestMemory + ?Sized>(
    mem: &M,
    head: u16,
    descs: &[(GuestAddress, u32, bool)],
) -> Result<Request, ChainError> {
    let total: u64 = descs.iter().map(|d| u64::from(d.1)).sum();
    if total < u64::from(HEADER) + 1 {
        return Err(ChainError::Short(total));
    }
    let last = descs.len() - 1;
    if descs[last].1 == 0 {
        // the status byte is the last descriptor's last byte
        return Err(ChainError::Short(total));
    }
    let mut header = [0u8; HEADER as usize];
    let mut got = 0usize;
    let mut data = Vec::new();
    let mut writable = None;
    for (i, &(addr, len, w)) in descs.iter().enumerate() {
        let (mut addr, mut len) = (addr, len);
        // the header: the chain's first 16 bytes
        if got < header.len() {
            let n = (header.len() - got).min(len as usize);
            mem.read_slice(&mut header[got..got + n], addr)
                .map_err(|_| ChainError::Header)?;
            got += n;
            addr = addr.checked_add(n as u64).ok_or(ChainError::Header)?;
            len -= n as u32;
        }
        // the status: the chain's last byte
        if i == last {
            if !w {
                return Err(ChainError::ReadOnlyStatus);
            }
            len = len.saturating_sub(1);
        }
        if len == 0 {
            continue;
        }
        if *writable.get_or_insert(w) != w {
            return Err(ChainError::MixedData);
        }
        data.push(Range { addr, len });
    }
    let (a, l, _) = descs[last];
    let kind = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    let sector = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    Ok(Request {
        head,
        kind,
        sector,
        data,
        writable: writable.unwrap_or(false),
        status: a
            .checked_add(u64::from(l) - 1)
            .ok_or(ChainError::ReadOnlyStatus)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    fn mem() -> GuestMemoryMmap<()> {
        let m = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let mut hdr = [0u8; 16];
        hdr[0..4].copy_from_slice(&kind::OUT.to_le_bytes());
        hdr[8..16].copy_from_slice(&77u64.to_le_bytes());
        m.write_slice(&hdr, GuestAddress(0x1000)).unwrap();
        m
    }

    #[test]
    fn the_usual_framing_header_data_status() {
        let m = mem();
        let descs = [
            (GuestAddress(0x1000), 16, false),
            (GuestAddress(0x8000), 4096, false),
            (GuestAddress(0xa000), 512, false),
            (GuestAddress(0x2000), 1, true),
        ];
        let r = parse(&m, 5, &descs).unwrap();
        assert_eq!(
            (r.head, r.kind, r.sector, r.len()),
            (5, kind::OUT, 77, 4608)
        );
        assert_eq!(r.status, GuestAddress(0x2000));
        assert!(!r.writable);
    }

    #[test]
    fn any_framing_header_with_data_and_data_with_status() {
        let m = mem();
        // header and 512 bytes in one descriptor; 512 bytes and the status in the last
        let descs = [
            (GuestAddress(0x1000), 16 + 512, true),
            (GuestAddress(0x3000), 513, true),
        ];
        let r = parse(&m, 0, &descs).unwrap();
        assert_eq!(
            r.data,
            [
                Range {
                    addr: GuestAddress(0x1010),
                    len: 512
                },
                Range {
                    addr: GuestAddress(0x3000),
                    len: 512
                }
            ]
        );
        assert_eq!(r.status, GuestAddress(0x3200));
        assert!(r.writable);
    }

    #[test]
    fn chains_that_are_not_requests() {
        let m = mem();
        let short = [(GuestAddress(0x1000), 16, false)];
        assert_eq!(parse(&m, 0, &short), Err(ChainError::Short(16)));
        let ro = [
            (GuestAddress(0x1000), 16, false),
            (GuestAddress(0x2000), 1, false),
        ];
        assert_eq!(parse(&m, 0, &ro), Err(ChainError::ReadOnlyStatus));
        let mixed = [
            (GuestAddress(0x1000), 16, false),
            (GuestAddress(0x8000), 512, false),
            (GuestAddress(0x9000), 512, true),
            (GuestAddress(0x2000), 1, true),
        ];
        assert_eq!(parse(&m, 0, &mixed), Err(ChainError::MixedData));
        let outside = [(GuestAddress(1 << 30), 17, true)];
        assert_eq!(parse(&m, 0, &outside), Err(ChainError::Header));
        // a last descriptor of no bytes has no status byte
        let empty_last = [
            (GuestAddress(0x1000), 32, true),
            (GuestAddress(0x2000), 0, true),
        ];
        assert_eq!(parse(&m, 0, &empty_last), Err(ChainError::Short(32)));
        // an address that would wrap
        let wrap = [
            (GuestAddress(0x1000), 16, false),
            (GuestAddress(u64::MAX), 2, true),
        ];
        assert!(parse(&m, 0, &wrap).is_err());
    }

    /// Writes descriptor `i` of the table at `table`.
    fn put(
        m: &GuestMemoryMmap<()>,
        table: u64,
        i: u64,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        m.write_slice(&d, GuestAddress(table + i * 16)).unwrap();
    }

    #[test]
    fn a_chain_taken_again_follows_next_and_one_indirect_table_and_refuses_loops() {
        let m = mem();
        let t = 0x2000;
        let (next, write, indirect) = (1, 2, 4);
        // 0 -> 1 -> 2: header, data, status
        put(&m, t, 0, 0x1000, 16, next, 1);
        put(&m, t, 1, 0x8000, 4096, next, 2);
        put(&m, t, 2, 0x9000, 1, write, 0);
        let got = chain_at(&m, GuestAddress(t), 8, 0).expect("a chain");
        assert_eq!(
            got,
            vec![
                (GuestAddress(0x1000), 16, false),
                (GuestAddress(0x8000), 4096, false),
                (GuestAddress(0x9000), 1, true)
            ]
        );
        // 3 -> 4 -> 3: a loop, cut at the ring's size
        put(&m, t, 3, 0x1000, 16, next, 4);
        put(&m, t, 4, 0x1000, 16, next, 3);
        assert!(chain_at(&m, GuestAddress(t), 8, 3).is_err());
        // 5: an indirect table of three (0x3000), walked as the chain
        put(&m, t, 5, 0x3000, 48, indirect, 0);
        put(&m, 0x3000, 0, 0x1000, 16, next, 1);
        put(&m, 0x3000, 1, 0x8000, 512, next, 2);
        put(&m, 0x3000, 2, 0x9000, 1, write, 0);
        assert_eq!(
            chain_at(&m, GuestAddress(t), 8, 5).expect("indirect").len(),
            3
        );
        // an indirect table claiming more entries than any ring has, looping in its first
        put(&m, t, 6, 0x4000, 65536 * 16, indirect, 0);
        put(&m, 0x4000, 0, 0x1000, 16, next, 0);
        assert!(chain_at(&m, GuestAddress(t), 8, 6).is_err());
        // a head past the ring, a table past guest memory
        assert!(chain_at(&m, GuestAddress(t), 8, 8).is_err());
        assert!(chain_at(&m, GuestAddress(1 << 20), 8, 0).is_err());
    }
}
