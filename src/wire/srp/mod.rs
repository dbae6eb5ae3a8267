//! SRP information units (T10 SRP r16a, SRP-2 immediate data; Linux `include/scsi/srp.h`).
//!
//! Initiator-to-target IUs encode into caller-provided buffers (no allocation); target-to-initiator IUs
//! decode from received bytes into borrowed views. [`parse_target_iu`] is the one entry point for what a
//! receive completion holds; [`parse_login_reply`] for the CM REP/REJ private data.

mod cmd;
mod layout;
mod login;
mod misc;
mod rsp;

pub use cmd::{DataDesc, DescList, ParsedCmd, SrpCmd, TaskAttr};
pub use login::{
    parse_login_reply, LoginRej, LoginRejReason, LoginReply, LoginReq, LoginRsp,
    MultiChannelAction, MultiChannelResult, IMMED_REQUESTED, IMMED_SUPP,
};
pub use misc::{AerReq, CredReq, TLogout, TLogoutReason, TagOnly, TskMgmt, TskMgmtFunc};
pub use rsp::{RspFlags, SrpRsp, TSK_MGMT_COMPLETE};

use super::WireError;

/// SRP opcodes (`enum` in `srp.h`).
pub mod opcode {
    /// SRP_LOGIN_REQ.
    pub const LOGIN_REQ: u8 = 0x00;
    /// SRP_TSK_MGMT.
    pub const TSK_MGMT: u8 = 0x01;
    /// SRP_CMD.
    pub const CMD: u8 = 0x02;
    /// SRP_I_LOGOUT.
    pub const I_LOGOUT: u8 = 0x03;
    /// SRP_CRED_RSP.
    pub const CRED_RSP: u8 = 0x41;
    /// SRP_AER_RSP.
    pub const AER_RSP: u8 = 0x42;
    /// SRP_T_LOGOUT.
    pub const T_LOGOUT: u8 = 0x80;
    /// SRP_CRED_REQ.
    pub const CRED_REQ: u8 = 0x81;
    /// SRP_AER_REQ.
    pub const AER_REQ: u8 = 0x82;
    /// SRP_LOGIN_RSP.
    pub const LOGIN_RSP: u8 = 0xc0;
    /// SRP_RSP.
    pub const RSP: u8 = 0xc1;
    /// SRP_LOGIN_REJ.
    pub const LOGIN_REJ: u8 = 0xc2;
}

/// Sizes of the fixed parts of each IU.
pub mod size {
    /// SRP_LOGIN_REQ as IB CM private data.
    pub const LOGIN_REQ: usize = 64;
    /// `srp_login_req_rdma`, the RDMA/CM private data.
    pub const LOGIN_REQ_RDMA: usize = 56;
    /// SRP_LOGIN_RSP.
    pub const LOGIN_RSP: usize = 52;
    /// SRP_LOGIN_REJ.
    pub const LOGIN_REJ: usize = 32;
    /// SRP_CMD without additional CDB and descriptors.
    pub const CMD: usize = 48;
    /// SRP_RSP without response and sense data.
    pub const RSP: usize = 36;
    /// SRP_TSK_MGMT.
    pub const TSK_MGMT: usize = 48;
    /// SRP_I_LOGOUT, SRP_T_LOGOUT, SRP_CRED_REQ, SRP_CRED_RSP, SRP_AER_RSP.
    pub const SMALL: usize = 16;
    /// SRP_AER_REQ without sense data.
    pub const AER_REQ: usize = 36;
    /// One direct data buffer descriptor.
    pub const DIRECT_DESC: usize = 16;
    /// The indirect descriptor header (table descriptor + total length).
    pub const INDIRECT_HDR: usize = 20;
    /// The immediate data descriptor (a length).
    pub const IMM_DESC: usize = 4;
    /// The largest additional CDB length ib_srp reserves room for.
    pub const MAX_ADD_CDB: usize = 16;
    /// Where ib_srp (and so LIO) expects immediate data: 48 + 16 + 4.
    pub const IMM_DATA_OFFSET: usize = CMD + MAX_ADD_CDB + IMM_DESC;
}

/// Supported data buffer descriptor formats (LOGIN_REQ `req_buf_fmt`, LOGIN_RSP `buf_fmt`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BufFormats(pub u16);

