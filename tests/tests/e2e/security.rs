//! TLS, mutual TLS and tokens, with real handshakes on 127.0.0.1:0: who can connect,
//! who can read what, what bad input gets over TLS, and certificate rotation without a
//! restart.
#![allow(clippy::unwrap_used)]

use std::{path::Path, sync::Arc, time::Duration};

use hub_server::ServeOptions;
use shardcache_client::{Client, ConnectOptions, Range};
use shardcache_proto::v1::{ReadRangeRequest, shard_reader_client::ShardReaderClient};
use shardcache_serving::{
    auth::Authenticator,
    server::Security,
    tls::{ServerTls, ServerTlsFiles},
};
use shardcache_tests::{
    TestHub, TestSpoke, make_dataset,
    pki::{Pki, expired, not_yet_valid, valid},
    scrape_metrics, sha256, spoke_options, test_options, token_file, write_pattern,
};
use shardcache_transport::{http2::Http2Settings, reload::RELOAD_POLL, tls::ClientTlsFiles};
use tonic::Code;

fn secure(files: &ServerTlsFiles, auth: Authenticator) -> Security {
    Security { tls: Some(ServerTls::load(files).unwrap()), auth }
}

async fn tls_hub(root: &Path, files: &ServerTlsFiles) -> TestHub {
    TestHub::start_with(
        root,
        ServeOptions { security: secure(files, Authenticator::open()), ..test_options() },
    )
    .await
}

fn options(tls: ClientTlsFiles, token: Option<&str>) -> ConnectOptions {
    ConnectOptions { tls: Some(tls), token: token.map(str::to_owned) }
}

/// Connects and lists: the whole path a client takes, as one result.
async fn list(endpoint: &str, options: &ConnectOptions) -> shardcache_client::Result<Vec<String>> {
    let client = Client::connect_with(endpoint, options).await?;
    Ok(client.list_datasets().await?.into_iter().map(|d| d.name).collect())
}

/// The error and its sources, one line (rustls' reason is deep in the chain).
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

fn dataset(root: &Path) {
    make_dataset(root, "ds", 2, 20 * 16384);
}

