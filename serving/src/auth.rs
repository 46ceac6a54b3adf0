//! Who may read what: bearer tokens, each mapped to the datasets it may read.
//!
//! A server given `--token-file` answers UNAUTHENTICATED to a request without a known
//! token (`authorization: Bearer <token>`) and PERMISSION_DENIED to one for a dataset
//! its token does not hold. The file holds only SHA-256 hashes of the tokens, one line
//! each:
//!
//! ```text
//! # NAME        HASH                 DATASETS (comma-separated, or * for all)  [control]
//! trainer-a     sha256:5e884898...   c4,wiki
//! ops           sha256:2c26b46b...   *                                          control
//! spoke-eu      sha256:a665a459...   *
//! ```
//!
//! A token reads its datasets; only one marked `control` may also change what a spoke
//! holds of them (prefetch, evict, pin, unpin): a reader cannot pin a cache full or
//! evict what other jobs read.
//!
//! Client certificates get grants in the same file: `NAME cert:DNSNAME DATASETS
//! [control]` grants a certificate (verified against `--client-ca`) whose DNS name is
//! DNSNAME. On a server with a token file, a verified certificate with no such line is
//! refused; without a token file (mTLS only) every verified certificate reads
//! everything and controls nothing: control is always granted by a line that says so.
//!
//! Each grant names a *principal* ([`Grant::principal`]): the token's or certificate's
//! line name, or the certificate's DNS name under mTLS only. What a principal sets up on
//! a spoke (a job's plan, its per-job counters) is its own: another principal neither
//! replaces nor sees it. An open server (no credentials at all) has one principal, "".
//!
//! Tokens are 256 random bits ([`new_token`]), so a plain SHA-256 is as good as a slow
//! password hash: there is nothing to guess. Revoking a token is deleting its line; the
//! file is [`Reloading`], so that takes effect within seconds without a restart. A token
//! file that can no longer be read or parsed fails closed: requests with a token get
//! UNAVAILABLE, naming the problem, until it is fixed (keeping the old list would undo a
//! revocation that broke the file), and [`Authenticator::token_file_failure`] says so
//! for an alarm.
//!
//! The [`Authenticator`] interceptor puts a [`Grant`] in every request; handlers call
//! [`Grant::check`] with the dataset they are about to touch. A request that reaches a
//! handler without a grant is refused: the check fails closed.

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
};

use sha2::{Digest, Sha256};
use tonic::{Request, Status, service::Interceptor};

use shardcache_proto::names::DatasetName;

use shardcache_transport::{credentials::TOKEN_PREFIX, reload::Reloading};

use crate::tls::PeerInfo;

/// A new random token (256 bits from the OS), shown to its holder once.
pub fn new_token() -> Result<String, String> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| "the OS random source failed".to_owned())?;
    Ok(format!("{TOKEN_PREFIX}{}", hex(&bytes)))
}

/// How a token is stored: `sha256:<hex>`.
pub fn hash_token(token: &str) -> String {
    format!("sha256:{}", hex(&Sha256::digest(token.as_bytes())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The datasets a token may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Datasets {
    All,
    Only(BTreeSet<String>),
}

impl fmt::Display for Datasets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Datasets::All => f.write_str("*"),
            Datasets::Only(names) => f.write_str(&names.iter().cloned().collect::<Vec<_>>().join(",")),
        }
    }
}

impl Datasets {
    /// `*` or a comma-separated list of dataset names.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == "*" {
            return Ok(Datasets::All);
        }
        let names = text
            .split(',')
            .map(|name| DatasetName::new(name).map(|n| n.as_str().to_owned()).map_err(|e| e.to_string()))
            .collect::<Result<BTreeSet<_>, _>>()?;
        Ok(Datasets::Only(names))
    }
}

/// One line of a token file: who holds the token and what it may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenHolder {
    pub name: String,
    pub datasets: Datasets,
    /// May also control a spoke's cache of its datasets (prefetch, evict, pin).
    pub control: bool,
}

/// The word that gives a token control of a spoke's cache, after its datasets.
pub const CONTROL: &str = "control";

impl TokenHolder {
    /// The token file line for this holder's `token`.
    pub fn line(&self, token: &str) -> String {
        let control = if self.control { format!(" {CONTROL}") } else { String::new() };
        format!("{} {} {}{control}", self.name, hash_token(token), self.datasets)
    }
}

/// A parsed token file: holders by token hash, and by client certificate name.
#[derive(Debug, Default)]
pub struct TokenBook {
    by_hash: HashMap<String, Arc<TokenHolder>>,
    by_cert: HashMap<String, Arc<TokenHolder>>,
}

/// The prefix of a grants-file line's second field that names a client certificate.
pub const CERT_PREFIX: &str = "cert:";

