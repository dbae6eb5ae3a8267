//! srp-ublk: a userspace SRP (SCSI RDMA Protocol) initiator that presents remote SRP LUNs as ublk
//! block devices and NBD exports.
//!
//! The crate is layered so that data flows one way (front end -> channel -> transport -> wire) and
//! each concern has its own folder; see docs/architecture.md.
//!
//! - [`wire`]: bytes only: SRP IUs, SCSI CDBs/parameter data/sense, target strings.
//! - [`channel`]: one queue's SRP engine (tags, credits, send slots, receives) over a transport.
//! - [`session`]: logging a target's channels in, interrogating the LUN, runtime state.
//! - [`frontend`]: ublk (and NBD) over the per-queue channels.
//! - [`rdma`]: libibverbs/librdmacm (the FFI): one logged-in channel per [`rdma::Endpoint`].

pub mod backend;
pub mod channel;
pub mod frontend;
pub mod path;
pub mod ratelimit;
pub mod rdma;
pub mod session;
pub mod stats;
pub mod ublk;
pub mod wire;

/// An error and its causes (its `source` chain) for a log line: "what: why: ...", as anyhow's
/// `{:#}` prints them at the binary's edge.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}
