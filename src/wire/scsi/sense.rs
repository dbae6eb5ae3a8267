//! SCSI status and sense data (SPC-5 4.4), decoded into what the block layer should see.
//!
//! [`Sense::parse`] reads fixed (0x70/0x71) and descriptor (0x72/0x73) format; [`classify`] turns a
//! status and its sense into a [`Disposition`]: the errno for the block layer if the command fails for
//! good, and whether to retry now, retry after a wait, refresh something first, or reconnect. The
//! mapping follows the kernel's `scsi_check_sense` / `scsi_result_to_blk_status` where it can.

use crate::wire::{be32, be64, WireError};

/// SCSI status byte (SAM-5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScsiStatus {
    /// 0x00 GOOD.
    Good,
    /// 0x02 CHECK CONDITION: sense data says why.
    CheckCondition,
    /// 0x04 CONDITION MET.
    ConditionMet,
    /// 0x08 BUSY.
    Busy,
    /// 0x18 RESERVATION CONFLICT.
    ReservationConflict,
    /// 0x28 TASK SET FULL.
    TaskSetFull,
    /// 0x30 ACA ACTIVE.
    AcaActive,
    /// 0x40 TASK ABORTED.
    TaskAborted,
    /// Any other value.
    Other(u8),
}

impl From<u8> for ScsiStatus {
    fn from(b: u8) -> Self {
        match b {
            0x00 => ScsiStatus::Good,
            0x02 => ScsiStatus::CheckCondition,
            0x04 => ScsiStatus::ConditionMet,
            0x08 => ScsiStatus::Busy,
            0x18 => ScsiStatus::ReservationConflict,
            0x28 => ScsiStatus::TaskSetFull,
            0x30 => ScsiStatus::AcaActive,
            0x40 => ScsiStatus::TaskAborted,
            b => ScsiStatus::Other(b),
        }
    }
}

/// Sense key (SPC-5 table 51).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SenseKey {
    /// 0x0
    NoSense,
    /// 0x1
    RecoveredError,
    /// 0x2
    NotReady,
    /// 0x3
    MediumError,
    /// 0x4
    HardwareError,
    /// 0x5
    IllegalRequest,
    /// 0x6
    UnitAttention,
    /// 0x7
    DataProtect,
    /// 0x8
    BlankCheck,
    /// 0x9
    VendorSpecific,
    /// 0xA
    CopyAborted,
    /// 0xB
    AbortedCommand,
    /// 0xC (obsolete)
    Reserved,
    /// 0xD
    VolumeOverflow,
    /// 0xE
    Miscompare,
    /// 0xF
    Completed,
}

impl SenseKey {
    /// From the low nibble of `b`.
    pub fn from_nibble(b: u8) -> Self {
        use SenseKey::*;
        [
            NoSense,
            RecoveredError,
            NotReady,
            MediumError,
            HardwareError,
            IllegalRequest,
            UnitAttention,
            DataProtect,
            BlankCheck,
            VendorSpecific,
            CopyAborted,
            AbortedCommand,
            Reserved,
            VolumeOverflow,
            Miscompare,
            Completed,
        ][usize::from(b & 0x0f)]
    }
}

/// Decoded sense data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sense {
    /// Sense key.
    pub key: SenseKey,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// Deferred error (response code 0x71 / 0x73): about an earlier command.
    pub deferred: bool,
    /// Descriptor format (0x72 / 0x73).
    pub descriptor_format: bool,
    /// The INFORMATION field when valid (e.g. the first bad LBA of a medium error).
    pub information: Option<u64>,
}

impl Sense {
    /// Decodes fixed or descriptor format sense data. Truncated additional bytes read as zero, as
    /// SPC allows targets to cut sense short.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let rc = *b.first().ok_or(WireError::Truncated {
            what: "sense data",
            need: 1,
            got: 0,
        })?;
        let at = |i: usize| b.get(i).copied().unwrap_or(0);
        match rc & 0x7f {
            0x70 | 0x71 => {
                if b.len() < 3 {
                    return Err(WireError::Truncated {
                        what: "fixed sense data",
                        need: 3,
                        got: b.len(),
                    });
                }
                let information = (rc & 0x80 != 0 && b.len() >= 7).then(|| u64::from(be32(b, 3)));
                Ok(Sense {
                    key: SenseKey::from_nibble(at(2)),
                    asc: at(12),
                    ascq: at(13),
                    deferred: rc & 0x7f == 0x71,
                    descriptor_format: false,
                    information,
                })
            }
            0x72 | 0x73 => {
                if b.len() < 2 {
                    return Err(WireError::Truncated {
                        what: "descriptor sense data",
                        need: 2,
                        got: b.len(),
                    });
                }
                let information = descriptor_information(b);
                Ok(Sense {
                    key: SenseKey::from_nibble(at(1)),
                    asc: at(2),
                    ascq: at(3),
                    deferred: rc & 0x7f == 0x73,
                    descriptor_format: true,
                    information,
                })
            }
            other => Err(WireError::Invalid {
                what: "sense data",
                field: "response code",
                value: u64::from(other),
                rule: "0x70-0x73 (fixed or descriptor format)",
            }),
        }
    }
}

