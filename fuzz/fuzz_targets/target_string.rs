//! Target strings and srp_daemon.conf rules on arbitrary text: parse or a clear error; a string that
//! parses prints a normalized form that parses back to the same target.
#![no_main]
use libfuzzer_sys::fuzz_target;
use srp_ublk::wire::target::{Rules, TargetSpec};

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    if let Ok(t) = TargetSpec::parse(&s) {
        let again = TargetSpec::parse(&t.to_string()).expect("normalized form must parse");
        assert_eq!(again, t);
        let _ = t.target_port_id();
    }
    if let Ok(r) = Rules::parse(&s) {
        let t = TargetSpec::parse("id_ext=1,ioc_guid=2,dest=10.0.0.1:5555").unwrap();
        let _ = r.apply(&t);
    }
});
