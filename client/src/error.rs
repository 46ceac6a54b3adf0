//! Errors of the client SDK. Every byte the SDK hands out has been verified; anything
//! that could not be verified is one of these.

use shardcache_proto::checksum::ChecksumMismatch;
use shardcache_routing::{Judged, Verdict, of_code};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Settings that cannot work (TLS files, a token), with what to change.
    #[error("{0}")]
    Config(String),
    /// An endpoint that is not a URL. The cause is in the message (not a `source`): a
    /// caller printing the chain would print it twice.
    #[error("invalid endpoint {endpoint:?}: {}", chain(cause))]
    Endpoint { endpoint: String, cause: tonic::transport::Error },
    /// No connection: the innermost cause (refused, a TLS alert), then what to do.
    #[error("cannot connect to {endpoint}: {}", explained(endpoint, &chain(cause)))]
    Connect { endpoint: String, cause: tonic::transport::Error },
    /// The server's status, or tonic's for a connection that failed under a request
    /// (then the cause, e.g. a TLS alert or a reset, follows in parentheses, and what to
    /// do about it).
    #[error("{}", describe(endpoint, status))]
    Status { endpoint: String, status: tonic::Status },
    /// The bytes do not match their CRC32C: corrupted on the way. Never returned as data.
    #[error("corrupt data from {endpoint}: {source}")]
    Checksum {
        endpoint: String,
        #[source]
        source: ChecksumMismatch,
    },
    /// The server answered something other than what was asked (wrong offset, length,
    /// number of chunks, a stream that ended early).
    #[error("{endpoint} broke the protocol: {detail}")]
    Protocol { endpoint: String, detail: String },
    /// A dataset's file that does not hold what its format says (a truncated upload, a
    /// buggy writer, a hostile file): which file, the byte where it goes wrong when
    /// known, and what is wrong. Nothing of such a file is handed out as samples.
    #[error("{file}: damaged{}: {what}", at_byte(*offset))]
    Damaged { file: String, offset: Option<u64>, what: String },
    /// Decoding would hold more memory than the reader's budget allows
    /// (`SHARDCACHE_MEMORY_BUDGET`, Python `memory_budget=`): what, how much, the budget.
    #[error("{what} needs {needed} bytes of memory, past the budget of {budget} (SHARDCACHE_MEMORY_BUDGET; Python: Client.samples(memory_budget=...)){}", advise_budget(*needed, *budget))]
    OverBudget { what: String, needed: u64, budget: u64 },
    /// The shard changed between two messages of one read.
    #[error("shard {shard:?} changed during the read: version {expected} then {found}; read it again")]
    VersionChanged { shard: String, expected: String, found: String },
}

pub use shardcache_transport::report::chain;

/// The message a panic carried (its payload, when text), for an error that reports it.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// ` at byte N`, when the byte is known.
fn at_byte(offset: Option<u64>) -> String {
    offset.map(|at| format!(" at byte {at}")).unwrap_or_default()
}

/// What to do about an allocation over the budget: a larger budget where the file is
/// plausible, nothing where it claims more than any machine has.
fn advise_budget(needed: u64, budget: u64) -> String {
    if needed >= 1 << 40 {
        "; no dataset file needs that much: the file is damaged or was not written by the format's writer"
            .into()
    } else {
        format!(
            "; raise the budget past {needed} bytes if this machine has the memory, or read smaller batches (budget {budget})"
        )
    }
}

/// `ENDPOINT answered CODE: MESSAGE (CAUSES); ADVICE`, the parts a status has.
fn describe(endpoint: &str, status: &tonic::Status) -> String {
    let message = match status.message() {
        "" => String::new(),
        message => format!(": {message}"),
    };
    format!(
        "{endpoint} answered {:?}{message}{}{}",
        status.code(),
        causes(status),
        status_advice(endpoint, status)
    )
}

/// The source chain of a status (set for transport failures), as ` (a: b)`.
fn causes(status: &tonic::Status) -> String {
    match std::error::Error::source(status) {
        Some(cause) => format!(" ({})", chain(cause)),
        None => String::new(),
    }
}

