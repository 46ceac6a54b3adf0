//! Files that hold secrets: a private key or a token file must not be readable by every
//! user of the machine ([`check_private`]), and a client reads its bearer token from a
//! file ([`read_token_file`]), never from a flag's value (which `ps` shows).

use std::{os::unix::fs::PermissionsExt, path::Path};

/// Prefix of generated tokens (`shardcache token new`), so a leaked one is recognisable
/// in a secret scanner, and one given where its file's path was expected is refused
/// without being echoed.
pub const TOKEN_PREFIX: &str = "sct_";

/// Refuses a key or token file that every user of the machine may read, naming it.
pub fn check_private(path: &Path) -> Result<(), String> {
    let mode = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o004 != 0 {
        return Err(format!(
            "{} is readable by every user (mode {:o}); it holds a secret: run `chmod 600 {}`",
            path.display(),
            mode & 0o777,
            path.display()
        ));
    }
    Ok(())
}

/// Reads a token to present from `path` (the file holds the token itself, so it must
/// not be world-readable). A `path` that is a token (given where its file was asked for)
/// is refused without being echoed: error messages end up in logs.
pub fn read_token_file(path: &Path) -> Result<String, String> {
    let text = path.to_string_lossy();
    if !path.exists() && (text.starts_with(TOKEN_PREFIX) || (text.len() >= 32 && !text.contains('/'))) {
        return Err(
            "expected the path of a file holding the token, and this looks like a token itself (not \
                    shown): write it to a file (`chmod 600`) and give that file's path"
                .into(),
        );
    }
    check_private(path)?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(format!("{} must hold exactly one token", path.display()));
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn world_readable_secrets_are_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join("hub.key");
        std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\n").expect("write");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = check_private(&key).unwrap_err();
        assert!(err.contains("hub.key is readable by every user (mode 644)"), "{err}");
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        check_private(&key).expect("group-readable (a Kubernetes fsGroup secret) is allowed");
    }

    #[test]
    fn a_token_given_for_its_file_is_refused_without_being_echoed() {
        // As `shardcache token new` mints them: the prefix and 64 hex digits.
        let token = format!("{TOKEN_PREFIX}{}", "5e".repeat(32));
        let err = read_token_file(Path::new(&token)).unwrap_err();
        assert!(!err.contains(&token[4..]), "the secret is not echoed: {err}");
        assert!(err.contains("looks like a token"), "{err}");
        let missing = read_token_file(Path::new("/no/such/tokens")).unwrap_err();
        assert!(missing.contains("/no/such/tokens"), "a path is named: {missing}");
    }
}
