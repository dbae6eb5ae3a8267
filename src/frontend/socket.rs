//! The unix sockets the exports listen on (NBD's and vhost-user-blk's): made safely, private
//! from the start, and opened to one group only when the administrator asks.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Why a unix socket could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Something that is not a socket is at the path: never removed.
    #[error("{0} exists and is not a socket: remove it or choose another path")]
    NotASocket(PathBuf),
    /// A server is listening there already.
    #[error("{0} is in use by a running server: stop it or choose another path")]
    InUse(PathBuf),
    /// The system refused.
    #[error("{what} {path}")]
    Io {
        /// The step.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// Binds a unix socket at `path`, 0600 from the start (no window in which another user can
/// connect), then, with `group`, owned by that group and 0660 (a VMM run as its own user in that
/// group, libvirt's QEMU say, may connect); a stale socket left by a dead server is replaced,
/// anything else at the path is left alone.
pub fn bind_unix(path: &Path, group: Option<u32>) -> Result<UnixListener, SocketError> {
    let io = |what, source| SocketError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io("creating the directory of", e))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(SocketError::NotASocket(path.to_path_buf()))
        }
        Ok(_) => {
            if UnixStream::connect(path).is_ok() {
                return Err(SocketError::InUse(path.to_path_buf()));
            }
            std::fs::remove_file(path).map_err(|e| io("removing the stale socket", e))?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("looking at", e)),
    }
    use nix::sys::stat::{umask, Mode};
    let old = umask(Mode::from_bits_truncate(0o177));
    let l = UnixListener::bind(path);
    umask(old);
    let l = l.map_err(|e| io("binding", e))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid))
            .map_err(|e| io("giving the group access to", e))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .map_err(|e| io("giving the group access to", e))?;
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_is_private_from_the_start_and_nothing_else_is_replaced() {
        let dir = std::env::temp_dir().join(format!("srp-ublk-listen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s.sock");
        let l = bind_unix(&p, None).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(bind_unix(&p, None), Err(SocketError::InUse(_))));
        drop(l); // a stale socket: replaced
        drop(bind_unix(&p, None).unwrap());
        let f = dir.join("file");
        std::fs::write(&f, b"keep").unwrap();
        let e = bind_unix(&f, None).unwrap_err();
        assert!(matches!(e, SocketError::NotASocket(_)), "{e}");
        assert!(e.to_string().contains("is not a socket"));
        assert_eq!(std::fs::read(&f).unwrap(), b"keep");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_socket_group_gets_the_socket_and_only_the_group_is_let_in() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("srp-ublk-group-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("g.sock");
        // a group this process is in (its own), so that the chown is allowed without root
        let gid = nix::unistd::getegid().as_raw();
        let _l = bind_unix(&p, Some(gid)).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o660);
        assert_eq!(m.gid(), gid);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
