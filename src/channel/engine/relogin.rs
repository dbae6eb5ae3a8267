//! A channel going down and coming back: holding, the new login's hand-over, re-issue within the
//! [`ReissueLimit`], failing what is held, and synchronous commands for setup.

use super::*;

impl<T: Transport> Channel<T> {
    /// Takes the channel down from outside (the queue saw no completion for too long): the caller
    /// then treats it as any other failure (stop, hold, reconnect, re-issue).
    pub fn declare_down(&mut self, reason: DownReason) {
        self.set_down(reason);
    }

    /// While down, hold new commands for a reconnect (`true`) or refuse them (`false`, the default;
    /// also what fast_io_fail switches to).
    pub fn set_hold(&mut self, hold: bool) {
        self.hold = hold;
    }

    /// Puts the channel on a new, logged-in transport after it went down, and returns the old one
    /// for the caller to drop. Every command that had not completed is kept, in the order it was
    /// first sent, to be sent again by [`Channel::resume`]: what the old channel did with it is
    /// unknown, and reads and writes of the same data are safe to repeat. `req_lim` and `max_imm`
    /// are the new login's; `rekey` gives each kept command's data buffer its registration on the new
    /// transport (tag, old descriptor) -> new descriptor.
    ///
    /// The old transport must be closed (no RDMA into the buffers, no completions) before `resume`.
    pub fn reconnect(
        &mut self,
        mut t: T,
        req_lim: i32,
        max_imm: u32,
        rekey: &mut dyn FnMut(u16, DataBuf) -> DataBuf,
    ) -> T {
        let mut order: Vec<u16> = (0..self.cfg.depth)
            .filter(|&t| self.tags[usize::from(t)].state == TagState::InFlight)
            .collect();
        order.extend(self.waiting.drain(..));
        order.extend(
            (0..self.cfg.depth)
                .filter(|&t| matches!(self.tags[usize::from(t)].state, TagState::Delayed { .. })),
        );
        // in the order they were submitted: a write and a read of the same blocks keep theirs
        order.sort_by_key(|&t| self.tags[usize::from(t)].seq);
        for &tag in &order {
            self.set_state(tag, TagState::Waiting);
            let e = &mut self.tags[usize::from(tag)];
            e.reissued = e.reissued.saturating_add(1);
            e.cmd.data = match e.cmd.data {
                DataDir::None => DataDir::None,
                DataDir::In(b) => DataDir::In(rekey(tag, b)),
                DataDir::Out(b) => DataDir::Out(rekey(tag, b)),
                d @ (DataDir::InSegments(_) | DataDir::OutSegments(_)) => {
                    self.segs.rekey(tag, rekey);
                    d
                }
            };
        }
        self.waiting.extend(order);
        // a new transport: every slot is free, no SEND of the old one will complete
        self.slots.reset();
        self.lone = None;
        for e in &mut self.tags {
            e.slot = None;
        }
        self.extra_free = (self.cfg.cmd_slots()..self.cfg.send_slots())
            .rev()
            .collect();
        self.small_pending.clear();
        self.tmf = None;
        self.last_wc = self.now;
        self.req_lim = req_lim;
        self.cfg.req_lim = req_lim;
        self.cfg.max_imm = max_imm;
        self.segs
            .set_max(super::segments::max_for(&mut t, &self.cfg));
        self.down = None;
        std::mem::replace(&mut self.t, t)
    }

    /// Sends what [`Channel::reconnect`] kept, as credits allow, after failing with EIO each kept
    /// command past `limit` at `now_ms` (re-issued too often, or first held too long ago); returns
    /// how many were failed.
    pub fn resume(
        &mut self,
        now_ms: u64,
        limit: ReissueLimit,
        done: &mut dyn FnMut(Done),
    ) -> usize {
        self.now = now_ms;
        let over = |e: &TagEntry| {
            e.reissued > limit.max_reissues
                || limit
                    .max_held_ms
                    .zip(e.held_since)
                    .is_some_and(|(max, since)| now_ms.saturating_sub(since) >= max)
        };
        let (failed, kept): (Vec<u16>, Vec<u16>) = self
            .waiting
            .drain(..)
            .partition(|&t| over(&self.tags[usize::from(t)]));
        self.waiting.extend(kept);
        for &tag in &failed {
            self.complete(tag, CmdOutcome::failed(errno::EIO), done);
        }
        if !failed.is_empty() {
            tracing::warn!(
                "{} command(s) failed with EIO instead of being re-issued again: re-issued more \
                 than {} times, or first held {} ago or more (fast_io_fail_tmo)",
                failed.len(),
                limit.max_reissues,
                limit
                    .max_held_ms
                    .map_or("-".into(), |m| format!("{} s", m / 1000))
            );
        }
        self.drain_waiting();
        self.flush();
        failed.len()
    }

    /// Fails every command that has not completed (after the channel went down), with `errno`.
    /// Commands whose SEND is still the HCA's are failed too: the caller must not reuse their
    /// buffers until the transport is torn down (which flushes the QP).
    pub fn fail_all(&mut self, errno_val: i32, done: &mut dyn FnMut(Done)) {
        self.waiting.clear();
        for tag in 0..self.cfg.depth {
            if self.tags[usize::from(tag)].state != TagState::Idle {
                self.complete(tag, CmdOutcome::failed(errno_val), done);
            }
        }
    }

    /// Runs one command to completion on an otherwise idle channel, polling (for setup commands
    /// such as INQUIRY before the device exists). Gives up after `timeout`.
    pub fn execute(
        &mut self,
        tag: u16,
        cmd: ScsiCmd,
        timeout: std::time::Duration,
    ) -> Result<CmdOutcome, SubmitError> {
        self.set_clock(crate::channel::clock_ms());
        self.submit(tag, cmd)?;
        self.flush();
        let start = std::time::Instant::now();
        let mut out = None;
        while out.is_none() {
            let n = self.process(&mut |d| {
                if d.tag == tag {
                    out = Some(d.outcome)
                }
            });
            if out.is_some() {
                break;
            }
            if let Some(d) = self.down.clone() {
                self.fail_all(errno::EIO, &mut |_| {});
                return Err(SubmitError::Down(d));
            }
            self.tick(crate::channel::clock_ms());
            if start.elapsed() > timeout {
                let d = DownReason::Timeout(Timeout::NoResponse(timeout));
                self.set_down(d.clone());
                self.fail_all(errno::EIO, &mut |_| {});
                return Err(SubmitError::Down(d));
            }
            if n == 0 {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
        Ok(out.unwrap_or(CmdOutcome::failed(errno::EIO)))
    }
}
