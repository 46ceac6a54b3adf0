//! S3 access keys: who an S3 request signed with AWS Signature Version 4 is.
//!
//! SigV4 proves that a request was signed with a secret the server also knows, so the
//! server must keep the secret itself; a token file keeps only SHA-256 hashes, and a
//! signing key is never derived from one. The spoke's S3 door (`--s3-keys FILE`) reads
//! its keys from a file of their own, mode 0600 (a file others can read is refused),
//! one line per key:
//!
//! ```text
//! # PRINCIPAL   ACCESS_KEY_ID          SECRET_ACCESS_KEY
//! trainer-a     SCAK4M2Q7XH3V9J6B1TP   Yq0x...(40 characters)
//! ```
//!
//! PRINCIPAL is a line name of the server's `--token-file`: an S3 key reads what that
//! line's token reads, and is that principal in the spoke's job table and status. A
//! principal may have several keys (rotation: add the new one, then delete the old
//! line); the file is reloaded as the token file is, so deleting a line revokes its key
//! within seconds. `shardcache token s3-key` makes a pair and appends its line.

use std::{collections::HashMap, path::Path};

/// The access key id a request names, and who it is.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Key {
    pub principal: String,
    pub access_key: String,
    /// Never logged or shown after it is made.
    pub secret: String,
}

impl std::fmt::Debug for S3Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("S3Key")
            .field("principal", &self.principal)
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// A parsed keys file, by access key id.
#[derive(Debug, Default)]
pub struct S3KeyBook {
    by_access_key: HashMap<String, S3Key>,
}

/// Characters of an access key id after its prefix, and of a secret.
const ACCESS_KEY_LEN: usize = 18;
const SECRET_LEN: usize = 40;
/// Every key this tool makes starts so: a person can tell one from an AWS key.
pub const ACCESS_KEY_PREFIX: &str = "SC";

impl S3KeyBook {
    /// Parses a keys file; an error names the line. `path` is for messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, String> {
        let mut by_access_key = HashMap::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = || format!("{} line {}", path.display(), number + 1);
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [principal, access_key, secret] = fields[..] else {
                return Err(format!(
                    "{}: expected `PRINCIPAL ACCESS_KEY_ID SECRET_ACCESS_KEY`, found {} fields",
                    at(),
                    fields.len()
                ));
            };
            if !valid_key_text(access_key, 16, 128) || !valid_key_text(secret, 16, 128) {
                return Err(format!(
                    "{}: an access key id and a secret are 16 to 128 letters, digits or `+/=` \
                     (make one with `shardcache token s3-key`)",
                    at()
                ));
            }
            let key = S3Key {
                principal: principal.to_owned(),
                access_key: access_key.to_owned(),
                secret: secret.to_owned(),
            };
            if by_access_key.insert(access_key.to_owned(), key).is_some() {
                return Err(format!("{}: access key id {access_key} is on two lines", at()));
            }
        }
        Ok(Self { by_access_key })
    }

    /// Reads `path`, refusing a file that users other than its owner may read.
    pub fn load(path: &Path) -> Result<Self, String> {
        use std::os::unix::fs::PermissionsExt;
        let metadata = std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "{} holds S3 secrets but is mode {mode:03o}: make it readable by its owner only (chmod 600)",
                path.display()
            ));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text, path)
    }

    pub fn get(&self, access_key: &str) -> Option<&S3Key> {
        self.by_access_key.get(access_key)
    }

    pub fn len(&self) -> usize {
        self.by_access_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_access_key.is_empty()
    }
}

fn valid_key_text(text: &str, least: usize, most: usize) -> bool {
    (least..=most).contains(&text.len())
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
}

impl S3Key {
    /// A new random key pair for `principal` (from the OS's random source).
    pub fn new(principal: &str) -> Result<Self, String> {
        const UPPER: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
        const ANY: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let random = |alphabet: &[u8], len: usize| -> Result<String, String> {
            use ring::rand::SecureRandom;
            let mut bytes = vec![0u8; len];
            ring::rand::SystemRandom::new()
                .fill(&mut bytes)
                .map_err(|_| "the OS random source failed".to_owned())?;
            // Both alphabets are powers of two long: no bias.
            Ok(bytes.iter().map(|b| char::from(alphabet[usize::from(*b) % alphabet.len()])).collect())
        };
        Ok(Self {
            principal: principal.to_owned(),
            access_key: format!("{ACCESS_KEY_PREFIX}{}", random(UPPER, ACCESS_KEY_LEN)?),
            secret: random(ANY, SECRET_LEN)?,
        })
    }

    /// Its line in a keys file.
    pub fn line(&self) -> String {
        format!("{} {} {}", self.principal, self.access_key, self.secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_file_maps_access_keys_to_principals_and_names_a_bad_line() {
        let made = S3Key::new("trainer").unwrap();
        assert!(made.access_key.starts_with(ACCESS_KEY_PREFIX) && made.access_key.len() == 20);
        assert_eq!(made.secret.len(), SECRET_LEN);
        assert_ne!(made, S3Key::new("trainer").unwrap(), "random");
        let text = format!("# comment\n\n{}\n", made.line());
        let book = S3KeyBook::parse(&text, Path::new("keys")).unwrap();
        assert_eq!(book.get(&made.access_key), Some(&made));
        assert_eq!(book.get("SCNOTAKEY0000000000"), None);
        let twice = format!("{}\n{}\n", made.line(), made.line());
        let err = S3KeyBook::parse(&twice, Path::new("keys")).unwrap_err();
        assert!(err.contains("keys line 2") && err.contains("two lines"), "{err}");
        let err = S3KeyBook::parse("trainer SCABC\n", Path::new("keys")).unwrap_err();
        assert!(err.contains("keys line 1") && err.contains("found 2 fields"), "{err}");
        let err = S3KeyBook::parse("trainer SCABCDEFGHIJKLMNOPQR short\n", Path::new("keys")).unwrap_err();
        assert!(err.contains("16 to 128"), "{err}");
    }

    #[test]
    fn a_keys_file_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s3-keys");
        std::fs::write(&path, S3Key::new("trainer").unwrap().line() + "\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = S3KeyBook::load(&path).unwrap_err();
        assert!(err.contains("mode 644") && err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(S3KeyBook::load(&path).unwrap().len(), 1);
    }
}
