//! Login: SRP_LOGIN_REQ (64-byte IB CM form and 56-byte RDMA/CM form), SRP_LOGIN_RSP, SRP_LOGIN_REJ.
//!
//! The request travels as CM REQ private data, the answer as REP or (consumer-defined) REJ private
//! data. The private data length the CM reports is the whole REP/REJ area (196 / 148 bytes with
//! librdmacm), not the IU length: [`parse_login_reply`] decides by the opcode byte.

use super::layout::{RawLoginRej, RawLoginReq, RawLoginReqRdma, RawLoginRsp};
use super::{expect_opcode, opcode, size, BufFormats};
use crate::wire::{need, WireError};
use zerocopy::FromBytes;

/// The multi-channel action of a login (`req_flags` bits 1:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MultiChannelAction {
    /// SRP_MULTICHAN_SINGLE: terminate this initiator port's other channels to the target.
    Single,
    /// SRP_MULTICHAN_MULTI: keep them (channels 1..n of a session).
    Multi,
    /// A reserved value (2 or 3), kept so decoding is total.
    Reserved(u8),
}

impl MultiChannelAction {
    fn bits(self) -> u8 {
        match self {
            MultiChannelAction::Single => 0,
            MultiChannelAction::Multi => 1,
            MultiChannelAction::Reserved(b) => b & 3,
        }
    }
    fn from_bits(b: u8) -> Self {
        match b & 3 {
            0 => MultiChannelAction::Single,
            1 => MultiChannelAction::Multi,
            r => MultiChannelAction::Reserved(r),
        }
    }
}

/// SRP_IMMED_REQUESTED in `req_flags` (SRP-2).
pub const IMMED_REQUESTED: u8 = 0x80;
/// SRP_LOGIN_RSP_IMMED_SUPP in `rsp_flags` (SRP-2).
pub const IMMED_SUPP: u8 = 0x80;

/// SRP_LOGIN_REQ in native form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LoginReq {
    /// Opaque tag echoed in the answer.
    pub tag: u64,
    /// Largest IU the initiator will send (`req_it_iu_len`).
    pub req_it_iu_len: u32,
    /// Descriptor formats the initiator will use.
    pub req_buf_fmt: BufFormats,
    /// SINGLE for a session's first channel, MULTI for the others.
    pub multi_channel: MultiChannelAction,
    /// Ask for immediate data (SRP-2).
    pub immed_requested: bool,
    /// Where immediate data starts in an SRP_CMD (68 with ib_srp and LIO).
    pub imm_data_offset: u16,
    /// initiator_ext || port GUID (SRP r16a).
    pub initiator_port_id: [u8; 16],
    /// id_ext || ioc_guid (SRP r16a).
    pub target_port_id: [u8; 16],
}

impl LoginReq {
    fn req_flags(&self) -> u8 {
        self.multi_channel.bits()
            | if self.immed_requested {
                IMMED_REQUESTED
            } else {
                0
            }
    }

    /// The 64-byte SRP_LOGIN_REQ, the IB CM REQ private data.
    pub fn encode_ib(&self) -> [u8; size::LOGIN_REQ] {
        let raw = RawLoginReq {
            opcode: opcode::LOGIN_REQ,
            tag: self.tag.into(),
            req_it_iu_len: self.req_it_iu_len.into(),
            req_buf_fmt: self.req_buf_fmt.0.into(),
            req_flags: self.req_flags(),
            imm_data_offset: self.imm_data_offset.into(),
            initiator_port_id: self.initiator_port_id,
            target_port_id: self.target_port_id,
            ..Default::default()
        };
        super::to_array::<{ size::LOGIN_REQ }>(&raw)
    }

    /// The 56-byte `srp_login_req_rdma`, the RDMA/CM private data (the CM adds its 36-byte header).
    pub fn encode_rdma(&self) -> [u8; size::LOGIN_REQ_RDMA] {
        let raw = RawLoginReqRdma {
            tag: self.tag.into(),
            req_buf_fmt: self.req_buf_fmt.0.into(),
            req_flags: self.req_flags(),
            opcode: opcode::LOGIN_REQ,
            req_it_iu_len: self.req_it_iu_len.into(),
            initiator_port_id: self.initiator_port_id,
            target_port_id: self.target_port_id,
            imm_data_offset: self.imm_data_offset.into(),
            reserved: [0; 6],
        };
        super::to_array::<{ size::LOGIN_REQ_RDMA }>(&raw)
    }

