//! Front ends: how the per-queue channels are presented. `ublk` makes `/dev/ublkbN`; `nbd` serves NBD
//! exports; `vhost` serves vhost-user-blk disks; `socket` makes the unix sockets the exports listen on.

pub mod nbd;
pub mod socket;
pub mod ublk;
pub mod vhost;
