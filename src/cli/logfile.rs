//! A daemon's log file, bounded: past `max` bytes it is moved to `NAME.old` (replacing the one
//! before) and a new one started, so a daemon that logs for months keeps at most twice `max`.

use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The default bound of one log file.
pub const MAX_LOG_BYTES: u64 = 8 << 20;

struct State {
    file: File,
    written: u64,
}

/// A log file that rotates at `max` bytes; clones write to the same file.
#[derive(Clone)]
pub struct CappedLog {
    path: PathBuf,
    max: u64,
    state: Arc<Mutex<State>>,
}

impl CappedLog {
    /// Appends to `path` (created 0640 if missing).
    pub fn open(path: PathBuf, max: u64) -> io::Result<CappedLog> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o640)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        let written = file.metadata()?.len();
        Ok(CappedLog {
            path,
            max,
            state: Arc::new(Mutex::new(State { file, written })),
        })
    }

    fn rotate(&self, st: &mut State) -> io::Result<()> {
        let mut old = self.path.clone().into_os_string();
        old.push(".old");
        std::fs::rename(&self.path, &old)?;
        st.file = srp_ublk::session::state::create_new(&self.path, 0o640)?;
        st.written = 0;
        Ok(())
    }
}

impl Write for CappedLog {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.written > 0 && st.written + buf.len() as u64 > self.max {
            // a log that cannot rotate keeps growing rather than losing the line
            let _ = self.rotate(&mut st);
        }
        let n = st.file.write(buf)?;
        st.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_past_its_bound_moves_to_old_and_starts_again() {
        let dir = std::env::temp_dir().join(format!("srp-ublk-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("d.log");
        let mut log = CappedLog::open(p.clone(), 100).unwrap();
        for i in 0..25 {
            // tracing writes each event with one write_all, as here (19 bytes)
            log.write_all(format!("line {i:02} of the log\n").as_bytes())
                .unwrap();
        }
        let now = std::fs::read_to_string(&p).unwrap();
        let old = std::fs::read_to_string(dir.join("d.log.old")).unwrap();
        assert!(
            now.len() <= 100 && old.len() <= 100,
            "{} {}",
            now.len(),
            old.len()
        );
        assert!(now.ends_with("line 24 of the log\n"), "{now}");
        assert!(old.ends_with("line 19 of the log\n"), "{old}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
