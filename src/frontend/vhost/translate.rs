//! A request's data, as guest-physical ranges, turned into segments of the guest memory lent to
//! the path: what an SRP_CMD's data descriptors point at. Every byte of a segment is a byte of one
//! of the request's ranges, inside one lent descriptor and with its keys; a range the lent memory
//! does not hold whole gives no segments at all (the request is then copied).

use super::request::Range;
use crate::channel::DataBuf;
use vm_memory::{
    Address, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    MemoryRegionAddress,
};

/// Fills `out` with `data` as segments of the lent descriptors `lent` (at most `max`, in order);
/// false (and `out` empty) when a range lies outside guest memory or the loan, or needs more.
pub(super) fn segments(
    mem: &GuestMemoryMmap<()>,
    lent: &[DataBuf],
    data: &[Range],
    max: usize,
    out: &mut Vec<DataBuf>,
) -> bool {
    out.clear();
    for d in data {
        let (mut addr, mut left) = (d.addr, u64::from(d.len));
        while left > 0 {
            let seg = match host_segment(mem, lent, addr, left) {
                Some(seg) if out.len() < max => seg,
                _ => {
                    out.clear();
                    return false;
                }
            };
            out.push(seg);
            left -= u64::from(seg.len);
            match addr.checked_add(u64::from(seg.len)) {
                Some(next) => addr = next,
                None if left == 0 => {}
                None => {
                    out.clear();
                    return false;
                }
            }
        }
    }
    true
}

/// `addr..addr+left` of guest memory as one segment: from `addr` to the first of the range's end,
/// its memory region's end and its lent descriptor's end, with that descriptor's keys; None when
/// `addr` is outside guest memory or the loan.
fn host_segment(
    mem: &GuestMemoryMmap<()>,
    lent: &[DataBuf],
    addr: GuestAddress,
    left: u64,
) -> Option<DataBuf> {
    let region = mem.find_region(addr)?;
    let off = addr.0.checked_sub(region.start_addr().0)?;
    let in_region = region.len().checked_sub(off)?;
    let host = region.get_host_address(MemoryRegionAddress(off)).ok()? as u64;
    let d = lent
        .iter()
        .find(|d| host >= d.addr && host - d.addr < u64::from(d.len))?;
    let in_desc = u64::from(d.len) - (host - d.addr);
    let n = left.min(in_region).min(in_desc);
    Some(DataBuf {
        addr: host,
        len: u32::try_from(n).ok()?,
        ..*d
    })
}

/// Guest memory of two 64 KiB regions with a gap between them, and a loan of the first region (as
/// two descriptors) and the first half of the second: what the tests and the fuzz target translate
/// against.
#[cfg(any(test, feature = "test-utils"))]
fn small_guest() -> (GuestMemoryMmap<()>, Vec<DataBuf>) {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[
        (GuestAddress(0), 0x10000),
        (GuestAddress(0x20000), 0x10000),
    ])
    .expect("two small regions");
    let host = |g: u64| mem.get_host_address(GuestAddress(g)).expect("in memory") as u64;
    let lent = [(0, 1), (0x8000, 2), (0x20000, 3)]
        .map(|(g, k)| DataBuf {
            addr: host(g),
            len: 0x8000,
            lkey: k,
            rkey: 10 + k,
        })
        .to_vec();
    (mem, lent)
}

/// The fuzz target `vhost_chain_at`: a descriptor table from `input` in guest memory (at a place
/// `input` picks: inside a region, across its end, in the gap), walked from the head and for the
/// ring size `input` names, as a request taken again from the inflight region is. Panics when the
/// walk returns more descriptors than its tables hold.
#[cfg(feature = "test-utils")]
pub fn fuzz_chain_at(input: &[u8]) {
    use vm_memory::Bytes;
    let (mem, _) = small_guest();
    let [pick, head, size_lo, size_hi, table @ ..] = input else {
        return;
    };
    let at = match pick % 4 {
        0 => 0x1000,
        1 => 0x10000 - 0x40,
        2 => 0x18000,
        _ => 0x20000 + u64::from(*pick) * 16,
    };
    let table = &table[..table.len().min(0x4000)];
    // what does not fit where the table goes is left out (a table across a region's end)
    let _ = mem.write_slice(table, GuestAddress(at));
    let size = u16::from_le_bytes([*size_lo, *size_hi]);
    let head = u16::from(*head) % size.max(1);
    if let Ok(descs) = super::request::chain_at(&mem, GuestAddress(at), size, head) {
        assert!(!descs.is_empty());
        assert!(
            descs.len() <= usize::from(u16::MAX),
            "{} descriptors",
            descs.len()
        );
    }
}

