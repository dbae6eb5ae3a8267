//! The NBD request and option parsers on arbitrary bytes: a value or an error, never a panic; a
//! request that parses re-encodes to the same 28 bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use srp_ublk::wire::nbd::{InfoRequest, OptionHeader, Request};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Request::parse(data) {
        assert_eq!(&r.encode()[..], &data[..28]);
    }
    let _ = OptionHeader::parse(data);
    if let Ok(g) = InfoRequest::parse(data) {
        // lossy UTF-8: each input byte yields at most one char (invalid ones become U+FFFD)
        assert!(g.name.chars().count() <= data.len());
    }
});
