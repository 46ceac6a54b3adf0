//! The flags both servers take, written once: TLS, tokens and limits
//! ([`ServingFlags`], flattened into `hub-server`'s and `spoke-cache`'s own), and the
//! rule that gives every flag an environment variable: the server's prefix and the
//! flag's name (`--tls-cert` is `HUB_TLS_CERT` for the hub, `SPOKE_TLS_CERT` for the
//! spoke), applied by [`parse`].

use std::{path::PathBuf, sync::Arc, time::Duration};

use clap::{CommandFactory, Parser};
use shardcache_proto::units::ByteSize;

use shardcache_transport::credentials::read_token_file;

use crate::{
    scrape::ScrapeAccess,
    server::{DEFAULT_MAX_STREAMS_PER_CONNECTION, Security, ServerLimits},
};

/// Largest `--max-read`; the client SDK accepts responses up to a bit more than this.
pub const MAX_READ_LIMIT: u64 = 64 << 20;

/// The flags both servers take: who may connect and what one request may cost.
#[derive(Debug, Clone, clap::Args)]
pub struct ServingFlags {
    /// Serve TLS (gRPC and metrics) with this PEM certificate chain (reloaded on change
    /// or SIGHUP).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert; must not be world-readable.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Require client certificates signed by this CA (with --token-file too, a client
    /// may present either).
    #[arg(long)]
    pub client_ca: Option<PathBuf>,

    /// Require bearer tokens listed (as hashes) in this file; each names the datasets it
    /// may read. See `shardcache token`.
    #[arg(long)]
    pub token_file: Option<PathBuf>,

    /// File holding the bearer token a scraper must send to the metrics listener
    /// (Prometheus: `authorization: {credentials_file: ...}`); without it, anyone who can
    /// connect may read the metrics, dataset names included.
    #[arg(long)]
    pub metrics_token_file: Option<PathBuf>,

    /// Largest read one ReadRange or ReadRanges call may return (at most 64MiB).
    #[arg(long, default_value = "16MiB")]
    pub max_read: ByteSize,

    /// Time a request may take to produce its response headers (e.g. 30s, 2m).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// Requests one connection may have open at once (HTTP/2 max concurrent streams).
    #[arg(long, default_value_t = DEFAULT_MAX_STREAMS_PER_CONNECTION)]
    pub max_streams_per_connection: u32,
}

impl ServingFlags {
    /// TLS and the token check these flags ask for; an error names the flag or file.
    pub fn security(&self) -> Result<Security, String> {
        Security::from_flags(
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.client_ca.as_deref(),
            self.token_file.as_deref(),
        )
    }

    /// Who may scrape the metrics listener.
    pub fn metrics_access(&self) -> Result<ScrapeAccess, String> {
        let token = self.metrics_token_file.as_deref().map(read_token_file).transpose();
        let token = token.map_err(|e| format!("--metrics-token-file: {e}"))?;
        Ok(ScrapeAccess { token: token.map(Arc::from) })
    }

    /// `--max-read`, checked.
    pub fn max_read(&self) -> Result<u64, String> {
        if self.max_read.0 == 0 || self.max_read.0 > MAX_READ_LIMIT {
            return Err(format!(
                "--max-read {} must be between 1B and {}",
                self.max_read,
                ByteSize(MAX_READ_LIMIT)
            ));
        }
        Ok(self.max_read.0)
    }

    /// The server's limits, with its own `--max-concurrency`.
    pub fn limits(&self, max_concurrency: usize) -> Result<ServerLimits, String> {
        if max_concurrency == 0 {
            return Err("--max-concurrency must be at least 1".into());
        }
        if self.max_streams_per_connection == 0 {
            return Err("--max-streams-per-connection must be at least 1".into());
        }
        Ok(ServerLimits {
            max_concurrency,
            max_streams_per_connection: self.max_streams_per_connection,
            request_timeout: self.request_timeout,
        })
    }
}

/// `T`'s command with an environment variable for every flag that has none: `prefix`
/// and the flag's long name in upper snake case (`--hub-timeout` with `SPOKE_` is
/// `SPOKE_HUB_TIMEOUT`).
pub fn command<T: CommandFactory>(prefix: &str) -> clap::Command {
    let mut command = T::command();
    // The server's example, then how sizes are written.
    let example = command.get_after_help().map(ToString::to_string).unwrap_or_default();
    command = command.after_help(format!("{example}\n\n{}", shardcache_proto::units::SIZE_SYNTAX));
    let named: Vec<(clap::Id, String)> = command
        .get_arguments()
        .filter(|arg| arg.get_env().is_none())
        .filter_map(|arg| Some((arg.get_id().clone(), arg.get_long()?.to_owned())))
        .collect();
    for (id, long) in named {
        let env = format!("{prefix}{}", long.to_ascii_uppercase().replace('-', "_"));
        command = command.mut_arg(id, |arg| arg.env(env));
    }
    command
}

/// Parses the process's arguments (and environment) as `T`, exiting with clap's
/// message on a bad flag.
pub fn parse<T: Parser>(prefix: &str) -> T {
    let matches = command::<T>(prefix).get_matches();
    T::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// [`parse`] over `args` (tests).
pub fn try_parse_from<T: Parser>(prefix: &str, args: &[&str]) -> Result<T, clap::Error> {
    let matches = command::<T>(prefix).try_get_matches_from(args)?;
    T::from_arg_matches(&matches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Parser)]
    struct Server {
        #[arg(long = "hub")]
        hubs: Vec<String>,
        #[arg(long, default_value_t = 8)]
        max_concurrency: usize,
        #[command(flatten)]
        serving: ServingFlags,
    }

    #[test]
    fn every_flag_gets_the_prefixed_environment_variable() {
        let spoke = command::<Server>("SPOKE_");
        let env = |id: &str| {
            let arg = spoke.get_arguments().find(|a| a.get_id() == id).unwrap();
            arg.get_env().unwrap().to_string_lossy().into_owned()
        };
        assert_eq!(env("hubs"), "SPOKE_HUB", "from the flag's name, not the field's");
        assert_eq!(env("max_concurrency"), "SPOKE_MAX_CONCURRENCY");
        assert_eq!(env("tls_cert"), "SPOKE_TLS_CERT");
        assert_eq!(env("max_streams_per_connection"), "SPOKE_MAX_STREAMS_PER_CONNECTION");
        let hub = command::<Server>("HUB_");
        let arg = hub.get_arguments().find(|a| a.get_id() == "metrics_token_file").unwrap();
        assert_eq!(arg.get_env().unwrap(), "HUB_METRICS_TOKEN_FILE");
    }

    #[test]
    fn shared_flags_are_checked_with_the_flag_named() {
        let parsed: Server = try_parse_from("X_", &["server", "--max-read", "128MiB"]).unwrap();
        assert!(parsed.serving.max_read().unwrap_err().contains("--max-read 128MiB"));
        assert!(parsed.serving.limits(0).unwrap_err().contains("--max-concurrency"));
        let limits = parsed.serving.limits(parsed.max_concurrency).unwrap();
        assert_eq!((limits.max_concurrency, limits.request_timeout), (8, Duration::from_secs(60)));
        assert!(
            try_parse_from::<Server>("X_", &["server", "--tls-cert", "c.pem"]).is_err(),
            "needs --tls-key"
        );
    }
}
