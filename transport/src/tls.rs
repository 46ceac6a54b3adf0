//! TLS with rustls (ring) for every connection: what a client needs (its settings,
//! reloaded; its handshake) and what a server's TLS (`shardcache_serving::tls`) shares
//! with it (certificate, key and CA files, the handshake timeout, the byte stream of
//! either side).
//!
//! Handshakes happen here rather than in tonic so that certificates, keys and CAs are
//! [`Reloading`]: a rotation (SIGHUP or a change of the files) applies to the next
//! handshake, and connections already open (with their streams) carry on untouched.
//! Private key files must not be readable by every user ([`check_private`]).

use std::{
    io,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};

pub use crate::credentials::check_private;
use crate::reload::Reloading;

/// Longest a TLS handshake may take before the connection is dropped: a client across
/// a 60 ms link needs 2-3 round trips (~200 ms); 10 s covers retransmits and stops a
/// client that opens connections and never speaks from holding them.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why TLS settings could not be loaded, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read PEM certificates from {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    check_private(path)?;
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("cannot read a PEM private key from {}: {e}", path.display()))
}

pub fn read_roots(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|e| format!("{} is not a usable CA certificate: {e}", path.display()))?;
    }
    Ok(roots)
}

/// A handshake, failed with `TimedOut` after [`HANDSHAKE_TIMEOUT`].
pub async fn within_handshake_timeout<T>(handshake: impl std::future::Future<Output = T>) -> io::Result<T> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))
}

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// HTTP/2 over TLS is negotiated with ALPN `h2` (RFC 9113 §3.2).
pub const ALPN_H2: &[u8] = b"h2";

// ---------------------------------------------------------------------------------------
// Clients

/// What a client trusts and presents (`--ca`, `--cert`, `--key`, `--tls-domain`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// CA that signs the server's certificate; the system's roots when unset.
    pub ca: Option<PathBuf>,
    /// Client certificate chain and key, for servers that require one (mTLS).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Name to verify the server's certificate against, when the URL's host is not in
    /// it (an IP address, a port-forward).
    pub domain: Option<String>,
}

impl ClientTlsFiles {
    fn files(&self) -> Vec<PathBuf> {
        [&self.ca, &self.cert, &self.key].into_iter().flatten().cloned().collect()
    }

    fn client_config(&self) -> Result<ClientConfig, String> {
        let roots = match &self.ca {
            Some(ca) => read_roots(ca)?,
            None => {
                let mut roots = RootCertStore::empty();
                let native = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(native.certs);
                if roots.is_empty() {
                    return Err("no CA given (--ca) and no system root certificates found".into());
                }
                roots
            }
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        let mut config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                builder.with_client_auth_cert(read_certs(cert)?, read_key(key)?).map_err(|e| {
                    format!("{} and {} are not a certificate and its key: {e}", cert.display(), key.display())
                })?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => return Err("a client certificate needs both --cert and --key".into()),
        };
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(config)
    }
}

/// A client's TLS settings, reloaded when their files change.
#[derive(Debug, Clone)]
pub struct ClientTls {
    config: Reloading<ClientConfig>,
    domain: Option<String>,
}

impl ClientTls {
    pub fn load(files: &ClientTlsFiles) -> Result<Self, TlsError> {
        let watched = files.clone();
        let config = Reloading::watch("client TLS", files.files(), move || watched.client_config())
            .map_err(TlsError)?;
        Ok(Self { config, domain: files.domain.clone() })
    }

    /// Runs the handshake on `tcp` to `host` (or the configured domain).
    pub async fn connect(&self, host: &str, tcp: TcpStream) -> io::Result<ClientConn> {
        let name = self.domain.as_deref().unwrap_or(host);
        let server_name = ServerName::try_from(name.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?}: {e}")))?;
        let connector = tokio_rustls::TlsConnector::from(self.config.get());
        let tls = within_handshake_timeout(connector.connect(server_name, tcp)).await??;
        Ok(Conn::Tls(Box::new(tls)))
    }
}

/// A client connection, plaintext or TLS.
pub type ClientConn = Conn<tokio_rustls::client::TlsStream<TcpStream>>;

// ---------------------------------------------------------------------------------------
// One byte stream for either side: `T` is rustls's client or server stream.

/// A connection, plaintext or TLS (`T`: the client's or the server's TLS stream).
#[derive(Debug)]
pub enum Conn<T> {
    Plain(TcpStream),
    Tls(Box<T>),
}

macro_rules! delegate {
    ($io:expr, $s:ident => $call:expr) => {
        match $io {
            Conn::Plain($s) => {
                let $s = Pin::new($s);
                $call
            }
            Conn::Tls($s) => {
                let $s = Pin::new($s.as_mut());
                $call
            }
        }
    };
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Conn<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        delegate!(self.get_mut(), s => s.poll_read(cx, buf))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Conn<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        delegate!(self.get_mut(), s => s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        delegate!(self.get_mut(), s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self.get_mut(), s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self.get_mut(), s => s.poll_shutdown(cx))
    }
}
