//! The faults a test injects into the fake target (see [`super::FakeTarget::faults`]).

use std::collections::VecDeque;

/// Faults to inject.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Deliver responses before the SEND completion of their command (gotcha 9).
    pub rsp_before_send: bool,
    /// Credits returned per response (default 1 when `None`).
    pub delta_per_rsp: Option<i32>,
    /// Fail the next N commands with this (sense key, asc, ascq) as CHECK CONDITION.
    pub check_condition: VecDeque<(u8, u8, u8)>,
    /// Drop the response to the next command (a lost response).
    pub drop_next_rsp: bool,
    /// Hold responses (not delivered until [`FakeTarget::release_held`](super::FakeTarget::release_held)).
    pub hold_rsps: bool,
    /// Answers to the next task management requests: `Some(code)` responds with that response
    /// code, `None` leaves it unanswered; when empty, every request completes (code 0).
    pub tmf_answers: VecDeque<Option<u8>>,
    /// Answer the next N commands with BUSY.
    pub busy_next: u32,
    /// Never deliver the SEND completion of the next send.
    pub drop_next_send_wc: bool,
    /// Hold SEND completions (not delivered until [`FakeTarget::release_send_wcs`](super::FakeTarget::release_send_wcs)).
    pub hold_send_wcs: bool,
    /// The next chain's post fails at this work request (0 = the first): the ones before it go,
    /// it and the rest do not (`ibv_post_send`'s `bad_wr`).
    pub fail_post_at: Option<usize>,
    /// The local link is down: [`Login::link_down`](crate::channel::Login::link_down) says so.
    pub link_down: bool,
    /// The RDMA device is being removed: [`Login::release_if_removed`](crate::channel::Login::release_if_removed) releases the login.
    pub removed: bool,
    /// Operation codes answered ILLEGAL REQUEST, INVALID COMMAND OPERATION CODE (a LUN that
    /// announced a command in its VPD pages and refuses it).
    pub refuse: Vec<u8>,
    /// A malformed IU arrives as the completion channel is next armed (once), and that arm never
    /// fires: the channel goes down between a loop's last poll and its sleep, and no completion
    /// wakes the loop for it.
    pub break_on_arm: bool,
}