#[tokio::test]
async fn tls_reads_work_and_a_plaintext_client_fails_cleanly_while_the_hub_keeps_serving() {
    let root = tempfile::tempdir().unwrap();
    dataset(root.path());
    let pki = Pki::new("main");
    let hub = tls_hub(root.path(), &pki.server("hub", None)).await;
    assert!(hub.endpoint.starts_with("https://"));
    let tls = options(pki.client(None), None);

    let plain = hub.endpoint.replace("https://", "http://");
    let err = list(&plain, &ConnectOptions::default()).await.unwrap_err();
    // tonic reports a connection the server closed mid-request as UNKNOWN or UNAVAILABLE;
    // the message carries the cause.
    let refused = err.to_string();
    assert!(
        matches!(err.code(), Some(Code::Unknown | Code::Unavailable)) && refused.contains("broken pipe")
            || matches!(err, shardcache_client::Error::Connect { .. }),
        "{refused}"
    );
    // Asking for TLS files with an http:// URL is refused before any connection.
    let mixed = list(&plain, &tls).await.unwrap_err().to_string();
    assert!(mixed.contains("use https://"), "{mixed}");

    // The hub is still there for TLS clients, and the bytes are the file's.
    assert_eq!(list(&hub.endpoint, &tls).await.unwrap(), ["ds"]);
    let client = Client::connect_with(&hub.endpoint, &tls).await.unwrap();
    let shard = &client.list_shards("ds").await.unwrap()[0];
    let bytes = client.stream_shard("ds", &shard.shard, 0, None).await.unwrap().read_to_end().await.unwrap();
    assert_eq!(sha256(&bytes), sha256(&std::fs::read(root.path().join("ds").join(&shard.shard)).unwrap()));
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_expired_or_not_yet_valid_is_rejected() {
    let root = tempfile::tempdir().unwrap();
    dataset(root.path());
    let pki = Pki::new("main");
    let stranger = Pki::new("stranger");

    let hub = tls_hub(root.path(), &pki.server("hub", None)).await;
    let err = list(&hub.endpoint, &options(stranger.client(None), None)).await.unwrap_err();
    assert!(chain(&err).contains("UnknownIssuer"), "{}", chain(&err));

    for (validity, words) in [(expired(), "expired"), (not_yet_valid(), "not valid")] {
        let (cert, key) = pki.leaf("dated-hub", validity);
        let files = ServerTlsFiles { cert, key, client_ca: None, client_cert_optional: false };
        let hub = tls_hub(root.path(), &files).await;
        let err = list(&hub.endpoint, &options(pki.client(None), None)).await.unwrap_err();
        assert!(chain(&err).to_lowercase().contains(words), "{words}: {}", chain(&err));
        assert_eq!(hub.stats.snapshot().stat_requests, 0);
    }
}

#[tokio::test]
async fn a_hub_that_requires_client_certificates_refuses_clients_without_a_valid_one() {
    let root = tempfile::tempdir().unwrap();
    dataset(root.path());
    let pki = Pki::new("main");
    let stranger = Pki::new("stranger");
    let hub = tls_hub(root.path(), &pki.server("hub", Some(pki.ca()))).await;

    let no_cert = pki.client(None);
    let mut foreign = stranger.client(Some(("intruder", valid())));
    foreign.ca = Some(pki.ca());
    let old = pki.client(Some(("old-client", expired())));
    let refusals = [
        ("no certificate", no_cert, "CertificateRequired"),
        ("another CA's", foreign, "UnknownCA"),
        ("expired", old, "CertificateExpired"),
    ];
    for (what, tls, alert) in refusals {
        let err = list(&hub.endpoint, &options(tls, None)).await.unwrap_err();
        // TLS 1.3: the client learns of the refusal (an alert) on its first request. The
        // hub drains the connection before closing it, so the alert is what the client
        // reports, not a reset ("broken pipe").
        assert!(
            matches!(err, shardcache_client::Error::Connect { .. })
                || matches!(err.code(), Some(Code::Unknown | Code::Unavailable)),
            "{what}: {}",
            chain(&err)
        );
        assert!(chain(&err).contains(alert), "{what}: the client should see {alert}: {}", chain(&err));
    }
    assert_eq!(hub.stats.snapshot().stat_requests, 0, "no refused client may reach a handler");

    let good = options(pki.client(Some(("trainer", valid()))), None);
    assert_eq!(list(&hub.endpoint, &good).await.unwrap(), ["ds"]);
}

/// Writes a token file with `holders` and returns each holder's token.
#[tokio::test]
async fn mutual_tls_spoke_to_hub_and_tokens_on_the_spoke_end_to_end() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 2, 20 * 16384);
    make_dataset(root.path(), "secret", 1, 16384);
    let pki = Pki::new("main");
    let hub = tls_hub(root.path(), &pki.server("hub", Some(pki.ca()))).await;

    let tokens_path = pki.dir.path().join("spoke-tokens");
    let tokens = token_file(&tokens_path, &[("trainer", "c4"), ("admin", "*")]);
    let (trainer, admin) = (&tokens[0], &tokens[1]);
    let cache_dir = tempfile::tempdir().unwrap();
    let mut spoke_opts = spoke_options(&hub.endpoint);
    spoke_opts.hub_credentials = options(pki.client(Some(("spoke", valid()))), None);
    spoke_opts.security =
        secure(&pki.server("spoke-server", None), Authenticator::with_token_file(&tokens_path).unwrap());
    let spoke = TestSpoke::start(cache_dir.path(), spoke_opts).await;
    assert!(spoke.endpoint.starts_with("https://"));

    // The trainer's token: c4 through the spoke (cold, then warm), byte for byte.
    let client =
        Client::connect_with(&spoke.endpoint, &options(pki.client(None), Some(trainer))).await.unwrap();
    assert_eq!(client.list_datasets().await.unwrap().iter().map(|d| &d.name).collect::<Vec<_>>(), ["c4"]);
    for _ in 0..2 {
        for shard in client.list_shards("c4").await.unwrap() {
            let got =
                client.stream_shard("c4", &shard.shard, 0, None).await.unwrap().read_to_end().await.unwrap();
            let want = std::fs::read(root.path().join("c4").join(&shard.shard)).unwrap();
            assert_eq!(sha256(&got), sha256(&want));
        }
    }
    assert!(hub.stats.snapshot().bytes_served > 0, "the spoke fetched over mTLS");

    // A dataset the token does not hold: PERMISSION_DENIED naming both, for every RPC.
    let denied = client.stat("secret", "shard-00000.bin").await.unwrap_err();
    assert_eq!(denied.code(), Some(Code::PermissionDenied), "{denied}");
    assert!(denied.to_string().contains("token \"trainer\" may not read dataset \"secret\""), "{denied}");
    let batch = [Range::new("c4", "shard-00000.bin", 0, 10), Range::new("secret", "shard-00000.bin", 0, 10)];
    assert_eq!(client.read_ranges(&batch).await.unwrap_err().code(), Some(Code::PermissionDenied));
    let control = shardcache_client::CacheClient::connect_with(
        &spoke.endpoint,
        &options(pki.client(None), Some(trainer)),
    )
    .await
    .unwrap();
    assert_eq!(control.prefetch("secret", &[], 0).await.unwrap_err().code(), Some(Code::PermissionDenied));
    assert_eq!(control.evict("secret", &[]).await.unwrap_err().code(), Some(Code::PermissionDenied));

    // The admin token reads everything.
    let admin = Client::connect_with(&spoke.endpoint, &options(pki.client(None), Some(admin))).await.unwrap();
    assert_eq!(
        admin.read_range(&Range::new("secret", "shard-00000.bin", 0, 100)).await.unwrap().data.len(),
        100
    );

    // No token, a wrong token: UNAUTHENTICATED.
    for token in [None, Some("sct_0000"), Some(&trainer[..trainer.len() - 2])] {
        let err = list(&spoke.endpoint, &options(pki.client(None), token)).await.unwrap_err();
        assert_eq!(err.code(), Some(Code::Unauthenticated), "{token:?}: {err}");
    }

    // Revoked (its line removed): refused within a few reload polls, without a restart.
    token_file(&tokens_path, &[("admin", "*")]);
    let mut refused = None;
    for _ in 0..(RELOAD_POLL.as_millis() * 10 / 50) {
        match client.list_datasets().await {
            Err(e) => {
                refused = Some(e);
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let refused = refused.expect("a revoked token kept working");
    assert_eq!(refused.code(), Some(Code::Unauthenticated), "{refused}");
    assert!(refused.to_string().contains("unknown or revoked token"), "{refused}");
}

/// Polls `call` (bounded: ten reload polls) until `done` accepts its answer.
async fn within_reload_polls<T, F: std::future::Future<Output = T>>(
    mut call: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    for _ in 0..(RELOAD_POLL.as_millis() * 10 / 50) {
        let answer = call().await;
        if done(&answer) {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    call().await
}

#[tokio::test]
async fn a_broken_token_file_refuses_tokens_until_it_is_fixed() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 1, 16384);
    let hub = TestHub::start(root.path()).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens_path = dir.path().join("tokens");
    let tokens = token_file(&tokens_path, &[("trainer", "c4")]);
    let mut spoke_opts = spoke_options(&hub.endpoint);
    spoke_opts.security = Security { tls: None, auth: Authenticator::with_token_file(&tokens_path).unwrap() };
    let cache_dir = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(cache_dir.path(), spoke_opts).await;
    let client = Client::connect_with(&spoke.endpoint, &options_token(&tokens[0])).await.unwrap();
    client.stat("c4", "shard-00000.bin").await.unwrap();
    let alarm = || async { scrape_metrics(spoke.metrics_addr).await.unwrap() };
    assert!(alarm().await.contains("shardcache_spoke_token_file_broken 0"));

    // Broken (a half-written rotation): the old list must not stay in force.
    let text = std::fs::read_to_string(&tokens_path).unwrap();
    std::fs::write(&tokens_path, &text[..text.len() / 2]).unwrap();
    let refused = within_reload_polls(|| client.stat("c4", "shard-00000.bin"), Result::is_err).await;
    let err = refused.expect_err("a token stayed valid while the token file was broken");
    assert_eq!(err.code(), Some(Code::Unavailable), "{err}");
    assert!(err.to_string().contains("token file cannot be used"), "{err}");
    assert!(alarm().await.contains("shardcache_spoke_token_file_broken 1"));

    // Fixed: the same token works again, and the alarm clears.
    std::fs::write(&tokens_path, &text).unwrap();
    within_reload_polls(|| client.stat("c4", "shard-00000.bin"), Result::is_ok).await.unwrap();
    assert!(alarm().await.contains("shardcache_spoke_token_file_broken 0"));
}

#[tokio::test]
async fn reading_a_dataset_does_not_grant_control_of_the_cache() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 2, 16384);
    let hub = TestHub::start(root.path()).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens_path = dir.path().join("tokens");
    let tokens = token_file(&tokens_path, &[("trainer", "c4"), ("ops", "c4 control")]);
    let mut spoke_opts = spoke_options(&hub.endpoint);
    spoke_opts.security = Security { tls: None, auth: Authenticator::with_token_file(&tokens_path).unwrap() };
    let cache_dir = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(cache_dir.path(), spoke_opts).await;
    let shard = ["shard-00000.bin".to_owned()];

    let reader = shardcache_client::CacheClient::connect_with(&spoke.endpoint, &options_token(&tokens[0]))
        .await
        .unwrap();
    let client = Client::connect_with(&spoke.endpoint, &options_token(&tokens[0])).await.unwrap();
    client.read_range(&Range::new("c4", "shard-00000.bin", 0, 100)).await.unwrap();
    reader.status().await.unwrap();
    let refusals = [
        reader.pin("c4", &shard, true).await.unwrap_err(),
        reader.evict("c4", &shard).await.unwrap_err(),
        reader.prefetch("c4", &shard, 0).await.unwrap_err(),
    ];
    for err in refusals {
        assert_eq!(err.code(), Some(Code::PermissionDenied), "{err}");
        assert!(err.to_string().contains("needs `control`"), "{err}");
    }

    let ops = shardcache_client::CacheClient::connect_with(&spoke.endpoint, &options_token(&tokens[1]))
        .await
        .unwrap();
    ops.prefetch("c4", &shard, 0).await.unwrap().finish().await.unwrap();
    assert_eq!(ops.pin("c4", &shard, true).await.unwrap(), 1);
    assert_eq!(ops.pin("c4", &shard, false).await.unwrap(), 1);
    assert_eq!(ops.evict("c4", &shard).await.unwrap().shards, 1);
}

