//! Discovery over RDMA/CM: log in to a target (MULTI, so no existing session of the same nexus is
//! torn down), REPORT LUNS, interrogate every LUN as `add` would, log out. What `srp-ublk discover
//! --dest` prints and what `add --lun all` attaches.

use super::{connect_params, data_in, interrogate, LunInfo, SessionError};
use crate::channel::Channel;
use crate::rdma::Endpoint;
use crate::wire::scsi::{Cdb, ReportLuns};
use crate::wire::srp::{MultiChannelAction, ScsiLun};
use crate::wire::target::TargetSpec;
use std::time::Duration;

/// REPORT LUNS allocation: 8 header bytes and 511 LUNs.
const REPORT_LUNS_ALLOC: u32 = 4096;

/// One LUN the target reported: what it is, or why it cannot be served.
#[derive(Debug)]
pub struct FoundLun {
    /// The LUN number (as Linux numbers them).
    pub lun: u64,
    /// Its description, or why it cannot be a block device.
    pub info: Result<LunInfo, SessionError>,
}

/// Logs one channel in to `target` (MULTI), lists its LUNs and interrogates each.
pub fn discover_luns(
    target: &TargetSpec,
    timeout: Duration,
) -> Result<Vec<FoundLun>, SessionError> {
    let p = connect_params(target, MultiChannelAction::Multi, 4, timeout);
    let ep = Endpoint::connect(&p)?;
    let cfg = super::channel_config(&ep, 1, 0, p.req_it_iu_len);
    let mut ch = Channel::new(ep, cfg);
    let luns = report_luns(&mut ch)?;
    let mut found = Vec::with_capacity(luns.len());
    for lun in luns {
        // one channel reaches every LUN: each command names its own
        let info = interrogate(&mut ch, lun);
        found.push(FoundLun { lun, info });
    }
    ch.send_i_logout();
    Ok(found)
}

/// The LUNs the target maps for us (REPORT LUNS sent to LUN 0, which every SCSI target answers).
pub fn report_luns(ch: &mut Channel<Endpoint>) -> Result<Vec<u64>, SessionError> {
    let b = data_in(
        ch,
        "REPORT LUNS",
        0,
        Cdb::report_luns(0, REPORT_LUNS_ALLOC),
        REPORT_LUNS_ALLOC,
    )?;
    let r = ReportLuns::parse(&b).map_err(|e| SessionError::Command {
        what: "REPORT LUNS",
        lun: 0,
        cause: super::CommandFailure::Parse(e),
    })?;
    if !r.complete() {
        tracing::warn!(
            "REPORT LUNS: the target lists {} bytes of LUNs, more than the {REPORT_LUNS_ALLOC} read; \
             using the first ones",
            r.list_len
        );
    }
    let mut luns: Vec<u64> = r.luns().map(ScsiLun::to_int).collect();
    luns.sort_unstable();
    luns.dedup();
    Ok(luns)
}
