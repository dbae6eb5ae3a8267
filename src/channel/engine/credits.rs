//! The channel's credits (`req_lim`, as SRP r16a counts them) and the room its login has: what
//! decides whether a command goes out now or waits.

use super::*;

impl<T: Transport> Channel<T> {
    /// A credit beyond the one kept for task management and room on the login: a free send
    /// slot, and fewer commands out than its send depth.
    pub(super) fn can_send(&self) -> bool {
        self.req_lim > 1 && self.sends_free()
    }

    /// Room on the login: a free send slot, and fewer commands out than its send depth.
    pub(super) fn sends_free(&self) -> bool {
        self.slots.any_free() && self.on_wire < self.cfg.send_depth
    }

    /// Sets `tag`'s state, keeping [`Channel::on_wire`] the count of the tags in flight.
    pub(super) fn set_state(&mut self, tag: u16, state: TagState) {
        let e = &mut self.tags[usize::from(tag)];
        let (was, is) = (e.state == TagState::InFlight, state == TagState::InFlight);
        e.state = state;
        self.on_wire = self.on_wire + u16::from(is) - u16::from(was);
    }

    /// One credit spent on a request (SRP_CMD or SRP_TSK_MGMT).
    pub(super) fn take_credit(&mut self) {
        self.req_lim -= 1;
        self.stats.min_req_lim = self.stats.min_req_lim.min(self.req_lim);
    }

    /// Adds a target's credit delta (SRP_RSP, CRED_REQ, AER_REQ), within [`MAX_REQ_LIM`].
    pub(super) fn add_credits(&mut self, delta: i32) {
        let sum = self.req_lim.saturating_add(delta);
        // more credits than any target grants: a buggy or hostile target; what we send is bounded
        // by our tags anyway, so keep the count sane and say so
        self.req_lim = sum.min(MAX_REQ_LIM);
        if sum > MAX_REQ_LIM {
            if let Some(n) = self.noisy.allow(std::time::Instant::now()) {
                tracing::warn!(
                    "the target granted {delta} credits, which would make req_lim {sum}: kept at \
                     {MAX_REQ_LIM} ({n} more target requests left out of the log since the last line)"
                );
            }
        }
        if delta < 0 {
            // a target may take credits back; only then can the low-water mark move
            self.stats.min_req_lim = self.stats.min_req_lim.min(self.req_lim);
        }
    }
}
