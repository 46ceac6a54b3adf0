//! Command-line flags of `hub-server`; every flag is also an environment variable, `HUB_`
//! and its name (`shardcache_serving::flags`).

use std::{net::SocketAddr, path::PathBuf};

use clap::Parser;
use shardcache_proto::units::ByteSize;
use shardcache_reader::ReadLimits;
use shardcache_serving::flags::ServingFlags;
use shardcache_transport::http2::Http2Settings;

use crate::{
    Error,
    server::ServeOptions,
    source::s3::{S3Location, S3Options},
};

/// Smallest and largest `--message-size`. Below 64 KiB per-message overhead (headers,
/// CRC, a task wake-up) dominates; above 8 MiB a single message delays every other
/// stream on the connection and read-ahead memory grows.
pub const MESSAGE_SIZE_RANGE: (u64, u64) = (64 << 10, 8 << 20);

/// The prefix of the hub's environment variables.
pub const ENV_PREFIX: &str = "HUB_";

/// Serves dataset shards from a local directory or S3 over gRPC.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "hub-server",
    version,
    about,
    after_help = "Examples:\n  hub-server --root /data --listen 0.0.0.0:7070          # serves /data/DATASET/SHARD\n  \
                  hub-server --source s3://bucket/datasets --listen 0.0.0.0:7070"
)]
pub struct HubArgs {
    /// Directory to serve: each top-level folder is a dataset, each file below it a shard
    /// (short for --source file:///DIR).
    #[arg(long, required_unless_present = "source", conflicts_with = "source")]
    pub root: Option<PathBuf>,

    /// Where the data is: file:///DIR, or s3://BUCKET/PREFIX (each first-level folder
    /// under the prefix is a dataset; credentials from the AWS default chain).
    #[arg(long)]
    pub source: Option<String>,

    /// S3-compatible endpoint (MinIO, Ceph, ...); implies path-style addressing.
    #[arg(long)]
    pub s3_endpoint: Option<String>,

    /// S3 region (default: AWS_REGION or the profile's, else us-east-1).
    #[arg(long)]
    pub s3_region: Option<String>,

    /// Path-style S3 URLs (http://endpoint/bucket/key) even without --s3-endpoint.
    #[arg(long)]
    pub s3_path_style: bool,

    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,

    /// Address for Prometheus metrics (`GET /metrics`: requests, bytes served, read
    /// latency); none when unset.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,

    /// Size of the messages StreamShard sends (64KiB to 8MiB); was --chunk-size.
    #[arg(long, alias = "chunk-size", default_value = "1MiB")]
    pub message_size: ByteSize,

    /// zstd level (1..=19) of data messages to readers that take zstd (spokes and the SDK
    /// do), where a message compresses (judged on a sample of it); 0: none.
    #[arg(long, default_value_t = DEFAULT_COMPRESSION_LEVEL)]
    pub link_compression_level: i32,

    /// Requests in flight across all connections before new ones get RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 256)]
    pub max_concurrency: usize,

    /// HTTP/2 stream window for what clients send (requests are small; matches the spoke).
    #[arg(long, default_value = "8MiB")]
    pub http2_stream_window: ByteSize,

    /// HTTP/2 connection window for what clients send.
    #[arg(long, default_value = "64MiB")]
    pub http2_connection_window: ByteSize,

    /// Largest HTTP/2 frame the hub accepts (16KiB..16MiB); spokes set the size it sends.
    #[arg(long, default_value = "1MiB")]
    pub http2_max_frame_size: ByteSize,

    /// SO_SNDBUF of accepted connections; 0 = kernel autotuning (see README: long links).
    #[arg(long, default_value = "0")]
    pub socket_send_buffer: ByteSize,

    #[command(flatten)]
    pub serving: ServingFlags,
}

/// Default of `--link-compression-level`: chosen by compress-bench (BENCHMARKS.md).
pub const DEFAULT_COMPRESSION_LEVEL: i32 = 1;

/// A parsed `--root` / `--source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    Local(PathBuf),
    S3(S3Location),
}

impl HubArgs {
    /// Which source the flags name.
    pub fn source_spec(&self) -> Result<SourceSpec, Error> {
        match (&self.root, &self.source) {
            (Some(root), _) => Ok(SourceSpec::Local(root.clone())),
            (None, Some(url)) if url.starts_with("s3://") => Ok(SourceSpec::S3(S3Location::parse(url)?)),
            (None, Some(url)) => match url.strip_prefix("file://") {
                Some(dir) if dir.starts_with('/') => Ok(SourceSpec::Local(PathBuf::from(dir))),
                _ => Err(Error::Config(format!(
                    "--source {url:?} must be file:///absolute/dir or s3://bucket/prefix"
                ))),
            },
            (None, None) => Err(Error::Config("one of --root or --source is needed".into())),
        }
    }

