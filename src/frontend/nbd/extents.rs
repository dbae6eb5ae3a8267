//! base:allocation extents from GET LBA STATUS: what NBD_CMD_BLOCK_STATUS answers on a thin LUN.
//! Only what the target described of the requested range, in order from its first block, is
//! reported (a client asks again for the rest); an answer that does not describe the first block
//! gives one data extent. A hole is never guessed: a client skips what it is told is a hole.

use crate::channel::block::Geometry;
use crate::wire::nbd::state;
use crate::wire::scsi::data::{lba_status, LbaProvisioning};

/// The extents of the `len` bytes at `off` (both block aligned) from GET LBA STATUS parameter
/// `data` (what the target transferred), as (length, [`state`] flags): in order, adjacent ones
/// of one kind merged, at least one, only the first when `one` (NBD_CMD_FLAG_REQ_ONE).
pub(super) fn allocation(
    data: &[u8],
    off: u64,
    len: u32,
    geo: &Geometry,
    one: bool,
) -> Vec<(u32, u32)> {
    let shift = geo.block_shift;
    let end = (off + u64::from(len)) >> shift;
    let mut at = off >> shift;
    let mut out: Vec<(u32, u32)> = Vec::new();
    let unmapped = state::HOLE | if geo.lbprz { state::ZERO } else { 0 };
    for d in lba_status(data).into_iter().flatten() {
        let d_end = d.lba.saturating_add(u64::from(d.blocks));
        // the first descriptor holds the first block; each next one starts where it ended
        let in_order = if out.is_empty() {
            d.lba <= at
        } else {
            d.lba == at
        };
        if !in_order || d_end <= at {
            break;
        }
        let upto = d_end.min(end);
        let bytes = ((upto - at) << shift) as u32;
        let flags = match d.status {
            LbaProvisioning::Mapped => 0,
            LbaProvisioning::Deallocated | LbaProvisioning::Anchored => unmapped,
        };
        match out.last_mut() {
            Some((n, f)) if *f == flags => *n += bytes,
            _ => out.push((bytes, flags)),
        }
        at = upto;
        if at == end {
            break;
        }
    }
    if out.is_empty() {
        out.push((len, 0));
    }
    if one {
        out.truncate(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::block::tests::GEO;
    const DATA: u32 = 0;
    const HOLE: u32 = state::HOLE | state::ZERO;

    /// GET LBA STATUS data with descriptors (lba, blocks, status).
    fn answer(descs: &[(u64, u32, u8)]) -> Vec<u8> {
        let mut b = (4 + 16 * descs.len() as u32).to_be_bytes().to_vec();
        b.extend_from_slice(&[0; 4]);
        for &(lba, n, st) in descs {
            b.extend_from_slice(&lba.to_be_bytes());
            b.extend_from_slice(&n.to_be_bytes());
            b.extend_from_slice(&[st, 0, 0, 0]);
        }
        b
    }

    #[test]
    fn mapped_and_deallocated_runs_become_data_and_holes_clipped_to_the_request() {
        // the first descriptor starts before the request, the last runs past it
        let a = answer(&[(0, 16, 0), (16, 8, 1), (24, 8, 2), (32, 100, 0)]);
        let e = allocation(&a, 8 * 512, 32 * 512, &GEO, false);
        assert_eq!(e, [(8 * 512, DATA), (16 * 512, HOLE), (8 * 512, DATA)]);
        assert_eq!(e.iter().map(|x| x.0).sum::<u32>(), 32 * 512);
        assert_eq!(
            allocation(&a, 8 * 512, 32 * 512, &GEO, true),
            [(8 * 512, DATA)]
        );
        // without LBPRZ a deallocated block is a hole that need not read as zeros
        let no_rz = Geometry {
            lbprz: false,
            ..GEO
        };
        let a = answer(&[(16, 8, 1)]);
        assert_eq!(
            allocation(&a, 16 * 512, 8 * 512, &no_rz, false),
            [(8 * 512, state::HOLE)]
        );
    }

    #[test]
    fn an_answer_that_skips_or_goes_back_is_cut_where_it_stops_describing_the_range() {
        // a gap after the first run: only the first run is reported
        let a = answer(&[(0, 8, 1), (12, 8, 0)]);
        assert_eq!(allocation(&a, 0, 64 * 512, &GEO, false), [(8 * 512, HOLE)]);
        // one going back over the first is not believed either
        let a = answer(&[(0, 8, 1), (4, 8, 0)]);
        assert_eq!(allocation(&a, 0, 64 * 512, &GEO, false), [(8 * 512, HOLE)]);
    }

    #[test]
    fn an_answer_that_misses_the_first_block_is_all_data() {
        for a in [
            answer(&[(8, 8, 1)]), // starts after the first block
            answer(&[(0, 4, 1)]), // ends before it
            answer(&[(0, 0, 1)]), // empty
            answer(&[]),          // nothing
            vec![0, 0, 0, 20, 0], // shorter than its header
        ] {
            assert_eq!(allocation(&a, 4 * 512, 4096, &GEO, false), [(4096, DATA)]);
        }
    }
}