/// The VALID Information descriptor's value in descriptor-format sense data (the last one, if the
/// target sent several); descriptors past the additional sense length or the buffer are ignored.
fn descriptor_information(b: &[u8]) -> Option<u64> {
    let add_len = usize::from(b.get(7).copied().unwrap_or(0));
    let end = b.len().min(8 + add_len);
    let mut information = None;
    let mut off = 8;
    while off + 2 <= end {
        let (dtype, dlen) = (b[off], usize::from(b[off + 1]));
        let dend = off + 2 + dlen;
        if dend > end {
            break;
        }
        // Information descriptor: type 0, length 0x0a, VALID bit, 8-byte value at +4
        if dtype == 0x00 && dlen >= 0x0a && b[off + 2] & 0x80 != 0 {
            information = Some(be64(b, off + 4));
        }
        off = dend;
    }
    information
}

/// Fixed-format sense data (response code 0x70, 18 bytes) for `key`/`asc`/`ascq` (for test targets).
pub fn fixed_sense(key: u8, asc: u8, ascq: u8) -> [u8; 18] {
    let mut s = [0u8; 18];
    s[0] = 0x70;
    s[2] = key;
    s[7] = 10;
    s[12] = asc;
    s[13] = ascq;
    s
}

impl std::fmt::Display for Sense {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} asc {:#04x} ascq {:#04x}",
            self.key, self.asc, self.ascq
        )?;
        if let Some(i) = self.information {
            write!(f, " information {i:#x}")?;
        }
        Ok(())
    }
}

/// Something to re-read before retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refresh {
    /// Capacity data has changed: READ CAPACITY again (and resize the device).
    Capacity,
    /// Reported LUNs data has changed: REPORT LUNS again.
    Luns,
    /// Mode parameters or inquiry data changed: re-read them (cache mode, write protect).
    Parameters,
}

/// What to do with a command after its status came back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Success: complete the I/O.
    Complete,
    /// Retry at once (bounded by the caller).
    Retry,
    /// Retry after a delay (busy, becoming ready).
    RetryAfterDelay,
    /// Re-read something, then retry.
    RefreshThenRetry(Refresh),
    /// The nexus is gone or confused: reconnect, then retry.
    Reconnect,
    /// Fail the I/O with the errno.
    Fail,
}

/// The decision for one completed command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Disposition {
    /// What to do now.
    pub action: Action,
    /// The errno (positive) to report if the command fails (at once, or when retries run out);
    /// 0 on success.
    pub errno: i32,
}

const fn d(action: Action, errno: i32) -> Disposition {
    Disposition { action, errno }
}

/// errno values (Linux), kept here so the wire layer needs no libc.
pub mod errno {
    /// I/O error.
    pub const EIO: i32 = 5;
    /// Try again.
    pub const EAGAIN: i32 = 11;
    /// Device busy.
    pub const EBUSY: i32 = 16;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// No space left.
    pub const ENOSPC: i32 = 28;
    /// Read-only.
    pub const EROFS: i32 = 30;
    /// Invalid exchange (the block layer's reservation conflict).
    pub const EBADE: i32 = 52;
    /// No medium.
    pub const ENOMEDIUM: i32 = 123;
    /// Illegal byte sequence (the block layer's protection error).
    pub const EILSEQ: i32 = 84;
    /// Operation not supported.
    pub const EOPNOTSUPP: i32 = 95;
    /// Remote I/O error (the block layer's target error).
    pub const EREMOTEIO: i32 = 121;
}

