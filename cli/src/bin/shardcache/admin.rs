//! Commands that prepare a secure setup: development certificates, access tokens and S3
//! keys.

use std::{io::Write, os::unix::fs::OpenOptionsExt, path::Path};

use anyhow::Context;
use shardcache_cli::certs;
use shardcache_serving::{
    auth::{Datasets, TokenBook, TokenHolder, new_token as random_token},
    s3_keys::{S3Key, S3KeyBook},
};

pub fn certs(out: &Path, names: &[String], days: i64) -> anyhow::Result<()> {
    let written = certs::write_dev_set(out, names, days)?;
    println!("wrote {} in {} (valid {days} days; keys are mode 0600)", written.join(", "), out.display());
    Ok(())
}

/// Prints a new token and appends `NAME sha256:HASH DATASETS` to `file`.
pub fn new_token(name: &str, datasets: &str, control: bool, file: &Path) -> anyhow::Result<()> {
    if name.is_empty() || name.contains(char::is_whitespace) || name.starts_with('#') {
        anyhow::bail!("--name {name:?} must be one word");
    }
    let datasets = Datasets::parse(datasets).map_err(anyhow::Error::msg).context("--datasets")?;
    let existing = std::fs::read_to_string(file).unwrap_or_default();
    let holder = TokenHolder { name: name.to_owned(), datasets, control };
    let token = random_token().map_err(anyhow::Error::msg)?;
    let mut text = existing.clone();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&holder.line(&token));
    text.push('\n');
    // Refuse to write a file the servers would refuse (a duplicate name).
    TokenBook::parse(&text, file).map_err(anyhow::Error::msg)?;
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(file)
        .with_context(|| format!("cannot open {}", file.display()))?;
    out.write_all(&text.as_bytes()[existing.len()..])
        .with_context(|| format!("cannot write {}", file.display()))?;
    eprintln!("added {name} ({}) to {}; the token is shown only now:", holder.datasets, file.display());
    println!("{token}");
    Ok(())
}

/// Prints a new S3 key pair for `name` and appends its line to `file` (created mode
/// 0600; an existing file others may read is refused, as the spoke refuses it).
pub fn new_s3_key(name: &str, file: &Path) -> anyhow::Result<()> {
    if name.is_empty() || name.contains(char::is_whitespace) || name.starts_with('#') {
        anyhow::bail!("--name {name:?} must be one word: a line name of the spoke's token file");
    }
    let existing = match std::fs::metadata(file) {
        Ok(_) => {
            S3KeyBook::load(file).map_err(anyhow::Error::msg)?;
            std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?
        }
        Err(_) => String::new(),
    };
    let key = S3Key::new(name).map_err(anyhow::Error::msg)?;
    let mut line = String::new();
    if !existing.is_empty() && !existing.ends_with('\n') {
        line.push('\n');
    }
    line.push_str(&key.line());
    line.push('\n');
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(file)
        .with_context(|| format!("cannot open {}", file.display()))?;
    out.write_all(line.as_bytes()).with_context(|| format!("cannot write {}", file.display()))?;
    eprintln!("added an S3 key for {name} to {}; the secret is shown only now:", file.display());
    println!("AWS_ACCESS_KEY_ID={}", key.access_key);
    println!("AWS_SECRET_ACCESS_KEY={}", key.secret);
    Ok(())
}

/// Removes `name`'s line from `file` (rewritten whole, then renamed into place so a
/// server never reads half a file).
pub fn revoke_token(name: &str, file: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let kept: Vec<&str> = text.lines().filter(|line| line.split_whitespace().next() != Some(name)).collect();
    if kept.len() == text.lines().count() {
        anyhow::bail!("{} has no token named {name}", file.display());
    }
    let temporary = file.with_extension("revoking");
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    out.write_all((kept.join("\n") + "\n").as_bytes())?;
    out.sync_all()?;
    std::fs::rename(&temporary, file).with_context(|| format!("cannot replace {}", file.display()))?;
    eprintln!("revoked {name} in {}", file.display());
    Ok(())
}