/// The fuzz target `vhost_chain`: a guest's descriptor chain from `input` (up to 16 descriptors
/// over two memory regions with a gap between them, addresses and lengths running off them)
/// parsed into a request and translated to segments of a loan that holds the first region and
/// half the second. Panics when a segment holds a byte outside the request's ranges or the loan,
/// or the segments do not add up to the request.
#[cfg(feature = "test-utils")]
pub fn fuzz_chain(input: &[u8]) {
    use vm_memory::Bytes;
    let (mem, lent) = small_guest();
    let Some((&m, rest)) = input.split_first() else {
        return;
    };
    let max = 1 + usize::from(m % 32);
    let (header, rest) = rest.split_at(rest.len().min(16));
    mem.write_slice(header, GuestAddress(0x1000))
        .expect("in memory");
    let descs: Vec<(GuestAddress, u32, bool)> = rest
        .chunks_exact(7)
        .take(16)
        .map(|c| {
            let a = u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            let l = u32::from(u16::from_le_bytes([c[4], c[5]]));
            let f = c[6];
            let addr = match f >> 4 {
                0 => u64::MAX - a,
                1 => a,
                _ => a % 0x40000,
            };
            let len = if f & 2 != 0 { l << 4 } else { l };
            (GuestAddress(addr), len, f & 1 != 0)
        })
        .collect();
    if descs.is_empty() {
        return;
    }
    let Ok(req) = super::request::parse(&mem, 0, &descs) else {
        return;
    };
    let total: u64 = descs.iter().map(|d| u64::from(d.1)).sum();
    assert!(req.data.iter().all(|r| r.len > 0) && req.len() + 17 <= total);
    let mut out = Vec::new();
    if !segments(&mem, &lent, &req.data, max, &mut out) {
        assert!(out.is_empty());
        return;
    }
    assert!(out.len() <= max);
    assert_eq!(out.iter().map(|s| u64::from(s.len)).sum::<u64>(), req.len());
    // the segments walk the ranges in order, each inside one lent descriptor with its keys
    let mut segs = out.iter();
    for r in &req.data {
        let (mut at, mut left) = (r.addr, u64::from(r.len));
        while left > 0 {
            let s = segs.next().expect("a segment for every byte");
            let end = s.addr + u64::from(s.len);
            assert!(lent.iter().any(|d| {
                d.addr <= s.addr
                    && end <= d.addr + u64::from(d.len)
                    && (d.lkey, d.rkey) == (s.lkey, s.rkey)
            }));
            assert_eq!(
                Some(s.addr),
                mem.get_host_address(at).ok().map(|p| p as u64)
            );
            assert!(mem.get_slice(at, s.len as usize).is_ok());
            left -= u64::from(s.len);
            at = at.unchecked_add(u64::from(s.len));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(addr: u64, len: u32) -> Range {
        Range {
            addr: GuestAddress(addr),
            len,
        }
    }

    #[test]
    fn a_range_across_two_descriptors_is_two_segments() {
        let (mem, lent) = small_guest();
        let mut out = Vec::new();
        assert!(segments(&mem, &lent, &[range(0x7000, 0x2000)], 4, &mut out));
        let keys: Vec<_> = out.iter().map(|s| (s.len, s.rkey)).collect();
        assert_eq!(keys, [(0x1000, 11), (0x1000, 12)]);
        assert_eq!(out[1].addr, lent[1].addr);
    }

    #[test]
    fn memory_outside_the_loan_or_the_guest_is_never_a_segment() {
        let (mem, lent) = small_guest();
        let mut out = Vec::new();
        // in guest memory but not lent
        assert!(!segments(
            &mem,
            &lent,
            &[range(0x29000, 0x1000)],
            4,
            &mut out
        ));
        // partly lent: lent to 0x28000
        assert!(!segments(
            &mem,
            &lent,
            &[range(0x27000, 0x2000)],
            4,
            &mut out
        ));
        // in the gap between regions, and running off the first region's end
        assert!(!segments(
            &mem,
            &lent,
            &[range(0x18000, 0x100)],
            4,
            &mut out
        ));
        assert!(!segments(
            &mem,
            &lent,
            &[range(0xf000, 0x2000)],
            4,
            &mut out
        ));
        assert!(out.is_empty());
        // more segments than a command carries
        let many: Vec<_> = (0..5).map(|i| range(i * 0x1000, 0x200)).collect();
        assert!(!segments(&mem, &lent, &many, 4, &mut out));
        assert!(segments(&mem, &lent, &many[..4], 4, &mut out));
        assert_eq!(out.len(), 4);
    }
}
