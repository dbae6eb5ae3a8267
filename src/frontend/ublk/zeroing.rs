//! A ublk WRITE_ZEROES on its tag: one WRITE SAME where the LUN has it, else zeros written one
//! buffer at a time (`max_io`, what the device's buffers hold). A LUN that refuses a WRITE SAME
//! its pages announced gets the rest of the request, from the refused command on, as zero writes:
//! the device honours the max_write_zeroes_sectors it advertised either way.

use crate::channel::block::BlockOp;
use crate::channel::CmdOutcome;

/// A WRITE_ZEROES in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Zeroing {
    /// Where the command out now starts, and its length.
    cur: u64,
    part: u32,
    /// The request's end (bytes).
    end: u64,
    may_unmap: bool,
    /// Zeros are written (the LUN has no WRITE SAME, or refused it).
    by_write: bool,
}

impl Zeroing {
    /// A WRITE_ZEROES of `len` bytes at `off`; `write_same` as the queue's geometry says.
    pub(super) fn new(off: u64, len: u32, may_unmap: bool, write_same: bool) -> Zeroing {
        Zeroing {
            cur: off,
            part: 0,
            end: off + u64::from(len),
            may_unmap,
            by_write: !write_same,
        }
    }

    /// Whether zeros are written (the queue stops sending WRITE SAME once one was refused).
    pub(super) fn by_write(&self) -> bool {
        self.by_write
    }

    /// The command to send now: (operation, offset, length).
    pub(super) fn command(&mut self, max_io: u32) -> (BlockOp, u64, u32) {
        let left = self.end - self.cur;
        if self.by_write {
            self.part = left.min(u64::from(max_io.max(1))) as u32;
            return (BlockOp::ZeroWrite, self.cur, self.part);
        }
        self.part = left as u32;
        let op = BlockOp::WriteZeroes {
            may_unmap: self.may_unmap,
        };
        (op, self.cur, self.part)
    }

    /// The command out finished with `o`: `Some(errno)` when the request is done (0: zeroed),
    /// `None` when another command follows ([`Zeroing::command`]).
    pub(super) fn finished(&mut self, o: &CmdOutcome) -> Option<i32> {
        match (o.errno, self.by_write) {
            (libc::EOPNOTSUPP, false) => {
                self.by_write = true;
                None
            }
            // zeros not all written: the request must not read as done
            (0, true) if o.resid != 0 => Some(libc::EIO),
            (0, true) => {
                self.cur += u64::from(self.part);
                (self.cur >= self.end).then_some(0)
            }
            (e, _) => Some(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(errno: i32) -> CmdOutcome {
        crate::channel::Done::failed(0, errno).outcome
    }

    fn ok() -> CmdOutcome {
        ended(0)
    }

    #[test]
    fn write_same_is_one_command() {
        let mut z = Zeroing::new(4096, 64 << 20, true, true);
        let c = z.command(1 << 20);
        assert_eq!(
            c,
            (BlockOp::WriteZeroes { may_unmap: true }, 4096, 64 << 20)
        );
        assert_eq!(z.finished(&ok()), Some(0));
        let mut z = Zeroing::new(0, 4096, false, true);
        z.command(1 << 20);
        assert_eq!(z.finished(&ended(libc::EIO)), Some(libc::EIO));
    }

    #[test]
    fn without_write_same_zeros_are_written_a_buffer_at_a_time() {
        let mut z = Zeroing::new(0, (2 << 20) + 4096, true, false);
        assert_eq!(z.command(1 << 20), (BlockOp::ZeroWrite, 0, 1 << 20));
        assert_eq!(z.finished(&ok()), None);
        assert_eq!(z.command(1 << 20), (BlockOp::ZeroWrite, 1 << 20, 1 << 20));
        assert_eq!(z.finished(&ok()), None);
        assert_eq!(z.command(1 << 20), (BlockOp::ZeroWrite, 2 << 20, 4096));
        assert_eq!(z.finished(&ok()), Some(0));
    }

    #[test]
    fn a_refused_write_same_goes_on_as_zero_writes_and_a_short_one_fails() {
        let mut z = Zeroing::new(8192, 3 << 20, true, true);
        z.command(1 << 20);
        assert_eq!(z.finished(&ended(libc::EOPNOTSUPP)), None);
        assert!(z.by_write());
        assert_eq!(z.command(1 << 20), (BlockOp::ZeroWrite, 8192, 1 << 20));
        let mut short = ok();
        short.resid = 512;
        assert_eq!(z.finished(&short), Some(libc::EIO));
        // once zeros are written, a refusal is the request's error
        let mut z = Zeroing::new(0, 4096, true, false);
        z.command(1 << 20);
        let refused = ended(libc::EOPNOTSUPP);
        assert_eq!(z.finished(&refused), Some(libc::EOPNOTSUPP));
    }
}
