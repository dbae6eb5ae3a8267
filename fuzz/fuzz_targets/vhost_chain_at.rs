//! A descriptor table in guest memory walked from a head, as a request the last backend took is
//! taken again from the inflight region: never a panic, never more descriptors than the tables
//! hold (`srp_ublk::frontend::vhost::fuzz_chain_at` asserts it), whatever the table, its place
//! and the ring size.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| srp_ublk::frontend::vhost::fuzz_chain_at(data));
