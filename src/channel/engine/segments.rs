//! Commands whose data is several segments (a scatter-gather list a front end lends, such as a
//! guest's buffers): each tag's list, and the SRP_CMD's indirect descriptor built from it. Every
//! descriptor goes inline in the IU (SRP's partial table being the whole table: LIO's ib_srpt
//! reads no external table), so a command has as many segments as its send slot and the target's
//! `max_it_iu_len` leave room for, and no more than the transport's send queue was sized for; each
//! segment gets a window of its own in command scope.

use super::{Channel, ChannelConfig, SubmitError, TagState};
use crate::channel::{DataBuf, DataDir, RemoteAccess, ScsiCmd, Transport, TransportError};
use crate::wire::scsi::Cdb;
use crate::wire::srp::{size, DataDesc, DescList, DirectBuf, ScsiLun};

/// The tags' segment lists, and the descriptors of the command being sent.
pub(super) struct Segments {
    lists: Vec<Vec<DataBuf>>,
    descs: Vec<DirectBuf>,
    /// The most segments a command may have.
    max: u16,
}

/// Descriptors an SRP_CMD of `iu_len` bytes has room for inline behind an indirect header (a
/// 16-byte CDB, no additional CDB).
pub(super) fn inline_room(iu_len: usize) -> u16 {
    let room = iu_len.saturating_sub(size::CMD + size::INDIRECT_HDR) / size::DIRECT_DESC;
    room.min(usize::from(u16::MAX)) as u16
}

/// The most segments a command may have on `t`: what fits its send slot and the target's
/// `max_it_iu_len` inline, and what its send queue was sized for.
pub(super) fn max_for<T: Transport>(t: &mut T, cfg: &ChannelConfig) -> u16 {
    let iu_len = t.send_buf(0).len().min(cfg.max_it_iu_len as usize);
    inline_room(iu_len).min(t.max_segments()).max(1)
}

impl Segments {
    pub(super) fn new(depth: u16, max: u16) -> Segments {
        Segments {
            lists: vec![Vec::new(); usize::from(depth)],
            descs: Vec::new(),
            max,
        }
    }

    pub(super) fn max(&self) -> u16 {
        self.max
    }

    /// A new login's limit.
    pub(super) fn set_max(&mut self, max: u16) {
        self.max = max;
    }

    /// Keeps `segs` as tag `tag`'s list; their total length.
    fn set(&mut self, tag: u16, segs: &[DataBuf]) -> Result<u32, SubmitError> {
        if segs.is_empty() || segs.len() > usize::from(self.max) {
            return Err(SubmitError::Segments {
                given: segs.len(),
                max: self.max,
            });
        }
        let total = segs.iter().try_fold(0u32, |t, s| t.checked_add(s.len));
        let total = total.ok_or(SubmitError::Segments {
            given: segs.len(),
            max: self.max,
        })?;
        let list = self
            .lists
            .get_mut(usize::from(tag))
            .ok_or(SubmitError::BadTag(tag))?;
        list.clear();
        list.extend_from_slice(segs);
        Ok(total)
    }

    /// Re-keys tag `tag`'s segments for a new login.
    pub(super) fn rekey(&mut self, tag: u16, rekey: &mut dyn FnMut(u16, DataBuf) -> DataBuf) {
        if let Some(list) = self.lists.get_mut(usize::from(tag)) {
            for s in list.iter_mut() {
                *s = rekey(tag, *s);
            }
        }
    }
}

/// Tag `tag`'s segments as an indirect descriptor (all inline), each opened to the target for
/// `access` ([`Memory::open_window`]). Out of line and cold: a block device's commands have one
/// segment, and the hot path stays as small as it was.
#[cold]
#[inline(never)]
pub(super) fn describe<'s, T: Transport>(
    segs: &'s mut Segments,
    t: &mut T,
    tag: u16,
    access: RemoteAccess,
    total_len: u32,
) -> Result<DataDesc<'s>, TransportError> {
    segs.descs.clear();
    let list = &segs.lists[usize::from(tag)];
    for (i, &s) in list.iter().enumerate() {
        let w = t.open_window(tag, i as u16, s, access)?;
        segs.descs.push(DirectBuf {
            va: w.addr,
            key: w.rkey,
            len: w.len,
        });
    }
    let n = segs.descs.len() as u32;
    Ok(DataDesc::Indirect {
        // every descriptor is inline: the table is not in initiator memory for the target to read
        table: DirectBuf {
            va: 0,
            key: 0,
            len: n * size::DIRECT_DESC as u32,
        },
        total_len,
        inline: DescList::Native(&segs.descs),
    })
}

impl<T: Transport> Channel<T> {
    /// The most segments [`Channel::submit_segments`] takes for one command.
    pub fn max_segments(&self) -> u16 {
        self.segs.max()
    }

    /// Queues `cdb` for logical unit `lun` under `tag` with its data in `segs` (registered memory, in order; data-out
    /// with `out`): one segment goes as a direct descriptor, several as an indirect one. As
    /// [`Channel::submit`] otherwise.
    pub fn submit_segments(
        &mut self,
        tag: u16,
        lun: ScsiLun,
        cdb: Cdb,
        out: bool,
        segs: &[DataBuf],
    ) -> Result<(), SubmitError> {
        if self
            .tags
            .get(usize::from(tag))
            .is_some_and(|e| e.state != TagState::Idle)
        {
            // its list belongs to the command in flight
            return Err(SubmitError::Busy(tag));
        }
        let data = match (segs, out) {
            ([one], false) => DataDir::In(*one),
            ([one], true) => DataDir::Out(*one),
            (_, false) => DataDir::InSegments(self.segs.set(tag, segs)?),
            (_, true) => DataDir::OutSegments(self.segs.set(tag, segs)?),
        };
        self.submit(tag, ScsiCmd { lun, cdb, data })
    }
}
