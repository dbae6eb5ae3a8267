//! The channel's timed work: delayed retries, command timeouts and task management, the stall
//! backstop and the link check, on the millisecond clock the front end hands it.

use super::*;

impl<T: Transport> Channel<T> {
    /// Sets the clock (ms, from any fixed origin) that stamps commands as they are sent: the front
    /// end calls it when a batch of commands arrives after a sleep.
    pub fn set_clock(&mut self, now_ms: u64) {
        self.now = now_ms;
    }

    /// Sets the clock and, when due, runs the timed work: delayed retries, task management deadlines,
    /// command timeouts, the stall backstop. Cheap when nothing is due (one comparison); the front
    /// end calls it every loop while commands are outstanding, and at least by
    /// [`Channel::next_tick_in`].
    pub fn tick(&mut self, now_ms: u64) {
        self.now = now_ms;
        if now_ms < self.next_due {
            return;
        }
        self.next_due = now_ms + SCAN_MS;
        if self.down.is_some() || self.busy == 0 {
            return;
        }
        self.run_delayed();
        if self.down.is_none() {
            self.check_timeouts();
        }
        self.flush();
        let quiet = now_ms.saturating_sub(self.last_wc);
        if self.down.is_none() && quiet >= LINK_CHECK_MS {
            if let Some(port) = self.t.link_down() {
                self.set_down(DownReason::LinkDown(port));
            }
        }
        if self.down.is_none() && quiet >= STALL_MS {
            self.set_down(DownReason::Timeout(Timeout::Stalled {
                outstanding: self.busy,
            }));
        }
    }

    /// How long until [`Channel::tick`] has work, while commands are outstanding (None: idle).
    pub fn next_tick_in(&self) -> Option<u64> {
        (self.busy > 0 && self.down.is_none()).then(|| self.next_due.saturating_sub(self.now))
    }

    /// Sends the delayed retries that are due; fixes when the next one is.
    fn run_delayed(&mut self) {
        for tag in 0..self.cfg.depth {
            if let TagState::Delayed { until } = self.tags[usize::from(tag)].state {
                if until <= self.now {
                    self.set_state(tag, TagState::Idle);
                    self.start(tag);
                } else {
                    self.next_due = self.next_due.min(until);
                }
            }
        }
    }

    /// Escalates a task management request that failed or went unanswered, or aborts the oldest
    /// command past [`CMD_TIMEOUT_MS`].
    fn check_timeouts(&mut self) {
        if let Some(t) = self.tmf {
            if self.now.saturating_sub(t.sent) >= TMF_TIMEOUT_MS {
                self.escalate(t, TmfAnswer::None);
            }
            return;
        }
        let mut oldest: Option<(u16, u64)> = None;
        for tag in 0..self.cfg.depth {
            let e = &self.tags[usize::from(tag)];
            if e.state == TagState::InFlight && oldest.is_none_or(|(_, sent)| e.sent < sent) {
                oldest = Some((tag, e.sent));
            }
        }
        let Some((tag, sent)) = oldest else {
            return;
        };
        if self.now.saturating_sub(sent) < CMD_TIMEOUT_MS {
            return;
        }
        self.stats.timeouts += 1;
        let e = self.tags[usize::from(tag)];
        if e.slot.is_some() && e.signalled {
            // the HCA never finished sending it: the QP is stuck, only a reconnect frees the slot
            self.set_down(DownReason::Timeout(Timeout::NotSent { tag }));
            return;
        }
        tracing::warn!(
            "command (tag {tag}) unanswered for {} s: ABORT TASK",
            CMD_TIMEOUT_MS / 1000
        );
        self.send_tmf(TskMgmtFunc::AbortTask, e.cmd.lun, Some((tag, e.gen)));
    }

    /// ABORT TASK failed or went unanswered: LOGICAL UNIT RESET of the command's LUN; that failed
    /// too: down.
    fn escalate(&mut self, t: Tmf, answer: TmfAnswer) {
        self.tmf = None;
        match t.func {
            TskMgmtFunc::AbortTask => {
                tracing::warn!("ABORT TASK {answer}: LOGICAL UNIT RESET");
                self.send_tmf(TskMgmtFunc::LunReset, t.lun, None);
            }
            _ => self.set_down(DownReason::Timeout(Timeout::LunReset { answer })),
        }
    }

    /// Sends a task management request for logical unit `lun` on an extra slot with the credit
    /// kept back for it.
    fn send_tmf(&mut self, func: TskMgmtFunc, lun: ScsiLun, target: Option<(u16, u16)>) {
        let slot = match self.extra_free.pop() {
            Some(s) if self.req_lim >= 1 => s,
            other => {
                if let Some(s) = other {
                    self.extra_free.push(s);
                }
                self.set_down(DownReason::Timeout(Timeout::TmfUnsendable {
                    func,
                    req_lim: self.req_lim,
                }));
                return;
            }
        };
        self.tmf_seq = self.tmf_seq.wrapping_add(1);
        let srp_tag = TMF_TAG | u64::from(self.tmf_seq);
        let task_tag = target.map_or(0, |(tag, gen)| (u64::from(gen) << 16) | u64::from(tag));
        let iu = TskMgmt {
            sol_not: 0,
            tag: srp_tag,
            lun,
            func,
            task_tag,
        }
        .encode();
        if !self.post_extra(slot, &iu) {
            return;
        }
        self.take_credit();
        self.stats.tmfs += 1;
        self.tmf = Some(Tmf {
            func,
            lun,
            srp_tag,
            target,
            sent: self.now,
        });
    }

    /// The response to the task management request out.
    pub(super) fn on_tmf_rsp(&mut self, srp_tag: u64, info: RspInfo) {
        let Some(t) = self.tmf.filter(|t| t.srp_tag == srp_tag) else {
            return self.unexpected(srp_tag);
        };
        let ok = info.tmf_code.unwrap_or(info.status) == TSK_MGMT_COMPLETE;
        if !ok {
            let code = info.tmf_code.unwrap_or(0xff);
            return self.escalate(t, TmfAnswer::Refused(code));
        }
        self.tmf = None;
        // what the request ended is sent again, with a new generation: a late response to the old
        // one is dropped
        let ended = match t.target {
            Some((tag, gen)) if self.tags[usize::from(tag)].gen == gen => tag..tag + 1,
            // answered after the command itself: nothing to send again
            Some(_) => 0..0,
            None => 0..self.cfg.depth,
        };
        for tag in ended {
            let e = &self.tags[usize::from(tag)];
            // a LUN reset ended its LUN's commands only
            if e.state == TagState::InFlight && e.cmd.lun == t.lun {
                tracing::info!("{:?} done: tag {tag} sent again", t.func);
                self.set_state(tag, TagState::Idle);
                self.start(tag);
            }
        }
        self.drain_waiting();
    }
}