    /// Decodes the 64-byte IB CM form.
    pub fn parse_ib(b: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "SRP_LOGIN_REQ";
        need(WHAT, b, size::LOGIN_REQ)?;
        expect_opcode(WHAT, b, opcode::LOGIN_REQ)?;
        let (r, _) =
            RawLoginReq::ref_from_prefix(b).map_err(|_| trunc(WHAT, b, size::LOGIN_REQ))?;
        Ok(LoginReq {
            tag: r.tag.get(),
            req_it_iu_len: r.req_it_iu_len.get(),
            req_buf_fmt: BufFormats(r.req_buf_fmt.get()),
            multi_channel: MultiChannelAction::from_bits(r.req_flags),
            immed_requested: r.req_flags & IMMED_REQUESTED != 0,
            imm_data_offset: r.imm_data_offset.get(),
            initiator_port_id: r.initiator_port_id,
            target_port_id: r.target_port_id,
        })
    }

    /// Decodes the 56-byte RDMA/CM form (as a target sees it after the CM strips its header).
    pub fn parse_rdma(b: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "srp_login_req_rdma";
        let (r, _) = RawLoginReqRdma::ref_from_prefix(b)
            .map_err(|_| trunc(WHAT, b, size::LOGIN_REQ_RDMA))?;
        if r.opcode != opcode::LOGIN_REQ {
            return Err(WireError::WrongOpcode {
                what: WHAT,
                expected: opcode::LOGIN_REQ,
                got: r.opcode,
            });
        }
        Ok(LoginReq {
            tag: r.tag.get(),
            req_it_iu_len: r.req_it_iu_len.get(),
            req_buf_fmt: BufFormats(r.req_buf_fmt.get()),
            multi_channel: MultiChannelAction::from_bits(r.req_flags),
            immed_requested: r.req_flags & IMMED_REQUESTED != 0,
            imm_data_offset: r.imm_data_offset.get(),
            initiator_port_id: r.initiator_port_id,
            target_port_id: r.target_port_id,
        })
    }
}

/// What the target did with this initiator port's other channels (`rsp_flags` bits 1:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MultiChannelResult {
    /// No existing channels.
    NoChannels,
    /// Existing channels were terminated (a SINGLE login replaced them).
    Terminated,
    /// Existing channels were maintained (MULTI).
    Maintained,
    /// Reserved value 3.
    Reserved,
}

/// SRP_LOGIN_RSP in native form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LoginRsp {
    /// Initial credits (request limit).
    pub req_lim_delta: i32,
    /// The login's tag, echoed.
    pub tag: u64,
    /// Largest IU the target accepts from us.
    pub max_it_iu_len: u32,
    /// Largest IU the target will send us: size receive buffers by this.
    pub max_ti_iu_len: u32,
    /// Descriptor formats the target supports.
    pub buf_fmt: BufFormats,
    /// Raw `rsp_flags`.
    pub rsp_flags: u8,
}

impl LoginRsp {
    /// Whether the target accepts immediate data (signalled only by `rsp_flags` 0x80 with LIO).
    pub fn immed_supported(&self) -> bool {
        self.rsp_flags & IMMED_SUPP != 0
    }
    /// What happened to this initiator port's other channels.
    pub fn multi_channel_result(&self) -> MultiChannelResult {
        match self.rsp_flags & 3 {
            0 => MultiChannelResult::NoChannels,
            1 => MultiChannelResult::Terminated,
            2 => MultiChannelResult::Maintained,
            _ => MultiChannelResult::Reserved,
        }
    }
    /// Encodes the 52-byte IU (for test targets).
    pub fn encode(&self) -> [u8; size::LOGIN_RSP] {
        let raw = RawLoginRsp {
            opcode: opcode::LOGIN_RSP,
            req_lim_delta: (self.req_lim_delta as u32).into(),
            tag: self.tag.into(),
            max_it_iu_len: self.max_it_iu_len.into(),
            max_ti_iu_len: self.max_ti_iu_len.into(),
            buf_fmt: self.buf_fmt.0.into(),
            rsp_flags: self.rsp_flags,
            ..Default::default()
        };
        super::to_array::<{ size::LOGIN_RSP }>(&raw)
    }
    /// Decodes SRP_LOGIN_RSP; trailing bytes (the rest of the REP private data) are ignored.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "SRP_LOGIN_RSP";
        expect_opcode(WHAT, b, opcode::LOGIN_RSP)?;
        let (r, _) =
            RawLoginRsp::ref_from_prefix(b).map_err(|_| trunc(WHAT, b, size::LOGIN_RSP))?;
        Ok(LoginRsp {
            req_lim_delta: r.req_lim_delta.get() as i32,
            tag: r.tag.get(),
            max_it_iu_len: r.max_it_iu_len.get(),
            max_ti_iu_len: r.max_ti_iu_len.get(),
            buf_fmt: BufFormats(r.buf_fmt.get()),
            rsp_flags: r.rsp_flags,
        })
    }
}

