//! Dataset and shard names, validated before they touch a filesystem path or a cache key.
//!
//! A dataset is one path component (a top-level folder of the source, an S3 prefix); a
//! shard is a relative `/`-separated path inside it. Rules, the same on every server:
//! no empty, `.` or `..` components, nothing absolute, no NUL or other control
//! characters, no backslash, no hidden components (a leading `.`: those hold metadata
//! such as [`DATASET_META_FILE`], never shards), and bounded lengths. A name that
//! passes can be joined to a root directory without leaving it, symlinks aside (the
//! source checks those).

use std::fmt;

/// Longest dataset name, in bytes.
pub const MAX_DATASET_LEN: usize = 128;
/// Longest shard name, in bytes (Linux `PATH_MAX` is 4096; S3 keys stop at 1024).
pub const MAX_SHARD_LEN: usize = 1024;
/// Longest single path component, in bytes (Linux `NAME_MAX`).
pub const MAX_COMPONENT_LEN: usize = 255;
/// Optional per-dataset metadata file (JSON, e.g. `{"record_size": 16384}`); hidden, so
/// never listed or served as a shard.
pub const DATASET_META_FILE: &str = ".shardcache.json";

/// Why a name was refused. Each message names the problem so a person can fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{kind} name is empty")]
    Empty { kind: &'static str },
    #[error("{kind} name is {len} bytes long; the limit is {limit}")]
    TooLong { kind: &'static str, len: usize, limit: usize },
    #[error("{kind} name {name:?} contains a NUL byte")]
    Nul { kind: &'static str, name: String },
    #[error("{kind} name {name:?} contains a control character")]
    Control { kind: &'static str, name: String },
    #[error("{kind} name {name:?} contains a backslash; use '/' to separate folders")]
    Backslash { kind: &'static str, name: String },
    #[error("{kind} name {name:?} is an absolute path; names are relative to the dataset")]
    Absolute { kind: &'static str, name: String },
    #[error("{kind} name {name:?} contains a '..' component; names may not leave their dataset")]
    ParentDir { kind: &'static str, name: String },
    #[error("{kind} name {name:?} contains an empty or '.' component")]
    EmptyComponent { kind: &'static str, name: String },
    #[error("{kind} name {name:?} has a hidden component (leading '.'); hidden files are not served")]
    Hidden { kind: &'static str, name: String },
    #[error("{kind} name {name:?} has a component longer than {limit} bytes")]
    ComponentTooLong { kind: &'static str, name: String, limit: usize },
    #[error("dataset name {name:?} contains '/'; a dataset is a single top-level folder")]
    DatasetSlash { name: String },
}

impl From<NameError> for tonic::Status {
    fn from(err: NameError) -> Self {
        tonic::Status::invalid_argument(err.to_string())
    }
}

/// A validated dataset name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DatasetName(String);

/// A validated shard name (relative path inside its dataset).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardName(String);

impl DatasetName {
    pub fn new(name: &str) -> Result<Self, NameError> {
        check_path("dataset", name, MAX_DATASET_LEN)?;
        if name.contains('/') {
            return Err(NameError::DatasetSlash { name: name.to_owned() });
        }
        Ok(Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl ShardName {
    pub fn new(name: &str) -> Result<Self, NameError> {
        check_path("shard", name, MAX_SHARD_LEN)?;
        Ok(Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `/`-separated components, each safe to join to a directory.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }
}

impl fmt::Display for DatasetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for ShardName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn check_path(kind: &'static str, name: &str, limit: usize) -> Result<(), NameError> {
    let owned = || name.to_owned();
    if name.is_empty() {
        return Err(NameError::Empty { kind });
    }
    if name.len() > limit {
        return Err(NameError::TooLong { kind, len: name.len(), limit });
    }
    if name.contains('\0') {
        return Err(NameError::Nul { kind, name: owned() });
    }
    if name.chars().any(char::is_control) {
        return Err(NameError::Control { kind, name: owned() });
    }
    if name.contains('\\') {
        return Err(NameError::Backslash { kind, name: owned() });
    }
    if name.starts_with('/') {
        return Err(NameError::Absolute { kind, name: owned() });
    }
    for component in name.split('/') {
        match component {
            ".." => return Err(NameError::ParentDir { kind, name: owned() }),
            "" | "." => return Err(NameError::EmptyComponent { kind, name: owned() }),
            c if c.starts_with('.') => return Err(NameError::Hidden { kind, name: owned() }),
            c if c.len() > MAX_COMPONENT_LEN => {
                return Err(NameError::ComponentTooLong { kind, name: owned(), limit: MAX_COMPONENT_LEN });
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        assert!(DatasetName::new("c4-llama3").is_ok());
        assert!(ShardName::new("train/shard-00001.bin").is_ok());
        assert!(ShardName::new("a b/ünïcode.bin").is_ok());
    }

    #[test]
    fn refuses_each_bad_shape_with_its_reason() {
        let cases: &[(&str, &str)] = &[
            ("", "is empty"),
            ("../etc/passwd", "'..' component"),
            ("a/../../b", "'..' component"),
            ("/etc/passwd", "absolute path"),
            ("a\0b", "NUL byte"),
            ("a\nb", "control character"),
            ("a\\b", "backslash"),
            ("a//b", "empty or '.' component"),
            ("./a", "empty or '.' component"),
            ("a/", "empty or '.' component"),
            (".git/config", "hidden component"),
            (".shardcache.json", "hidden component"),
        ];
        for (name, reason) in cases {
            let err = ShardName::new(name).unwrap_err().to_string();
            assert!(err.contains(reason), "{name:?}: {err}");
        }
        let long = "x".repeat(MAX_SHARD_LEN + 1);
        assert!(ShardName::new(&long).unwrap_err().to_string().contains("the limit is 1024"));
        let long_component = format!("a/{}", "y".repeat(256));
        assert!(matches!(ShardName::new(&long_component), Err(NameError::ComponentTooLong { .. })));
    }

    #[test]
    fn dataset_is_one_component() {
        assert!(matches!(DatasetName::new("a/b"), Err(NameError::DatasetSlash { .. })));
        assert!(matches!(DatasetName::new(".."), Err(NameError::ParentDir { .. })));
        assert!(matches!(DatasetName::new("../x"), Err(NameError::ParentDir { .. })));
        assert!(matches!(DatasetName::new("/x"), Err(NameError::Absolute { .. })));
        assert!(matches!(DatasetName::new(&"d".repeat(129)), Err(NameError::TooLong { .. })));
    }

    #[test]
    fn refusal_is_invalid_argument() {
        let status: tonic::Status = ShardName::new("../x").unwrap_err().into();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    }
}