#[tokio::test]
async fn the_metrics_listener_wants_its_token_and_caps_its_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 1, 16384);
    let hub = TestHub::start(root.path()).await;
    let mut spoke_opts = spoke_options(&hub.endpoint);
    spoke_opts.metrics_access =
        shardcache_serving::scrape::ScrapeAccess { token: Some("sct_scraper".into()) };
    let cache_dir = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(cache_dir.path(), spoke_opts).await;
    let get = |headers: &'static str| async move {
        let mut socket = tokio::net::TcpStream::connect(spoke.metrics_addr).await.unwrap();
        socket
            .write_all(format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{headers}\r\n").as_bytes())
            .await
            .unwrap();
        let mut page = String::new();
        socket.read_to_string(&mut page).await.unwrap_or_default();
        page
    };
    assert!(get("").await.starts_with("HTTP/1.1 401"), "no token");
    assert!(get("Authorization: Bearer sct_wrong\r\n").await.starts_with("HTTP/1.1 401"), "a wrong token");
    let page = get("Authorization: Bearer sct_scraper\r\n").await;
    assert!(page.starts_with("HTTP/1.1 200") && page.contains("shardcache_spoke_used_bytes"), "{page}");

    // Connections past the cap are closed unanswered; the listener serves again once
    // they go.
    let mut idle = Vec::new();
    for _ in 0..shardcache_serving::scrape::MAX_CONNECTIONS {
        idle.push(tokio::net::TcpStream::connect(spoke.metrics_addr).await.unwrap());
    }
    assert_eq!(
        get("Authorization: Bearer sct_scraper\r\n").await,
        "",
        "a connection past the cap was served"
    );
    drop(idle);
    let mut served = String::new();
    for _ in 0..200 {
        served = get("Authorization: Bearer sct_scraper\r\n").await;
        if !served.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
}

