//! How the SDK connects: the URL's scheme decides TLS (`https://`) or plaintext
//! (`http://`), [`ConnectOptions`] carries the CA, client certificate and bearer token,
//! and every connection uses the tuned HTTP/2 windows.

use std::fmt;

use shardcache_transport::{
    http2::Http2Settings,
    liveness::LiveChannel,
    tls::{ClientTls, ClientTlsFiles},
};
use tonic::{
    metadata::{Ascii, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::Endpoint,
};

use crate::{Error, Result};

/// TLS files and a token for [`crate::Client::connect_with`]. `Debug` never shows the
/// token.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    /// CA, client certificate and key, domain override; used with `https://` URLs
    /// (system roots when `None`).
    pub tls: Option<ClientTlsFiles>,
    /// Bearer token for servers started with `--token-file`.
    pub token: Option<String>,
}

impl fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("tls", &self.tls)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Adds `authorization: Bearer <token>` to every request (when there is a token), and the
/// caller's trace context (`shardcache_transport::telemetry::inject`).
#[derive(Clone, Default)]
pub struct Credentials {
    bearer: Option<MetadataValue<Ascii>>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("bearer", &self.bearer.as_ref().map(|_| "<redacted>")).finish()
    }
}

impl Credentials {
    pub fn token(token: Option<&str>) -> Result<Self> {
        let bearer = token
            .map(|t| {
                let mut value: MetadataValue<Ascii> = format!("Bearer {t}")
                    .parse()
                    .map_err(|_| Error::Config("the token holds characters a header cannot carry".into()))?;
                // Keeps the token out of HPACK's shared tables (RFC 7541 §7.1.3).
                value.set_sensitive(true);
                Ok::<_, Error>(value)
            })
            .transpose()?;
        Ok(Self { bearer })
    }

    /// The `authorization` header's value, when there is a token (the same-node door
    /// carries it in its questions).
    pub(crate) fn bearer(&self) -> Option<&MetadataValue<Ascii>> {
        self.bearer.as_ref()
    }
}

impl Interceptor for Credentials {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(bearer) = &self.bearer {
            request.metadata_mut().insert("authorization", bearer.clone());
        }
        // Every call of the SDK, the spoke's to hubs and peers too, carries its span's
        // W3C trace context when the process exports traces.
        shardcache_transport::telemetry::inject(request.metadata_mut());
        Ok(request)
    }
}

/// A channel that carries [`Credentials`], whose calls cannot outlive its connections
/// ([`LiveChannel`]).
pub type AuthChannel = InterceptedService<LiveChannel, Credentials>;

/// The TLS settings `endpoint`'s scheme asks for: `https://` needs them (system roots
/// when no files are given), `http://` must not have any.
pub fn client_tls(endpoint: &str, files: Option<&ClientTlsFiles>) -> Result<Option<ClientTls>> {
    let https = endpoint.starts_with("https://");
    match (https, files) {
        (true, files) => {
            let tls = ClientTls::load(&files.cloned().unwrap_or_default())
                .map_err(|e| Error::Config(format!("TLS for {endpoint}: {e}")))?;
            Ok(Some(tls))
        }
        (false, Some(files)) if *files != ClientTlsFiles::default() => Err(Error::Config(format!(
            "TLS files were given but {endpoint} is plaintext; use https://{}",
            endpoint.trim_start_matches("http://")
        ))),
        (false, _) => Ok(None),
    }
}

/// Connects a channel to `endpoint` (naming it in an error) with the tuned HTTP/2
/// windows (`shardcache_transport::http2`): a trainer keeps many batch reads in flight
/// on one connection, and hyper's default 5 MiB connection window holds only ~13
/// responses of 24 x 16 KiB. Its connections are counted, so that no call waits on one
/// that is gone ([`LiveChannel`]).
pub async fn connect_channel(endpoint: &str, options: &ConnectOptions) -> Result<LiveChannel> {
    let tls = client_tls(endpoint, options.tls.as_ref())?;
    let parsed = Endpoint::from_shared(endpoint.to_owned())
        .map_err(|cause| Error::Endpoint { endpoint: endpoint.to_owned(), cause })?;
    LiveChannel::connect(parsed, Http2Settings::TUNED, tls)
        .await
        .map_err(|cause| Error::Connect { endpoint: endpoint.to_owned(), cause })
}

/// [`connect_channel`] that connects on first use (and again after a failure): a member
/// of a group that is down when the client starts does not keep it from starting.
pub fn connect_channel_lazy(endpoint: &str, options: &ConnectOptions) -> Result<LiveChannel> {
    let tls = client_tls(endpoint, options.tls.as_ref())?;
    let parsed = Endpoint::from_shared(endpoint.to_owned())
        .map_err(|cause| Error::Endpoint { endpoint: endpoint.to_owned(), cause })?;
    Ok(LiveChannel::lazy(parsed, Http2Settings::TUNED, tls))
}
