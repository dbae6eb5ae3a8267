//! Where srp-ublk's log lines go and what each carries: a daemon's bounded file under
//! /run/srp-ublk/logs, or, under systemd, the journal (the unit's stderr, which its daemons inherit:
//! journald files their lines under the unit), each line with its syslog priority there so that
//! `journalctl -p warning` finds the warnings; every line of a device's daemon starts with the
//! device's name, which is how one device's lines are told from the unit's others. A daemon that
//! serves several devices (a target port's) names its port on its lines and the device on the
//! lines about one device.

use std::cell::RefCell;
use std::io::{self, Write};
use std::sync::OnceLock;
use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// The device (or export) this process serves, once it is known: the prefix of its log lines.
static SERVING: OnceLock<String> = OnceLock::new();

/// Names what this process serves in every log line from now on ("ublkb3", "export lun0").
pub fn name_lines(what: &str) {
    let _ = SERVING.set(format!("{what}: "));
}

thread_local! {
    /// The device the lines this thread logs now are about, ahead of what the process serves.
    static ABOUT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Names the device `what` ("ublkb3") in the lines this thread logs until the guard drops, in
/// place of what the process serves: how a port daemon's lines about one of its devices are told
/// from its others.
pub fn lines_about(what: &str) -> About {
    let before = ABOUT.with(|a| a.replace(Some(format!("{what}: "))));
    About { before }
}

/// Names a device in this thread's lines while it lives ([`lines_about`]).
pub struct About {
    before: Option<String>,
}

impl Drop for About {
    fn drop(&mut self) {
        let before = self.before.take();
        ABOUT.with(|a| *a.borrow_mut() = before);
    }
}

/// Whether standard error is the journal: systemd's JOURNAL_STREAM names the stream it connected
/// (device:inode), and a process that inherited it still has that stream as its fd 2.
pub fn stderr_is_journal() -> bool {
    let Some(want) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(st) = nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(&std::io::stderr())) else {
        return false;
    };
    want.to_str() == Some(format!("{}:{}", st.st_dev, st.st_ino).as_str())
}

/// The syslog priority the journal reads from a line's start (sd-daemon(3)).
fn priority(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "<3>",
        Level::WARN => "<4>",
        Level::INFO => "<6>",
        _ => "<7>",
    }
}

/// A `MakeWriter` that puts the journal priority (when writing to the journal) and the device's
/// name in front of each event's line.
pub struct Tagged<M> {
    inner: M,
    journal: bool,
}

impl<M> Tagged<M> {
    /// Lines written through `inner`; `journal`: with their syslog priority.
    pub fn new(inner: M, journal: bool) -> Self {
        Tagged { inner, journal }
    }

    fn prefix(&self, level: Option<&Level>) -> Vec<u8> {
        let mut p = Vec::new();
        if let (true, Some(l)) = (self.journal, level) {
            p.extend_from_slice(priority(l).as_bytes());
        }
        ABOUT.with(|a| match (&*a.borrow(), SERVING.get()) {
            (Some(s), _) | (None, Some(s)) => p.extend_from_slice(s.as_bytes()),
            (None, None) => {}
        });
        p
    }
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Tagged<M> {
    type Writer = TaggedWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        TaggedWriter {
            inner: self.inner.make_writer(),
            prefix: self.prefix(None),
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        TaggedWriter {
            inner: self.inner.make_writer_for(meta),
            prefix: self.prefix(Some(meta.level())),
        }
    }
}

/// One event's writer: its first write carries the prefix, in the same write as the line's start
/// (two writes could be split by another thread's line).
pub struct TaggedWriter<W> {
    inner: W,
    prefix: Vec<u8>,
}

impl<W: Write> Write for TaggedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.prefix.is_empty() {
            return self.inner.write(buf);
        }
        let mut line = std::mem::take(&mut self.prefix);
        line.extend_from_slice(buf);
        self.inner.write_all(&line)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// What `f` logs through a [`Tagged`] writer (`journal`: with priorities).
    fn logged(journal: bool, f: impl FnOnce()) -> String {
        let sink = Sink::default();
        let s2 = sink.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(Tagged::new(move || s2.clone(), journal))
            .with_ansi(false)
            .without_time()
            .finish();
        tracing::subscriber::with_default(sub, f);
        let out = sink.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_line_carries_its_priority_for_the_journal_and_the_device_once() {
        name_lines("ublkb7");
        let out = logged(true, || {
            tracing::warn!("path down");
            tracing::info!("path up");
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[0].starts_with("<4>ublkb7: "), "{out}");
        assert!(lines[0].ends_with("path down"), "{out}");
        assert!(lines[1].starts_with("<6>ublkb7: "), "{out}");
    }

    #[test]
    fn a_line_about_one_device_names_it_in_place_of_the_port() {
        let out = logged(false, || {
            {
                let _about = lines_about("ublkb2");
                tracing::info!("/dev/ublkb2 is live");
                let _inner = lines_about("ublkb3");
                tracing::info!("/dev/ublkb3 is live");
            }
            tracing::info!("channel 0 reconnected");
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].starts_with("ublkb2: "), "{out}");
        assert!(lines[1].starts_with("ublkb3: "), "{out}");
        // the process's own name (another test may have set it), no device's
        assert!(
            !lines[2].starts_with("ublkb2") && !lines[2].starts_with("ublkb3"),
            "{out}"
        );
        assert!(lines[2].ends_with("channel 0 reconnected"), "{out}");
    }

    #[test]
    fn a_prefix_goes_out_with_the_first_write_only() {
        let sink = Sink::default();
        let mut w = TaggedWriter {
            inner: sink.clone(),
            prefix: b"<3>x: ".to_vec(),
        };
        w.write_all(b"one ").unwrap();
        w.write_all(b"two\n").unwrap();
        assert_eq!(&*sink.0.lock().unwrap(), b"<3>x: one two\n");
    }

    #[test]
    fn without_journal_stream_stderr_is_not_the_journal() {
        // the test runner's stderr is no systemd stream (JOURNAL_STREAM names another or none)
        if std::env::var_os("JOURNAL_STREAM").is_none() {
            assert!(!stderr_is_journal());
        }
    }
}