fn options_token(token: &str) -> ConnectOptions {
    ConnectOptions { token: Some(token.to_owned()), ..Default::default() }
}

#[tokio::test]
async fn a_spoke_without_the_hubs_client_certificate_or_token_says_so() {
    let root = tempfile::tempdir().unwrap();
    dataset(root.path());
    let pki = Pki::new("main");
    // A hub that takes a client certificate or a token.
    let hub_tokens = pki.dir.path().join("hub-tokens");
    let tokens = token_file(&hub_tokens, &[("spoke-eu", "*")]);
    let files = ServerTlsFiles { client_cert_optional: true, ..pki.server("hub", Some(pki.ca())) };
    let security = secure(&files, Authenticator::with_token_file(&hub_tokens).unwrap());
    let hub = TestHub::start_with(root.path(), ServeOptions { security, ..test_options() }).await;

    // A spoke with the token reads; a spoke with neither gets UNAVAILABLE naming its flags.
    for (token, works) in [(Some(tokens[0].as_str()), true), (None, false), (Some("sct_wrong"), false)] {
        let cache_dir = tempfile::tempdir().unwrap();
        let mut opts = spoke_options(&hub.endpoint);
        opts.hub_credentials = options(pki.client(None), token);
        let spoke = TestSpoke::start(cache_dir.path(), opts).await;
        let read = spoke.client().await.read_range(&Range::new("ds", "shard-00000.bin", 0, 1000)).await;
        if works {
            assert_eq!(read.unwrap().data.len(), 1000);
        } else {
            let err = read.unwrap_err();
            assert_eq!(err.code(), Some(Code::Unavailable), "{err}");
            assert!(err.to_string().contains("refused this spoke's credentials"), "{err}");
            assert!(err.to_string().contains("--hub-token-file"), "{err}");
        }
    }
    // A client certificate instead of a token, with the grant its name has in the same
    // file (reloaded); one the file does not name is refused, however well signed.
    let stranger = options(pki.client(Some(("stranger", valid()))), None);
    let err = list(&hub.endpoint, &stranger).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Unauthenticated), "{err}");
    assert!(err.to_string().contains("has no grant"), "{err}");
    let mut text = std::fs::read_to_string(&hub_tokens).unwrap();
    text.push_str("eu-spoke cert:spoke-cert ds\n");
    std::fs::write(&hub_tokens, text).unwrap();
    let certified = options(pki.client(Some(("spoke-cert", valid()))), None);
    let mut listed = list(&hub.endpoint, &certified).await;
    for _ in 0..(RELOAD_POLL.as_millis() * 10 / 50) {
        if listed.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        listed = list(&hub.endpoint, &certified).await;
    }
    assert_eq!(listed.unwrap(), ["ds"]);
}

