//! Criterion benchmarks of the per-I/O wire work: encoding an SRP_CMD for a 4 KiB READ(16) with a
#![allow(missing_docs)] // criterion_group! generates undocumented items
//! direct descriptor, and decoding the SRP_RSP that answers it (`just bench-wire`).

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use srp_ublk::wire::scsi::{classify, Cdb, ScsiStatus};
use srp_ublk::wire::srp::{
    parse_target_iu, DataDesc, DirectBuf, ScsiLun, SrpCmd, SrpRsp, TargetIu,
};

fn encode_read_cmd(c: &mut Criterion) {
    let mut iu = [0u8; 128];
    let lun = ScsiLun::from_int(0);
    c.bench_function("srp_cmd_encode_read16_4k_direct", |b| {
        let mut lba = 0u64;
        b.iter(|| {
            lba = lba.wrapping_add(8) & 0xffff;
            let cdb = Cdb::read16(black_box(lba), 8, false);
            let d = DirectBuf {
                va: 0x7f00_0000_0000 + lba * 512,
                key: 0x1234,
                len: 4096,
            };
            let cmd = SrpCmd::new(black_box(lba), lun, cdb.as_slice()).data_in(DataDesc::Direct(d));
            black_box(cmd.encode(&mut iu, 68).unwrap())
        })
    });
}

fn decode_rsp(c: &mut Criterion) {
    let rsp = SrpRsp::good(42, 1);
    let mut iu = [0u8; 64];
    let n = rsp.encode(&mut iu).unwrap();
    c.bench_function("srp_rsp_decode_good", |b| {
        b.iter(|| match parse_target_iu(black_box(&iu[..n])).unwrap() {
            TargetIu::Rsp(r) => black_box(classify(ScsiStatus::from(r.status), None)),
            _ => unreachable!(),
        })
    });
}

criterion_group!(benches, encode_read_cmd, decode_rsp);
criterion_main!(benches);
