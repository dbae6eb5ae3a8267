//! SRP_RSP: status, residuals, credits, then response data and sense data (SRP r16a 6.9).

use super::layout::RawRsp;
use super::{expect_opcode, opcode, size};
use crate::wire::{room, WireError};
use zerocopy::{FromBytes, IntoBytes};

/// Task management "function complete" (response data byte 3).
pub const TSK_MGMT_COMPLETE: u8 = 0x00;

/// SRP_RSP `flags`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RspFlags(pub u8);

impl RspFlags {
    /// Response data present (task management responses, transport failures).
    pub const RSPVALID: u8 = 1 << 0;
    /// Sense data present.
    pub const SNSVALID: u8 = 1 << 1;
    /// Data-out overflow: the target wanted more than the descriptor gave.
    pub const DOOVER: u8 = 1 << 2;
    /// Data-out underflow.
    pub const DOUNDER: u8 = 1 << 3;
    /// Data-in overflow.
    pub const DIOVER: u8 = 1 << 4;
    /// Data-in underflow: fewer bytes than asked were transferred.
    pub const DIUNDER: u8 = 1 << 5;
    /// Whether `bit` is set.
    pub fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
}

/// A decoded SRP_RSP; response and sense data borrow the received IU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrpRsp<'a> {
    /// Solicited notification bits.
    pub sol_not: u8,
    /// Credits returned (signed, SRP r16a).
    pub req_lim_delta: i32,
    /// The command's (or task management request's) tag.
    pub tag: u64,
    /// Flags.
    pub flags: RspFlags,
    /// SCSI status byte.
    pub status: u8,
    /// Data-out residual count.
    pub data_out_res_cnt: u32,
    /// Data-in residual count.
    pub data_in_res_cnt: u32,
    /// Response data (present when RSPVALID).
    pub resp_data: &'a [u8],
    /// Sense data (present when SNSVALID).
    pub sense: &'a [u8],
}

const WHAT: &str = "SRP_RSP";

impl SrpRsp<'static> {
    /// A GOOD status response with no response or sense data, returning `req_lim_delta` credits
    /// (what a target sends for a command that succeeded; for test targets and benchmarks).
    pub fn good(tag: u64, req_lim_delta: i32) -> Self {
        SrpRsp {
            sol_not: 0,
            req_lim_delta,
            tag,
            flags: RspFlags(0),
            status: 0,
            data_out_res_cnt: 0,
            data_in_res_cnt: 0,
            resp_data: &[],
            sense: &[],
        }
    }
}

impl<'a> SrpRsp<'a> {
    /// Decodes an SRP_RSP, checking that the response and sense lengths fit in the IU. As in ib_srp,
    /// sense data starts after `resp_data_len` bytes of response data.
    pub fn parse(iu: &'a [u8]) -> Result<Self, WireError> {
        expect_opcode(WHAT, iu, opcode::RSP)?;
        let (r, rest) = RawRsp::ref_from_prefix(iu).map_err(|_| WireError::Truncated {
            what: WHAT,
            need: size::RSP,
            got: iu.len(),
        })?;
        let flags = RspFlags(r.flags);
        let resp_len = r.resp_data_len.get() as usize;
        let sense_len = r.sense_data_len.get() as usize;
        let (resp_part, after) = if flags.has(RspFlags::RSPVALID) {
            if resp_len > rest.len() {
                return Err(WireError::Truncated {
                    what: "SRP_RSP response data",
                    need: size::RSP.saturating_add(resp_len),
                    got: iu.len(),
                });
            }
            rest.split_at(resp_len)
        } else {
            (&rest[..0], rest)
        };
        let sense = if flags.has(RspFlags::SNSVALID) {
            if sense_len > after.len() {
                return Err(WireError::Truncated {
                    what: "SRP_RSP sense data",
                    need: size::RSP
                        .saturating_add(resp_part.len())
                        .saturating_add(sense_len),
                    got: iu.len(),
                });
            }
            &after[..sense_len]
        } else {
            &after[..0]
        };
        Ok(SrpRsp {
            sol_not: r.sol_not,
            req_lim_delta: r.req_lim_delta.get() as i32,
            tag: r.tag.get(),
            flags,
            status: r.status,
            data_out_res_cnt: r.data_out_res_cnt.get(),
            data_in_res_cnt: r.data_in_res_cnt.get(),
            resp_data: resp_part,
            sense,
        })
    }

    /// The task management response code (response data byte 3), when there is response data.
    pub fn tsk_mgmt_status(&self) -> Option<u8> {
        if self.flags.has(RspFlags::RSPVALID) && self.resp_data.len() >= 4 {
            Some(self.resp_data[3])
        } else {
            None
        }
    }

