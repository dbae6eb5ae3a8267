//! READ and WRITE requests larger than one command (up to [`MAX_REQUEST`]): carried out as
//! several commands of at most the export's `max_io`, each on a tag of its own, and answered once
//! every part is done. A write's payload is received into the request's own buffer as it arrives
//! and each part goes out as soon as its bytes are in; a read's parts are gathered there and sent
//! in one reply. An error in any part fails the whole request, and a failed read sends no data.
//! A FUA write's parts each follow the write-cache rule ([`super::step`]), so every part is
//! durable before the reply.

use super::{error_reply, read_reply_header, step, Conn, TagReq};
use crate::channel::block::BlockOp;
use crate::path::Connect;
use crate::wire::nbd::{self, cmd, cmdflag, err, Request};

/// The largest READ or WRITE served: what qemu-nbd and nbdkit accept, and the largest request the
/// kernel's nbd client sends (it ignores the advertised maximum). Larger: EOVERFLOW on a
/// structured connection, EINVAL otherwise, as the protocol says.
pub const MAX_REQUEST: u32 = 32 << 20;

/// Bytes of split requests one connection holds at once; a request past it waits for one to end
/// (a single one is always taken).
const SPLIT_BUDGET: usize = 2 * MAX_REQUEST as usize;

/// One request carried out in parts.
pub(super) struct Split {
    cookie: u64,
    read: bool,
    fua: bool,
    off: u64,
    /// The whole request's data.
    data: Vec<u8>,
    /// Payload bytes received so far (a read: all of them).
    arrived: usize,
    /// Bytes handed to commands so far.
    issued: usize,
    /// Parts in flight.
    out: u16,
    /// The first failed part's NBD error.
    err: Option<u32>,
}

/// A connection's split requests.
#[derive(Default)]
pub(super) struct Splits {
    slots: Vec<Option<Split>>,
    /// Their bytes, against [`SPLIT_BUDGET`].
    bytes: usize,
    /// The write whose payload is still arriving: the stream holds nothing else until it is in.
    receiving: Option<u16>,
}

impl Splits {
    /// Whether a write's payload is still arriving.
    pub(super) fn receiving(&self) -> bool {
        self.receiving.is_some()
    }
}

