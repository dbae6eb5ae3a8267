//! Property tests of the wire layer: every IU round-trips (decode(encode(x)) == x), and every decoder
//! returns a value or an error for arbitrary bytes, never a panic.

use proptest::prelude::*;
use srp_ublk::wire::scsi::{self, vpd, Capacity, ModeSense10, ReportLuns, Sense, StandardInquiry};
use srp_ublk::wire::srp::*;
use srp_ublk::wire::target::{Rules, TargetSpec};

fn direct() -> impl Strategy<Value = DirectBuf> {
    (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(va, key, len)| DirectBuf { va, key, len })
}

fn lun() -> impl Strategy<Value = ScsiLun> {
    any::<[u8; 8]>().prop_map(ScsiLun)
}

fn task_attr() -> impl Strategy<Value = TaskAttr> {
    prop_oneof![
        Just(TaskAttr::Simple),
        Just(TaskAttr::HeadOfQueue),
        Just(TaskAttr::Ordered),
        Just(TaskAttr::Aca),
        (5u8..=255).prop_map(TaskAttr::Other),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn login_req_round_trips(tag in any::<u64>(), len in any::<u32>(), fmt in any::<u16>(),
                             multi in 0u8..4, immed in any::<bool>(), off in any::<u16>(),
                             ipi in any::<[u8; 16]>(), tpi in any::<[u8; 16]>()) {
        let mc = match multi { 0 => MultiChannelAction::Single, 1 => MultiChannelAction::Multi,
                               r => MultiChannelAction::Reserved(r) };
        let r = LoginReq { tag, req_it_iu_len: len, req_buf_fmt: BufFormats(fmt), multi_channel: mc,
                           immed_requested: immed, imm_data_offset: off, initiator_port_id: ipi,
                           target_port_id: tpi };
        prop_assert_eq!(LoginReq::parse_ib(&r.encode_ib()).unwrap(), r);
        prop_assert_eq!(LoginReq::parse_rdma(&r.encode_rdma()).unwrap(), r);
    }

    #[test]
    fn login_rsp_rej_round_trip(d in any::<i32>(), tag in any::<u64>(), a in any::<u32>(), b in any::<u32>(),
                                fmt in any::<u16>(), flags in any::<u8>(), reason in any::<u32>()) {
        let rsp = LoginRsp { req_lim_delta: d, tag, max_it_iu_len: a, max_ti_iu_len: b,
                             buf_fmt: BufFormats(fmt), rsp_flags: flags };
        prop_assert_eq!(parse_login_reply(&rsp.encode()).unwrap(), LoginReply::Accepted(rsp));
        let rej = LoginRej { reason: LoginRejReason::from_code(reason), tag, buf_fmt: BufFormats(fmt) };
        prop_assert_eq!(parse_login_reply(&rej.encode()).unwrap(), LoginReply::Rejected(rej));
    }

    #[test]
    fn cmd_round_trips(tag in any::<u64>(), lun in lun(), attr in task_attr(), sol in any::<u8>(),
                       cdb in proptest::collection::vec(any::<u8>(), 1..64),
                       out_kind in 0u8..4, in_kind in 0u8..3, d1 in direct(), d2 in direct(),
                       inline in proptest::collection::vec(direct(), 0..8), extra in 0u32..4,
                       total in any::<u32>(), imm in proptest::collection::vec(any::<u8>(), 0..64)) {
        // cdbs longer than 16 bytes must be a multiple of 4 past 16 to round-trip exactly
        // (the CDB field holds 16 bytes, so shorter CDBs decode zero-padded to 16)
        let cdb_len = if cdb.len() > 16 { 16 + (cdb.len() - 16) / 4 * 4 } else { 16 };
        let mut cdb = cdb.clone();
        cdb.resize(cdb_len.max(cdb.len()), 0);
        let cdb = &cdb[..cdb_len];
        let table = DirectBuf { len: ((inline.len() as u32) + extra) * 16, ..d2 };
        let mk = |k: u8, d: DirectBuf| match k {
            0 => DataDesc::None,
            1 => DataDesc::Direct(d),
            2 => DataDesc::Indirect { table, total_len: total, inline: DescList::Native(&inline) },
            _ => DataDesc::Immediate { len: imm.len() as u32 },
        };
        let mut cmd = SrpCmd::new(tag, lun, cdb).data_out(mk(out_kind, d1)).data_in(mk(in_kind, d2));
        cmd.task_attr = attr;
        cmd.sol_not = sol;
        let desc_len = |k: u8| match k { 0 => 0, 1 => 16, 2 => 20 + 16 * inline.len(), _ => 4 };
        let desc_end = 48 + cdb_len.saturating_sub(16) + desc_len(out_kind) + desc_len(in_kind);
        let imm_off = 68usize.max(desc_end);
        let mut buf = vec![0u8; 1024];
        let n = cmd.encode(&mut buf, imm_off).unwrap();
        let mut total_len = n;
        if out_kind == 3 {
            buf[n..n + imm.len()].copy_from_slice(&imm);
            total_len += imm.len();
        }
        let p = ParsedCmd::parse(&buf[..total_len], imm_off).unwrap();
        prop_assert_eq!(p.cmd, cmd);
        if out_kind == 3 { prop_assert_eq!(p.immediate, &imm[..]); }
        match parse_initiator_iu(&buf[..total_len], imm_off).unwrap() {
            InitiatorIu::Cmd(c) => prop_assert_eq!(c, p),
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn rsp_round_trips(sol in any::<u8>(), d in any::<i32>(), tag in any::<u64>(), flags in any::<u8>(),
                       status in any::<u8>(), a in any::<u32>(), b in any::<u32>(),
                       resp in proptest::collection::vec(any::<u8>(), 0..8),
                       sense in proptest::collection::vec(any::<u8>(), 0..96)) {
        let flags = RspFlags(flags & !(RspFlags::RSPVALID | RspFlags::SNSVALID)
            | if resp.is_empty() { 0 } else { RspFlags::RSPVALID }
            | if sense.is_empty() { 0 } else { RspFlags::SNSVALID });
        let r = SrpRsp { sol_not: sol, req_lim_delta: d, tag, flags, status, data_out_res_cnt: a,
                         data_in_res_cnt: b, resp_data: &resp, sense: &sense };
        let mut buf = [0u8; 256];
        let n = r.encode(&mut buf).unwrap();
        prop_assert_eq!(parse_target_iu(&buf[..n]).unwrap(), TargetIu::Rsp(r));
    }

    #[test]
    fn small_ius_round_trip(sol in any::<u8>(), d in any::<i32>(), tag in any::<u64>(), lun in lun(),
                            func in any::<u8>(), task in any::<u64>(), reason in any::<u32>(),
                            sense in proptest::collection::vec(any::<u8>(), 0..64)) {
        let t = TskMgmt { sol_not: sol, tag, lun, func: TskMgmtFunc::from_code(func), task_tag: task };
        let tb = t.encode();
        prop_assert_eq!(parse_initiator_iu(&tb, 68).unwrap(), InitiatorIu::TskMgmt(t));
        let c = CredReq { sol_not: sol, req_lim_delta: d, tag };
        let cb = c.encode();
        prop_assert_eq!(parse_target_iu(&cb).unwrap(), TargetIu::CredReq(c));
        let l = TLogout { sol_not: sol, reason: TLogoutReason::from_code(reason), tag };
        let lb = l.encode();
        prop_assert_eq!(parse_target_iu(&lb).unwrap(), TargetIu::TLogout(l));
        let a = AerReq { sol_not: sol, req_lim_delta: d, tag, lun, sense: &sense };
        let mut buf = [0u8; 128];
        let n = a.encode(&mut buf).unwrap();
        prop_assert_eq!(parse_target_iu(&buf[..n]).unwrap(), TargetIu::AerReq(a));
        for (mk, want) in [(TagOnly::i_logout as fn(u64) -> TagOnly, "ilogout"),
                           (TagOnly::cred_rsp, "credrsp"), (TagOnly::aer_rsp, "aerrsp")] {
            let x = mk(tag);
            let xb = x.encode();
            let got = parse_initiator_iu(&xb, 68).unwrap();
            let ok = matches!((want, got), ("ilogout", InitiatorIu::ILogout(y)) | ("credrsp", InitiatorIu::CredRsp(y))
                              | ("aerrsp", InitiatorIu::AerRsp(y)) if y == x);
            prop_assert!(ok);
        }
    }

    #[test]
    fn decoders_are_total(bytes in proptest::collection::vec(any::<u8>(), 0..300), off in 0usize..400) {
        let _ = parse_target_iu(&bytes);
        let _ = parse_initiator_iu(&bytes, off);
        let _ = parse_login_reply(&bytes);
        let _ = LoginReq::parse_ib(&bytes);
        let _ = LoginReq::parse_rdma(&bytes);
        let _ = Sense::parse(&bytes).map(|s| scsi::classify(scsi::ScsiStatus::CheckCondition, Some(&s)));
        let _ = StandardInquiry::parse(&bytes);
        let _ = Capacity::parse(&bytes).map(|c| (c.bytes(), c.physical_block_len()));
        let _ = ModeSense10::parse(&bytes).map(|m| m.caching());
        let _ = ReportLuns::parse(&bytes).map(|r| r.luns().count());
        let _ = vpd::serial_number(&bytes);
        if let Ok(ds) = vpd::designators(&bytes) {
            for d in ds {
                let _ = vpd::scsi_id_serial(&d);
            }
        }
        let _ = vpd::BlockLimits::parse(&bytes);
        let _ = vpd::Provisioning::parse(&bytes);
    }

    #[test]
    fn opcode_led_decoders_are_total(op in prop::sample::select(vec![0x00u8, 0x01, 0x02, 0x03, 0x41, 0x42, 0x80, 0x81, 0x82, 0xc0, 0xc1, 0xc2]),
                                     rest in proptest::collection::vec(any::<u8>(), 0..300), off in 0usize..400) {
        let mut b = vec![op];
        b.extend_from_slice(&rest);
        let _ = parse_target_iu(&b);
        let _ = parse_initiator_iu(&b, off);
        let _ = parse_login_reply(&b);
    }

    #[test]
    fn target_strings_are_total(s in "[a-z_=0-9x:.,\\[\\]\n]{0,120}") {
        if let Ok(t) = TargetSpec::parse(&s) {
            // the normalized form reads back as the same target
            prop_assert_eq!(TargetSpec::parse(&t.to_string()).unwrap(), t);
        }
        let _ = Rules::parse(&s);
    }

    #[test]
    fn target_strings_with_real_keys(id in any::<u64>(), ioc in any::<u64>(), port in 1u16..,
                                     ip in any::<[u8; 4]>(), qs in 1u32..100000, ch in 1u32..64) {
        let s = format!("id_ext={id:x},ioc_guid={ioc:X},dest={}.{}.{}.{}:{port},queue_size={qs},ch_count={ch}",
                        ip[0], ip[1], ip[2], ip[3]);
        let t = TargetSpec::parse(&s).unwrap();
        prop_assert_eq!((t.id_ext, t.ioc_guid, t.opts.queue_size, t.opts.ch_count), (id, ioc, Some(qs), Some(ch)));
        prop_assert_eq!(TargetSpec::parse(&t.to_string()).unwrap(), t);
    }

    #[test]
    fn mad_decoders_are_total(b in proptest::collection::vec(any::<u8>(), 0..600), n in 0usize..6) {
        use srp_ublk::wire::mad;
        let _ = mad::parse_response(&b, mad::CLASS_DM, mad::ATTR_IO_UNIT_INFO);
        if let Ok(recs) = mad::sa_records(&b) {
            for r in recs {
                let _ = (mad::port_info(r), mad::node_port_guid(r), mad::path_pkey(r));
            }
        }
        let _ = mad::iou_info(&b).map(|i| i.present().count());
        let _ = mad::ioc_profile(&b);
        let _ = mad::service_entries(&b, n).map(|e| e.iter().filter(|x| x.srp_id_ext().is_some()).count());
    }

    #[test]
    fn srp_daemon_lines_are_target_strings(id in any::<u64>(), guid in any::<u64>(), prefix in any::<u64>(),
                                           port in any::<u64>(), pkey in any::<u16>(), sid in any::<u64>(),
                                           class in prop_oneof![Just(0x0100u16), Just(0xff00u16)]) {
        use srp_ublk::wire::mad;
        let ioc = mad::IocProfile { guid, vendor_id: 0, device_id: 0, io_class: class, send_size: 0,
                                    service_entries: 1, id: String::new() };
        let line = mad::srp_daemon_line(&format!("{id:016x}"), &ioc, prefix, port, pkey, sid);
        let t = TargetSpec::parse(&line).unwrap();
        prop_assert_eq!((t.id_ext, t.ioc_guid), (id, guid));
    }
}
