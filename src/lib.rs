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
pub mod wire;
