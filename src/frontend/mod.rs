//! Front ends: how the per-queue channels are presented. `ublk` makes `/dev/ublkbN`; `nbd` serves NBD exports.

pub mod nbd;
pub mod ublk;
pub mod vhost;
