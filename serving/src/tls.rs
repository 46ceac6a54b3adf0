//! TLS with rustls (ring) for every listener and every connection: the hub's and the
//! spoke's gRPC listeners, the spoke's metrics listener, the spoke's connections to its
//! hubs and the SDK's connections.
//!
//! Handshakes happen here rather than in tonic so that certificates, keys and client CAs
//! are [`Reloading`]: a rotation (SIGHUP or a change of the files) applies to the next
//! handshake, and connections already open (with their streams) carry on untouched.
//! Private key files must not be readable by every user: a server refuses to start and
//! names the file ([`check_private`]).

use std::{
    io,
    net::SocketAddr,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::{Stream, StreamExt};
use rustls::{
    ClientConfig, RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject},
    server::WebPkiClientVerifier,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};
use tonic::transport::server::Connected;

use crate::reload::Reloading;

/// Longest a TLS handshake may take before the connection is dropped: a client across
/// a 60 ms link needs 2-3 round trips (~200 ms); 10 s covers retransmits and stops a
/// client that opens connections and never speaks from holding them.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once per listener; further connections wait in the
/// kernel's accept queue. Bounds the memory a flood of half-open TLS connections holds.
pub const MAX_PENDING_HANDSHAKES: usize = 256;

/// Why TLS settings could not be loaded, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

/// Refuses a key or token file that every user of the machine may read, naming it.
pub fn check_private(path: &Path) -> Result<(), String> {
    let mode = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o004 != 0 {
        return Err(format!(
            "{} is readable by every user (mode {:o}); it holds a secret: run `chmod 600 {}`",
            path.display(),
            mode & 0o777,
            path.display()
        ));
    }
    Ok(())
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read PEM certificates from {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    check_private(path)?;
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("cannot read a PEM private key from {}: {e}", path.display()))
}

fn read_roots(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|e| format!("{} is not a usable CA certificate: {e}", path.display()))?;
    }
    Ok(roots)
}

/// A handshake, failed with `TimedOut` after [`HANDSHAKE_TIMEOUT`].
async fn within_handshake_timeout<T>(handshake: impl std::future::Future<Output = T>) -> io::Result<T> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))
}

/// The first byte of a TLS connection: a handshake record (RFC 8446 §5.1, type 22).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// How long a server keeps a connection whose handshake failed, reading and discarding
/// what the client sends, after it has sent its alert and FIN (see
/// [`close_after_failed_handshake`]). A second is ample on any link (the client sends
/// its first data right after its Finished, in the same flight); it holds one of the
/// [`MAX_PENDING_HANDSHAKES`] slots meanwhile, like a slow handshake would.
const FAILED_HANDSHAKE_LINGER: Duration = Duration::from_secs(1);

/// Closes a connection whose handshake failed so that the client can read why.
///
/// In TLS 1.3 the client finishes its side of the handshake before the server checks
/// its certificate, and sends its first HTTP/2 bytes at once. rustls has written the
/// alert (CertificateRequired, UnknownCA, ...) by now; but closing a socket with unread
/// bytes makes the kernel send a reset, which can reach the client before it reads the
/// alert, and the client then reports only "broken pipe" (seen with the CLI against a
/// hub that requires client certificates). So: FIN after the alert, then drain reads
/// until the client closes or [`FAILED_HANDSHAKE_LINGER`] passes.
async fn close_after_failed_handshake(mut tcp: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tcp.shutdown().await;
    let mut discard = [0u8; 4096];
    let drain = async {
        while let Ok(read) = tcp.read(&mut discard).await {
            if read == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(FAILED_HANDSHAKE_LINGER, drain).await;
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// HTTP/2 over TLS is negotiated with ALPN `h2` (RFC 9113 §3.2).
const ALPN_H2: &[u8] = b"h2";

// ---------------------------------------------------------------------------------------
// Servers

/// The files of a TLS listener (`--tls-cert`, `--tls-key`, `--client-ca`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1); must not be world-readable.
    pub key: PathBuf,
    /// CA that signs client certificates; when set, clients present one.
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: a client *may* connect without a certificate (and must then
    /// authenticate with a token); a certificate it does present must verify.
    pub client_cert_optional: bool,
}

impl ServerTlsFiles {
    fn files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.cert.clone(), self.key.clone()];
        files.extend(self.client_ca.clone());
        files
    }

    fn server_config(&self) -> Result<ServerConfig, String> {
        let provider = provider();
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(read_roots(ca)?), provider);
                let verifier =
                    if self.client_cert_optional { verifier.allow_unauthenticated() } else { verifier };
                builder.with_client_cert_verifier(
                    verifier.build().map_err(|e| format!("--client-ca {}: {e}", ca.display()))?,
                )
            }
        };
        let mut config =
            builder.with_single_cert(read_certs(&self.cert)?, read_key(&self.key)?).map_err(|e| {
                format!(
                    "{} and {} are not a certificate and its key: {e}",
                    self.cert.display(),
                    self.key.display()
                )
            })?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(config)
    }
}