    /// Encoded length.
    pub fn encoded_len(&self) -> usize {
        size::RSP + self.resp_data.len() + self.sense.len()
    }

    /// Encodes the IU into `out` (for test targets). RSPVALID / SNSVALID follow the data given.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let n = self.encoded_len();
        room(WHAT, out, n)?;
        let mut flags = self.flags.0 & !(RspFlags::RSPVALID | RspFlags::SNSVALID);
        if !self.resp_data.is_empty() {
            flags |= RspFlags::RSPVALID;
        }
        if !self.sense.is_empty() {
            flags |= RspFlags::SNSVALID;
        }
        let raw = RawRsp {
            opcode: opcode::RSP,
            sol_not: self.sol_not,
            req_lim_delta: (self.req_lim_delta as u32).into(),
            tag: self.tag.into(),
            flags,
            status: self.status,
            data_out_res_cnt: self.data_out_res_cnt.into(),
            data_in_res_cnt: self.data_in_res_cnt.into(),
            sense_data_len: (self.sense.len() as u32).into(),
            resp_data_len: (self.resp_data.len() as u32).into(),
            ..Default::default()
        };
        out[..size::RSP].copy_from_slice(raw.as_bytes());
        let r_end = size::RSP + self.resp_data.len();
        out[size::RSP..r_end].copy_from_slice(self.resp_data);
        out[r_end..n].copy_from_slice(self.sense);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::wire::hex;

    /// A good response as LIO sends it (36 bytes, one credit back; userspace-login NOTES step 3).
    #[test]
    fn good_status_from_lio() {
        let iu = hex(
            "c1000000 00000001 0000000000001000 0000 00 00 00000000 00000000 00000000 00000000",
        );
        let r = SrpRsp::parse(&iu).unwrap();
        assert_eq!((r.req_lim_delta, r.tag, r.status), (1, 0x1000, 0));
        assert!(r.sense.is_empty() && r.resp_data.is_empty());
    }

    /// CHECK CONDITION with LIO's 96 bytes of sense (132-byte IU) and a LUN RESET answer (40 bytes).
    #[test]
    fn sense_and_task_management_response() {
        let mut sense = [0u8; 96];
        sense[0] = 0x70;
        sense[2] = 0x05;
        sense[7] = 10;
        sense[12] = 0x21;
        let rsp = SrpRsp {
            sol_not: 0,
            req_lim_delta: 1,
            tag: 5,
            flags: RspFlags(0),
            status: 2,
            data_out_res_cnt: 0,
            data_in_res_cnt: 0,
            resp_data: &[],
            sense: &sense,
        };
        let mut buf = [0u8; 256];
        let n = rsp.encode(&mut buf).unwrap();
        assert_eq!(n, 132);
        assert_eq!(buf[18], RspFlags::SNSVALID);
        assert_eq!(&buf[28..32], &96u32.to_be_bytes());
        let p = SrpRsp::parse(&buf[..n]).unwrap();
        assert_eq!(p.sense, &sense[..]);
        let tmf = SrpRsp {
            status: 0,
            resp_data: &[0, 0, 0, 0],
            sense: &[],
            ..rsp
        };
        let n = tmf.encode(&mut buf).unwrap();
        assert_eq!(n, 40);
        assert_eq!(
            SrpRsp::parse(&buf[..n]).unwrap().tsk_mgmt_status(),
            Some(TSK_MGMT_COMPLETE)
        );
    }

    #[test]
    fn lengths_past_the_iu_are_errors() {
        let mut iu = [0u8; 40];
        iu[0] = 0xc1;
        iu[18] = RspFlags::SNSVALID;
        iu[28..32].copy_from_slice(&5u32.to_be_bytes());
        assert!(SrpRsp::parse(&iu).is_err());
        iu[28..32].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(SrpRsp::parse(&iu).is_err());
        iu[18] = RspFlags::RSPVALID | RspFlags::SNSVALID;
        iu[28..32].copy_from_slice(&2u32.to_be_bytes());
        iu[32..36].copy_from_slice(&3u32.to_be_bytes());
        assert!(SrpRsp::parse(&iu).is_err(), "3 + 2 bytes do not fit in 4");
        iu[32..36].copy_from_slice(&2u32.to_be_bytes());
        let r = SrpRsp::parse(&iu).unwrap();
        assert_eq!((r.resp_data.len(), r.sense.len()), (2, 2));
        // lengths without their VALID flag are ignored, as ib_srp does
        iu[18] = 0;
        iu[28..32].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(SrpRsp::parse(&iu).unwrap().sense.is_empty());
    }
}