#[tokio::test]
async fn certificates_have_one_role_a_server_one_cannot_be_a_client_nor_a_client_one_a_server() {
    let root = tempfile::tempdir().unwrap();
    dataset(root.path());
    let pki = Pki::new("main");
    let hub = tls_hub(root.path(), &pki.server("hub", Some(pki.ca()))).await;
    // The spoke's server certificate presented as a client certificate: refused.
    let (cert, key) = pki.leaf("spoke-server", valid());
    let as_client = ClientTlsFiles { ca: Some(pki.ca()), cert: Some(cert), key: Some(key), domain: None };
    assert!(
        list(&hub.endpoint, &options(as_client, None)).await.is_err(),
        "a server certificate posed as a client"
    );
    assert_eq!(
        list(&hub.endpoint, &options(pki.client(Some(("reader", valid()))), None)).await.unwrap(),
        ["ds"]
    );

    // A client certificate serving: clients refuse it.
    let (cert, key) = pki.client_leaf("not-a-server", valid());
    let files = ServerTlsFiles { cert, key, client_ca: None, client_cert_optional: false };
    let impostor = tls_hub(root.path(), &files).await;
    let err = list(&impostor.endpoint, &options(pki.client(None), None)).await.unwrap_err();
    assert!(chain(&err).to_lowercase().contains("certificate"), "{}", chain(&err));
}

