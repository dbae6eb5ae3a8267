//! A [`Connect`] for the in-process fake target (tests, and examples without an RDMA device).

use super::{Connect, Fresh};

/// A reconnect to the in-process fake target: its next login ([`FakeTarget::successor`], over the
/// same disk), with 16 credits and 8 KiB of immediate data.
///
/// [`FakeTarget::successor`]: crate::channel::fake::FakeTarget::successor
pub struct FakeRelogin;

impl Connect for FakeRelogin {
    type T = crate::channel::fake::FakeTarget;
    type Error = std::io::Error;

    fn connect(&self, old: &mut Self::T) -> Result<Fresh<Self::T>, std::io::Error> {
        Ok(Fresh {
            t: old.successor(),
            req_lim: 16,
            max_imm: 8192,
        })
    }
}
