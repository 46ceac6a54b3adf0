//! HTTP/2 and TCP settings for the long link between hub and spoke.
//!
//! 60 ms RTT at ~1 GB/s is a bandwidth-delay product of ~60 MB: that many bytes must be
//! in flight to fill the link. HTTP/2 flow control is set by the *receiver* (the spoke
//! for data): a response can be no larger than the stream window before the sender waits
//! a round trip for a WINDOW_UPDATE, and all streams of a connection share its window.
//! hyper's defaults (2 MiB stream, 5 MiB connection window, one connection) cap a 60 ms
//! link at 5 MiB / 60 ms = ~87 MB/s whatever the pipe. So the spoke opens several
//! connections with large fixed windows and no adaptive window (BDP estimation starts
//! small and grows by round trips: at 60 ms it needs seconds to open up, longer than a
//! cold start). The measurements behind each number are in BENCHMARKS.md (`wan-bench`).

use std::net::SocketAddr;

use tokio::net::TcpStream;
use tonic::transport::Endpoint;

use shardcache_proto::units::ByteSize;

use crate::tls::{ClientConn, ClientTls, Conn};

/// Stream window: the largest chunk (8 MiB, the spoke's `--chunk-size` limit) fits, so a
/// chunk response never waits a round trip for a WINDOW_UPDATE.
pub const STREAM_WINDOW: u32 = 8 << 20;

/// Connection window: covers the chunks one connection carries at once. The spoke keeps
/// at most `--upstream-bytes-in-flight` in flight over all connections, so 64 MiB per
/// connection never limits it; windows are allowances, not buffers, so a large one costs
/// no memory. Larger windows than hyper's default moved the 60 ms link closer to raw TCP
/// (`wan-bench`, BENCHMARKS.md).
pub const CONNECTION_WINDOW: u32 = 64 << 20;

/// Largest DATA frame the receiver accepts. 16 KiB (the HTTP/2 default) means 64 frame
/// headers and 64 wakeups per 1 MiB chunk; 1 MiB frames cut that to one (`wan-bench`
/// compares the two, BENCHMARKS.md).
pub const MAX_FRAME_SIZE: u32 = 1 << 20;

/// Connections the spoke opens to each hub. One TCP connection is one congestion window
/// and one loss recovery on a real long link, and one hyper connection task (one core)
/// at each end; four spread both (`wan-bench` compares one and four; the emulator models
/// delay and rate, not congestion windows, so the real-link reason is not measured there).
pub const DEFAULT_HUB_CONNECTIONS: usize = 4;

/// The HTTP/2 and socket settings of one side of the link (a client applies them with
/// [`Http2Settings::endpoint`] and [`Http2Settings::connector`]; a server with
/// `shardcache_serving`'s assembly, `serve_grpc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Settings {
    /// `None` leaves each setting at tonic/hyper's default (the comparison row of
    /// `wan-bench`).
    pub stream_window: Option<u32>,
    pub connection_window: Option<u32>,
    pub max_frame_size: Option<u32>,
    /// Socket buffer (SO_RCVBUF on the spoke's connections, SO_SNDBUF on the hub's);
    /// 0 leaves it to the kernel's autotuning. Linux caps an explicit size at
    /// `net.core.{r,w}mem_max` (4 MiB on this machine) and turns autotuning off, while
    /// autotuning grows receive buffers to `net.ipv4.tcp_rmem`'s max (32 MiB here): so
    /// the default is 0, and a long real link wants those sysctls raised (README).
    pub socket_buffer: usize,
}

