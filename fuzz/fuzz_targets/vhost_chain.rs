//! A guest's virtio-blk descriptor chain, parsed into a request and translated into the segments an
//! SRP_CMD's data descriptors point at: never a panic, never a segment byte outside the request's
//! ranges or the memory lent to the path (`srp_ublk::frontend::vhost::fuzz_chain` asserts it).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| srp_ublk::frontend::vhost::fuzz_chain(data));