impl BufFormats {
    /// SRP_BUF_FORMAT_DIRECT.
    pub const DIRECT: u16 = 1 << 1;
    /// SRP_BUF_FORMAT_INDIRECT.
    pub const INDIRECT: u16 = 1 << 2;
    /// Direct and indirect descriptors, what ib_srp asks for.
    pub const DIRECT_INDIRECT: BufFormats = BufFormats(Self::DIRECT | Self::INDIRECT);
    /// Whether direct descriptors are supported.
    pub fn direct(self) -> bool {
        self.0 & Self::DIRECT != 0
    }
    /// Whether indirect descriptors are supported.
    pub fn indirect(self) -> bool {
        self.0 & Self::INDIRECT != 0
    }
}

/// Buffer descriptor format codes in SRP_CMD `buf_fmt` (data-out high nibble, data-in low nibble).
pub mod desc_fmt {
    /// No data buffer descriptor.
    pub const NONE: u8 = 0;
    /// One direct descriptor.
    pub const DIRECT: u8 = 1;
    /// An indirect descriptor table.
    pub const INDIRECT: u8 = 2;
    /// Immediate data in the IU (SRP-2).
    pub const IMMEDIATE: u8 = 3;
}

/// A memory descriptor (`struct srp_direct_buf`): where the target RDMA-reads or -writes data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DirectBuf {
    /// Virtual address in the initiator's registered memory.
    pub va: u64,
    /// The memory region's rkey.
    pub key: u32,
    /// Length in bytes.
    pub len: u32,
}

impl DirectBuf {
    fn to_raw(self) -> layout::RawDirectBuf {
        layout::RawDirectBuf {
            va: self.va.into(),
            key: self.key.into(),
            len: self.len.into(),
        }
    }
    fn from_raw(r: &layout::RawDirectBuf) -> Self {
        DirectBuf {
            va: r.va.get(),
            key: r.key.get(),
            len: r.len.get(),
        }
    }
    /// Decodes one 16-byte descriptor.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let (r, _) =
            layout::RawDirectBuf::ref_from_prefix(b).map_err(|_| WireError::Truncated {
                what: "direct descriptor",
                need: 16,
                got: b.len(),
            })?;
        Ok(Self::from_raw(r))
    }
}

use zerocopy::FromBytes;

/// A SCSI logical unit number in its 8-byte SAM form (`struct scsi_lun`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScsiLun(pub [u8; 8]);

impl ScsiLun {
    /// The kernel's `int_to_scsilun`: each 16-bit level of `lun` goes big-endian into two bytes.
    /// For LUNs below 256 this is peripheral addressing, `[0, lun, 0, ..]`.
    pub fn from_int(lun: u64) -> Self {
        let mut b = [0u8; 8];
        for i in 0..4 {
            let level = (lun >> (16 * i)) as u16;
            b[2 * i..2 * i + 2].copy_from_slice(&level.to_be_bytes());
        }
        ScsiLun(b)
    }
    /// The kernel's `scsilun_to_int` (the inverse of [`ScsiLun::from_int`]).
    pub fn to_int(self) -> u64 {
        (0..4).fold(0u64, |acc, i| {
            acc | (u64::from(u16::from_be_bytes([self.0[2 * i], self.0[2 * i + 1]])) << (16 * i))
        })
    }
}

impl std::fmt::Display for ScsiLun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_int())
    }
}

/// The bytes of a fixed-size raw IU as an array (the encoders' last step).
pub(crate) fn to_array<const N: usize>(
    raw: &(impl zerocopy::IntoBytes + zerocopy::Immutable),
) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(raw.as_bytes());
    out
}

/// The opcode of an IU (its first byte), if there is one.
pub fn opcode_of(iu: &[u8]) -> Option<u8> {
    iu.first().copied()
}