impl Http2Settings {
    /// Checked settings from flag values (bytes); the error names the flag's rule.
    pub fn new(
        stream_window: u64,
        connection_window: u64,
        max_frame_size: u64,
        socket_buffer: u64,
    ) -> Result<Self, String> {
        // RFC 9113: windows up to 2^31-1, frames 16 KiB..=16 MiB-1.
        let window = |what: &str, v: u64| {
            u32::try_from(v).ok().filter(|&v| (65_535..=i32::MAX as u32).contains(&v)).ok_or_else(|| {
                format!("{what} {} is outside 64KiB..2GiB (HTTP/2 allows 65535..=2^31-1)", ByteSize(v))
            })
        };
        let frame = u32::try_from(max_frame_size).ok().filter(|&v| ((16 << 10)..(16 << 20)).contains(&v));
        Ok(Self {
            stream_window: Some(window("stream window", stream_window)?),
            connection_window: Some(window("connection window", connection_window)?),
            max_frame_size: Some(frame.ok_or_else(|| {
                format!(
                    "max frame size {} is outside 16KiB..16MiB (HTTP/2's limits)",
                    ByteSize(max_frame_size)
                )
            })?),
            socket_buffer: usize::try_from(socket_buffer)
                .map_err(|_| "socket buffer too large".to_owned())?,
        })
    }

    /// Large fixed windows and frames, adaptive window off.
    pub const TUNED: Self = Self {
        stream_window: Some(STREAM_WINDOW),
        connection_window: Some(CONNECTION_WINDOW),
        max_frame_size: Some(MAX_FRAME_SIZE),
        socket_buffer: 0,
    };

    /// tonic's defaults, for comparison.
    pub const DEFAULTS: Self =
        Self { stream_window: None, connection_window: None, max_frame_size: None, socket_buffer: 0 };

    /// A client endpoint with these settings: the windows the hub's responses may fill.
    pub fn endpoint(&self, endpoint: Endpoint) -> Endpoint {
        let endpoint = endpoint
            .initial_stream_window_size(self.stream_window)
            .initial_connection_window_size(self.connection_window)
            .max_frame_size(self.max_frame_size);
        if *self == Self::DEFAULTS { endpoint } else { endpoint.http2_adaptive_window(false) }
    }

    /// Connects a client socket with `TCP_NODELAY` and, when set, the receive buffer.
    /// (tonic applies the endpoint's connect timeout around a custom connector.)
    pub async fn connect(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        let socket =
            if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        if self.socket_buffer > 0 {
            socket.set_recv_buffer_size(self.socket_buffer as u32)?;
        }
        let stream = socket.connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    /// A connector for tonic endpoints: TCP with `TCP_NODELAY` and the receive buffer
    /// (tonic's own connector cannot set it), then TLS when `tls` is set. tonic applies
    /// the endpoint's connect timeout around it.
    pub fn connector(
        self,
        tls: Option<ClientTls>,
    ) -> impl tower::Service<
        http::Uri,
        Response = hyper_util::rt::TokioIo<ClientConn>,
        Error = std::io::Error,
        Future = impl Send + use<>,
    > + Clone
    + Send
    + 'static {
        tower::service_fn(move |uri: http::Uri| {
            let tls = tls.clone();
            async move {
                let bad =
                    || std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no host in {uri}"));
                let host =
                    uri.host().ok_or_else(bad)?.trim_start_matches('[').trim_end_matches(']').to_owned();
                let default_port = if uri.scheme_str() == Some("https") { 443 } else { 80 };
                let port = uri.port_u16().unwrap_or(default_port);
                let addr = tokio::net::lookup_host((host.as_str(), port)).await?.next().ok_or_else(bad)?;
                let tcp = self.connect(addr).await?;
                let conn = match tls {
                    Some(tls) => tls.connect(&host, tcp).await?,
                    None => Conn::Plain(tcp),
                };
                Ok(hyper_util::rt::TokioIo::new(conn))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked_against_http2_limits() {
        let tuned = Http2Settings::new(8 << 20, 64 << 20, 1 << 20, 0).unwrap();
        assert_eq!(tuned, Http2Settings::TUNED);
        assert!(Http2Settings::new(1 << 10, 64 << 20, 1 << 20, 0).unwrap_err().contains("stream window"));
        assert!(Http2Settings::new(8 << 20, 4 << 30, 1 << 20, 0).unwrap_err().contains("connection window"));
        assert!(Http2Settings::new(8 << 20, 64 << 20, 16 << 20, 0).unwrap_err().contains("max frame size"));
        assert!(Http2Settings::new(8 << 20, 64 << 20, 1 << 10, 0).unwrap_err().contains("16KiB"));
    }
}