impl TokenBook {
    /// Parses a token file; an error names the line.
    pub fn parse(text: &str, path: &Path) -> Result<Self, String> {
        let mut by_hash = HashMap::new();
        let mut by_cert = HashMap::new();
        let mut names = BTreeSet::new();
        for (number, line) in text.lines().enumerate() {
            let at = || format!("{}:{}", path.display(), number + 1);
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (name, hash, datasets, control) = match fields[..] {
                [name, hash, datasets] => (name, hash, datasets, false),
                [name, hash, datasets, CONTROL] => (name, hash, datasets, true),
                [_, _, _, other] => {
                    return Err(format!(
                        "{}: unknown capability {other:?} (the only one is `{CONTROL}`)",
                        at()
                    ));
                }
                _ => {
                    return Err(format!(
                        "{}: expected `NAME sha256:HASH DATASETS [{CONTROL}]`, found {} fields",
                        at(),
                        fields.len()
                    ));
                }
            };
            if let Some(cert_name) = hash.strip_prefix(CERT_PREFIX) {
                if cert_name.is_empty() {
                    return Err(format!("{}: {name}'s `cert:` needs the certificate's DNS name", at()));
                }
                let datasets = Datasets::parse(datasets).map_err(|e| format!("{}: {e}", at()))?;
                if !names.insert(name.to_owned()) {
                    return Err(format!("{}: the name {name} is used twice", at()));
                }
                let holder = Arc::new(TokenHolder { name: name.to_owned(), datasets, control });
                if by_cert.insert(cert_name.to_ascii_lowercase(), holder).is_some() {
                    return Err(format!("{}: the certificate name {cert_name} is granted twice", at()));
                }
                continue;
            }
            let digest = hash.strip_prefix("sha256:").unwrap_or_default();
            if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "{}: {name}'s hash must be sha256: and 64 hex digits (`shardcache token` writes lines)",
                    at()
                ));
            }
            let datasets = Datasets::parse(datasets).map_err(|e| format!("{}: {e}", at()))?;
            if !names.insert(name.to_owned()) {
                return Err(format!("{}: the name {name} is used twice", at()));
            }
            let holder = Arc::new(TokenHolder { name: name.to_owned(), datasets, control });
            if by_hash.insert(digest.to_ascii_lowercase(), holder).is_some() {
                return Err(format!("{}: {name}'s token hash is used twice", at()));
            }
        }
        Ok(Self { by_hash, by_cert })
    }

    /// The grant of a client certificate with DNS names `names`, if a line names one.
    fn certificate(&self, names: &[String]) -> Option<Arc<TokenHolder>> {
        names.iter().find_map(|name| self.by_cert.get(&name.to_ascii_lowercase()).cloned())
    }

    pub fn load(path: &Path) -> Result<Self, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text, path)
    }

    fn holder(&self, token: &str) -> Option<Arc<TokenHolder>> {
        let hash = hash_token(token);
        self.by_hash.get(hash.trim_start_matches("sha256:")).cloned()
    }

    /// The holder whose line is named `name`.
    pub fn named(&self, name: &str) -> Option<Arc<TokenHolder>> {
        self.by_hash.values().chain(self.by_cert.values()).find(|holder| holder.name == name).cloned()
    }

    pub fn len(&self) -> usize {
        self.by_hash.len() + self.by_cert.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What one request may read, put in its extensions by the [`Authenticator`].
#[derive(Debug, Clone)]
pub enum Grant {
    /// No credentials configured: an open server, where every request is one principal.
    Everything,
    /// mTLS without a token file: a verified client certificate (its first DNS name)
    /// reads every dataset and controls nothing.
    Certificate(Arc<str>),
    Token(Arc<TokenHolder>),
}

impl Grant {
    /// The request's grant; none (a service wired without the interceptor) refuses.
    pub fn of<T>(request: &Request<T>) -> Result<Grant, Status> {
        request
            .extensions()
            .get::<Grant>()
            .cloned()
            .ok_or_else(|| Status::permission_denied("request was not authenticated (server wiring error)"))
    }

    pub fn allows(&self, dataset: &str) -> bool {
        match self {
            Grant::Everything | Grant::Certificate(_) => true,
            Grant::Token(holder) => match &holder.datasets {
                Datasets::All => true,
                Datasets::Only(names) => names.contains(dataset),
            },
        }
    }

    /// Who the request is: the grant's line name (token or certificate), a certificate's
    /// DNS name under mTLS only, or "" on an open server. What a principal sets up on a
    /// server (a job's plan, its job counters) belongs to it.
    pub fn principal(&self) -> &str {
        match self {
            Grant::Everything => "",
            Grant::Certificate(name) => name,
            Grant::Token(holder) => &holder.name,
        }
    }

    /// Whether the grant may control a cache (its line says `control`, or the server is
    /// open): it then also sees what is the server's rather than a dataset's (hub URLs,
    /// global counters).
    pub fn may_control(&self) -> bool {
        match self {
            Grant::Everything => true,
            Grant::Certificate(_) => false,
            Grant::Token(holder) => holder.control,
        }
    }

    /// The operator's view: control of every dataset, so every principal's jobs and
    /// plans are its business too.
    pub fn is_operator(&self) -> bool {
        self.may_control()
            && match self {
                Grant::Token(holder) => matches!(holder.datasets, Datasets::All),
                _ => true,
            }
    }

    /// PERMISSION_DENIED unless the grant holds `dataset` and may control a cache's
    /// copy of it (prefetch, evict, pin).
    pub fn check_control(&self, dataset: &str) -> Result<(), Status> {
        self.check(dataset)?;
        match self {
            Grant::Token(holder) if !holder.control => Err(Status::permission_denied(format!(
                "{:?} may read dataset {dataset:?} but not change what the cache holds of it \
                 (prefetch, evict, pin): its line in the token file needs `{CONTROL}`",
                holder.name
            ))),
            Grant::Certificate(name) => Err(Status::permission_denied(format!(
                "client certificate {name:?} may read but not change what the cache holds (prefetch, evict, \
                 pin): give it a line `NAME {CERT_PREFIX}{name} DATASETS {CONTROL}` in a --token-file"
            ))),
            _ => Ok(()),
        }
    }

    /// PERMISSION_DENIED unless the grant holds `dataset`.
    pub fn check(&self, dataset: &str) -> Result<(), Status> {
        match self {
            _ if self.allows(dataset) => Ok(()),
            Grant::Token(holder) => Err(Status::permission_denied(format!(
                "token {:?} may not read dataset {dataset:?} (it holds: {})",
                holder.name, holder.datasets
            ))),
            Grant::Everything | Grant::Certificate(_) => Ok(()),
        }
    }
}

/// Checks each request's credentials and attaches its [`Grant`] (a tonic interceptor;
/// health and reflection are not wrapped: probes carry no token).
#[derive(Debug, Clone)]
pub struct Authenticator {
    tokens: Option<Reloading<TokenBook>>,
}

impl Authenticator {
    /// Every request may read everything (no `--token-file`).
    pub fn open() -> Self {
        Self { tokens: None }
    }

    /// Requests need a token from `path` (reloaded when it changes), or a verified
    /// client certificate.
    pub fn with_token_file(path: &Path) -> Result<Self, String> {
        let file: PathBuf = path.to_owned();
        let book = Reloading::watch("token file", vec![file.clone()], move || TokenBook::load(&file))?;
        Ok(Self { tokens: Some(book) })
    }

    /// A fixed set of tokens (tests).
    pub fn with_tokens(book: TokenBook) -> Self {
        Self { tokens: Some(Reloading::fixed(book)) }
    }

    /// Whether requests need credentials (a token file is in use).
    pub fn requires_credentials(&self) -> bool {
        self.tokens.is_some()
    }

    /// Why the token file no longer loads (tokens are refused meanwhile), or `None`.
    pub fn token_file_failure(&self) -> Option<String> {
        self.tokens.as_ref().and_then(Reloading::failure)
    }

    /// The grant of the token file's line `name`: what a principal known another way (an
    /// S3 access key, `s3_keys.rs`) may read. UNAVAILABLE while the token file cannot be
    /// used; `None` for a name the file no longer has (revoked). On an open server every
    /// name reads everything.
    pub fn grant_of_principal(&self, name: &str) -> Result<Option<Grant>, Status> {
        let Some(book) = &self.tokens else { return Ok(Some(Grant::Everything)) };
        if let Some(failure) = book.failure() {
            return Err(Status::unavailable(format!(
                "the server's token file cannot be used ({failure}); requests are refused until it is fixed"
            )));
        }
        Ok(book.get().named(name).map(Grant::Token))
    }

    fn grant<T>(&self, request: &Request<T>) -> Result<Grant, Status> {
        let peer = request.extensions().get::<PeerInfo>().filter(|peer| peer.client_certified);
        let Some(book) = &self.tokens else {
            // mTLS only: a verified certificate reads, and is someone (its plans are its
            // own); control needs a grants line that says so.
            return Ok(match peer.and_then(|peer| peer.client_names.first()) {
                Some(name) => Grant::Certificate(name.as_str().into()),
                None => Grant::Everything,
            });
        };
        let Some(value) = request.metadata().get("authorization") else {
            if let Some(peer) = peer {
                if book.failure().is_some() {
                    return Err(Status::unavailable(
                        "the server's grants file cannot be used; certificates are refused until it is fixed",
                    ));
                }
                return book.get().certificate(&peer.client_names).map(Grant::Token).ok_or_else(|| {
                    Status::unauthenticated(format!(
                        "client certificate {:?} has no grant: add `NAME {CERT_PREFIX}<its DNS name> DATASETS` \
                         to the server's token file",
                        peer.client_names
                    ))
                });
            }
            return Err(Status::unauthenticated(
                "missing credentials: send `authorization: Bearer <token>` (shardcache --token-file, \
                 spoke-cache --hub-token-file) or a client certificate",
            ));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .ok_or_else(|| Status::unauthenticated("the authorization header must be `Bearer <token>`"))?;
        if let Some(failure) = book.failure() {
            return Err(Status::unavailable(format!(
                "the server's token file cannot be used ({failure}); requests with tokens are refused until \
                 it is fixed"
            )));
        }
        // Never log the token: the holder's name is what identifies it.
        match book.get().holder(token) {
            Some(holder) => Ok(Grant::Token(holder)),
            None => Err(Status::unauthenticated("unknown or revoked token")),
        }
    }
}

impl Interceptor for Authenticator {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let grant = self.grant(&request)?;
        request.extensions_mut().insert(grant);
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(text: &str) -> Result<TokenBook, String> {
        TokenBook::parse(text, Path::new("tokens"))
    }

    fn request(token: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(token) = token {
            request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("ascii"));
        }
        request
    }

    #[test]
    fn tokens_map_to_their_datasets_and_the_file_holds_only_hashes() {
        let a = new_token().expect("random");
        let b = new_token().expect("random");
        assert_ne!(a, b);
        let holder = TokenHolder {
            name: "trainer-a".into(),
            datasets: Datasets::parse("c4,wiki").expect("names"),
            control: false,
        };
        let line = holder.line(&a);
        assert!(!line.contains(&a), "the file must not hold the token: {line}");
        let all = TokenHolder { name: "spoke".into(), datasets: Datasets::All, control: true }.line(&b);
        let mut auth =
            Authenticator::with_tokens(book(&format!("# comment\n\n{line}\n{all}\n")).expect("parses"));

        let granted = auth.call(request(Some(&a))).expect("known token");
        let grant = Grant::of(&granted).expect("attached");
        assert!(grant.allows("c4") && grant.allows("wiki") && !grant.allows("secret"));
        let denied = grant.check("secret").unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(denied.message().contains("\"trainer-a\" may not read dataset \"secret\""), "{denied:?}");
        assert!(Grant::of(&auth.call(request(Some(&b))).expect("known")).expect("attached").allows("secret"));
        // Control is its own capability: the reader may not, the `control` line may.
        let refused = grant.check_control("c4").unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert!(refused.message().contains("needs `control`"), "{refused:?}");
        let controller = Grant::of(&auth.call(request(Some(&b))).expect("known")).expect("attached");
        assert!(controller.check_control("c4").is_ok());

        for (token, words) in [
            (None, "missing credentials"),
            (Some("sct_nope"), "unknown or revoked token"),
            (Some(&a[..a.len() - 1]), "unknown or revoked token"),
        ] {
            let err = auth.call(request(token)).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated);
            assert!(err.message().contains(words), "{err:?}");
        }
        let mut basic = Request::new(());
        basic.metadata_mut().insert("authorization", "Basic abc".parse().expect("ascii"));
        assert_eq!(auth.call(basic).unwrap_err().code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn a_grant_missing_from_a_request_fails_closed() {
        assert_eq!(Grant::of(&Request::new(())).unwrap_err().code(), tonic::Code::PermissionDenied);
    }

    #[test]
    fn bad_token_files_name_the_line() {
        let hash = hash_token("x");
        assert!(book(&format!("a {hash}")).unwrap_err().contains("tokens:1: expected"));
        assert!(book("a sha256:12 *").unwrap_err().contains("tokens:1: a's hash"));
        assert!(book(&format!("a {hash} ../etc")).unwrap_err().contains("tokens:1: dataset name"));
        let twice = format!("a {hash} *\nb {hash} *");
        assert!(book(&twice).unwrap_err().contains("tokens:2: b's token hash is used twice"));
        let names = format!("a {hash} *\na {} *", hash_token("y"));
        assert!(book(&names).unwrap_err().contains("tokens:2: the name a is used twice"));
        assert!(book(&format!("a {hash} * contrl")).unwrap_err().contains("unknown capability \"contrl\""));
        assert!(book(&format!("a {hash} * control")).expect("parses").by_hash.values().all(|h| h.control));
    }
}
