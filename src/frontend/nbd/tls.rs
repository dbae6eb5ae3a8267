//! TLS for NBD exports (NBD_OPT_STARTTLS, X.509 as qemu-nbd and nbdkit offer it), over rustls: the
//! server's certificate and key, and optionally a CA whose certificates clients must present.
//! [`TlsConn`] is a connection's TLS session over its socket, readable and writable in blocking mode
//! (the handshake, under its deadline) and non-blocking mode (the transmission loop) alike.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why the TLS configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file that does not read or parse.
    #[error("{what} {path}")]
    Pem {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A file with none of what it should hold.
    #[error("{path} holds no {what}")]
    Empty {
        /// What was looked for.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// rustls refused the combination (a key that does not match the certificate, say).
    #[error("{what}")]
    Rustls {
        /// The step.
        what: &'static str,
        /// rustls's error.
        #[source]
        source: rustls::Error,
    },
    /// The client CA does not make a verifier.
    #[error("client CA {path}")]
    Verifier {
        /// The CA file.
        path: PathBuf,
        /// The error.
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
}

fn certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |source| TlsError::Pem {
        what,
        path: path.into(),
        source,
    };
    let v = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if v.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.into(),
        });
    }
    Ok(v)
}

/// The server side of TLS: `cert` (PEM, the chain) and `key` (PEM); with `client_ca`, clients must
/// present a certificate that CA signed.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certs(cert, "certificate")?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Pem {
        what: "private key",
        path: key.into(),
        source,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            what: "protocol versions",
            source,
        })?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in certs(ca, "CA certificate")? {
                roots.add(c).map_err(|source| TlsError::Rustls {
                    what: "client CA",
                    source,
                })?;
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|source| TlsError::Verifier {
                    path: ca.into(),
                    source,
                })?;
            builder.with_client_cert_verifier(v)
        }
    };
    let cfg = builder
        .with_single_cert(chain, key)
        .map_err(|source| TlsError::Rustls {
            what: "certificate and key",
            source,
        })?;
    Ok(Arc::new(cfg))
}

/// One connection's TLS session over its socket.
pub struct TlsConn {
    conn: ServerConnection,
    pub(super) sock: TcpStream,
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl TlsConn {
    /// Runs the TLS handshake on `sock` (blocking, bounded by its timeouts; `arm` sets them before
    /// each step from the caller's deadline).
    pub fn accept(
        cfg: Arc<ServerConfig>,
        mut sock: TcpStream,
        arm: impl Fn(&TcpStream) -> io::Result<()>,
    ) -> io::Result<TlsConn> {
        let mut conn = ServerConnection::new(cfg).map_err(invalid)?;
        while conn.is_handshaking() {
            arm(&sock)?;
            conn.complete_io(&mut sock)?;
        }
        Ok(TlsConn { conn, sock })
    }

    /// Sends what rustls holds (records of written data, alerts) as far as the socket takes it.
    pub fn flush_tls(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.sock) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Records are waiting for the socket to take them.
    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// Decrypted data is waiting to be read (the socket need not be readable).
    pub fn buffered(&mut self) -> bool {
        self.conn
            .process_new_packets()
            .is_ok_and(|st| st.plaintext_bytes_to_read() > 0)
    }
}

impl Read for TlsConn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                // the peer closed without close_notify: the end of the stream all the same
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            self.flush_tls()?;
            if self.conn.read_tls(&mut self.sock)? > 0 {
                if let Err(e) = self.conn.process_new_packets() {
                    let _ = self.flush_tls(); // the alert
                    return Err(invalid(e));
                }
            }
        }
    }
}

impl Write for TlsConn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.conn.writer().write(buf)?;
        self.flush_tls()?;
        if n == 0 && !buf.is_empty() {
            // rustls's buffer is full until the socket takes more
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.flush_tls()
    }
}
