//! Certificates for TLS tests: a CA in a temporary folder and leaves signed by it, with
//! any validity (expired, not yet valid), written as the PEM files servers read.

use std::path::{Path, PathBuf};

use shardcache_cli::certs::{Authority, Role, Validity, write};
use shardcache_serving::tls::ServerTlsFiles;
use shardcache_transport::tls::ClientTlsFiles;
use time::Duration;

/// A CA and the folder its files go in.
#[derive(Debug)]
pub struct Pki {
    pub dir: tempfile::TempDir,
    ca: Authority,
    name: String,
}

/// Valid from an hour ago for a year.
pub fn valid() -> Validity {
    Validity::days(365)
}

/// Expired yesterday.
pub fn expired() -> Validity {
    Validity { not_before: Duration::days(-30), days: 29 }
}

/// Valid from tomorrow.
pub fn not_yet_valid() -> Validity {
    Validity { not_before: Duration::days(1), days: 30 }
}

impl Pki {
    /// A new CA called `name` (files `NAME-ca.pem`, `NAME-ca.key`).
    pub fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::new(&format!("{name} test CA"), valid()).unwrap();
        write(dir.path(), &format!("{name}-ca"), &ca.pem).unwrap();
        Self { dir, ca, name: name.to_owned() }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.path().join(format!("{}-ca.pem", self.name))
    }

    /// Writes a server leaf `file` (`FILE.pem`, `FILE.key`) for localhost/127.0.0.1.
    pub fn leaf(&self, file: &str, validity: Validity) -> (PathBuf, PathBuf) {
        self.leaf_in(self.dir.path(), file, validity)
    }

    /// Writes a server leaf into another folder (to replace a server's files in place).
    pub fn leaf_in(&self, dir: &Path, file: &str, validity: Validity) -> (PathBuf, PathBuf) {
        self.write_leaf(dir, file, Role::Server, validity)
    }

    /// Writes a client leaf `file` whose identity (DNS name) is `file`.
    pub fn client_leaf(&self, file: &str, validity: Validity) -> (PathBuf, PathBuf) {
        self.write_leaf(self.dir.path(), file, Role::Client, validity)
    }

    fn write_leaf(&self, dir: &Path, file: &str, role: Role, validity: Validity) -> (PathBuf, PathBuf) {
        write(dir, file, &self.ca.leaf(file, &[], role, validity).unwrap()).unwrap();
        (dir.join(format!("{file}.pem")), dir.join(format!("{file}.key")))
    }

    /// A server's files: a fresh valid leaf; clients must present one signed by
    /// `client_ca` when given.
    pub fn server(&self, file: &str, client_ca: Option<PathBuf>) -> ServerTlsFiles {
        let (cert, key) = self.leaf(file, valid());
        ServerTlsFiles { cert, key, client_ca, client_cert_optional: false }
    }

    /// A client that trusts this CA, presenting `identity` (a leaf of this CA) if given.
    pub fn client(&self, identity: Option<(&str, Validity)>) -> ClientTlsFiles {
        let (cert, key) = match identity {
            Some((file, validity)) => {
                let (cert, key) = self.client_leaf(file, validity);
                (Some(cert), Some(key))
            }
            None => (None, None),
        };
        ClientTlsFiles { ca: Some(self.ca()), cert, key, domain: None }
    }
}
