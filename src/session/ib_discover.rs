//! InfiniBand discovery, srp_daemon's way (`srp_daemon -o`): ask the subnet manager for the ports
//! that support device management, then for each one its port GUID and the partitions it shares
//! with us, and in each partition ask its Device Management agent for IOUnitInfo, the profile of
//! every IO controller present and their service entries; every `SRP.T10:<id_ext>` service is a
//! target, printed as the string ib_srp's `add_target` (and `srp-ublk add`) takes.
//!
//! The MADs go through a [`MadPort`]: the kernel's umad device ([`Umad`]), or in tests a fake
//! fabric that answers from the same bytes a target would send.

use crate::rdma::umad::{Agent, LocalPort, Umad, UmadError};
use crate::wire::mad::{self, IocProfile, MAD_SIZE};

/// Where discovery sends its MADs.
pub trait MadPort {
    /// The local port.
    fn local(&self) -> &LocalPort;
    /// Sends `mad` and returns the answer's MAD.
    fn query(
        &mut self,
        agent: Agent,
        lid: u16,
        pkey_index: u16,
        mad: &[u8; MAD_SIZE],
        what: &'static str,
    ) -> Result<Vec<u8>, UmadError>;
}

impl MadPort for Umad {
    fn local(&self) -> &LocalPort {
        &self.local
    }
    fn query(
        &mut self,
        agent: Agent,
        lid: u16,
        pkey_index: u16,
        mad: &[u8; MAD_SIZE],
        what: &'static str,
    ) -> Result<Vec<u8>, UmadError> {
        Umad::query(self, agent, lid, pkey_index, mad, what)
    }
}

/// One SRP target service found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbTarget {
    /// The target string, as `srp_daemon -o` prints it.
    pub line: String,
    /// The LID of the target port.
    pub lid: u16,
    /// The partition it was found in.
    pub pkey: u16,
    /// The IO controller.
    pub ioc: IocProfile,
}

/// A discovery run: the targets found, and what could not be asked (srp_daemon goes on past a
/// port or controller that does not answer; so does this, saying so).
#[derive(Debug, Default)]
pub struct IbFound {
    /// The targets.
    pub targets: Vec<IbTarget>,
    /// Ports or controllers skipped, and why.
    pub skipped: Vec<String>,
}

struct Asker<'a, P: MadPort> {
    port: &'a mut P,
    tid: u64,
}

impl<P: MadPort> Asker<'_, P> {
    fn next_tid(&mut self) -> u64 {
        self.tid = self.tid.wrapping_add(1).max(1); // OpenSM ignores tid 0
        self.tid
    }

    /// Sends a request built for the next tid and checks the answer's header.
    fn ask(
        &mut self,
        agent: Agent,
        lid: u16,
        pkey_index: u16,
        what: &'static str,
        build: impl FnOnce(u64) -> [u8; MAD_SIZE],
    ) -> Result<Vec<u8>, UmadError> {
        let req = build(self.next_tid());
        let (class, attr) = (req[1], u16::from_be_bytes([req[16], req[17]]));
        let ans = self.port.query(agent, lid, pkey_index, &req, what)?;
        mad::parse_response(&ans, class, attr).map_err(|source| UmadError::Answer {
            what,
            lid,
            source,
        })?;
        Ok(ans)
    }
}

/// Discovers every SRP target the subnet manager knows a device-management port for.
pub fn discover(port: &mut impl MadPort) -> Result<IbFound, UmadError> {
    let local = port.local().clone();
    let mut a = Asker { port, tid: 0 };
    let sm = local.sm_lid;
    let table = a.ask(
        Agent::Sa,
        sm,
        0,
        "PortInfoRecord query (IsDM)",
        mad::query_dm_ports,
    )?;
    let dm_ports: Vec<mad::PortInfo> = mad::sa_records(&table)
        .map_err(|source| UmadError::Answer {
            what: "PortInfoRecord table",
            lid: sm,
            source,
        })?
        .filter_map(|r| mad::port_info(r).ok())
        .filter(|p| p.lid != 0 && p.capability_mask & mad::CAP_IS_DM != 0)
        .collect();
    let mut found = IbFound::default();
    for p in dm_ports {
        if let Err(e) = port_targets(&mut a, &local, p, &mut found) {
            found
                .skipped
                .push(format!("port LID {:#x}: {}", p.lid, crate::Chain(&e)));
        }
    }
    Ok(found)
}