/// An IU the target sends on an established channel (what a receive completion holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetIu<'a> {
    /// SRP_RSP: a command or task management response.
    Rsp(SrpRsp<'a>),
    /// SRP_CRED_REQ: extra credits; answer with SRP_CRED_RSP (costs no credit).
    CredReq(CredReq),
    /// SRP_AER_REQ: an asynchronous event; answer with SRP_AER_RSP (costs no credit).
    AerReq(AerReq<'a>),
    /// SRP_T_LOGOUT: the target is closing this channel.
    TLogout(TLogout),
}

/// Decodes what the target sent on a channel. Any other opcode (including a login IU) is an error.
pub fn parse_target_iu(iu: &[u8]) -> Result<TargetIu<'_>, WireError> {
    match opcode_of(iu) {
        Some(opcode::RSP) => SrpRsp::parse(iu).map(TargetIu::Rsp),
        Some(opcode::CRED_REQ) => CredReq::parse(iu).map(TargetIu::CredReq),
        Some(opcode::AER_REQ) => AerReq::parse(iu).map(TargetIu::AerReq),
        Some(opcode::T_LOGOUT) => TLogout::parse(iu).map(TargetIu::TLogout),
        Some(op) => Err(WireError::UnexpectedOpcode {
            opcode: op,
            who: "target-to-initiator IU",
        }),
        None => Err(WireError::Truncated {
            what: "SRP IU",
            need: 1,
            got: 0,
        }),
    }
}

/// An IU the initiator sends on an established channel (decoded by test targets and fuzzers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitiatorIu<'a> {
    /// SRP_CMD.
    Cmd(ParsedCmd<'a>),
    /// SRP_TSK_MGMT.
    TskMgmt(TskMgmt),
    /// SRP_I_LOGOUT.
    ILogout(TagOnly),
    /// SRP_CRED_RSP.
    CredRsp(TagOnly),
    /// SRP_AER_RSP.
    AerRsp(TagOnly),
}

/// Decodes what an initiator sent on a channel. `imm_data_offset` is the one agreed at login.
pub fn parse_initiator_iu(iu: &[u8], imm_data_offset: usize) -> Result<InitiatorIu<'_>, WireError> {
    match opcode_of(iu) {
        Some(opcode::CMD) => ParsedCmd::parse(iu, imm_data_offset).map(InitiatorIu::Cmd),
        Some(opcode::TSK_MGMT) => TskMgmt::parse(iu).map(InitiatorIu::TskMgmt),
        Some(opcode::I_LOGOUT) => TagOnly::parse(iu, opcode::I_LOGOUT).map(InitiatorIu::ILogout),
        Some(opcode::CRED_RSP) => TagOnly::parse(iu, opcode::CRED_RSP).map(InitiatorIu::CredRsp),
        Some(opcode::AER_RSP) => TagOnly::parse(iu, opcode::AER_RSP).map(InitiatorIu::AerRsp),
        Some(op) => Err(WireError::UnexpectedOpcode {
            opcode: op,
            who: "initiator-to-target IU",
        }),
        None => Err(WireError::Truncated {
            what: "SRP IU",
            need: 1,
            got: 0,
        }),
    }
}

/// Checks the opcode byte of a fixed IU.
pub(crate) fn expect_opcode(what: &'static str, b: &[u8], expected: u8) -> Result<(), WireError> {
    match b.first() {
        Some(&got) if got == expected => Ok(()),
        Some(&got) => Err(WireError::WrongOpcode {
            what,
            expected,
            got,
        }),
        None => Err(WireError::Truncated {
            what,
            need: 1,
            got: 0,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_int_round_trip_matches_kernel() {
        assert_eq!(ScsiLun::from_int(0).0, [0; 8]);
        assert_eq!(ScsiLun::from_int(5).0, [0, 5, 0, 0, 0, 0, 0, 0]);
        assert_eq!(ScsiLun::from_int(0x4123).0, [0x41, 0x23, 0, 0, 0, 0, 0, 0]);
        for l in [0u64, 1, 255, 256, 16383, 0x1234_5678_9abc_def0] {
            assert_eq!(ScsiLun::from_int(l).to_int(), l);
        }
    }

    #[test]
    fn dispatch_rejects_initiator_opcodes_from_target() {
        let mut iu = [0u8; 48];
        iu[0] = opcode::CMD;
        assert!(matches!(
            parse_target_iu(&iu),
            Err(WireError::UnexpectedOpcode { opcode: 2, .. })
        ));
        assert!(parse_target_iu(&[]).is_err());
        iu[0] = opcode::LOGIN_RSP;
        assert!(parse_target_iu(&iu).is_err());
    }
}
