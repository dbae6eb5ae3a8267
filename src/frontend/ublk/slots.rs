//! A queue's slot map: which device's ublk tag each of its path's tags (its slots) serves.
//!
//! ublk numbers a queue's requests per device (tags 0..depth of that device's queue); the path a
//! queue thread owns numbers its commands in one space of its own. A thread that serves queue q
//! of several devices over one channel gives each device a range of the path's tags as large as
//! the device's depth: slot = the device's base + its tag, so every request of every device has
//! a slot for its whole life and no lookup table changes on the I/O path. The path's depth is the
//! sum of the devices' depths.

use crate::ublk::Dev;

/// The slots of one queue thread's path, device by device.
#[derive(Debug, Default)]
pub(super) struct SlotMap {
    /// Each device's range of slots, by the ring's device index: (device, first slot, depth).
    ranges: Vec<Option<(Dev, u16, u16)>>,
    /// The device range each slot belongs to (an index into `ranges`).
    owner: Vec<u16>,
}

/// The path's tag space cannot hold another device's depth.
#[derive(Debug, thiserror::Error)]
#[error("a queue serves at most {max} requests at once: {have} taken, {asked} more asked for")]
pub(super) struct SlotsFull {
    max: usize,
    have: usize,
    asked: u16,
}

/// The most slots a path has: its tags are 16 bits.
const MAX_SLOTS: usize = u16::MAX as usize;

/// `have` slots taken and `asked` more: the slots taken then, if a path holds them.
fn grow(have: usize, asked: u16) -> Result<usize, SlotsFull> {
    let now = have + usize::from(asked);
    if now > MAX_SLOTS {
        return Err(SlotsFull {
            max: MAX_SLOTS,
            have,
            asked,
        });
    }
    Ok(now)
}

/// The slots devices of these depths take together (the path's depth), if a path holds them.
pub(super) fn total(mut depths: impl Iterator<Item = u16>) -> Result<u16, SlotsFull> {
    let have = depths.try_fold(0, grow)?;
    Ok(have as u16)
}

impl SlotMap {
    /// Gives device `dev` (a queue of `depth` tags) the next `depth` slots; returns the first.
    pub(super) fn add(&mut self, dev: Dev, depth: u16) -> Result<u16, SlotsFull> {
        let have = self.owner.len();
        grow(have, depth)?;
        let base = have as u16;
        let idx = dev.index();
        if self.ranges.len() <= idx {
            self.ranges.resize(idx + 1, None);
        }
        self.ranges[idx] = Some((dev, base, depth));
        self.owner
            .extend(std::iter::repeat_n(idx as u16, usize::from(depth)));
        Ok(base)
    }

    /// How many slots the devices take together: the path's depth.
    pub(super) fn len(&self) -> u16 {
        self.owner.len() as u16
    }

    /// The slot of `dev`'s tag `tag`, if the map has that device and the tag is in its depth.
    pub(super) fn slot(&self, dev: Dev, tag: u16) -> Option<u16> {
        let (_, base, depth) = (*self.ranges.get(dev.index())?)?;
        (tag < depth).then_some(base + tag)
    }

    /// The device and tag slot `slot` serves.
    pub(super) fn tag(&self, slot: u16) -> Option<(Dev, u16)> {
        let idx = *self.owner.get(usize::from(slot))?;
        let (dev, base, _) = self.ranges[usize::from(idx)]?;
        Some((dev, slot - base))
    }

    /// Takes device `dev` out: its slots serve nothing from now on (they are not given to
    /// another device).
    pub(super) fn remove(&mut self, dev: Dev) {
        if let Some(r) = self.ranges.get_mut(dev.index()) {
            *r = None;
        }
    }

    /// Every device and its first slot and depth.
    pub(super) fn devices(&self) -> impl Iterator<Item = (Dev, u16, u16)> + '_ {
        self.ranges.iter().flatten().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_get_consecutive_ranges_and_map_both_ways() {
        let (a, b) = (Dev::from_index(0), Dev::from_index(1));
        let mut map = SlotMap::default();
        assert_eq!(map.add(a, 4).unwrap(), 0);
        assert_eq!(map.add(b, 2).unwrap(), 4);
        assert_eq!(map.len(), 6);
        assert_eq!(map.slot(a, 3), Some(3));
        assert_eq!(map.slot(b, 0), Some(4));
        assert_eq!(map.slot(b, 1), Some(5));
        assert_eq!(map.tag(5), Some((b, 1)));
        assert_eq!(map.tag(0), Some((a, 0)));
        for slot in 0..map.len() {
            let (dev, tag) = map.tag(slot).unwrap();
            assert_eq!(map.slot(dev, tag), Some(slot));
        }
        let all: Vec<_> = map.devices().collect();
        assert_eq!(all, vec![(a, 0, 4), (b, 4, 2)]);
    }

    #[test]
    fn out_of_range_is_none_not_another_devices_slot() {
        let (a, b, c) = (Dev::from_index(0), Dev::from_index(1), Dev::from_index(2));
        let mut map = SlotMap::default();
        map.add(a, 4).unwrap();
        map.add(b, 2).unwrap();
        // a tag past a's depth is not b's first slot
        assert_eq!(map.slot(a, 4), None);
        assert_eq!(map.slot(b, 2), None);
        assert_eq!(map.slot(c, 0), None);
        assert_eq!(map.tag(6), None);
        assert_eq!(map.tag(u16::MAX), None);
    }

    #[test]
    fn the_tag_space_is_bounded() {
        let mut map = SlotMap::default();
        for i in 0..15 {
            map.add(Dev::from_index(i), 4096).unwrap();
        }
        let err = map.add(Dev::from_index(15), 4096).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a queue serves at most 65535 requests at once: 61440 taken, 4096 more asked for"
        );
        assert_eq!(map.len(), 61440);
    }

    #[test]
    fn depths_together_fit_the_path_or_say_what_does_not() {
        assert_eq!(total([64, 64, 128].into_iter()).expect("fits"), 256);
        assert_eq!(total(std::iter::empty()).expect("none"), 0);
        let e = total([u16::MAX, 1].into_iter()).expect_err("one too many");
        assert_eq!((e.have, e.asked), (usize::from(u16::MAX), 1));
        assert!(
            e.to_string().contains("65535 taken, 1 more asked for"),
            "{e}"
        );
    }
}
