//! Front ends: how the per-queue channels are presented. `ublk` makes `/dev/ublkbN`; `nbd` serves NBD
//! exports; `vhost` serves vhost-user-blk disks; `socket` makes the unix sockets the exports listen on;
//! `status` holds the counters each front end's queues publish.

pub mod capacity;
pub mod nbd;
pub mod socket;
pub mod status;
pub mod ublk;
pub mod vhost;