/// What to do about a connection that failed with `cause` (its words), as `; ADVICE`;
/// empty when the words are not ones we know.
pub fn advice(endpoint: &str, cause: &str) -> String {
    let plain = endpoint.trim_start().starts_with("http://");
    let lower = cause.to_ascii_lowercase();
    let advice = if cause.contains("Connection refused") {
        "nothing is listening there: is the server running, and is this its address and port? (a hub \
         listens on 7070 and a spoke on 7071 by default)"
    } else if cause.contains("InvalidContentType") || cause.contains("corrupt message") {
        "the server does not speak TLS: use http:// for it"
    } else if cause.contains("UnknownIssuer") {
        "the server's certificate is signed by a CA this client does not trust: give the CA certificate \
         with --ca (SHARDCACHE_CA; Python: Client(ca=...))"
    } else if cause.contains("NotValidForName") {
        "the server's certificate does not name this host: connect by a name it holds, or give that name \
         with --tls-domain"
    } else if cause.contains("CertificateRequired") {
        "the server requires a client certificate: give --cert and --key (SHARDCACHE_CERT, SHARDCACHE_KEY)"
    } else if cause.contains("Expired") {
        "a certificate has expired: renew it (the server re-reads its files; restart a client)"
    } else if plain
        && [
            "broken pipe",
            "connection reset",
            "frame with invalid size",
            "invalid http version",
            "connection closed",
            "connection was not ready",
        ]
        .iter()
        .any(|words| lower.contains(words))
    {
        "if the server serves TLS, use https:// (and --ca with its CA)"
    } else if cause.contains("dns error") || cause.contains("failed to lookup address") {
        "the host name does not resolve: check the endpoint's host"
    } else {
        return String::new();
    };
    format!("; {advice}")
}

/// `cause` and what to do about it (`CAUSE; ADVICE`), for `endpoint`.
pub fn explained(endpoint: &str, cause: &str) -> String {
    format!("{cause}{}", advice(endpoint, cause))
}

/// A status tonic made for a transport failure, explained: its source chain (or, where
/// it has none, its message) and what to do.
pub fn explained_status(endpoint: &str, status: &tonic::Status) -> String {
    match std::error::Error::source(status) {
        Some(cause) => explained(endpoint, &chain(cause)),
        None => explained(endpoint, status.message()),
    }
}

/// What to do about `status` from `endpoint`, as `; ADVICE`, for the statuses a
/// misconfiguration gives: a transport failure under a request, a service the server
/// does not have.
fn status_advice(endpoint: &str, status: &tonic::Status) -> String {
    if status.code() == tonic::Code::Unimplemented && status.message().is_empty() {
        return "; the server does not serve this call: cache commands (status, warm, evict, pin, plans) need a \
                spoke, not a hub"
            .into();
    }
    // (A call the SDK failed itself when its connection went from under it has how the
    // connection ended as its source: `shardcache_transport::liveness::Orphaned`.)
    match std::error::Error::source(status) {
        Some(cause) => advice(endpoint, &chain(cause)),
        None => String::new(),
    }
}

impl Error {
    /// The gRPC status code: the server's, when it answered with an error status;
    /// ABORTED when the SDK itself saw a version change (what a server says for one).
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Status { status, .. } => Some(status.code()),
            Error::VersionChanged { .. } => Some(tonic::Code::Aborted),
            Error::Damaged { .. } => Some(tonic::Code::InvalidArgument),
            Error::OverBudget { .. } => Some(tonic::Code::ResourceExhausted),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a member that failed with this error is judged (`shardcache_routing`'s table): a
/// failure of the member's (its connection, garbled or corrupt bytes, an unwell status)
/// moves the read on; an answer about the request stands.
impl Judged for Error {
    fn verdict(&self) -> Verdict {
        match self {
            Error::Status { status, .. } => of_code(status.code()),
            Error::Connect { .. } | Error::Checksum { .. } | Error::Protocol { .. } => Verdict::Unwell,
            Error::Config(_)
            | Error::Endpoint { .. }
            | Error::VersionChanged { .. }
            | Error::Damaged { .. }
            | Error::OverBudget { .. } => Verdict::Answer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_members_failure_moves_on_and_an_answer_stands() {
        let garbled = Error::Protocol { endpoint: "http://a:1".into(), detail: "short".into() };
        assert_eq!(garbled.verdict(), Verdict::Unwell);
        let changed = Error::VersionChanged { shard: "s".into(), expected: "1".into(), found: "2".into() };
        assert_eq!(changed.verdict(), Verdict::Answer);
        let unavailable =
            Error::Status { endpoint: "http://a:1".into(), status: tonic::Status::unavailable("x") };
        assert_eq!(unavailable.verdict(), Verdict::Unwell);
    }

    #[test]
    fn a_call_failed_when_its_connection_went_says_how_and_what_to_do() {
        let orphaned = |how| Error::Status {
            endpoint: "http://a:1".into(),
            status: shardcache_transport::liveness::orphaned_status(how),
        };
        let reset = orphaned("Connection reset by peer (os error 104)");
        assert_eq!(reset.verdict(), Verdict::Unwell, "another member may answer");
        let said = reset.to_string();
        assert!(said.contains("(Connection reset by peer") && said.contains("use https://"), "{said}");
        // The advice follows how the connection ended, not the status's own words.
        let alert = orphaned("received fatal alert: DecodeError");
        assert!(!alert.to_string().contains("use https://"), "{alert}");
        // A server's own UNAVAILABLE gets no advice about this client's connection.
        let relayed = Error::Status {
            endpoint: "http://a:1".into(),
            status: tonic::Status::unavailable("hub unreachable: connection reset"),
        };
        assert!(!relayed.to_string().contains("use https://"), "{relayed}");
    }
}
