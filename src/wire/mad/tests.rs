//! Byte tests of the MAD codecs against the layouts of IBTA vol. 1 and rdma-core's srp_daemon.h /
//! umad_sa.h / umad_dm.h: every request byte that matters at its offset, responses built byte for
//! byte at the spec's offsets and decoded.

use super::*;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn struct_sizes_are_the_c_ones() {
    // srp_sa_port_info_rec 58 (packed), srp_sa_node_rec 108, ib_path_rec 64, srp_dm_iou_info 132,
    // srp_dm_ioc_prof 128, srp_dm_svc_entries 4 x 48, ib_sa_mad_t header 56, srp_dm_mad header 64
    assert_eq!(core::mem::size_of::<RawPortInfoRecord>(), 58);
    assert_eq!(core::mem::size_of::<RawNodeRecord>(), 108);
    assert_eq!(core::mem::size_of::<RawPathRecord>(), 64);
    assert_eq!(core::mem::size_of::<RawIouInfo>(), 132);
    assert_eq!(core::mem::size_of::<RawIocProfile>(), 128);
    assert_eq!(core::mem::size_of::<RawServiceEntry>() * 4, 192);
    assert_eq!(24 + core::mem::size_of::<RawSaHdr>(), SA_DATA);
    assert_eq!(DM_DATA + 192, MAD_SIZE);
}

#[test]
fn dm_port_query_bytes() {
    let m = query_dm_ports(0x1234);
    assert_eq!(m.len(), 256);
    // common header: base version 1, class SA, class version 2, SubnAdmGetTable
    assert_eq!(&m[..4], &[1, 0x03, 2, 0x12]);
    assert_eq!(be16(&m, 4), 0, "status");
    assert_eq!(be64(&m, 8), 0x1234, "tid");
    assert_eq!(be16(&m, 16), 0x0012, "attr_id PortInfoRecord");
    assert_eq!(
        be32(&m, 20),
        0x8000_0000,
        "attr_mod: match the capability mask bits"
    );
    // RMPP header: version 1, type 1 (DATA), flags 0 (the kernel sets Active), status 0
    assert_eq!(&m[24..28], &[1, 1, 0, 0]);
    assert_eq!(be64(&m, 36), 0, "SM_Key");
    assert_eq!(be64(&m, 48), 1 << 7, "ComponentMask: CapabilityMask");
    // the record: CapabilityMask at record offset 24 (lid 2, port 1, rsvd 1, m_key 8, prefix 8,
    // base lid 2, master SM lid 2) = MAD offset 80, IsDM = bit 19
    assert_eq!(be32(&m, 80), 0x0008_0000);
    assert!(m[SA_DATA..80].iter().all(|&b| b == 0));
    assert!(m[84..].iter().all(|&b| b == 0));
}

#[test]
fn node_and_path_query_bytes() {
    let m = query_node(7, 0x0042);
    assert_eq!(&m[..4], &[1, 0x03, 2, 0x01], "SubnAdmGet");
    assert_eq!(be16(&m, 16), 0x0011, "NodeRecord");
    assert_eq!(&m[24..28], &[0, 0, 0, 0], "no RMPP for a Get");
    assert_eq!(be64(&m, 48), 1, "ComponentMask: LID");
    assert_eq!(be16(&m, 56), 0x0042, "NodeRecord.LID");

    let p = query_path(8, 0x0001, 0x0042, 0xffff);
    assert_eq!(&p[..4], &[1, 0x03, 2, 0x12]);
    assert_eq!(be16(&p, 16), 0x0035, "PathRecord");
    assert_eq!(be64(&p, 48), 0x2030, "ComponentMask: DLID, SLID, P_Key");
    // PathRecord: ServiceID 8, DGID 16, SGID 16 -> DLID at 40, SLID at 42; P_Key at 50
    assert_eq!(be16(&p, SA_DATA + 40), 0x0042);
    assert_eq!(be16(&p, SA_DATA + 42), 0x0001);
    assert_eq!(be16(&p, SA_DATA + 50), 0xffff);
}

#[test]
fn dm_get_bytes() {
    let m = dm_get(9, ATTR_SERVICE_ENTRIES, service_entries_mod(2, 4, 7));
    assert_eq!(&m[..4], &[1, 0x06, 1, 0x01], "DevMgtGet, class version 1");
    assert_eq!(be16(&m, 16), 0x0012);
    // srp_daemon: (ioc << 16) | (end << 8) | start
    assert_eq!(be32(&m, 20), 0x0002_0704);
    assert!(m[24..].iter().all(|&b| b == 0));
}

