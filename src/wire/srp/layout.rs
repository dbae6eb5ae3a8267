//! The SRP IUs as the wire lays them out, field for field after Linux `include/scsi/srp.h`.
//!
//! Private to the wire module: callers see the native-typed structs in the sibling modules. Every
//! multi-byte field is big-endian (`zerocopy::big_endian`), every struct is `Unaligned` (no padding),
//! and the size of each is asserted at compile time; `tests` pins every field offset.
//!
//! Tags are opaque to the target (LIO echoes the 8 bytes, never swaps them); we store them big-endian.

use zerocopy::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

macro_rules! wire_struct {
    ($(#[$m:meta])* $name:ident, $size:expr, { $($(#[$fm:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
        pub(crate) struct $name { $($(#[$fm])* pub(crate) $field: $ty),* }
        const _: () = assert!(core::mem::size_of::<$name>() == $size);
    };
}

wire_struct!(
    /// SRP_LOGIN_REQ (IB CM private data), 64 bytes.
    RawLoginReq, 64, {
    opcode: u8, reserved1: [u8; 7], tag: U64, req_it_iu_len: U32, reserved2: [u8; 4],
    req_buf_fmt: U16, req_flags: u8, reserved3: u8, imm_data_offset: U16, reserved4: [u8; 2],
    initiator_port_id: [u8; 16], target_port_id: [u8; 16],
});

wire_struct!(
    /// `struct srp_login_req_rdma`: the login as RDMA/CM private data (92 - 36 = 56 bytes).
    RawLoginReqRdma, 56, {
    tag: U64, req_buf_fmt: U16, req_flags: u8, opcode: u8, req_it_iu_len: U32,
    initiator_port_id: [u8; 16], target_port_id: [u8; 16], imm_data_offset: U16, reserved: [u8; 6],
});

wire_struct!(
    /// SRP_LOGIN_RSP, 52 bytes.
    RawLoginRsp, 52, {
    opcode: u8, reserved1: [u8; 3], req_lim_delta: U32, tag: U64, max_it_iu_len: U32,
    max_ti_iu_len: U32, buf_fmt: U16, rsp_flags: u8, reserved2: [u8; 25],
});

wire_struct!(
    /// SRP_LOGIN_REJ, 32 bytes.
    RawLoginRej, 32, {
    opcode: u8, reserved1: [u8; 3], reason: U32, tag: U64, reserved2: [u8; 8], buf_fmt: U16,
    reserved3: [u8; 6],
});

wire_struct!(
    /// SRP_I_LOGOUT, SRP_CRED_RSP and SRP_AER_RSP share this 16-byte shape.
    RawTagOnly, 16, { opcode: u8, reserved: [u8; 7], tag: U64 });

wire_struct!(
    /// SRP_T_LOGOUT, 16 bytes.
    RawTLogout, 16, { opcode: u8, sol_not: u8, reserved: [u8; 2], reason: U32, tag: U64 });

wire_struct!(
    /// SRP_CRED_REQ, 16 bytes.
    RawCredReq, 16, { opcode: u8, sol_not: u8, reserved: [u8; 2], req_lim_delta: U32, tag: U64 });

wire_struct!(
    /// SRP_AER_REQ fixed part, 36 bytes; sense data follows.
    RawAerReq, 36, {
    opcode: u8, sol_not: u8, reserved: [u8; 2], req_lim_delta: U32, tag: U64, reserved2: [u8; 4],
    lun: [u8; 8], sense_data_len: U32, reserved3: [u8; 4],
});

wire_struct!(
    /// SRP_TSK_MGMT, 48 bytes.
    RawTskMgmt, 48, {
    opcode: u8, sol_not: u8, reserved1: [u8; 6], tag: U64, reserved2: [u8; 4], lun: [u8; 8],
    reserved3: [u8; 2], tsk_mgmt_func: u8, reserved4: u8, task_tag: U64, reserved5: [u8; 8],
});

wire_struct!(
    /// SRP_CMD fixed part, 48 bytes; additional CDB, descriptors and immediate data follow.
    RawCmd, 48, {
    opcode: u8, sol_not: u8, reserved1: [u8; 3], buf_fmt: u8, data_out_desc_cnt: u8,
    data_in_desc_cnt: u8, tag: U64, reserved2: [u8; 4], lun: [u8; 8], reserved3: u8, task_attr: u8,
    reserved4: u8, add_cdb_len: u8, cdb: [u8; 16],
});

wire_struct!(
    /// SRP_RSP fixed part, 36 bytes; response data then sense data follow.
    RawRsp, 36, {
    opcode: u8, sol_not: u8, reserved1: [u8; 2], req_lim_delta: U32, tag: U64, reserved2: [u8; 2],
    flags: u8, status: u8, data_out_res_cnt: U32, data_in_res_cnt: U32, sense_data_len: U32,
    resp_data_len: U32,
});

wire_struct!(
    /// `struct srp_direct_buf`: one memory descriptor, 16 bytes.
    RawDirectBuf, 16, { va: U64, key: U32, len: U32 });

wire_struct!(
    /// `struct srp_indirect_buf` header: the table descriptor and the total length, 20 bytes.
    RawIndirectHdr, 20, { table_desc: RawDirectBuf, len: U32 });

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    /// Offsets from `include/scsi/srp.h` and docs/srp-wire notes, field by field.
    #[test]
    fn field_offsets_match_srp_h() {
        assert_eq!(offset_of!(RawLoginReq, tag), 8);
        assert_eq!(offset_of!(RawLoginReq, req_it_iu_len), 16);
        assert_eq!(offset_of!(RawLoginReq, req_buf_fmt), 24);
        assert_eq!(offset_of!(RawLoginReq, req_flags), 26);
        assert_eq!(offset_of!(RawLoginReq, imm_data_offset), 28);
        assert_eq!(offset_of!(RawLoginReq, initiator_port_id), 32);
        assert_eq!(offset_of!(RawLoginReq, target_port_id), 48);

        assert_eq!(offset_of!(RawLoginReqRdma, tag), 0);
        assert_eq!(offset_of!(RawLoginReqRdma, req_buf_fmt), 8);
        assert_eq!(offset_of!(RawLoginReqRdma, req_flags), 10);
        assert_eq!(offset_of!(RawLoginReqRdma, opcode), 11);
        assert_eq!(offset_of!(RawLoginReqRdma, req_it_iu_len), 12);
        assert_eq!(offset_of!(RawLoginReqRdma, initiator_port_id), 16);
        assert_eq!(offset_of!(RawLoginReqRdma, target_port_id), 32);
        assert_eq!(offset_of!(RawLoginReqRdma, imm_data_offset), 48);
        assert_eq!(offset_of!(RawLoginReqRdma, reserved), 50);

        assert_eq!(offset_of!(RawLoginRsp, req_lim_delta), 4);
        assert_eq!(offset_of!(RawLoginRsp, tag), 8);
        assert_eq!(offset_of!(RawLoginRsp, max_it_iu_len), 16);
        assert_eq!(offset_of!(RawLoginRsp, max_ti_iu_len), 20);
        assert_eq!(offset_of!(RawLoginRsp, buf_fmt), 24);
        assert_eq!(offset_of!(RawLoginRsp, rsp_flags), 26);

        assert_eq!(offset_of!(RawLoginRej, reason), 4);
        assert_eq!(offset_of!(RawLoginRej, tag), 8);
        assert_eq!(offset_of!(RawLoginRej, buf_fmt), 24);

        assert_eq!(offset_of!(RawTagOnly, tag), 8);
        assert_eq!(offset_of!(RawTLogout, sol_not), 1);
        assert_eq!(offset_of!(RawTLogout, reason), 4);
        assert_eq!(offset_of!(RawTLogout, tag), 8);
        assert_eq!(offset_of!(RawCredReq, req_lim_delta), 4);
        assert_eq!(offset_of!(RawCredReq, tag), 8);

        assert_eq!(offset_of!(RawAerReq, req_lim_delta), 4);
        assert_eq!(offset_of!(RawAerReq, tag), 8);
        assert_eq!(offset_of!(RawAerReq, lun), 20);
        assert_eq!(offset_of!(RawAerReq, sense_data_len), 28);

        assert_eq!(offset_of!(RawTskMgmt, sol_not), 1);
        assert_eq!(offset_of!(RawTskMgmt, tag), 8);
        assert_eq!(offset_of!(RawTskMgmt, lun), 20);
        assert_eq!(offset_of!(RawTskMgmt, tsk_mgmt_func), 30);
        assert_eq!(offset_of!(RawTskMgmt, task_tag), 32);

        assert_eq!(offset_of!(RawCmd, sol_not), 1);
        assert_eq!(offset_of!(RawCmd, buf_fmt), 5);
        assert_eq!(offset_of!(RawCmd, data_out_desc_cnt), 6);
        assert_eq!(offset_of!(RawCmd, data_in_desc_cnt), 7);
        assert_eq!(offset_of!(RawCmd, tag), 8);
        assert_eq!(offset_of!(RawCmd, lun), 20);
        assert_eq!(offset_of!(RawCmd, task_attr), 29);
        assert_eq!(offset_of!(RawCmd, add_cdb_len), 31);
        assert_eq!(offset_of!(RawCmd, cdb), 32);

        assert_eq!(offset_of!(RawRsp, req_lim_delta), 4);
        assert_eq!(offset_of!(RawRsp, tag), 8);
        assert_eq!(offset_of!(RawRsp, flags), 18);
        assert_eq!(offset_of!(RawRsp, status), 19);
        assert_eq!(offset_of!(RawRsp, data_out_res_cnt), 20);
        assert_eq!(offset_of!(RawRsp, data_in_res_cnt), 24);
        assert_eq!(offset_of!(RawRsp, sense_data_len), 28);
        assert_eq!(offset_of!(RawRsp, resp_data_len), 32);

        assert_eq!(offset_of!(RawDirectBuf, key), 8);
        assert_eq!(offset_of!(RawDirectBuf, len), 12);
        assert_eq!(offset_of!(RawIndirectHdr, len), 16);
    }
}