    /// How to reach S3.
    pub fn s3_options(&self) -> S3Options {
        S3Options {
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
            path_style: self.s3_path_style || self.s3_endpoint.is_some(),
            static_credentials: None,
        }
    }

    /// The serving options these flags describe, or which flag is out of range.
    pub fn serve_options(&self) -> Result<ServeOptions, Error> {
        let (lo, hi) = MESSAGE_SIZE_RANGE;
        if !(lo..=hi).contains(&self.message_size.0) {
            return Err(Error::Config(format!(
                "--message-size {} is outside {}..={}",
                self.message_size,
                ByteSize(lo),
                ByteSize(hi)
            )));
        }
        if !(0..=19).contains(&self.link_compression_level) {
            return Err(Error::Config(format!(
                "--link-compression-level {} is outside 0..=19 (0: no compression)",
                self.link_compression_level
            )));
        }
        let serving = &self.serving;
        Ok(ServeOptions {
            // Checked against MESSAGE_SIZE_RANGE above, so it fits in u32.
            limits: ReadLimits {
                message_size: self.message_size.0 as u32,
                max_read: serving.max_read().map_err(Error::Config)?,
                compression: Some(self.link_compression_level).filter(|&level| level > 0),
            },
            server: serving.limits(self.max_concurrency).map_err(Error::Config)?,
            http2: Http2Settings::new(
                self.http2_stream_window.0,
                self.http2_connection_window.0,
                self.http2_max_frame_size.0,
                self.socket_send_buffer.0,
            )
            .map_err(|e| Error::Config(format!("--http2-*/--socket-send-buffer: {e}")))?,
            security: serving.security().map_err(Error::Config)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> HubArgs {
        let mut argv = vec!["hub-server", "--root", "/tmp"];
        argv.extend_from_slice(extra);
        shardcache_serving::flags::try_parse_from(ENV_PREFIX, &argv).expect("flags parse")
    }

    #[test]
    fn defaults_work_on_a_laptop() {
        let options = args(&[]).serve_options().expect("defaults are valid");
        assert_eq!(options.limits.message_size, 1 << 20);
        assert_eq!(args(&["--chunk-size", "2MiB"]).message_size.0, 2 << 20, "the old name still works");
        assert_eq!(options.limits.max_read, 16 << 20);
        assert_eq!(args(&[]).listen.to_string(), "127.0.0.1:7070");
        assert_eq!(options.http2, shardcache_transport::http2::Http2Settings::TUNED);
        assert_eq!(args(&[]).source_spec().unwrap(), SourceSpec::Local("/tmp".into()));
    }

    #[test]
    fn sources_are_a_directory_or_an_s3_prefix() {
        let parse = |argv: &[&str]| {
            shardcache_serving::flags::try_parse_from::<HubArgs>(
                ENV_PREFIX,
                &[&["hub-server"], argv].concat(),
            )
        };
        let s3 = parse(&["--source", "s3://bucket/data/", "--s3-endpoint", "http://127.0.0.1:9000"]).unwrap();
        assert_eq!(
            s3.source_spec().unwrap(),
            SourceSpec::S3(S3Location { bucket: "bucket".into(), prefix: "data/".into() })
        );
        assert!(s3.s3_options().path_style, "an endpoint implies path-style");
        let file = parse(&["--source", "file:///srv/data"]).unwrap();
        assert_eq!(file.source_spec().unwrap(), SourceSpec::Local("/srv/data".into()));
        let bad = parse(&["--source", "gs://x"]).unwrap().source_spec().unwrap_err().to_string();
        assert!(bad.contains("file:///absolute/dir or s3://bucket/prefix"), "{bad}");
        assert!(parse(&[]).is_err(), "a source is required");
        assert!(parse(&["--root", "/a", "--source", "s3://b"]).is_err(), "one source only");
    }

    #[test]
    fn out_of_range_flags_name_the_flag() {
        let err = args(&["--message-size", "16MiB"]).serve_options().unwrap_err().to_string();
        assert!(err.contains("--message-size 16MiB is outside 64KiB..=8MiB"), "{err}");
        let err = args(&["--max-read", "1GiB"]).serve_options().unwrap_err().to_string();
        assert!(err.contains("--max-read 1GiB"), "{err}");
        let err = args(&["--http2-max-frame-size", "32MiB"]).serve_options().unwrap_err().to_string();
        assert!(err.contains("max frame size") && err.contains("16KiB..16MiB"), "{err}");
    }
}
