//! TLS for the HTTP door: rustls (ring provider) driven by hand, sans-IO.
//!
//! [`load_server_config`] builds the server config from the PEM files `[listen] tls_cert`
//! and `tls_key` name (again on reload; connections already open keep the config they
//! started with). [`TlsSession`] wraps one `rustls::ServerConnection`: the loop feeds it
//! the ciphertext it reads, takes the plaintext requests out, writes plaintext responses in
//! and sends what [`TlsSession::pending_tls_out`] gives it.

use rustls::ServerConfig;
use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ServerConnection;
use std::fmt;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use crate::config::read_bounded;

/// Largest certificate chain or key file read.
pub const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// A TLS failure; messages name the file or say what the peer did wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError(pub String);

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

/// The server config for `cert_path` (a PEM chain, leaf first) and `key_path` (a PEM
/// private key: PKCS#8, PKCS#1 or SEC1). TLS 1.3 and 1.2, ALPN `http/1.1`.
pub fn load_server_config(
    cert_path: &Path,
    key_path: &Path,
) -> Result<Arc<ServerConfig>, TlsError> {
    let cert_err = |what: &dyn fmt::Display| {
        TlsError(format!("listen.tls_cert {}: {what}", cert_path.display()))
    };
    let key_err = |what: &dyn fmt::Display| {
        TlsError(format!("listen.tls_key {}: {what}", key_path.display()))
    };
    let cert_pem = read_bounded(cert_path, MAX_PEM_BYTES).map_err(|e| cert_err(&e))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| cert_err(&format!("not a PEM certificate chain: {e}")))?;
    if certs.is_empty() {
        return Err(cert_err(&"no CERTIFICATE block found"));
    }
    let key_pem = read_bounded(key_path, MAX_PEM_BYTES).map_err(|e| key_err(&e))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| key_err(&format!("no PEM private key found: {e}")))?;
    if let Ok(meta) = std::fs::metadata(key_path)
        && meta.permissions().mode() & 0o077 != 0
    {
        crate::warn!(
            "listen.tls_key {} is readable by group or others (mode {:o}); chmod 600 it",
            key_path.display(),
            meta.permissions().mode() & 0o777
        );
    }
    let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("TLS setup: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            TlsError(format!(
                "listen.tls_cert {} and listen.tls_key {}: {e}",
                cert_path.display(),
                key_path.display()
            ))
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// One TLS connection, sans-IO.
pub struct TlsSession {
    conn: ServerConnection,
    plain_in: Vec<u8>,
    /// Decrypted bytes held before `feed` stops taking ciphertext (back-pressure).
    max_plain_in: usize,
    peer_closed: bool,
}

impl fmt::Debug for TlsSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSession")
            .field("handshaking", &self.conn.is_handshaking())
            .field("plain_in", &self.plain_in.len())
            .field("peer_closed", &self.peer_closed)
            .finish()
    }
}

impl TlsSession {
    /// A server-side session; at most about `max_plain_in` decrypted bytes are held
    /// (set it to the largest request: head plus body limits).
    pub fn new(config: Arc<ServerConfig>, max_plain_in: usize) -> Result<TlsSession, TlsError> {
        let mut conn = ServerConnection::new(config).map_err(|e| TlsError(format!("TLS: {e}")))?;
        // Outgoing plaintext is bounded by the loop's own write-buffer limit instead.
        conn.set_buffer_limit(None);
        Ok(TlsSession {
            conn,
            plain_in: Vec::new(),
            max_plain_in,
            peer_closed: false,
        })
    }

    /// Take ciphertext read from the socket. Returns how many bytes were taken: fewer than
    /// given when enough plaintext waits to be consumed (keep the rest and feed it later).
    /// An error means the peer broke TLS: send [`pending_tls_out`](Self::pending_tls_out)
    /// (an alert) and close.
    pub fn feed(&mut self, ciphertext: &[u8]) -> Result<usize, TlsError> {
        let mut rest = ciphertext;
        while !rest.is_empty() && self.plain_in.len() < self.max_plain_in && !self.peer_closed {
            let n = self
                .conn
                .read_tls(&mut rest)
                .map_err(|e| TlsError(format!("TLS read: {e}")))?;
            if n == 0 {
                break;
            }
            let state = self
                .conn
                .process_new_packets()
                .map_err(|e| TlsError(format!("TLS: {e}")))?;
            if state.plaintext_bytes_to_read() > 0 {
                self.drain_plaintext()?;
            }
            if state.peer_has_closed() {
                self.peer_closed = true;
            }
        }
        Ok(ciphertext.len() - rest.len())
    }

