//! The SRP transport-class timers, with ib_srp's names, defaults and validity rules
//! (scsi_transport_srp.c `srp_tmo_valid`):
//!
//! - `reconnect_delay` (10 s): after a channel goes down, a reconnect is tried every this often;
//! - `fast_io_fail_tmo` (15 s): after this long down, held and new I/O fail with EIO (so
//!   dm-multipath moves to another path) while reconnecting goes on;
//! - `dev_loss_tmo` (600 s): after this long down, the device is removed.
//!
//! Each is a number of seconds or "off".

use std::time::Duration;

/// Longest fast_io_fail_tmo, and longest dev_loss_tmo when fast_io_fail is off (the SCSI layer's
/// SCSI_DEVICE_BLOCK_MAX_TIMEOUT): I/O must not wait longer than this for a transport.
pub const BLOCK_MAX_SECS: u32 = 600;

/// One timer: seconds, or off.
pub type Tmo = Option<u32>;

/// The three timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Timers {
    /// Seconds between reconnect attempts (off: never reconnect).
    pub reconnect_delay: Tmo,
    /// Seconds down before I/O fails fast (off: I/O waits until dev_loss).
    pub fast_io_fail_tmo: Tmo,
    /// Seconds down before the device is removed (off: never).
    pub dev_loss_tmo: Tmo,
}

impl Default for Timers {
    /// ib_srp's defaults.
    fn default() -> Self {
        Timers {
            reconnect_delay: Some(10),
            fast_io_fail_tmo: Some(15),
            dev_loss_tmo: Some(600),
        }
    }
}

/// A timer combination ib_srp would refuse, or a value that is not a timer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimerError {
    /// Not a number of seconds or "off".
    #[error("{name}: '{value}' is neither a number of seconds nor \"off\"")]
    Value {
        /// The option.
        name: &'static str,
        /// What was given.
        value: String,
    },
    /// The combination breaks one of ib_srp's rules.
    #[error("invalid timer combination: {0}")]
    Rule(&'static str),
}

/// Parses one timer value: seconds or "off" (a negative number is off too, as in sysfs).
pub fn parse_tmo(name: &'static str, s: &str) -> Result<Tmo, TimerError> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    match t.parse::<i64>() {
        Ok(n) if n < 0 => Ok(None),
        Ok(n) if n <= i64::from(u32::MAX) => Ok(Some(n as u32)),
        _ => Err(TimerError::Value {
            name,
            value: s.to_string(),
        }),
    }
}

impl Timers {
    /// Checks the combination with ib_srp's rules.
    pub fn validate(&self) -> Result<(), TimerError> {
        let (rd, ff, dl) = (
            self.reconnect_delay,
            self.fast_io_fail_tmo,
            self.dev_loss_tmo,
        );
        if rd.is_none() && ff.is_none() && dl.is_none() {
            return Err(TimerError::Rule(
                "reconnect_delay, fast_io_fail_tmo and dev_loss_tmo cannot all be off \
                 (a dead path would hold I/O for ever); set at least one",
            ));
        }
        if rd == Some(0) {
            return Err(TimerError::Rule(
                "reconnect_delay must be at least 1 second, or off",
            ));
        }
        if ff.is_some_and(|f| f > BLOCK_MAX_SECS) {
            return Err(TimerError::Rule(
                "fast_io_fail_tmo must be at most 600 seconds",
            ));
        }
        if ff.is_none() && dl.is_some_and(|d| d > BLOCK_MAX_SECS) {
            return Err(TimerError::Rule(
                "with fast_io_fail_tmo off, dev_loss_tmo must be at most 600 seconds \
                 (I/O would wait that long)",
            ));
        }
        if let (Some(f), Some(d)) = (ff, dl) {
            if f >= d {
                return Err(TimerError::Rule(
                    "fast_io_fail_tmo must be smaller than dev_loss_tmo",
                ));
            }
        }
        Ok(())
    }