#[tokio::test]
async fn bad_names_and_oversized_requests_over_tls_get_the_plaintext_answers() {
    let root = tempfile::tempdir().unwrap();
    dataset(root.path());
    let pki = Pki::new("main");
    let plain_hub = TestHub::start(root.path()).await;
    let tls_hub = tls_hub(root.path(), &pki.server("hub", None)).await;
    let tls = options(pki.client(None), None);

    let mut answers = Vec::new();
    for (endpoint, options) in [(&plain_hub.endpoint, ConnectOptions::default()), (&tls_hub.endpoint, tls)] {
        let client = Client::connect_with(endpoint, &options).await.unwrap();
        let mut got = Vec::new();
        for range in [
            Range::new("ds", "../../etc/passwd", 0, 10),
            Range::new("..", "x", 0, 10),
            Range::new("ds", "shard-00000.bin", 0, 2 << 20), // over --max-read (1 MiB in tests)
            Range::new("ds", "shard-00000.bin", 20 * 16384 - 10, 11), // past the end
        ] {
            let err = client.read_range(&range).await.unwrap_err();
            let shardcache_client::Error::Status { status, .. } = err else { panic!("{err}") };
            got.push((status.code(), status.message().to_owned()));
        }
        // A request larger than any legitimate one (a 9 MiB shard name) is refused
        // before it is looked at.
        let channel =
            tonic::transport::Endpoint::from_shared(endpoint.clone())
                .unwrap()
                .connect_with_connector(Http2Settings::TUNED.connector(
                    shardcache_client::connect::client_tls(endpoint, options.tls.as_ref()).unwrap(),
                ))
                .await
                .unwrap();
        let huge = ReadRangeRequest {
            dataset: "ds".into(),
            shard: "x".repeat(9 << 20),
            offset: 0,
            length: 1,
            expected_version: String::new(),
            cut_at_end: false,
        };
        let status = ShardReaderClient::new(channel).read_range(huge).await.unwrap_err();
        got.push((status.code(), status.message().to_owned()));
        answers.push(got);
    }
    assert_eq!(answers[0], answers[1], "TLS must not change what bad input gets");
    let codes: Vec<Code> = answers[0].iter().map(|(code, _)| *code).collect();
    assert_eq!(
        codes,
        [
            Code::InvalidArgument,
            Code::InvalidArgument,
            Code::InvalidArgument,
            Code::InvalidArgument,
            Code::OutOfRange
        ]
    );
    assert!(answers[0][4].1.contains("too large"), "{:?}", answers[0][4]);
    // And both hubs still serve.
    assert_eq!(list(&tls_hub.endpoint, &options(pki.client(None), None)).await.unwrap(), ["ds"]);
}

