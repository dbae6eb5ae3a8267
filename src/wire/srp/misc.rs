//! The small IUs: SRP_TSK_MGMT, SRP_I_LOGOUT, SRP_T_LOGOUT, SRP_CRED_REQ/RSP, SRP_AER_REQ/RSP.

use super::layout::{RawAerReq, RawCredReq, RawTLogout, RawTagOnly, RawTskMgmt};
use super::{expect_opcode, opcode, size, ScsiLun};
use crate::wire::WireError;
use zerocopy::{FromBytes, IntoBytes};

fn trunc(what: &'static str, b: &[u8], need: usize) -> WireError {
    WireError::Truncated {
        what,
        need,
        got: b.len(),
    }
}

/// A 16-byte IU that carries only a tag: SRP_I_LOGOUT, SRP_CRED_RSP, SRP_AER_RSP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TagOnly {
    /// Which IU (one of the three opcodes).
    pub opcode: u8,
    /// The tag (for CRED_RSP / AER_RSP: the request's tag).
    pub tag: u64,
}

impl TagOnly {
    /// SRP_I_LOGOUT.
    pub fn i_logout(tag: u64) -> Self {
        TagOnly {
            opcode: opcode::I_LOGOUT,
            tag,
        }
    }
    /// SRP_CRED_RSP answering a CRED_REQ with `tag`.
    pub fn cred_rsp(tag: u64) -> Self {
        TagOnly {
            opcode: opcode::CRED_RSP,
            tag,
        }
    }
    /// SRP_AER_RSP answering an AER_REQ with `tag`.
    pub fn aer_rsp(tag: u64) -> Self {
        TagOnly {
            opcode: opcode::AER_RSP,
            tag,
        }
    }
    /// The 16 bytes.
    pub fn encode(&self) -> [u8; size::SMALL] {
        let raw = RawTagOnly {
            opcode: self.opcode,
            tag: self.tag.into(),
            ..Default::default()
        };
        super::to_array::<{ size::SMALL }>(&raw)
    }
    /// Decodes one of the three, checking the opcode is `expected`.
    pub fn parse(b: &[u8], expected: u8) -> Result<Self, WireError> {
        const WHAT: &str = "SRP_I_LOGOUT/CRED_RSP/AER_RSP";
        expect_opcode(WHAT, b, expected)?;
        let (r, _) = RawTagOnly::ref_from_prefix(b).map_err(|_| trunc(WHAT, b, size::SMALL))?;
        Ok(TagOnly {
            opcode: r.opcode,
            tag: r.tag.get(),
        })
    }
}

/// Task management functions (SRP_TSK_MGMT `tsk_mgmt_func`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TskMgmtFunc {
    /// ABORT TASK (the command named by `task_tag`).
    AbortTask,
    /// ABORT TASK SET.
    AbortTaskSet,
    /// CLEAR TASK SET.
    ClearTaskSet,
    /// LOGICAL UNIT RESET.
    LunReset,
    /// CLEAR ACA.
    ClearAca,
    /// Another value.
    Other(u8),
}

impl TskMgmtFunc {
    /// The function code.
    pub fn code(self) -> u8 {
        match self {
            TskMgmtFunc::AbortTask => 0x01,
            TskMgmtFunc::AbortTaskSet => 0x02,
            TskMgmtFunc::ClearTaskSet => 0x04,
            TskMgmtFunc::LunReset => 0x08,
            TskMgmtFunc::ClearAca => 0x40,
            TskMgmtFunc::Other(c) => c,
        }
    }
    /// Decodes a function code.
    pub fn from_code(c: u8) -> Self {
        match c {
            0x01 => TskMgmtFunc::AbortTask,
            0x02 => TskMgmtFunc::AbortTaskSet,
            0x04 => TskMgmtFunc::ClearTaskSet,
            0x08 => TskMgmtFunc::LunReset,
            0x40 => TskMgmtFunc::ClearAca,
            c => TskMgmtFunc::Other(c),
        }
    }
}

/// SRP_TSK_MGMT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TskMgmt {
    /// Solicited notification bits.
    pub sol_not: u8,
    /// This request's own tag.
    pub tag: u64,
    /// Logical unit.
    pub lun: ScsiLun,
    /// The function.
    pub func: TskMgmtFunc,
    /// For ABORT TASK: the tag of the command to abort.
    pub task_tag: u64,
}

