//! Every SRP IU decoder on arbitrary bytes: a value or an error, never a panic or a read out of
//! bounds. The first byte picks the immediate data offset for SRP_CMD decoding.
#![no_main]
use libfuzzer_sys::fuzz_target;
use srp_ublk::wire::srp::{
    parse_initiator_iu, parse_login_reply, parse_target_iu, LoginReq, TargetIu,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(TargetIu::Rsp(r)) = parse_target_iu(data) {
        assert!(r.resp_data.len() + r.sense.len() + 36 <= data.len());
        let _ = r.tsk_mgmt_status();
    }
    let imm_off = data.first().map(|&b| usize::from(b)).unwrap_or(68);
    if let Ok(srp_ublk::wire::srp::InitiatorIu::Cmd(c)) = parse_initiator_iu(data, imm_off) {
        for d in [c.cmd.data_out, c.cmd.data_in] {
            if let srp_ublk::wire::srp::DataDesc::Indirect { inline, .. } = d {
                assert_eq!(inline.iter().count(), inline.len());
            }
        }
    }
    let _ = parse_login_reply(data);
    let _ = LoginReq::parse_ib(data);
    let _ = LoginReq::parse_rdma(data);
});