impl<C: Connect> Conn<'_, C> {
    /// Takes `req` (a READ or WRITE longer than one command) as a split request; false when the
    /// budget is spent (it waits in the stream for one to end).
    pub(super) fn open_split(&mut self, req: &Request) -> bool {
        let len = req.length as usize;
        let sp = &mut self.splits;
        if sp.bytes > 0 && sp.bytes + len > SPLIT_BUDGET {
            return false;
        }
        let read = req.kind == cmd::READ;
        let split = Split {
            cookie: req.cookie,
            read,
            fua: req.flags & cmdflag::FUA != 0,
            off: req.offset,
            data: vec![0u8; len],
            arrived: if read { len } else { 0 },
            issued: 0,
            out: 0,
            err: None,
        };
        let i = match sp.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                sp.slots.push(None);
                sp.slots.len() - 1
            }
        };
        sp.slots[i] = Some(split);
        sp.bytes += len;
        if !read {
            sp.receiving = Some(i as u16);
        }
        true
    }

    /// Moves what the read buffer holds of the arriving write's payload into its request; true
    /// while more is to come.
    pub(super) fn receive(&mut self) -> bool {
        let Some(i) = self.splits.receiving else {
            return false;
        };
        let Some(s) = self.splits.slots[usize::from(i)].as_mut() else {
            self.splits.receiving = None;
            return false;
        };
        let n = (s.data.len() - s.arrived).min(self.rlen - self.rpos);
        s.data[s.arrived..s.arrived + n].copy_from_slice(&self.rbuf[self.rpos..self.rpos + n]);
        s.arrived += n;
        self.rpos += n;
        if s.arrived < s.data.len() {
            return true;
        }
        self.splits.receiving = None;
        // a write whose parts all failed early is answered once its payload is in
        self.finish_split(i);
        false
    }

    /// Sends every part that is ready (a write's once its bytes are in), as far as tags are free.
    pub(super) fn issue_parts(&mut self) -> bool {
        let mut progress = false;
        for i in 0..self.splits.slots.len() {
            while let Some((at, len)) = self.next_part(i) {
                let Some(tag) = self.free.pop() else {
                    return progress;
                };
                self.send_part(i as u16, tag, at, len);
                progress = true;
            }
        }
        progress
    }

    /// The next part of split `i` that can go: (offset in the request, length).
    fn next_part(&self, i: usize) -> Option<(usize, usize)> {
        let s = self.splits.slots[i].as_ref()?;
        let max = self.ex.max_io as usize;
        let ready = s.arrived - s.issued;
        let whole = ready >= max || s.arrived == s.data.len();
        (s.err.is_none() && ready > 0 && whole).then_some((s.issued, ready.min(max)))
    }

    fn send_part(&mut self, i: u16, tag: u16, at: usize, len: usize) {
        let Some(s) = self.splits.slots[usize::from(i)].as_mut() else {
            return;
        };
        s.issued += len;
        s.out += 1;
        let op = if s.read {
            BlockOp::Read
        } else {
            self.exec.buf(tag)[..len].copy_from_slice(&s.data[at..at + len]);
            BlockOp::Write { fua: s.fua }
        };
        let off = s.off + at as u64;
        let (op, now, next) = step(self.ex, op, off, len as u64, s.fua);
        self.tags[usize::from(tag)] = TagReq {
            cookie: s.cookie,
            read: s.read,
            off,
            len: now,
            next,
            split: Some((i, at as u32)),
            ..TagReq::default()
        };
        if let Err(e) = self.exec.submit(tag, op, off, now) {
            self.part_done(tag, Err(e));
            self.free.push(tag);
        }
    }

    /// A part finished (the tag is freed by the caller after this): a read's data is kept, an
    /// error noted, and the request answered once it was its last.
    pub(super) fn part_done(&mut self, tag: u16, r: Result<(), i32>) {
        let t = self.tags[usize::from(tag)];
        let Some((i, at)) = t.split else {
            return;
        };
        let Some(s) = self.splits.slots[usize::from(i)].as_mut() else {
            return;
        };
        s.out -= 1;
        match r {
            Ok(()) if s.read => {
                let (at, len) = (at as usize, t.len as usize);
                s.data[at..at + len].copy_from_slice(&self.exec.buf(tag)[..len]);
            }
            Ok(()) => {}
            Err(e) => {
                s.err.get_or_insert(err::from_errno(e));
            }
        }
        self.finish_split(i);
    }

    /// Answers split `i` if nothing of it is left to come: its data (a read), or its first error.
    fn finish_split(&mut self, i: u16) {
        let slot = &mut self.splits.slots[usize::from(i)];
        let done = slot.as_ref().is_some_and(|s| {
            s.out == 0 && s.arrived == s.data.len() && (s.issued == s.data.len() || s.err.is_some())
        });
        if !done {
            return;
        }
        let Some(s) = slot.take() else { return };
        self.splits.bytes -= s.data.len();
        match s.err {
            Some(e) => error_reply(&mut self.out, self.neg, s.read, e, s.cookie),
            None if s.read => {
                read_reply_header(
                    &mut self.out,
                    self.neg,
                    s.cookie,
                    s.off,
                    s.data.len() as u32,
                );
                self.out.extend_from_slice(&s.data);
            }
            None => self.out.extend_from_slice(&nbd::simple_reply(0, s.cookie)),
        }
    }
}

/// The refusal of a READ or WRITE longer than [`MAX_REQUEST`].
pub(super) fn too_large(structured: bool) -> u32 {
    if structured {
        err::EOVERFLOW
    } else {
        err::EINVAL
    }
}