/// Why a target refused a login (`enum srp_login_rej_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoginRejReason {
    /// 0x10000: unable to establish RDMA channel, no reason specified.
    UnableToEstablish,
    /// 0x10001: insufficient RDMA channel resources.
    InsufficientResources,
    /// 0x10002: requested maximum initiator-to-target IU length too large.
    ItIuLengthTooLarge,
    /// 0x10003: unable to associate RDMA channel with I_T nexus (bad target port identifier).
    UnableToAssociate,
    /// 0x10004: requested data buffer descriptor format not supported.
    UnsupportedDescriptorFormat,
    /// 0x10005: multiple RDMA channels not supported with this I_T nexus.
    MultiChannelUnsupported,
    /// 0x10006: the target's limit on channels (or initiators) is reached; LIO also uses it for a
    /// login from an initiator with no ACL.
    ChannelLimitReached,
    /// Any other code.
    Other(u32),
}

impl LoginRejReason {
    /// The numeric reason code.
    pub fn code(self) -> u32 {
        match self {
            LoginRejReason::UnableToEstablish => 0x10000,
            LoginRejReason::InsufficientResources => 0x10001,
            LoginRejReason::ItIuLengthTooLarge => 0x10002,
            LoginRejReason::UnableToAssociate => 0x10003,
            LoginRejReason::UnsupportedDescriptorFormat => 0x10004,
            LoginRejReason::MultiChannelUnsupported => 0x10005,
            LoginRejReason::ChannelLimitReached => 0x10006,
            LoginRejReason::Other(c) => c,
        }
    }
    /// Decodes a reason code.
    pub fn from_code(c: u32) -> Self {
        match c {
            0x10000 => LoginRejReason::UnableToEstablish,
            0x10001 => LoginRejReason::InsufficientResources,
            0x10002 => LoginRejReason::ItIuLengthTooLarge,
            0x10003 => LoginRejReason::UnableToAssociate,
            0x10004 => LoginRejReason::UnsupportedDescriptorFormat,
            0x10005 => LoginRejReason::MultiChannelUnsupported,
            0x10006 => LoginRejReason::ChannelLimitReached,
            c => LoginRejReason::Other(c),
        }
    }
    /// What the reason means, as the spec names it.
    pub fn meaning(self) -> &'static str {
        match self {
            LoginRejReason::UnableToEstablish => "unable to establish RDMA channel",
            LoginRejReason::InsufficientResources => "insufficient RDMA channel resources",
            LoginRejReason::ItIuLengthTooLarge => "requested IU length too large",
            LoginRejReason::UnableToAssociate => {
                "unable to associate RDMA channel with I_T nexus (bad target port id)"
            }
            LoginRejReason::UnsupportedDescriptorFormat => {
                "unsupported data buffer descriptor format"
            }
            LoginRejReason::MultiChannelUnsupported => "multiple RDMA channels not supported",
            LoginRejReason::ChannelLimitReached => "channel limit reached",
            LoginRejReason::Other(_) => "unknown reason",
        }
    }
    /// What an administrator can do about it.
    pub fn hint(self) -> &'static str {
        match self {
            LoginRejReason::UnableToAssociate => {
                "check id_ext and ioc_guid against the target (LIO: both halves equal \
                 /sys/module/ib_srpt/parameters/srpt_service_guid)"
            }
            LoginRejReason::ChannelLimitReached => {
                "check the target's ACL for this initiator (LIO names RDMA/CM ACLs by the \
                 target-side IP address) and its channel limit"
            }
            LoginRejReason::ItIuLengthTooLarge => "lower max_it_iu_size in the target string",
            LoginRejReason::InsufficientResources => "retry later or lower queue_size / ch_count",
            LoginRejReason::MultiChannelUnsupported => "use ch_count=1 for this target",
            LoginRejReason::UnsupportedDescriptorFormat => {
                "the target supports neither direct nor indirect descriptors as requested"
            }
            LoginRejReason::UnableToEstablish | LoginRejReason::Other(_) => {
                "see the target's log for the cause"
            }
        }
    }
}