impl TskMgmt {
    /// The 48 bytes.
    pub fn encode(&self) -> [u8; size::TSK_MGMT] {
        let raw = RawTskMgmt {
            opcode: opcode::TSK_MGMT,
            sol_not: self.sol_not,
            tag: self.tag.into(),
            lun: self.lun.0,
            tsk_mgmt_func: self.func.code(),
            task_tag: self.task_tag.into(),
            ..Default::default()
        };
        super::to_array::<{ size::TSK_MGMT }>(&raw)
    }
    /// Decodes SRP_TSK_MGMT.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "SRP_TSK_MGMT";
        expect_opcode(WHAT, b, opcode::TSK_MGMT)?;
        let (r, _) = RawTskMgmt::ref_from_prefix(b).map_err(|_| trunc(WHAT, b, size::TSK_MGMT))?;
        Ok(TskMgmt {
            sol_not: r.sol_not,
            tag: r.tag.get(),
            lun: ScsiLun(r.lun),
            func: TskMgmtFunc::from_code(r.tsk_mgmt_func),
            task_tag: r.task_tag.get(),
        })
    }
}

/// Why a target logs a channel out (SRP_T_LOGOUT `reason`, SRP r16a table 17).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TLogoutReason {
    /// 0: no reason specified.
    NoReason,
    /// 1: inactive RDMA channel (the target reclaims resources).
    Inactive,
    /// 2: invalid IU type received by the target.
    InvalidIuType,
    /// 3: the initiator sent a response with no corresponding request.
    UnexpectedResponse,
    /// 4: disconnected by the multi-channel action of a new login.
    MultiChannelAction,
    /// Another value.
    Other(u32),
}

impl TLogoutReason {
    /// The code.
    pub fn code(self) -> u32 {
        match self {
            TLogoutReason::NoReason => 0,
            TLogoutReason::Inactive => 1,
            TLogoutReason::InvalidIuType => 2,
            TLogoutReason::UnexpectedResponse => 3,
            TLogoutReason::MultiChannelAction => 4,
            TLogoutReason::Other(c) => c,
        }
    }
    /// Decodes a code.
    pub fn from_code(c: u32) -> Self {
        match c {
            0 => TLogoutReason::NoReason,
            1 => TLogoutReason::Inactive,
            2 => TLogoutReason::InvalidIuType,
            3 => TLogoutReason::UnexpectedResponse,
            4 => TLogoutReason::MultiChannelAction,
            c => TLogoutReason::Other(c),
        }
    }
}

/// SRP_T_LOGOUT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TLogout {
    /// Solicited notification bits.
    pub sol_not: u8,
    /// Why.
    pub reason: TLogoutReason,
    /// Tag.
    pub tag: u64,
}

impl TLogout {
    /// The 16 bytes (for test targets).
    pub fn encode(&self) -> [u8; size::SMALL] {
        let raw = RawTLogout {
            opcode: opcode::T_LOGOUT,
            sol_not: self.sol_not,
            reason: self.reason.code().into(),
            tag: self.tag.into(),
            ..Default::default()
        };
        super::to_array::<{ size::SMALL }>(&raw)
    }
    /// Decodes SRP_T_LOGOUT.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "SRP_T_LOGOUT";
        expect_opcode(WHAT, b, opcode::T_LOGOUT)?;
        let (r, _) = RawTLogout::ref_from_prefix(b).map_err(|_| trunc(WHAT, b, size::SMALL))?;
        Ok(TLogout {
            sol_not: r.sol_not,
            reason: TLogoutReason::from_code(r.reason.get()),
            tag: r.tag.get(),
        })
    }
}

/// SRP_CRED_REQ: the target grants `req_lim_delta` more credits; answer with SRP_CRED_RSP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CredReq {
    /// Solicited notification bits.
    pub sol_not: u8,
    /// Credits granted.
    pub req_lim_delta: i32,
    /// Tag to echo in the CRED_RSP.
    pub tag: u64,
}

impl CredReq {
    /// The 16 bytes (for test targets).
    pub fn encode(&self) -> [u8; size::SMALL] {
        let raw = RawCredReq {
            opcode: opcode::CRED_REQ,
            sol_not: self.sol_not,
            req_lim_delta: (self.req_lim_delta as u32).into(),
            tag: self.tag.into(),
            ..Default::default()
        };
        super::to_array::<{ size::SMALL }>(&raw)
    }
    /// Decodes SRP_CRED_REQ.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "SRP_CRED_REQ";
        expect_opcode(WHAT, b, opcode::CRED_REQ)?;
        let (r, _) = RawCredReq::ref_from_prefix(b).map_err(|_| trunc(WHAT, b, size::SMALL))?;
        Ok(CredReq {
            sol_not: r.sol_not,
            req_lim_delta: r.req_lim_delta.get() as i32,
            tag: r.tag.get(),
        })
    }
}

