//! The InfiniBand SA / Device Management MAD decoders (srp_daemon-style discovery) on arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use srp_ublk::wire::mad;

fuzz_target!(|data: &[u8]| {
    let _ = mad::parse_response(data, mad::CLASS_SA, mad::ATTR_PORT_INFO_RECORD);
    if let Ok(recs) = mad::sa_records(data) {
        for r in recs {
            let _ = (mad::port_info(r), mad::node_port_guid(r), mad::path_pkey(r));
        }
    }
    let _ = mad::iou_info(data).map(|i| i.present().count());
    if let Ok(p) = mad::ioc_profile(data) {
        let n = usize::from(p.service_entries).min(4);
        if let Ok(e) = mad::service_entries(data, n) {
            for s in e.iter().filter_map(|s| s.srp_id_ext().map(|x| (x.to_string(), s.id))) {
                let _ = mad::srp_daemon_line(&s.0, &p, 0xfe80 << 48, 1, 0xffff, s.1);
            }
        }
    }
});