/// Decides what a status and its sense mean for the I/O (see the module docs).
pub fn classify(status: ScsiStatus, sense: Option<&Sense>) -> Disposition {
    use errno::*;
    match status {
        ScsiStatus::Good | ScsiStatus::ConditionMet => d(Action::Complete, 0),
        ScsiStatus::Busy | ScsiStatus::TaskSetFull => d(Action::RetryAfterDelay, EBUSY),
        ScsiStatus::ReservationConflict => d(Action::Fail, EBADE),
        ScsiStatus::TaskAborted => d(Action::Retry, EIO),
        ScsiStatus::AcaActive | ScsiStatus::Other(_) => d(Action::Fail, EIO),
        ScsiStatus::CheckCondition => match sense {
            None => d(Action::Retry, EIO),
            Some(s) => classify_sense(s),
        },
    }
}

fn classify_sense(s: &Sense) -> Disposition {
    use errno::*;
    match s.key {
        SenseKey::NoSense => d(Action::Retry, EIO),
        SenseKey::RecoveredError | SenseKey::Completed => d(Action::Complete, 0),
        SenseKey::NotReady => match (s.asc, s.ascq) {
            // becoming ready, an operation in progress, ALUA transition or unavailable port: wait
            // (the kernel's scsi_io_completion_action list, plus 04/0c as scsi_dh_alua retries it)
            (0x04, 0x01 | 0x04..=0x0a | 0x0c | 0x11 | 0x14 | 0x1a | 0x1b | 0x1d | 0x24 | 0x25) => {
                d(Action::RetryAfterDelay, EIO)
            }
            (0x3a, _) => d(Action::Fail, ENOMEDIUM),
            // anything else fails at once, as sd does: manual intervention required, format
            // corrupt, LOGICAL UNIT COMMUNICATION FAILURE (08/00: what LIO answers when its
            // backing device fails an I/O) -- retrying those for CMD_TIMEOUT would only delay the EIO
            _ => d(Action::Fail, EIO),
        },
        SenseKey::MediumError => d(Action::Fail, EIO),
        SenseKey::HardwareError => d(Action::Fail, EIO),
        SenseKey::IllegalRequest => match s.asc {
            0x20 => d(Action::Fail, EOPNOTSUPP), // invalid command operation code
            0x24 | 0x26 => d(Action::Fail, EOPNOTSUPP), // invalid field in CDB / parameter list
            0x21 => d(Action::Fail, EIO),        // LBA out of range
            0x25 => d(Action::Reconnect, EIO),   // logical unit not supported: the LUN went away
            _ => d(Action::Fail, EREMOTEIO),
        },
        SenseKey::UnitAttention => match (s.asc, s.ascq) {
            (0x2a, 0x09) => d(Action::RefreshThenRetry(Refresh::Capacity), EIO),
            (0x3f, 0x0e) => d(Action::RefreshThenRetry(Refresh::Luns), EIO),
            (0x2a, 0x01) | (0x3f, 0x03) | (0x2a, 0x03) => {
                d(Action::RefreshThenRetry(Refresh::Parameters), EIO)
            }
            _ => d(Action::Retry, EIO), // power on / reset (0x29), mode changed, ...
        },
        SenseKey::DataProtect => match (s.asc, s.ascq) {
            (0x27, 0x07) => d(Action::Fail, ENOSPC), // space allocation failed write protect
            _ => d(Action::Fail, EROFS),
        },
        SenseKey::AbortedCommand => match s.asc {
            0x10 => d(Action::Fail, EILSEQ), // protection information error
            _ => d(Action::Retry, EIO),
        },
        SenseKey::VolumeOverflow => d(Action::Fail, ENOSPC),
        SenseKey::Miscompare => d(Action::Fail, EILSEQ),
        SenseKey::BlankCheck
        | SenseKey::VendorSpecific
        | SenseKey::CopyAborted
        | SenseKey::Reserved => d(Action::Fail, EIO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(key: u8, asc: u8, ascq: u8) -> Vec<u8> {
        fixed_sense(key, asc, ascq).to_vec()
    }

    #[test]
    fn fixed_format_from_lio() {
        // READ past the end: ILLEGAL REQUEST, LBA out of range (userspace-login NOTES step 4)
        let mut b = fixed(0x05, 0x21, 0x00);
        b.resize(96, 0);
        let s = Sense::parse(&b).unwrap();
        assert_eq!((s.key, s.asc, s.ascq), (SenseKey::IllegalRequest, 0x21, 0));
        assert!(!s.deferred && !s.descriptor_format && s.information.is_none());
        assert_eq!(
            classify(ScsiStatus::CheckCondition, Some(&s)).action,
            Action::Fail
        );
    }

    #[test]
    fn fixed_information_and_short_sense() {
        let mut b = fixed(0x03, 0x11, 0x00);
        b[0] = 0xf0;
        b[3..7].copy_from_slice(&0x1234u32.to_be_bytes());
        let s = Sense::parse(&b).unwrap();
        assert_eq!(s.information, Some(0x1234));
        assert_eq!(
            classify(ScsiStatus::CheckCondition, Some(&s)),
            d(Action::Fail, errno::EIO)
        );
        // cut after the key: asc/ascq read as zero
        let s = Sense::parse(&b[..3]).unwrap();
        assert_eq!((s.key, s.asc), (SenseKey::MediumError, 0));
        assert!(Sense::parse(&b[..2]).is_err());
        assert!(Sense::parse(&[]).is_err());
        assert!(Sense::parse(&[0x12, 0, 0]).is_err());
    }

    #[test]
    fn descriptor_format_with_information() {
        let mut b = vec![0x72, 0x03, 0x11, 0x00, 0, 0, 0, 12];
        b.extend_from_slice(&[0x00, 0x0a, 0x80, 0x00]);
        b.extend_from_slice(&0xdead_beefu64.to_be_bytes());
        let s = Sense::parse(&b).unwrap();
        assert!(s.descriptor_format);
        assert_eq!(
            (s.key, s.asc, s.information),
            (SenseKey::MediumError, 0x11, Some(0xdead_beef))
        );
        // a descriptor running past the end is ignored, not read
        b[7] = 40;
        b[9] = 0x30;
        assert_eq!(Sense::parse(&b).unwrap().information, None);
    }

    #[test]
    fn unit_attentions_and_statuses() {
        let ua = |asc, ascq| Sense::parse(&fixed(6, asc, ascq)).unwrap();
        let cc = |s: &Sense| classify(ScsiStatus::CheckCondition, Some(s)).action;
        assert_eq!(cc(&ua(0x29, 0x03)), Action::Retry);
        assert_eq!(
            cc(&ua(0x2a, 0x09)),
            Action::RefreshThenRetry(Refresh::Capacity)
        );
        assert_eq!(cc(&ua(0x3f, 0x0e)), Action::RefreshThenRetry(Refresh::Luns));
        let nr = Sense::parse(&fixed(2, 0x04, 0x01)).unwrap();
        assert_eq!(cc(&nr), Action::RetryAfterDelay);
        // LIO's answer to a backing device error: EIO at once, as sd gives it
        let comm = Sense::parse(&fixed(2, 0x08, 0x00)).unwrap();
        assert_eq!(
            classify(ScsiStatus::CheckCondition, Some(&comm)),
            d(Action::Fail, errno::EIO)
        );
        let wp = Sense::parse(&fixed(7, 0x27, 0x00)).unwrap();
        assert_eq!(
            classify(ScsiStatus::CheckCondition, Some(&wp)),
            d(Action::Fail, errno::EROFS)
        );
        let ab = Sense::parse(&fixed(0x0b, 0x47, 0x00)).unwrap();
        assert_eq!(cc(&ab), Action::Retry);
        assert_eq!(
            classify(ScsiStatus::Busy, None).action,
            Action::RetryAfterDelay
        );
        assert_eq!(
            classify(ScsiStatus::from(0x28), None).action,
            Action::RetryAfterDelay
        );
        assert_eq!(classify(ScsiStatus::Good, None), d(Action::Complete, 0));
        assert_eq!(
            classify(ScsiStatus::ReservationConflict, None).errno,
            errno::EBADE
        );
        assert_eq!(
            classify(ScsiStatus::CheckCondition, None).action,
            Action::Retry
        );
        assert_eq!(ScsiStatus::from(0x77), ScsiStatus::Other(0x77));
    }

    #[test]
    fn every_sense_key_has_a_decision() {
        for k in 0..16u8 {
            let s = Sense::parse(&fixed(k, 0, 0)).unwrap();
            let dsp = classify(ScsiStatus::CheckCondition, Some(&s));
            assert!(dsp.action == Action::Complete || dsp.errno > 0, "key {k}");
        }
    }
}