    fn drain_plaintext(&mut self) -> Result<(), TlsError> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match self.conn.reader().read(&mut chunk) {
                Ok(0) => return Ok(()),
                Ok(n) => self.plain_in.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(TlsError(format!("TLS read: {e}"))),
            }
        }
    }

    /// Decrypted bytes not yet consumed.
    pub fn plaintext(&self) -> &[u8] {
        &self.plain_in
    }

    /// Drop the first `n` plaintext bytes (a request handled).
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.plain_in.len());
        self.plain_in.drain(..n);
        // A large body decrypted once is not kept for the rest of the connection.
        if self.plain_in.is_empty() && self.plain_in.capacity() > 16 * 1024 {
            self.plain_in = Vec::new();
        }
    }

    /// Queue plaintext (a response) for encryption.
    pub fn write_plain(&mut self, data: &[u8]) -> Result<(), TlsError> {
        self.conn
            .writer()
            .write_all(data)
            .map_err(|e| TlsError(format!("TLS write: {e}")))
    }

    /// Append the ciphertext waiting to be sent to `out`; returns how many bytes.
    pub fn pending_tls_out(&mut self, out: &mut Vec<u8>) -> usize {
        let before = out.len();
        while self.conn.wants_write() {
            match self.conn.write_tls(out) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        out.len() - before
    }

    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// The peer sent close_notify: no more requests will come.
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// Queue close_notify (then send [`pending_tls_out`](Self::pending_tls_out)).
    pub fn close(&mut self) {
        self.conn.send_close_notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::http::request::{Progress, RequestLimits, RequestReader};
    use rustls::ClientConfig;
    use rustls::client::ClientConnection;
    use rustls::pki_types::ServerName;

    struct Pki {
        _dir: tempfile::TempDir,
        cert: std::path::PathBuf,
        key: std::path::PathBuf,
        der: CertificateDer<'static>,
    }

    fn pki() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        Pki {
            der: made.cert.der().clone(),
            _dir: dir,
            cert,
            key,
        }
    }

    fn client(pki: &Pki) -> ClientConnection {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pki.der.clone()).unwrap();
        let mut config = ClientConfig::builder_with_provider(Arc::new(default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap()).unwrap()
    }

    /// Move bytes both ways until neither side has anything to say.
    fn pump(client: &mut ClientConnection, server: &mut TlsSession) {
        for _ in 0..20 {
            let mut to_server = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut to_server).unwrap();
            }
            let mut offset = 0;
            while offset < to_server.len() {
                let n = server.feed(&to_server[offset..]).unwrap();
                assert!(n > 0);
                offset += n;
            }
            let mut to_client = Vec::new();
            server.pending_tls_out(&mut to_client);
            let mut rd = &to_client[..];
            while !rd.is_empty() {
                client.read_tls(&mut rd).unwrap();
                client.process_new_packets().unwrap();
            }
            if to_server.is_empty() && to_client.is_empty() {
                return;
            }
        }
        panic!("TLS pump did not settle");
    }

    #[test]
    fn handshake_request_and_response_in_memory() {
        let pki = pki();
        let config = load_server_config(&pki.cert, &pki.key).unwrap();
        let mut server = TlsSession::new(config, 64 * 1024).unwrap();
        let mut client = client(&pki);
        pump(&mut client, &mut server);
        assert!(!server.is_handshaking());
        assert_eq!(client.alpn_protocol(), Some(&b"http/1.1"[..]));

        let request = b"POST /mcp HTTP/1.1\r\nHost: localhost:9210\r\nContent-Length: 2\r\n\r\n{}";
        client.writer().write_all(request).unwrap();
        pump(&mut client, &mut server);
        let mut reader = RequestReader::new(RequestLimits::default());
        let Progress::Ready(parsed) = reader.poll_whole(server.plaintext()).unwrap() else {
            panic!("no request")
        };
        assert_eq!(parsed.path(), "/mcp");
        assert_eq!(&server.plaintext()[parsed.body.clone()], b"{}");
        server.consume(parsed.consumed);
        assert!(server.plaintext().is_empty());

        let response = b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n";
        server.write_plain(response).unwrap();
        pump(&mut client, &mut server);
        let mut got = vec![0u8; response.len()];
        client.reader().read_exact(&mut got).unwrap();
        assert_eq!(got, response);

        client.send_close_notify();
        pump(&mut client, &mut server);
        assert!(server.peer_closed());
    }

    #[test]
    fn back_pressure_holds_ciphertext() {
        let pki = pki();
        let config = load_server_config(&pki.cert, &pki.key).unwrap();
        let mut server = TlsSession::new(config, 1024).unwrap();
        let mut client = client(&pki);
        pump(&mut client, &mut server);
        client.writer().write_all(&vec![b'x'; 64 * 1024]).unwrap();
        let mut wire = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut wire).unwrap();
        }
        let taken = server.feed(&wire).unwrap();
        assert!(taken < wire.len(), "stops taking while plaintext waits");
        assert!(server.plaintext().len() >= 1024);
        let mut total = server.plaintext().len();
        let mut offset = taken;
        while offset < wire.len() {
            server.consume(server.plaintext().len());
            offset += server.feed(&wire[offset..]).unwrap();
            total += server.plaintext().len();
        }
        assert_eq!(total, 64 * 1024);
    }

    #[test]
    fn garbage_is_an_error_with_an_alert() {
        let pki = pki();
        let config = load_server_config(&pki.cert, &pki.key).unwrap();
        let mut server = TlsSession::new(config, 1024).unwrap();
        let err = server
            .feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap_err();
        assert!(err.0.contains("TLS"), "{err}");
        let mut out = Vec::new();
        server.pending_tls_out(&mut out);
        assert!(!out.is_empty(), "an alert is queued");
    }

    #[test]
    fn config_errors_name_the_file() {
        let ours = pki();
        let missing = ours.cert.with_file_name("nope.pem");
        let err = load_server_config(&missing, &ours.key).unwrap_err();
        assert!(
            err.0.contains("tls_cert") && err.0.contains("nope.pem"),
            "{err}"
        );
        let err = load_server_config(&ours.cert, &missing).unwrap_err();
        assert!(
            err.0.contains("tls_key") && err.0.contains("nope.pem"),
            "{err}"
        );
        // A key where the certificate should be, and the other way round.
        let err = load_server_config(&ours.key, &ours.key).unwrap_err();
        assert!(err.0.contains("tls_cert"), "{err}");
        let err = load_server_config(&ours.cert, &ours.cert).unwrap_err();
        assert!(err.0.contains("tls_key"), "{err}");
        // A key that does not match the certificate.
        let other = pki();
        let err = load_server_config(&ours.cert, &other.key).unwrap_err();
        assert!(
            err.0.contains("tls_cert") && err.0.contains("tls_key"),
            "{err}"
        );
    }
}
