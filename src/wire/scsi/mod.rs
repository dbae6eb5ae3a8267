//! SCSI: the CDBs srp-ublk sends, the parameter data it reads back, and sense decoding.

pub mod cdb;
pub mod data;
pub mod sense;
pub mod vpd;

pub use cdb::{encode_unmap_params, Cdb, UnmapRange};
pub use data::{CachingPage, Capacity, ModeSense10, ReportLuns, StandardInquiry};
pub use sense::{classify, Action, Disposition, Refresh, ScsiStatus, Sense, SenseKey};
