//! A channel's fixed parameters: depth, send slots and their signalling, the re-issue bound.

use crate::wire::srp::ScsiLun;

/// Fixed parameters of one channel, from the login and the device setup.
#[derive(Clone, Copy, Debug)]
pub struct ChannelConfig {
    /// Tags: the commands the channel holds at once, out on the fabric or waiting for a credit
    /// or a send slot (the ublk queue depth, or the depths of the devices sharing the channel
    /// together).
    pub depth: u16,
    /// The commands the login's send queue was sized for (at most `depth`): its command send
    /// slots are twice this ([`ChannelConfig::cmd_slots`]).
    pub send_depth: u16,
    /// Send slots beyond the command slots for CRED_RSP / AER_RSP / I_LOGOUT.
    pub extra_slots: u16,
    /// The logical unit of the device the channel was logged in for: what a path's block commands
    /// address ([`crate::channel::ScsiCmd::lun`]; the engine sends each command to its own).
    pub lun: ScsiLun,
    /// Initial credits (LOGIN_RSP `req_lim_delta`).
    pub req_lim: i32,
    /// Largest immediate data payload the target accepts (0: no immediate data).
    pub max_imm: u32,
    /// Offset of immediate data in an SRP_CMD (agreed at login, 68).
    pub imm_data_offset: usize,
    /// The largest IU the target accepts (LOGIN_RSP `max_it_iu_len`).
    pub max_it_iu_len: u32,
    /// Retries of a command that failed with a retryable status (unit attention, busy, ...).
    pub max_retries: u8,
}

impl ChannelConfig {
    /// What a login to the fake target gives a test: `depth` commands, 16 credits, 8 KiB of
    /// immediate data, 3 retries.
    #[cfg(any(test, feature = "test-utils"))]
    pub fn fake(depth: u16) -> ChannelConfig {
        ChannelConfig {
            depth,
            send_depth: depth,
            extra_slots: 4,
            lun: ScsiLun::from_int(0),
            req_lim: 16,
            max_imm: 8192,
            imm_data_offset: 68,
            max_it_iu_len: 8260,
            max_retries: 3,
        }
    }

    /// Send slots for commands: twice the send depth, so that a command can go out again
    /// before the completion of its last SEND is reaped.
    pub fn cmd_slots(&self) -> u16 {
        cmd_slots(self.send_depth)
    }

    /// Every send slot the transport must have: [`ChannelConfig::cmd_slots`], then the extra ones.
    pub fn send_slots(&self) -> u16 {
        send_slots(self.send_depth, self.extra_slots)
    }

    /// One command SEND in this many is signalled: `SIGNAL_EVERY` (16), or fewer for a shallow
    /// channel, so that at most half the command slots wait for a signalled one.
    pub fn signal_every(&self) -> u16 {
        SIGNAL_EVERY.min(self.send_depth).max(1)
    }

    /// This channel holding `tags` commands at once (at least its send depth): the depths of
    /// every device sharing it. The sends stay what the login was sized for; commands beyond
    /// the credits or the send slots wait in the engine.
    pub fn with_tags(self, tags: u16) -> ChannelConfig {
        ChannelConfig {
            depth: tags.max(self.send_depth),
            ..self
        }
    }
}

/// Command SENDs per signalled one, at most (see [`ChannelConfig::signal_every`]).
const SIGNAL_EVERY: u16 = 16;

fn cmd_slots(depth: u16) -> u16 {
    depth.saturating_mul(2)
}

/// The send slots a transport needs for a channel of `depth` commands and `extra` more slots.
pub fn send_slots(depth: u16, extra: u16) -> u16 {
    cmd_slots(depth).saturating_add(extra)
}

/// How far a command may go round reconnects before it fails with EIO: the SCSI midlayer bounds
/// a command by retries and a total time; without this, a target that accepts every login and
/// then drops the channel again would keep held commands going round for ever (each login
/// restarts fast_io_fail_tmo).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReissueLimit {
    /// Re-issues after a reconnect allowed (sd's SD_MAX_RETRIES is 5).
    pub max_reissues: u8,
    /// Time from a command's first hold after which it is not sent again (fast_io_fail_tmo;
    /// `None`: no bound in time).
    pub max_held_ms: Option<u64>,
}

impl ReissueLimit {
    /// The limit for a channel under `fast_io_fail` (ms; `None` when off).
    pub fn new(fast_io_fail_ms: Option<u64>) -> ReissueLimit {
        ReissueLimit {
            max_reissues: 5,
            max_held_ms: fast_io_fail_ms,
        }
    }
}