impl std::fmt::Display for LoginRejReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:#x})", self.meaning(), self.code())
    }
}

/// SRP_LOGIN_REJ in native form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LoginRej {
    /// Why.
    pub reason: LoginRejReason,
    /// The login's tag, echoed.
    pub tag: u64,
    /// Descriptor formats the target supports.
    pub buf_fmt: BufFormats,
}

impl LoginRej {
    /// Encodes the 32-byte IU (for test targets).
    pub fn encode(&self) -> [u8; size::LOGIN_REJ] {
        let raw = RawLoginRej {
            opcode: opcode::LOGIN_REJ,
            reason: self.reason.code().into(),
            tag: self.tag.into(),
            buf_fmt: self.buf_fmt.0.into(),
            ..Default::default()
        };
        super::to_array::<{ size::LOGIN_REJ }>(&raw)
    }
    /// Decodes SRP_LOGIN_REJ; trailing bytes (the rest of the REJ private data) are ignored.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "SRP_LOGIN_REJ";
        expect_opcode(WHAT, b, opcode::LOGIN_REJ)?;
        let (r, _) =
            RawLoginRej::ref_from_prefix(b).map_err(|_| trunc(WHAT, b, size::LOGIN_REJ))?;
        Ok(LoginRej {
            reason: LoginRejReason::from_code(r.reason.get()),
            tag: r.tag.get(),
            buf_fmt: BufFormats(r.buf_fmt.get()),
        })
    }
}

/// The target's answer to a login.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoginReply {
    /// Logged in.
    Accepted(LoginRsp),
    /// Refused.
    Rejected(LoginRej),
}

/// Decodes CM REP or REJ private data by its opcode byte (its length is the CM's, not the IU's).
pub fn parse_login_reply(private_data: &[u8]) -> Result<LoginReply, WireError> {
    match private_data.first() {
        Some(&opcode::LOGIN_RSP) => LoginRsp::parse(private_data).map(LoginReply::Accepted),
        Some(&opcode::LOGIN_REJ) => LoginRej::parse(private_data).map(LoginReply::Rejected),
        Some(&op) => Err(WireError::UnexpectedOpcode {
            opcode: op,
            who: "login reply",
        }),
        None => Err(WireError::Truncated {
            what: "login reply",
            need: 1,
            got: 0,
        }),
    }
}

