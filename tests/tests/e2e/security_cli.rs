//! The secure setup as docs/deploying.md shows it, with the real binaries: `shardcache certs`,
//! `shardcache token`, a hub with TLS, client certificates and tokens, the CLI over
//! mTLS or a token; keys that others can read are refused; tokens never reach a log.
#![allow(clippy::unwrap_used)]

use std::{os::unix::fs::PermissionsExt, path::Path, time::Duration};

use shardcache_tests::{Cli, HubProcess, binary, make_dataset};
use shardcache_transport::reload::RELOAD_POLL;

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `shardcache certs` into `work/certs`, every key readable by its owner only.
fn new_certs(work: &Path) -> std::path::PathBuf {
    let certs = work.join("certs");
    Cli::run(&["certs", "--out", path(&certs), "--name", "hub.example"]).ok_text();
    for name in ["ca", "hub", "spoke", "spoke-client", "client"] {
        let mode = std::fs::metadata(certs.join(format!("{name}.key"))).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{name}.key");
    }
    certs
}

/// `shardcache token new` for dataset `ds` into the grants file `tokens`: the token, and
/// a file holding it (as a client passes it).
fn new_token(work: &Path, tokens: &Path) -> (String, std::path::PathBuf) {
    let token = Cli::run(&["token", "new", "--name", "trainer", "--datasets", "ds", "--file", path(tokens)])
        .ok_text();
    let token = token.trim().to_owned();
    assert!(token.starts_with("sct_") && token.len() > 60, "{token}");
    assert!(!std::fs::read_to_string(tokens).unwrap().contains(&token), "the file holds only the hash");
    let token_path = work.join("trainer.token");
    std::fs::write(&token_path, &token).unwrap();
    std::fs::set_permissions(&token_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (token, token_path)
}

/// Whether `done()` holds within `tries` checks 100 ms apart (a bounded wait for a
/// reload the hub does in the background).
fn within(tries: u128, mut done: impl FnMut() -> bool) -> bool {
    (0..tries).any(|_| {
        let done = done();
        if !done {
            std::thread::sleep(Duration::from_millis(100));
        }
        done
    })
}

#[test]
fn certs_and_tokens_from_the_cli_secure_a_hub_end_to_end() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "ds", 1, 8 * 16384);
    make_dataset(root.path(), "other", 1, 16384);
    let work = tempfile::tempdir().unwrap();
    let certs = new_certs(work.path());
    let tokens = work.path().join("tokens");
    let (token, token_path) = new_token(work.path(), &tokens);

    let log_path = work.path().join("hub.log");
    let hub = HubProcess::start_logged(
        root.path(),
        &[
            "--tls-cert",
            path(&certs.join("hub.pem")),
            "--tls-key",
            path(&certs.join("hub.key")),
            "--client-ca",
            path(&certs.join("ca.pem")),
            "--token-file",
            path(&tokens),
        ],
        std::fs::File::create(&log_path).unwrap(),
        "debug",
    );
    let ca = certs.join("ca.pem");
    let base = ["--endpoint", hub.endpoint.as_str(), "--ca", path(&ca)];
    let with = |extra: &[&str]| Cli::run(&[&base[..], extra].concat());

    // With the token: only its dataset is listed, and reads work.
    let listed = with(&["--token-file", path(&token_path), "ls"]).ok_text();
    assert!(listed.contains("ds") && !listed.contains("other"), "{listed}");
    let cat = with(&["--token-file", path(&token_path), "cat", "ds", "shard-00000.bin", "--length", "100"]);
    let expected = std::fs::read(root.path().join("ds/shard-00000.bin")).unwrap();
    assert_eq!(cat.ok_bytes(), expected[..100]);
    let denied = with(&["--token-file", path(&token_path), "stat", "other", "shard-00000.bin"]);
    assert!(!denied.ok);
    assert!(denied.stderr.contains("PermissionDenied"), "{denied:?}");

    // With the client certificate instead: refused until the grants file names it, then
    // what its line grants.
    let (cert, key) = (certs.join("client.pem"), certs.join("client.key"));
    let client_cert = ["--cert", path(&cert), "--key", path(&key)];
    let unnamed = with(&[&client_cert[..], &["ls"]].concat());
    assert!(unnamed.stderr.contains("has no grant"), "{unnamed:?}");
    let mut grants = std::fs::read_to_string(&tokens).unwrap();
    grants.push_str("ops cert:client *\n");
    std::fs::write(&tokens, grants).unwrap();
    let reload_polls = RELOAD_POLL.as_millis() * 10 / 100;
    let mut listed = String::new();
    within(reload_polls, || {
        let out = with(&[&client_cert[..], &["ls"]].concat());
        listed = out.text();
        out.ok
    });
    assert!(listed.contains("other") && listed.contains("ds"), "{listed}");

    // Neither: refused, saying what is missing.
    let bare = with(&["ls"]);
    assert!(!bare.ok && bare.stderr.contains("missing credentials"), "{}", bare.stderr);

    // Revoked: refused within a few reload polls, the hub still running.
    Cli::run(&["token", "revoke", "--name", "trainer", "--file", path(&tokens)]).ok_text();
    let refused = within(reload_polls, || {
        let out = with(&["--token-file", path(&token_path), "ls"]);
        let refused = !out.ok;
        assert!(!refused || out.stderr.contains("revoked"), "{out:?}");
        refused
    });
    assert!(refused, "the revoked token kept working");

    // SIGHUP reloads at once (and does not stop the hub, SIGHUP's default).
    let pid = hub.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    let reloaded = within(50, || std::fs::read_to_string(&log_path).unwrap().contains("forced=true"));
    assert!(reloaded, "SIGHUP did not reload");
    assert!(
        with(&[&client_cert[..], &["ls"]].concat()).ok_text().contains("ds"),
        "the hub stopped on SIGHUP"
    );

    drop(hub);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("reloaded"), "the token file reload is logged:\n{log}");
    assert!(!log.contains(&token), "the token appeared in the hub's debug log");
    assert!(!log.contains("PRIVATE KEY"), "key material appeared in the log");
}

#[test]
fn a_key_or_token_file_that_every_user_can_read_is_refused_by_name() {
    let root = tempfile::tempdir().unwrap();
    let certs = tempfile::tempdir().unwrap();
    Cli::run(&["certs", "--out", path(certs.path())]).ok_text();
    let key = certs.path().join("hub.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = std::process::Command::new(binary("hub-server"))
        .args(["--root", path(root.path()), "--listen", "127.0.0.1:0"])
        .args(["--tls-cert", path(&certs.path().join("hub.pem")), "--tls-key", path(&key)])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&format!("{} is readable by every user", key.display())), "{stderr}");
    assert!(stderr.contains("chmod 600"), "{stderr}");

    // The CLI refuses a readable token file the same way.
    let token = certs.path().join("token");
    std::fs::write(&token, "sct_abc").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Cli::run(&["--token-file", path(&token), "ls"]);
    assert!(out.stderr.contains("is readable by every user"), "{out:?}");
}
