//! srp-ublk's exit statuses: what a script can tell apart without reading the message (srp-ublk(8)'s
//! EXIT STATUS lists them).

use srp_ublk::rdma::RdmaError;
use srp_ublk::session::SessionError;
use srp_ublk::wire::target::TargetError;

/// Why a command failed, as its exit status says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Any other failure (the message says what and what to do).
    Failure = 1,
    /// The command line is wrong: an unknown option, a missing or bad value, a bad target string.
    Usage = 2,
    /// Some of several things were done and some were not (`up`, `down`,
    /// `del --all`, `recover --all`, `upgrade --all`): the message says which.
    Partial = 3,
    /// The device, state file or target file named does not exist.
    NotFound = 4,
    /// The target could not be reached, or did not answer in time: the fabric, the address or the
    /// port (worth trying again later).
    Unreachable = 5,
    /// The target refused the login (SRP_LOGIN_REJ): its configuration or the target string must
    /// change first.
    Refused = 6,
}

impl Exit {
    /// Each status with what it means (srp-ublk(8)).
    pub const ALL: [(Exit, &'static str); 6] = [
        (
            Exit::Failure,
            "the command failed; the message on standard error says why and what to do",
        ),
        (
            Exit::Usage,
            "the command line is wrong: an unknown option, a missing or bad value, a bad target \
             string or device name",
        ),
        (
            Exit::Partial,
            "some of several devices were handled and some were not (up, down, \
             del --all, recover --all, upgrade --all); the messages say which",
        ),
        (
            Exit::NotFound,
            "the device, its state or the target file named does not exist",
        ),
        (
            Exit::Unreachable,
            "the target could not be reached or did not answer in time (address, port, route, \
             link): worth trying again",
        ),
        (
            Exit::Refused,
            "the target refused the login (SRP_LOGIN_REJ: ACL, target port id, channel limit): \
             its configuration or the target string must change",
        ),
    ];
}

/// A failure whose exit status is not 1, with its message.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failed {
    /// The status.
    pub exit: Exit,
    /// What failed and what to do.
    pub message: String,
}

/// A failure with exit status `exit`, as an error for `?` and `bail!`.
pub fn failed(exit: Exit, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Failed {
        exit,
        message: message.into(),
    })
}

/// A not-found failure's context, for `with_context` over the error that found nothing.
pub fn not_found(message: String) -> Failed {
    Failed {
        exit: Exit::NotFound,
        message,
    }
}

/// The exit status of a failed command: the first error in its chain that says one.
pub fn exit_of(e: &anyhow::Error) -> Exit {
    // a context that says a status (anyhow finds it through every context above it)
    if let Some(f) = e.downcast_ref::<Failed>() {
        return f.exit;
    }
    for cause in e.chain() {
        if let Some(f) = cause.downcast_ref::<Failed>() {
            return f.exit;
        }
        if cause.downcast_ref::<TargetError>().is_some()
            || cause
                .downcast_ref::<super::device::DeviceNameError>()
                .is_some()
        {
            return Exit::Usage;
        }
        // a login's failure reaches here as itself or inside a session's (transparently: the
        // session error's source is the RDMA error's own)
        let rdma = cause.downcast_ref::<RdmaError>().or_else(|| {
            match cause.downcast_ref::<SessionError>() {
                Some(SessionError::Login(r)) => Some(r),
                _ => None,
            }
        });
        match rdma {
            Some(RdmaError::LoginRejected { .. }) => return Exit::Refused,
            Some(
                RdmaError::Unreachable { .. }
                | RdmaError::NoListener { .. }
                | RdmaError::Timeout { .. }
                | RdmaError::NoInterface { .. },
            ) => return Exit::Unreachable,
            _ => {}
        }
    }
    Exit::Failure
}

/// The status a daemon reports with its ERROR line, read back by `add` (`ERROR <status>
/// <message>`; a line without a status is a plain failure).
pub fn parse_error_line(rest: &str) -> (Exit, &str) {
    let exit = |n: u8| Exit::ALL.iter().map(|(e, _)| *e).find(|e| *e as u8 == n);
    match rest.split_once(' ') {
        Some((code, msg)) => match code.parse::<u8>().ok().and_then(exit) {
            Some(e) => (e, msg),
            None => (Exit::Failure, rest),
        },
        None => (Exit::Failure, rest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn the_status_comes_from_the_first_cause_that_says_one() {
        let e = failed(Exit::NotFound, "no device /dev/ublkb9").context("del");
        assert_eq!(exit_of(&e), Exit::NotFound);
        let io: Result<(), std::io::Error> = Err(std::io::ErrorKind::NotFound.into());
        let e = io
            .with_context(|| not_found("no device /dev/ublkb9".into()))
            .unwrap_err();
        assert_eq!(exit_of(&e.context("stats")), Exit::NotFound);
        let bad = TargetError {
            token: "ioc_guid=zz".into(),
            problem: "expected hex".into(),
        };
        assert_eq!(
            exit_of(&anyhow::Error::new(bad).context("add")),
            Exit::Usage
        );
        assert_eq!(exit_of(&anyhow::anyhow!("something else")), Exit::Failure);
        // a login refused inside a session's error (transparent: not in the source chain)
        let rej = RdmaError::LoginRejected {
            reason: srp_ublk::wire::srp::LoginRejReason::ChannelLimitReached,
            dest: "192.0.2.1:5555".parse().unwrap(),
        };
        let e = anyhow::Error::new(SessionError::from(rej)).context("LUN 0");
        assert_eq!(exit_of(&e), Exit::Refused);
    }

    #[test]
    fn an_error_line_carries_its_status_across_the_pipe() {
        assert_eq!(
            parse_error_line("6 target rejected login"),
            (Exit::Refused, "target rejected login")
        );
        assert_eq!(
            parse_error_line("no status here"),
            (Exit::Failure, "no status here")
        );
        assert_eq!(parse_error_line("99 odd"), (Exit::Failure, "99 odd"));
        assert_eq!(parse_error_line("5"), (Exit::Failure, "5"));
    }
}
