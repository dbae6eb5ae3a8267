//! Logging a channel in again after it went down ([`Relogin`]), and the logins a daemon makes
//! besides its channels (a capacity check's).

use super::state::DeviceState;
use super::{capacity16, channel_config, connect_params, lun_identity, LunIdentity, SessionError};
use crate::channel::Channel;
use crate::rdma::{ConnectParams, Endpoint};
use crate::wire::scsi::Capacity;
use crate::wire::srp::MultiChannelAction;
use crate::wire::target::TargetSpec;
use std::time::Duration;

/// What a queue thread needs to log its channel in again after it went down: the target and the
/// login parameters of the session's extra channels (MULTI: the target keeps the session's other
/// channels; if none is left it starts a new session).
#[derive(Clone, Debug)]
pub struct Relogin {
    params: ConnectParams,
    lun: u64,
    depth: u16,
    /// The LUNs every new login must find, each by its number (see [`Relogin::expecting`]).
    expect: Vec<(u64, LunIdentity)>,
    /// The target, when the session's first login ended the nexus's other channels (SINGLE: no
    /// other daemon had any): see [`Relogin::lead`].
    nexus: Option<Box<TargetSpec>>,
    /// This channel's logins end the nexus's other channels (SINGLE) while no other daemon
    /// shares the nexus.
    leads: bool,
}

/// A new login for a channel that went down.
pub struct Fresh {
    /// The logged-in endpoint.
    pub ep: Endpoint,
    /// Its initial credits.
    pub req_lim: i32,
    /// Its immediate-data limit.
    pub max_imm: u32,
}

impl Relogin {
    /// How a channel of `target` serving `lun` at `depth` logs in again: MULTI, each CM step
    /// limited to `timeout` (and to [`RELOGIN_STEP`](super::RELOGIN_STEP) when [`Relogin::connect`] is given it).
    pub fn new(target: &TargetSpec, lun: u64, depth: u16, timeout: Duration) -> Relogin {
        Relogin {
            params: connect_params(target, MultiChannelAction::Multi, depth, timeout),
            lun,
            depth,
            expect: Vec::new(),
            nexus: None,
            leads: false,
        }
    }

    /// The session owns the nexus of `target` (its first login was SINGLE): a leading channel's
    /// logins may end the nexus's other channels too ([`Relogin::lead`]).
    pub fn owning_nexus(mut self, target: &TargetSpec) -> Relogin {
        self.nexus = Some(Box::new(target.clone()));
        self
    }

    /// Whether the session owns its nexus ([`Relogin::owning_nexus`]).
    pub fn owns_nexus(&self) -> bool {
        self.nexus.is_some()
    }

    /// The logins of the channel that leads each reconnect (queue 0, as ib_srp's first channel):
    /// SINGLE, so that the target ends whatever it kept of the nexus's old channels before the
    /// others join with MULTI; MULTI after all while another daemon serves a LUN over the same
    /// nexus (its channels would end too).
    pub fn lead(&self) -> Relogin {
        Relogin {
            leads: self.nexus.is_some(),
            ..self.clone()
        }
    }

    /// Logins that carry commands of up to `n` data segments ([`super::SessionOptions::max_segments`]).
    pub fn with_segments(mut self, n: u16) -> Relogin {
        self.params.max_segments = n.max(1);
        self
    }

    /// Logins whose commands name up to `tags` tags (the devices of a target port together).
    pub fn with_tags(mut self, tags: u16) -> Relogin {
        self.params.tags = tags;
        self
    }

    /// Logs in one channel, each CM step limited to `step` (shorter than the first login's limit,
    /// so a queue waiting on a dead fabric still reaches its fast_io_fail and dev_loss deadlines).
    /// With [`Relogin::expecting`], a login that finds another LUN is refused.
    pub fn connect(&self, step: Duration) -> Result<Fresh, SessionError> {
        let mut p = self.params.clone();
        p.timeout = p.timeout.min(step);
        if let (true, Some(t)) = (self.leads, &self.nexus) {
            if !DeviceState::nexus_shared(t) {
                p.multi = MultiChannelAction::Single;
                tracing::info!(
                    "logging in with SINGLE: the target ends what it kept of this nexus's channels"
                );
            }
        }
        let ep = Endpoint::connect(&p)?;
        let cfg = channel_config(&ep, self.depth, self.lun, p.req_it_iu_len);
        if self.expect.is_empty() {
            return Ok(Fresh {
                ep,
                req_lim: cfg.req_lim,
                max_imm: cfg.max_imm,
            });
        }
        let mut ch = Channel::new(ep, cfg);
        for (lun, want) in &self.expect {
            let now = lun_identity(&mut ch, *lun)?;
            want.check(&now)
                .map_err(|source| SessionError::NotTheLun { lun: *lun, source })?;
        }
        Ok(Fresh {
            req_lim: ch.req_lim(),
            max_imm: cfg.max_imm,
            ep: ch.into_transport(),
        })
    }

    /// A channel logged in and ready to carry commands (what [`Relogin::connect`] gives, with its
    /// engine): a replacement for one that was lost.
    pub fn channel(&self, step: Duration) -> Result<Channel<Endpoint>, SessionError> {
        let fresh = self.connect(step)?;
        let p = &self.params;
        let cfg = channel_config(&fresh.ep, self.depth, self.lun, p.req_it_iu_len);
        Ok(Channel::new(fresh.ep, cfg))
    }

    /// The same logins, for LUN `lun` of the port (a capacity check's, [`Relogin::read_capacity`]).
    pub fn for_lun(&self, lun: u64) -> Relogin {
        Relogin {
            lun,
            expect: Vec::new(),
            leads: false,
            ..self.clone()
        }
    }

    /// Every login from now on must find LUN `lun` as `id` names it (its WWID or serial, size and
    /// logical block size): what a daemon that took devices over without a login of its own
    /// checks for each, so that a LUN mapping changed while the RDMA device was away never gets a
    /// device's I/O.
    pub fn expecting(mut self, lun: u64, id: LunIdentity) -> Relogin {
        self.expect.push((lun, id));
        self
    }
}

impl Relogin {
    /// Asks the LUN its capacity now (READ CAPACITY(16)) on a channel of its own, logged in for
    /// this (MULTI: the session's channels carry on) and logged out after: how a daemon re-reads
    /// the capacity without touching a queue's channel.
    pub fn read_capacity(&self, step: Duration) -> Result<Capacity, SessionError> {
        let fresh = self.connect(step)?;
        let p = &self.params;
        let cfg = channel_config(&fresh.ep, 1, self.lun, p.req_it_iu_len);
        let mut ch = Channel::new(fresh.ep, cfg);
        let cap = capacity16(&mut ch, self.lun);
        ch.send_i_logout();
        cap
    }
}