#[tokio::test]
async fn certificates_rotate_without_a_restart_and_open_streams_carry_on() {
    let root = tempfile::tempdir().unwrap();
    let data = write_pattern(&root.path().join("ds/big.bin"), 64 * (64 << 10), 7);
    let old_ca = Pki::new("old");
    let new_ca = Pki::new("new");
    let served = tempfile::tempdir().unwrap();
    let (cert, key) = old_ca.leaf_in(served.path(), "hub", valid());
    let hub =
        tls_hub(root.path(), &ServerTlsFiles { cert, key, client_ca: None, client_cert_optional: false })
            .await;

    // A stream opened under the old certificate, kept in flight by 64 KiB windows.
    let old_tls = shardcache_client::connect::client_tls(&hub.endpoint, Some(&old_ca.client(None))).unwrap();
    let channel = Http2Settings::DEFAULTS
        .endpoint(tonic::transport::Endpoint::from_shared(hub.endpoint.clone()).unwrap())
        .connect_with_connector(Http2Settings::DEFAULTS.connector(old_tls))
        .await
        .unwrap();
    let mut stream =
        Client::from_channel(channel, &hub.endpoint).stream_shard("ds", "big.bin", 0, None).await.unwrap();
    let mut received = stream.next_chunk().await.unwrap().unwrap().data.to_vec();

    // Rotate: the new CA's certificate replaces the files in place.
    new_ca.leaf_in(served.path(), "hub", valid());
    let new_client = options(new_ca.client(None), None);
    let mut rotated = false;
    for _ in 0..(RELOAD_POLL.as_millis() * 10 / 50) {
        if list(&hub.endpoint, &new_client).await.is_ok() {
            rotated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(rotated, "new connections never saw the new certificate");
    let old_client = options(old_ca.client(None), None);
    assert!(list(&hub.endpoint, &old_client).await.is_err(), "new connections must use the new certificate");

    // The stream that began before the rotation finishes with the right bytes.
    while let Some(chunk) = stream.next_chunk().await.unwrap() {
        received.extend_from_slice(&chunk.data);
    }
    assert_eq!(sha256(&received), sha256(&data));

    // A broken rotation (a key that does not match) keeps the working certificate.
    let (_, other_key) = new_ca.leaf("unrelated", valid());
    std::fs::copy(&other_key, served.path().join("hub.key")).unwrap();
    tokio::time::sleep(RELOAD_POLL * 2).await;
    assert_eq!(list(&hub.endpoint, &new_client).await.unwrap(), ["ds"]);
}

#[tokio::test]
async fn the_spokes_metrics_listener_serves_tls_with_the_same_certificate() {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let root = tempfile::tempdir().unwrap();
    dataset(root.path());
    let pki = Pki::new("main");
    let hub = TestHub::start(root.path()).await;
    let cache_dir = tempfile::tempdir().unwrap();
    let mut opts = spoke_options(&hub.endpoint);
    opts.security = secure(&pki.server("spoke", None), Authenticator::open());
    let spoke = TestSpoke::start(cache_dir.path(), opts).await;

    // A plaintext scrape gets no page.
    let plain = shardcache_tests::scrape_metrics(spoke.metrics_addr).await.unwrap_or_default();
    assert!(!plain.contains("200 OK"), "{plain}");

    // A Prometheus-like scrape: HTTP/1.1 over TLS, trusting the CA.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(pki.ca()).unwrap()).unwrap();
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(spoke.metrics_addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.unwrap();
    let mut page = String::new();
    tls.read_to_string(&mut page).await.unwrap();
    assert!(
        page.starts_with("HTTP/1.") && page.contains(" 200 OK") && page.contains("shardcache_"),
        "{page}"
    );
}