/// The target a bare GUID names (`srp-ublk add --target GUID`): the first found whose ioc_guid or
/// id_ext is `guid`, with the others found for the message when none is.
pub fn find_guid(
    port: &mut impl MadPort,
    guid: u64,
) -> Result<Result<IbTarget, IbFound>, UmadError> {
    let found = discover(port)?;
    let hit = found.targets.iter().find(|t| {
        t.ioc.guid == guid
            || crate::wire::target::TargetSpec::parse(&t.line).is_ok_and(|s| s.id_ext == guid)
    });
    Ok(match hit {
        Some(t) => Ok(t.clone()),
        None => Err(found),
    })
}

fn port_targets<P: MadPort>(
    a: &mut Asker<'_, P>,
    local: &LocalPort,
    p: mad::PortInfo,
    found: &mut IbFound,
) -> Result<(), UmadError> {
    let sm = local.sm_lid;
    let node = a.ask(Agent::Sa, sm, 0, "NodeRecord query", |t| {
        mad::query_node(t, p.lid)
    })?;
    let bad = |what, source| UmadError::Answer {
        what,
        lid: p.lid,
        source,
    };
    // no record decodes as a truncated one
    let guid = mad::sa_records(&node)
        .and_then(|mut recs| mad::node_port_guid(recs.next().unwrap_or_default()))
        .map_err(|e| bad("NodeRecord", e))?;
    for &(pkey_index, pkey) in &local.pkeys {
        // a path record in this partition: the target port is a member too
        let shared = a
            .ask(Agent::Sa, sm, 0, "PathRecord query", |t| {
                mad::query_path(t, local.lid, p.lid, pkey)
            })
            .ok()
            .and_then(|ans| {
                mad::sa_records(&ans)
                    .ok()?
                    .next()
                    .and_then(|r| mad::path_pkey(r).ok())
            })
            .is_some();
        if !shared {
            continue;
        }
        let iou = a.ask(Agent::Dm, p.lid, pkey_index, "IOUnitInfo", |t| {
            mad::dm_get(t, mad::ATTR_IO_UNIT_INFO, 0)
        })?;
        let iou = mad::iou_info(&iou).map_err(|e| bad("IOUnitInfo", e))?;
        for slot in iou.present() {
            if let Err(e) = controller(a, p, guid, pkey_index, pkey, slot, found) {
                found.skipped.push(format!(
                    "port LID {:#x} controller {slot}: {}",
                    p.lid,
                    crate::Chain(&e)
                ));
            }
        }
    }
    Ok(())
}

fn controller<P: MadPort>(
    a: &mut Asker<'_, P>,
    p: mad::PortInfo,
    port_guid: u64,
    pkey_index: u16,
    pkey: u16,
    slot: u8,
    found: &mut IbFound,
) -> Result<(), UmadError> {
    let bad = |what, source| UmadError::Answer {
        what,
        lid: p.lid,
        source,
    };
    let prof = a.ask(Agent::Dm, p.lid, pkey_index, "IOControllerProfile", |t| {
        mad::dm_get(t, mad::ATTR_IO_CONTROLLER_PROFILE, u32::from(slot))
    })?;
    let ioc = mad::ioc_profile(&prof).map_err(|e| bad("IOControllerProfile", e))?;
    let n = ioc.service_entries;
    for first in (0..n).step_by(4) {
        let last = (first + 3).min(n - 1);
        let ans = a.ask(Agent::Dm, p.lid, pkey_index, "ServiceEntries", |t| {
            mad::dm_get(
                t,
                mad::ATTR_SERVICE_ENTRIES,
                mad::service_entries_mod(slot, first, last),
            )
        })?;
        let entries = mad::service_entries(&ans, usize::from(last - first) + 1)
            .map_err(|e| bad("ServiceEntries", e))?;
        for e in entries {
            if let Some(id_ext) = e.srp_id_ext() {
                found.targets.push(IbTarget {
                    line: mad::srp_daemon_line(
                        id_ext,
                        &ioc,
                        p.subnet_prefix,
                        port_guid,
                        pkey,
                        e.id,
                    ),
                    lid: p.lid,
                    pkey,
                    ioc: ioc.clone(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
