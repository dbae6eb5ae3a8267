//! Front ends: how the per-queue channels are presented. `ublk` makes `/dev/ublkbN`; NBD comes next.

pub mod ublk;
