//! srp-ublk: a userspace SRP (SCSI RDMA Protocol) initiator that presents remote SRP LUNs as ublk
//! block devices and NBD exports.
//!
//! The crate is layered so that data flows one way (front end -> channel -> transport -> wire) and
//! each concern has its own folder; see docs/architecture.md.
//!
//! - [`wire`]: bytes only: SRP IUs, SCSI CDBs/parameter data/sense, target strings.

pub mod wire;
