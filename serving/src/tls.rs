//! TLS on every listener: the hub's and the spoke's gRPC listeners and the spoke's
//! metrics listener. What clients share with it (the files, the handshake timeout, the
//! byte stream) is `shardcache_transport::tls`.
//!
//! Certificates, keys and client CAs are reloaded: a rotation (SIGHUP or a change of the
//! files) applies to the next handshake, and connections already open carry on
//! untouched. A private key file readable by every user stops the server at start,
//! named ([`check_private`]).

use std::{
    io,
    net::SocketAddr,
    path::PathBuf,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::{Stream, StreamExt};
use rustls::{ServerConfig, server::WebPkiClientVerifier};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};
use tonic::transport::server::Connected;

pub use shardcache_transport::tls::{TlsError, check_private};
use shardcache_transport::{
    reload::Reloading,
    tls::{ALPN_H2, Conn, provider, read_certs, read_key, read_roots, within_handshake_timeout},
};

/// Handshakes in progress at once per listener; further connections wait in the
/// kernel's accept queue. Bounds the memory a flood of half-open TLS connections holds.
pub const MAX_PENDING_HANDSHAKES: usize = 256;

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
        Ok(ServerConn { io: Conn::Tls(Box::new(tls)), certified, client_names })
    }
}

/// An accepted connection, plaintext or TLS, as the gRPC server reads it.
#[derive(Debug)]
pub struct ServerConn {
    io: Conn<tokio_rustls::server::TlsStream<TcpStream>>,
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
            Conn::Plain(tcp) => tcp,
            Conn::Tls(tls) => tls.get_ref().0,
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
                    io: Conn::Plain(tcp),
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

impl AsyncRead for ServerConn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for ServerConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