/// SRP_AER_REQ: an asynchronous event with sense data; answer with SRP_AER_RSP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AerReq<'a> {
    /// Solicited notification bits.
    pub sol_not: u8,
    /// Credits granted.
    pub req_lim_delta: i32,
    /// Tag to echo in the AER_RSP.
    pub tag: u64,
    /// The logical unit the event concerns.
    pub lun: ScsiLun,
    /// Sense data describing the event.
    pub sense: &'a [u8],
}

impl<'a> AerReq<'a> {
    /// Encodes into `out` (for test targets); returns the length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let n = size::AER_REQ + self.sense.len();
        crate::wire::room("SRP_AER_REQ", out, n)?;
        let raw = RawAerReq {
            opcode: opcode::AER_REQ,
            sol_not: self.sol_not,
            req_lim_delta: (self.req_lim_delta as u32).into(),
            tag: self.tag.into(),
            lun: self.lun.0,
            sense_data_len: (self.sense.len() as u32).into(),
            ..Default::default()
        };
        out[..size::AER_REQ].copy_from_slice(raw.as_bytes());
        out[size::AER_REQ..n].copy_from_slice(self.sense);
        Ok(n)
    }
    /// Decodes SRP_AER_REQ, checking the sense length against the IU.
    pub fn parse(b: &'a [u8]) -> Result<Self, WireError> {
        const WHAT: &str = "SRP_AER_REQ";
        expect_opcode(WHAT, b, opcode::AER_REQ)?;
        let (r, rest) = RawAerReq::ref_from_prefix(b).map_err(|_| trunc(WHAT, b, size::AER_REQ))?;
        let len = r.sense_data_len.get() as usize;
        if len > rest.len() {
            return Err(trunc(
                "SRP_AER_REQ sense data",
                b,
                size::AER_REQ.saturating_add(len),
            ));
        }
        Ok(AerReq {
            sol_not: r.sol_not,
            req_lim_delta: r.req_lim_delta.get() as i32,
            tag: r.tag.get(),
            lun: ScsiLun(r.lun),
            sense: &rest[..len],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_reset_layout() {
        let t = TskMgmt {
            sol_not: 0,
            tag: 0xabc,
            lun: ScsiLun::from_int(3),
            func: TskMgmtFunc::LunReset,
            task_tag: 0,
        };
        let b = t.encode();
        assert_eq!(b[0], 0x01);
        assert_eq!(&b[8..16], &0xabcu64.to_be_bytes());
        assert_eq!(&b[20..28], &[0, 3, 0, 0, 0, 0, 0, 0]);
        assert_eq!(b[30], 0x08);
        assert_eq!(TskMgmt::parse(&b).unwrap(), t);
        let abort = TskMgmt {
            func: TskMgmtFunc::AbortTask,
            task_tag: 0x55,
            ..t
        };
        assert_eq!(&abort.encode()[32..40], &0x55u64.to_be_bytes());
    }

    #[test]
    fn small_ius() {
        let c = CredReq {
            sol_not: 1,
            req_lim_delta: 5,
            tag: 9,
        };
        let b = c.encode();
        assert_eq!((b[0], b[1]), (0x81, 1));
        assert_eq!(&b[4..8], &5u32.to_be_bytes());
        assert_eq!(CredReq::parse(&b).unwrap(), c);
        assert_eq!(TagOnly::cred_rsp(9).encode()[0], 0x41);
        assert_eq!(TagOnly::aer_rsp(9).encode()[0], 0x42);
        let lo = TagOnly::i_logout(3).encode();
        assert_eq!(lo[0], 0x03);
        assert!(TagOnly::parse(&lo, opcode::CRED_RSP).is_err());
        let t = TLogout {
            sol_not: 0,
            reason: TLogoutReason::Inactive,
            tag: 1,
        };
        assert_eq!(TLogout::parse(&t.encode()).unwrap(), t);
        let sense = [
            0x70u8, 0, 6, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x3f, 0x0e, 0, 0, 0, 0,
        ];
        let a = AerReq {
            sol_not: 0,
            req_lim_delta: 1,
            tag: 4,
            lun: ScsiLun::from_int(0),
            sense: &sense,
        };
        let mut buf = [0u8; 64];
        let n = a.encode(&mut buf).unwrap();
        assert_eq!(n, 36 + sense.len());
        assert_eq!(AerReq::parse(&buf[..n]).unwrap(), a);
        assert!(AerReq::parse(&buf[..n - 1]).is_err());
    }
}
