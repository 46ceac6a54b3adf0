//! Development certificates (`shardcache certs --out DIR`): a CA, and hub, spoke and
//! client certificates signed by it, so a TLS or mTLS setup takes a few lines.
//!
//! Every leaf has one role. `hub` and `spoke` are server certificates only (they cannot
//! be presented as a client: the spoke's cannot pose as a reader of the hub, nor a
//! client's as a server); `spoke-client` is the spoke's identity towards the hub and
//! `client` the trainers' and the CLI's, client certificates only. A client
//! certificate's DNS name (`spoke-client`, `client`) is what a grants file names
//! (`NAME cert:DNSNAME DATASETS`). Server leaves are valid for `localhost`,
//! `127.0.0.1` and `::1` plus the names given (container or Kubernetes service names).
//! Keys are ECDSA P-256, written with mode 0600. For production, use certificates from
//! your own CA (cert-manager, Vault).

use std::{io::Write, os::unix::fs::OpenOptionsExt, path::Path};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

/// Why certificates could not be made or written; the message says which file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CertError(String);

type Result<T> = std::result::Result<T, CertError>;

/// A certificate and its key, PEM-encoded.
#[derive(Debug, Clone)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// A certificate authority that signs leaves.
#[derive(Debug)]
pub struct Authority {
    pub pem: Pem,
    issuer: Issuer<'static, KeyPair>,
}

fn failed(e: rcgen::Error) -> CertError {
    CertError(format!("cannot make a certificate: {e}"))
}

/// When a certificate is valid: from `not_before` (relative to now, usually in the
/// past to absorb clock skew) for `days`.
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    pub not_before: Duration,
    pub days: i64,
}

impl Validity {
    /// From an hour ago (clock skew between machines) for `days`.
    pub fn days(days: i64) -> Self {
        Self { not_before: Duration::hours(-1), days }
    }

    fn apply(&self, params: &mut CertificateParams) {
        let start = OffsetDateTime::now_utc() + self.not_before;
        params.not_before = start;
        params.not_after = start + Duration::days(self.days);
    }
}

/// What a leaf certificate may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Serves TLS (extended key usage serverAuth only).
    Server,
    /// Authenticates a client (clientAuth only); its DNS name is its identity.
    Client,
}

impl Authority {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str, validity: Validity) -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        validity.apply(&mut params);
        let key = KeyPair::generate().map_err(failed)?;
        let cert = params.self_signed(&key).map_err(failed)?;
        let pem = Pem { cert: cert.pem(), key: key.serialize_pem() };
        Ok(Self { pem, issuer: Issuer::new(params, key) })
    }

    /// A leaf for `name` in `role`: a server certificate valid for `localhost`,
    /// loopback, `name` and `extra_names`; a client certificate named `name` (and
    /// `extra_names`) only, its identity.
    pub fn leaf(&self, name: &str, extra_names: &[String], role: Role, validity: Validity) -> Result<Pem> {
        let mut names = match role {
            Role::Server => vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()],
            Role::Client => Vec::new(),
        };
        names.extend(extra_names.iter().cloned());
        if !names.iter().any(|n| n == name) && !name.contains(' ') {
            names.push(name.to_owned());
        }
        let mut params = CertificateParams::new(names).map_err(failed)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![match role {
            Role::Server => ExtendedKeyUsagePurpose::ServerAuth,
            Role::Client => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        validity.apply(&mut params);
        let key = KeyPair::generate().map_err(failed)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(failed)?;
        Ok(Pem { cert: cert.pem(), key: key.serialize_pem() })
    }
}

/// Writes `pem` as `DIR/NAME.pem` and `DIR/NAME.key` (0600).
pub fn write(dir: &Path, name: &str, pem: &Pem) -> Result<()> {
    let io = |path: &Path, e: std::io::Error| CertError(format!("cannot write {}: {e}", path.display()));
    let cert = dir.join(format!("{name}.pem"));
    std::fs::write(&cert, &pem.cert).map_err(|e| io(&cert, e))?;
    let key = dir.join(format!("{name}.key"));
    // Replace, never append to, an older key; created 0600 so it is never readable by others.
    let _ = std::fs::remove_file(&key);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&key)
        .map_err(|e| io(&key, e))?;
    file.write_all(pem.key.as_bytes()).map_err(|e| io(&key, e))?;
    Ok(())
}

/// `shardcache certs`: `ca`, the servers' `hub` and `spoke`, and the clients'
/// `spoke-client` and `client` in `dir`, valid for `days`; `names` are added to the hub's
/// and the spoke's certificates. Returns the files.
pub fn write_dev_set(dir: &Path, names: &[String], days: i64) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).map_err(|e| CertError(format!("cannot create {}: {e}", dir.display())))?;
    let validity = Validity::days(days);
    let ca = Authority::new("shardcache development CA", validity)?;
    write(dir, "ca", &ca.pem)?;
    let mut written = vec!["ca.pem".to_owned(), "ca.key".to_owned()];
    for (name, extra, role) in [
        ("hub", names, Role::Server),
        ("spoke", names, Role::Server),
        ("spoke-client", &[][..], Role::Client),
        ("client", &[][..], Role::Client),
    ] {
        write(dir, name, &ca.leaf(name, extra, role, validity)?)?;
        written.extend([format!("{name}.pem"), format!("{name}.key")]);
    }
    Ok(written)
}