/// A listener's TLS settings, reloaded when their files change.
#[derive(Debug, Clone)]
pub struct ServerTls {
    config: Reloading<ServerConfig>,
    verifies_client_certs: bool,
}

impl ServerTls {
    /// Loads (and from now on watches) `files`; an error names the file at fault.
    pub fn load(files: &ServerTlsFiles) -> Result<Self, TlsError> {
        let watched = files.clone();
        let config = Reloading::watch("TLS certificate", files.files(), move || watched.server_config())
            .map_err(TlsError)?;
        Ok(Self { config, verifies_client_certs: files.client_ca.is_some() })
    }

    /// Whether a client certificate, when presented, was checked against a client CA.
    pub fn verifies_client_certs(&self) -> bool {
        self.verifies_client_certs
    }

    /// The TLS handshake of a gRPC connection (ALPN `h2`).
    async fn accept(&self, tcp: TcpStream) -> io::Result<ServerConn> {
        self.handshake(tcp, self.config.get()).await
    }

    /// The TLS handshake of a plain HTTP/1.1 connection (the metrics listener): same
    /// certificates, ALPN `http/1.1` so that curl and Prometheus do not try HTTP/2.
    pub async fn accept_http1(&self, tcp: TcpStream) -> io::Result<ServerConn> {
        let mut config = ServerConfig::clone(&self.config.get());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        self.handshake(tcp, Arc::new(config)).await
    }

    async fn handshake(&self, tcp: TcpStream, config: Arc<ServerConfig>) -> io::Result<ServerConn> {
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        // A plaintext client (an http:// URL) is closed at once, as before: draining it
        // would only hand its HTTP/2 parser a TLS alert to choke on ("frame with invalid
        // size"), where a reset tells it plainly that the connection was refused.
        let mut first = [0u8; 1];
        let peeked = within_handshake_timeout(tcp.peek(&mut first)).await??;
        if peeked == 0 || first[0] != TLS_HANDSHAKE_RECORD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a TLS client (a plaintext http:// client?); closed",
            ));
        }
        let tls = match within_handshake_timeout(acceptor.accept(tcp).into_fallible()).await? {
            Ok(tls) => tls,
            Err((error, tcp)) => {
                close_after_failed_handshake(tcp).await;
                return Err(error);
            }
        };
        let certified = self.verifies_client_certs && tls.get_ref().1.peer_certificates().is_some();
        // The verified certificate's DNS names: what a grants file's `cert:NAME` matches.
        let client_names: Arc<[String]> = match tls.get_ref().1.peer_certificates() {
            Some([leaf, ..]) if certified => webpki::EndEntityCert::try_from(leaf)
                .map(|cert| cert.valid_dns_names().map(str::to_owned).collect())
                .unwrap_or_default(),
            _ => Arc::from([]),
        };
        Ok(ServerConn { io: ConnIo::ServerTls(Box::new(tls)), certified, client_names })
    }
}

/// An accepted connection, plaintext or TLS, as the gRPC server reads it.
#[derive(Debug)]
pub struct ServerConn {
    io: ConnIo,
    certified: bool,
    client_names: Arc<[String]>,
}

/// What a request knows about its connection (tonic puts it in the request extensions).
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub remote: Option<SocketAddr>,
    /// The client presented a certificate that verified against the client CA.
    pub client_certified: bool,
    /// The DNS names of that certificate (its identity), when it did.
    pub client_names: Arc<[String]>,
}