fn trunc(what: &'static str, b: &[u8], need: usize) -> WireError {
    WireError::Truncated {
        what,
        need,
        got: b.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::wire::hex;

    fn guid_pair(a: u64, b: u64) -> [u8; 16] {
        let mut o = [0u8; 16];
        o[..8].copy_from_slice(&a.to_be_bytes());
        o[8..].copy_from_slice(&b.to_be_bytes());
        o
    }

    /// The 56 bytes ib_srp sent to ib_srpt in the lab recipe (REPORT.md section 6, kprobe capture).
    #[test]
    fn login_rdma_matches_captured_kernel_bytes() {
        let captured = hex(
            "0000000000000000 0006 80 00 00002044 0000000000000000000000fffe770001 \
             000000fffe770001000000fffe770001 0044 000000000000",
        );
        let req = LoginReq {
            tag: 0,
            req_it_iu_len: 8260,
            req_buf_fmt: BufFormats::DIRECT_INDIRECT,
            multi_channel: MultiChannelAction::Single,
            immed_requested: true,
            imm_data_offset: 68,
            initiator_port_id: guid_pair(0, 0x0000_00ff_fe77_0001),
            target_port_id: guid_pair(0x0000_00ff_fe77_0001, 0x0000_00ff_fe77_0001),
        };
        assert_eq!(req.encode_rdma().as_slice(), captured.as_slice());
        assert_eq!(LoginReq::parse_rdma(&captured).unwrap(), req);
        // the second channel: MULTI (req_flags 0x81)
        let multi = LoginReq {
            multi_channel: MultiChannelAction::Multi,
            ..req
        };
        assert_eq!(multi.encode_rdma()[10], 0x81);
    }

    /// The LOGIN_RSP ib_srpt accepted with (REPORT.md section 6).
    #[test]
    fn login_rsp_matches_captured_target_bytes() {
        let captured = hex(
            "c0000000000000800000000000000000000020540000204400068000000000000000000000000000000000000000000000000000",
        );
        let rsp = LoginRsp::parse(&captured).unwrap();
        assert_eq!(rsp.req_lim_delta, 128);
        assert_eq!(rsp.max_it_iu_len, 8276);
        assert_eq!(rsp.max_ti_iu_len, 8260);
        assert_eq!(rsp.buf_fmt, BufFormats::DIRECT_INDIRECT);
        assert!(rsp.immed_supported());
        assert_eq!(rsp.multi_channel_result(), MultiChannelResult::NoChannels);
        assert_eq!(rsp.encode().as_slice(), &captured[..52]);
        // in a 196-byte REP area, as librdmacm reports it
        let mut rep = captured.clone();
        rep.resize(196, 0);
        assert_eq!(parse_login_reply(&rep).unwrap(), LoginReply::Accepted(rsp));
    }

    /// The LOGIN_REJ ib_srpt sent without an ACL and for a wrong ioc_guid (REPORT.md section 6).
    #[test]
    fn login_rej_matches_captured_target_bytes() {
        let no_acl = hex("c200000000010006000000000000000000000000000000000006000000000000");
        let rej = LoginRej::parse(&no_acl).unwrap();
        assert_eq!(rej.reason, LoginRejReason::ChannelLimitReached);
        assert_eq!(rej.buf_fmt, BufFormats::DIRECT_INDIRECT);
        assert_eq!(rej.encode().as_slice(), no_acl.as_slice());
        let bad_guid = hex("c200000000010003000000000000000000000000000000000006000000000000");
        let mut rej_area = bad_guid.clone();
        rej_area.resize(148, 0);
        match parse_login_reply(&rej_area).unwrap() {
            LoginReply::Rejected(r) => {
                assert_eq!(r.reason, LoginRejReason::UnableToAssociate);
                assert!(r.reason.to_string().contains("0x10003"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_rej_reason_round_trips_and_has_text() {
        for c in 0x10000..=0x10006u32 {
            let r = LoginRejReason::from_code(c);
            assert!(!matches!(r, LoginRejReason::Other(_)));
            assert_eq!(r.code(), c);
            assert!(!r.meaning().is_empty() && !r.hint().is_empty());
        }
        assert_eq!(LoginRejReason::from_code(7), LoginRejReason::Other(7));
    }

    #[test]
    fn ib_form_offsets() {
        let req = LoginReq {
            tag: 0x0102_0304_0506_0708,
            req_it_iu_len: 0x2044,
            req_buf_fmt: BufFormats::DIRECT_INDIRECT,
            multi_channel: MultiChannelAction::Multi,
            immed_requested: true,
            imm_data_offset: 68,
            initiator_port_id: [0x11; 16],
            target_port_id: [0x22; 16],
        };
        let b = req.encode_ib();
        assert_eq!(b[0], 0);
        assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[16..20], &[0, 0, 0x20, 0x44]);
        assert_eq!(&b[24..26], &[0, 6]);
        assert_eq!(b[26], 0x81);
        assert_eq!(&b[28..30], &[0, 68]);
        assert_eq!(&b[32..48], &[0x11; 16]);
        assert_eq!(&b[48..64], &[0x22; 16]);
        assert_eq!(LoginReq::parse_ib(&b).unwrap(), req);
    }
}