/// A response MAD: `req` turned around with method | 0x80 and `status`.
fn response(req: &[u8; 256], status: u16) -> Vec<u8> {
    let mut r = req.to_vec();
    r[3] |= 0x80;
    r[4..6].copy_from_slice(&status.to_be_bytes());
    r
}

#[test]
fn responses_are_checked() {
    let req = dm_get(1, ATTR_IO_UNIT_INFO, 0);
    let ok = response(&req, 0);
    assert_eq!(
        parse_response(&ok, CLASS_DM, ATTR_IO_UNIT_INFO)
            .unwrap()
            .tid,
        1
    );
    assert!(
        parse_response(&req, CLASS_DM, ATTR_IO_UNIT_INFO).is_err(),
        "a request is no answer"
    );
    assert!(parse_response(&response(&req, 0x1c), CLASS_DM, ATTR_IO_UNIT_INFO).is_err());
    assert!(parse_response(&ok, CLASS_SA, ATTR_IO_UNIT_INFO).is_err());
    assert!(parse_response(&ok, CLASS_DM, ATTR_SERVICE_ENTRIES).is_err());
    assert!(parse_response(&ok[..10], CLASS_DM, ATTR_IO_UNIT_INFO).is_err());
}

#[test]
fn sa_table_records() {
    // a GetTableResp with two PortInfoRecords of 64 bytes (AttributeOffset 8), RMPP active
    let mut r = response(&query_dm_ports(5), 0);
    r.resize(SA_DATA + 2 * 64, 0);
    r[26] = 1; // RMPP flags: Active
    r[32..36].copy_from_slice(&(20u32 + 128).to_be_bytes()); // PayloadLength
    r[44..46].copy_from_slice(&8u16.to_be_bytes()); // AttributeOffset, in 8-byte words
    for (i, lid) in [0x11u16, 0x22].iter().enumerate() {
        let o = SA_DATA + i * 64;
        r[o..o + 2].copy_from_slice(&lid.to_be_bytes());
        r[o + 12..o + 20].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
        r[o + 24..o + 28].copy_from_slice(&CAP_IS_DM.to_be_bytes());
    }
    let recs: Vec<PortInfo> = sa_records(&r)
        .unwrap()
        .map(|b| port_info(b).unwrap())
        .collect();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[1].lid, 0x22);
    assert_eq!(recs[0].subnet_prefix, 0xfe80_0000_0000_0000);
    assert_eq!(recs[0].capability_mask & CAP_IS_DM, CAP_IS_DM);
    // a PayloadLength smaller than the buffer: only what it covers
    r[32..36].copy_from_slice(&(20u32 + 64).to_be_bytes());
    assert_eq!(sa_records(&r).unwrap().count(), 1);
    // no records (AttributeOffset 0), and a truncated MAD
    r[44..46].copy_from_slice(&[0, 0]);
    assert_eq!(sa_records(&r).unwrap().count(), 0);
    assert!(sa_records(&r[..40]).is_err());
}

#[test]
fn node_and_path_records() {
    let mut rec = [0u8; 112];
    rec[..2].copy_from_slice(&0x42u16.to_be_bytes());
    // NodeRecord: lid 2, rsvd 2, versions/type/ports 4, SystemImageGUID 8, NodeGUID 8, PortGUID at 24
    rec[24..32].copy_from_slice(&0x0002_c903_0001_0203u64.to_be_bytes());
    assert_eq!(node_port_guid(&rec).unwrap(), 0x0002_c903_0001_0203);
    assert!(node_port_guid(&rec[..100]).is_err());
    let mut path = [0u8; 64];
    path[50..52].copy_from_slice(&0x8001u16.to_be_bytes());
    assert_eq!(path_pkey(&path).unwrap(), 0x8001);
}

#[test]
fn io_unit_info_slots() {
    let mut r = response(&dm_get(1, ATTR_IO_UNIT_INFO, 0), 0);
    r[DM_DATA..DM_DATA + 2].copy_from_slice(&0x0007u16.to_be_bytes());
    r[DM_DATA + 2] = 5; // MaxControllers
                        // ControllerList: two slots a byte, the first in the high nibble
    r[DM_DATA + 4] = 0x10; // slot 1 present, slot 2 not installed
    r[DM_DATA + 5] = 0xf1; // slot 3 no slot, slot 4 present
    r[DM_DATA + 6] = 0x30; // slot 5 reserved value 3
    let iou = iou_info(&r).unwrap();
    assert_eq!(iou.change_id, 7);
    assert_eq!(
        iou.slots,
        [
            Slot::Present,
            Slot::NotInstalled,
            Slot::NoSlot,
            Slot::Present,
            Slot::Other(3)
        ]
    );
    assert_eq!(iou.present().collect::<Vec<_>>(), [1, 4]);
    assert!(iou_info(&r[..100]).is_err());
}

