//! The command send slots of one channel: which are free, which carry a SEND not yet reaped (in
//! posting order), and which SEND is signalled.
//!
//! A command takes any free slot and the slot comes back when its SEND is known to be done. Only
//! one SEND in `every` asks for a completion; the send queue completes in order, so that completion
//! gives back its slot and every slot posted before it. With `every` at most half the slots, the
//! slots never run out without a signalled SEND among the outstanding ones: a command waiting for
//! a slot always gets one.

use std::collections::VecDeque;

pub(super) struct SendSlots {
    /// Slots whose SEND is done (or never used), taken from the end.
    free: Vec<u16>,
    /// The tag each slot last carried.
    tag: Vec<u16>,
    /// Slots whose SEND is posted and not reaped, in posting order.
    sent: VecDeque<u16>,
    /// SENDs posted since the last signalled one.
    unsignalled: u16,
    /// One SEND in this many is signalled.
    every: u16,
}

impl SendSlots {
    /// `n` slots (`0..n`), one SEND in `every` signalled.
    pub(super) fn new(n: u16, every: u16) -> SendSlots {
        SendSlots {
            free: (0..n).rev().collect(),
            tag: vec![0; usize::from(n)],
            sent: VecDeque::with_capacity(usize::from(n)),
            unsignalled: 0,
            every: every.max(1),
        }
    }

    /// Every slot free again (a new transport: no SEND of the old one will complete).
    pub(super) fn reset(&mut self) {
        *self = SendSlots::new(self.tag.len() as u16, self.every);
    }

    /// The slot the next SEND would take, and whether that SEND is to be signalled.
    pub(super) fn next(&self) -> Option<(u16, bool)> {
        let slot = *self.free.last()?;
        Some((slot, self.unsignalled + 1 >= self.every))
    }

    /// The SEND [`SendSlots::next`] named was posted for `tag`.
    pub(super) fn posted(&mut self, tag: u16, signalled: bool) {
        let Some(slot) = self.free.pop() else {
            return;
        };
        self.tag[usize::from(slot)] = tag;
        self.sent.push_back(slot);
        self.unsignalled = if signalled { 0 } else { self.unsignalled + 1 };
    }

    /// Whether a slot is free.
    pub(super) fn any_free(&self) -> bool {
        !self.free.is_empty()
    }

    /// `slot`'s SEND completed (or failed): it and every slot posted before it are free again;
    /// `freed(tag, slot)` is called for each.
    pub(super) fn reap(&mut self, slot: u16, freed: &mut impl FnMut(u16, u16)) {
        if !self.sent.contains(&slot) {
            return; // not outstanding: nothing it can vouch for
        }
        while let Some(s) = self.sent.pop_front() {
            freed(self.tag[usize::from(s)], s);
            self.free.push(s);
            if s == slot {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signalled_completion_frees_what_was_posted_before_it_only() {
        let mut s = SendSlots::new(8, 4);
        let mut posted = Vec::new();
        for tag in 0..6u16 {
            let (slot, signal) = s.next().unwrap();
            assert_eq!(signal, tag == 3, "the fourth SEND is signalled");
            s.posted(tag, signal);
            posted.push(slot);
        }
        let mut freed = Vec::new();
        s.reap(posted[3], &mut |tag, slot| freed.push((tag, slot)));
        let want: Vec<(u16, u16)> = (0..4).map(|t| (t, posted[usize::from(t)])).collect();
        assert_eq!(freed, want);
        // a completion for a slot not outstanding (already reaped) frees nothing
        s.reap(posted[1], &mut |_, _| panic!("freed twice"));
        // 2 still outstanding, 6 free
        let mut n = 0;
        while s.next().is_some() {
            let (_, signal) = s.next().unwrap();
            s.posted(9, signal);
            n += 1;
        }
        assert_eq!(n, 6);
        assert!(!s.any_free());
        s.reset();
        assert_eq!(s.next(), Some((0, false)));
    }
}