impl Connected for ServerConn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        let tcp = match &self.io {
            ConnIo::Plain(tcp) => tcp,
            ConnIo::ServerTls(tls) => tls.get_ref().0,
            ConnIo::ClientTls(tls) => tls.get_ref().0,
        };
        PeerInfo {
            remote: tcp.peer_addr().ok(),
            client_certified: self.certified,
            client_names: self.client_names.clone(),
        }
    }
}

/// Accepted TCP connections, through a TLS handshake when `tls` is set. Handshakes run
/// in their own tasks, at most [`MAX_PENDING_HANDSHAKES`] at once; one that fails (a
/// plaintext client, an unknown CA, an expired certificate) is logged and dropped, and
/// the listener carries on.
pub fn incoming(
    tcp: impl Stream<Item = io::Result<TcpStream>> + Send + 'static,
    tls: Option<ServerTls>,
) -> impl Stream<Item = io::Result<ServerConn>> + Send + 'static {
    tcp.map(move |accepted| {
        let tls = tls.clone();
        async move {
            let tcp = accepted?;
            let Some(tls) = tls else {
                return Ok(Some(ServerConn {
                    io: ConnIo::Plain(tcp),
                    certified: false,
                    client_names: Arc::from([]),
                }));
            };
            let remote = tcp.peer_addr().ok();
            match tokio::spawn(async move { tls.accept(tcp).await }).await {
                Ok(Ok(conn)) => Ok(Some(conn)),
                Ok(Err(error)) => {
                    tracing::info!(?remote, %error, "TLS handshake failed");
                    Ok(None)
                }
                Err(join) => {
                    tracing::error!(?remote, error = %join, "TLS handshake task failed");
                    Ok(None)
                }
            }
        }
    })
    .buffer_unordered(MAX_PENDING_HANDSHAKES)
    .filter_map(|accepted| futures::future::ready(accepted.transpose()))
}

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
        Ok(ClientConn(ConnIo::ClientTls(Box::new(tls))))
    }
}

/// A client connection, plaintext or TLS.
#[derive(Debug)]
pub struct ClientConn(ConnIo);

impl ClientConn {
    pub fn plain(tcp: TcpStream) -> Self {
        Self(ConnIo::Plain(tcp))
    }
}

// ---------------------------------------------------------------------------------------
// One byte stream type for all of the above.

#[derive(Debug)]
enum ConnIo {
    Plain(TcpStream),
    ServerTls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    ClientTls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

macro_rules! delegate {
    ($io:expr, $s:ident => $call:expr) => {
        match $io {
            ConnIo::Plain($s) => {
                let $s = Pin::new($s);
                $call
            }
            ConnIo::ServerTls($s) => {
                let $s = Pin::new($s.as_mut());
                $call
            }
            ConnIo::ClientTls($s) => {
                let $s = Pin::new($s.as_mut());
                $call
            }
        }
    };
}

impl AsyncRead for ConnIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        delegate!(self.get_mut(), s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for ConnIo {
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
            ConnIo::Plain(s) => s.is_write_vectored(),
            ConnIo::ServerTls(s) => s.is_write_vectored(),
            ConnIo::ClientTls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self.get_mut(), s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self.get_mut(), s => s.poll_shutdown(cx))
    }
}

macro_rules! forward_io {
    ($t:ty, $field:tt) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                Pin::new(&mut self.get_mut().$field).poll_read(cx, buf)
            }
        }
        impl AsyncWrite for $t {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.get_mut().$field).poll_write(cx, buf)
            }
            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.get_mut().$field).poll_write_vectored(cx, bufs)
            }
            fn is_write_vectored(&self) -> bool {
                self.$field.is_write_vectored()
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.get_mut().$field).poll_flush(cx)
            }
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.get_mut().$field).poll_shutdown(cx)
            }
        }
    };
}

forward_io!(ServerConn, io);
forward_io!(ClientConn, 0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn world_readable_secrets_are_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join("hub.key");
        std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\n").expect("write");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = check_private(&key).unwrap_err();
        assert!(err.contains("hub.key is readable by every user (mode 644)"), "{err}");
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        check_private(&key).expect("group-readable (a Kubernetes fsGroup secret) is allowed");
    }
}