    /// `reconnect_delay` as a duration.
    pub fn reconnect_delay(&self) -> Option<Duration> {
        self.reconnect_delay.map(secs)
    }
    /// `fast_io_fail_tmo` as a duration.
    pub fn fast_io_fail(&self) -> Option<Duration> {
        self.fast_io_fail_tmo.map(secs)
    }
    /// How far a held command may go round reconnects ([`crate::channel::ReissueLimit`]): fast_io_fail_tmo from
    /// its first hold.
    pub fn reissue_limit(&self) -> crate::channel::ReissueLimit {
        crate::channel::ReissueLimit::new(self.fast_io_fail().map(|d| d.as_millis() as u64))
    }
    /// `dev_loss_tmo` as a duration.
    pub fn dev_loss(&self) -> Option<Duration> {
        self.dev_loss_tmo.map(secs)
    }
}

fn secs(s: u32) -> Duration {
    Duration::from_secs(u64::from(s))
}

impl Timers {
    /// What a channel that just went down will do, for its log line.
    pub fn down_plan(&self) -> String {
        let reconnect = match self.reconnect_delay {
            Some(s) => format!("reconnect every {s} s"),
            None => "no reconnect (reconnect_delay off)".to_string(),
        };
        format!(
            "{reconnect}, fast_io_fail {}, dev_loss {}",
            in_secs(self.fast_io_fail_tmo),
            in_secs(self.dev_loss_tmo)
        )
    }

    /// When a failed reconnect is tried again, for the log line that reports the failure.
    pub fn next_attempt(&self) -> String {
        match self.reconnect_delay {
            Some(s) => format!("next attempt in {s} s"),
            None => "no further attempt (reconnect_delay off)".to_string(),
        }
    }
}

/// A timer for a log line: "15 s" or "off".
fn in_secs(t: Tmo) -> String {
    t.map_or_else(|| "off".to_string(), |s| format!("{s} s"))
}

/// Shows a timer as ib_srp's sysfs does ("off" or seconds).
pub fn show_tmo(t: Tmo) -> String {
    t.map_or_else(|| "off".to_string(), |s| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(rd: Tmo, ff: Tmo, dl: Tmo) -> Timers {
        Timers {
            reconnect_delay: rd,
            fast_io_fail_tmo: ff,
            dev_loss_tmo: dl,
        }
    }

    #[test]
    fn log_lines_name_off_timers() {
        let on = t(Some(2), Some(5), None);
        assert_eq!(
            on.down_plan(),
            "reconnect every 2 s, fast_io_fail 5 s, dev_loss off"
        );
        assert_eq!(on.next_attempt(), "next attempt in 2 s");
        let off = t(None, Some(5), Some(60));
        assert_eq!(
            off.down_plan(),
            "no reconnect (reconnect_delay off), fast_io_fail 5 s, dev_loss 60 s"
        );
        assert_eq!(
            off.next_attempt(),
            "no further attempt (reconnect_delay off)"
        );
    }

    #[test]
    fn ib_srp_defaults_are_valid() {
        assert_eq!(Timers::default(), t(Some(10), Some(15), Some(600)));
        Timers::default().validate().unwrap();
    }

    #[test]
    fn values_parse_like_sysfs() {
        assert_eq!(parse_tmo("x", "off"), Ok(None));
        assert_eq!(parse_tmo("x", "-1"), Ok(None));
        assert_eq!(parse_tmo("x", " 15 "), Ok(Some(15)));
        assert!(matches!(
            parse_tmo("x", "soon"),
            Err(TimerError::Value { .. })
        ));
    }

    #[test]
    fn srp_tmo_valid_rules() {
        // every case of scsi_transport_srp.c's srp_tmo_valid
        assert!(t(None, None, None).validate().is_err());
        assert!(t(Some(0), Some(5), Some(10)).validate().is_err());
        assert!(t(Some(1), Some(601), None).validate().is_err());
        assert!(t(Some(1), None, Some(601)).validate().is_err());
        assert!(t(Some(1), None, Some(600)).validate().is_ok());
        assert!(t(Some(1), Some(10), Some(10)).validate().is_err());
        assert!(t(Some(1), Some(9), Some(10)).validate().is_ok());
        assert!(t(None, Some(5), None).validate().is_ok());
        assert!(t(Some(2), Some(601), Some(10_000)).validate().is_err());
        assert!(t(Some(2), Some(600), Some(10_000)).validate().is_ok());
    }
}