/// An IOControllerProfile as a Mellanox/LIO-style SRP target fills it.
fn ioc_response(io_class: u16) -> Vec<u8> {
    let mut r = response(&dm_get(1, ATTR_IO_CONTROLLER_PROFILE, 1), 0);
    let d = DM_DATA;
    r[d..d + 8].copy_from_slice(&0x0002_c903_000f_1234u64.to_be_bytes()); // GUID
    r[d + 8..d + 12].copy_from_slice(&0x0002_c900u32.to_be_bytes()); // VendorID (24 bits, high)
    r[d + 12..d + 16].copy_from_slice(&0x0000_1003u32.to_be_bytes()); // DeviceID
                                                                      // IOClass at 28: GUID 8, vendor 4, device 4, version 2, rsvd 2, subsys vendor 4, subsys id 4
    r[d + 28..d + 30].copy_from_slice(&io_class.to_be_bytes());
    r[d + 32..d + 34].copy_from_slice(&0x0108u16.to_be_bytes()); // Protocol: SRP
    r[d + 44..d + 48].copy_from_slice(&8276u32.to_be_bytes()); // SendMessageSize
    r[d + 54] = 1; // ServiceEntries
    r[d + 64..d + 64 + 19].copy_from_slice(b"Mellanox SRP Target"); // NUL-terminated by the zeros
    r
}

#[test]
fn ioc_profile_fields() {
    let p = ioc_profile(&ioc_response(0x0100)).unwrap();
    assert_eq!(p.guid, 0x0002_c903_000f_1234);
    assert_eq!(p.vendor_id, 0x0002c9, "srp_daemon prints vendor_id >> 8");
    assert_eq!(p.device_id, 0x1003);
    assert_eq!(p.io_class, SRP_REV16A_IO_CLASS);
    assert_eq!(p.send_size, 8276);
    assert_eq!(p.service_entries, 1);
    assert_eq!(p.id, "Mellanox SRP Target");
    assert!(ioc_profile(&ioc_response(0)[..150]).is_err());
}

#[test]
fn service_entries_and_the_srp_daemon_line() {
    let mut r = response(
        &dm_get(1, ATTR_SERVICE_ENTRIES, service_entries_mod(1, 0, 1)),
        0,
    );
    let name = b"SRP.T10:0002C903000F1234";
    r[DM_DATA..DM_DATA + name.len()].copy_from_slice(name);
    r[DM_DATA + 40..DM_DATA + 48].copy_from_slice(&0x0002_c903_000f_1234u64.to_be_bytes());
    let other = b"NFS/RDMA";
    r[DM_DATA + 48..DM_DATA + 48 + other.len()].copy_from_slice(other);
    let e = service_entries(&r, 2).unwrap();
    assert_eq!(e[0].srp_id_ext(), Some("0002C903000F1234"));
    assert_eq!(e[1].srp_id_ext(), None, "not an SRP service");
    assert_eq!(e[0].id, 0x0002_c903_000f_1234);
    assert!(service_entries(&r[..DM_DATA + 50], 2).is_err());

    let ioc = ioc_profile(&ioc_response(0x0100)).unwrap();
    let line = srp_daemon_line(
        e[0].srp_id_ext().unwrap(),
        &ioc,
        0xfe80_0000_0000_0000,
        0x0002_c903_000f_1235,
        0xffff,
        e[0].id,
    );
    // srp_daemon's format: id_ext as the service name gives it, the rest %016llx / %04x
    assert_eq!(
        line,
        "id_ext=0002C903000F1234,ioc_guid=0002c903000f1234,dgid=fe800000000000000002c903000f1235,\
         pkey=ffff,service_id=0002c903000f1234"
    );
    // a rev. 10 target gets io_class, and the line is a valid target string
    let old = ioc_profile(&ioc_response(0xff00)).unwrap();
    let l10 = srp_daemon_line("0002c903000f1234", &old, 0xfe80 << 48, 1, 0xffff, 2);
    assert!(l10.ends_with(",io_class=ff00"), "{l10}");
    let t = crate::wire::target::TargetSpec::parse(&l10).unwrap();
    assert_eq!(t.to_string(), l10);
}
