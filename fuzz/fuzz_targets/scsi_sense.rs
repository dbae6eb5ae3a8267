//! Sense decoding and classification, and every SCSI parameter-data parser, on arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use srp_ublk::wire::scsi::{
    classify, vpd, Capacity, ModeSense10, ReportLuns, ScsiStatus, Sense, StandardInquiry,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Sense::parse(data) {
        let d = classify(ScsiStatus::CheckCondition, Some(&s));
        assert!(d.errno >= 0);
        let _ = s.to_string();
    }
    let _ = StandardInquiry::parse(data);
    let _ = Capacity::parse(data).map(|c| (c.bytes(), c.physical_block_len(), c.block_len_ok()));
    let _ = ModeSense10::parse(data).map(|m| m.caching());
    let _ = ReportLuns::parse(data).map(|r| r.luns().count());
    let _ = vpd::serial_number(data);
    let _ = vpd::preferred_lu_designator(data).map(|d| d.map(|x| vpd::scsi_id_serial(&x)));
    let _ = vpd::BlockLimits::parse(data);
    let _ = vpd::Provisioning::parse(data);
});
