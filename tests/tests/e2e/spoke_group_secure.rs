//! A secured group is a group: with the secure setup of docs/deploying.md (TLS everywhere, the hub
//! granting the spokes' `spoke-client` certificate, tokens for trainers on the spokes,
//! the spokes verifying each other's `spoke-client` certificate with `--client-ca` and a
//! `peers cert:spoke-client *` line), two trainers reading everything through two
//! different members cost one copy over the long link. Without the peers' line, every
//! peer read is refused: the group fetches a copy per member, and says so loudly (the
//! refusals counted, each member's view of the others in `Status`).
#![allow(clippy::unwrap_used)]

use std::path::Path;

use hub_server::ServeOptions;
use shardcache_client::{CacheClient, Client, ConnectOptions, Range};
use shardcache_serving::{
    auth::Authenticator,
    server::Security,
    tls::{ServerTls, ServerTlsFiles},
};
use shardcache_tests::{
    TestHub, TestSpoke, make_dataset,
    pki::{Pki, valid},
    spoke_options, test_options, token_file,
};
use spoke_cache::PeerGroup;
use tokio::net::TcpListener;

const SHARDS: u32 = 6;
const SHARD: u64 = 1 << 20;

struct SecureGroup {
    hub: TestHub,
    spokes: Vec<TestSpoke>,
    trainer: String,
    pki: Pki,
    _dirs: Vec<tempfile::TempDir>,
}

/// The secure setup of docs/deploying.md with a group of three; `peers_line`: the spokes' token file
/// grants their `spoke-client` certificate.
async fn secure_group(root: &Path, peers_line: bool) -> SecureGroup {
    let pki = Pki::new("group");
    // The hub: TLS, and only the spokes' client certificate (by name) and their hub
    // token may read.
    let grants = pki.dir.path().join("hub-grants");
    let hub_tokens = token_file(&grants, &[("spoke-token", "*")]);
    let mut text = std::fs::read_to_string(&grants).unwrap();
    text.push_str("spoke cert:spoke-client *\n");
    std::fs::write(&grants, text).unwrap();
    let hub_tls = ServerTls::load(&pki.server("hub", Some(pki.ca()))).unwrap();
    let hub = TestHub::start_with(
        root,
        ServeOptions {
            security: Security { tls: Some(hub_tls), auth: Authenticator::with_token_file(&grants).unwrap() },
            ..test_options()
        },
    )
    .await;
    // The spokes: TLS, tokens for trainers, and client certificates (optional: trainers
    // present tokens) verified against the CA, for their peers.
    let spoke_tokens = pki.dir.path().join("spoke-tokens");
    let trainer = token_file(&spoke_tokens, &[("trainer", "c4")]).remove(0);
    if peers_line {
        let mut text = std::fs::read_to_string(&spoke_tokens).unwrap();
        text.push_str("peers cert:spoke-client *\n");
        std::fs::write(&spoke_tokens, text).unwrap();
    }
    let files = ServerTlsFiles { client_cert_optional: true, ..pki.server("spoke", Some(pki.ca())) };
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let urls: Vec<String> =
        listeners.iter().map(|l| format!("https://{}", l.local_addr().unwrap())).collect();
    let identity = pki.client(Some(("spoke-client", valid())));
    let mut spokes = Vec::new();
    let mut dirs = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let mut options = spoke_options(&hub.endpoint);
        // The spoke presents its certificate and its hub token to the hub; to its peers
        // the certificate only.
        options.hub_credentials =
            ConnectOptions { tls: Some(identity.clone()), token: Some(hub_tokens[0].clone()) };
        options.group = Some(PeerGroup {
            spec: urls.join(","),
            me: urls[i].clone(),
            credentials: ConnectOptions { tls: Some(identity.clone()), token: None },
        });
        options.security = Security {
            tls: Some(ServerTls::load(&files).unwrap()),
            auth: Authenticator::with_token_file(&spoke_tokens).unwrap(),
        };
        let dir = tempfile::tempdir().unwrap();
        spokes.push(TestSpoke::start_on(listener, dir.path(), options).await);
        dirs.push(dir);
    }
    SecureGroup { hub, spokes, trainer, pki, _dirs: dirs }
}

impl SecureGroup {
    fn trainer_options(&self) -> ConnectOptions {
        ConnectOptions { tls: Some(self.pki.client(None)), token: Some(self.trainer.clone()) }
    }

    /// Two trainers, each through its own member, read every shard whole (in batches of
    /// a quarter of each shard), byte for byte.
    async fn two_trainers_read_everything(&self, files: &Path) {
        for spoke in &self.spokes[..2] {
            let client = Client::connect_with(&spoke.endpoint, &self.trainer_options()).await.unwrap();
            for i in 0..SHARDS {
                let name = shardcache_cli::dataset_gen::shard_name(i);
                let want = std::fs::read(files.join(&name)).unwrap();
                let quarter = SHARD / 4;
                let ranges: Vec<Range> =
                    (0..4).map(|q| Range::new("c4", &name, q * quarter, quarter)).collect();
                let got = client.read_ranges(&ranges).await.unwrap();
                for (q, part) in got.iter().enumerate() {
                    let at = q * quarter as usize;
                    assert!(part.data == want[at..at + quarter as usize], "{name} quarter {q}");
                }
            }
        }
        for spoke in &self.spokes {
            spoke.settled().await;
        }
    }
}

#[tokio::test]
async fn the_readme_secure_group_fetches_one_copy_over_the_long_link() {
    let root = tempfile::tempdir().unwrap();
    let files = make_dataset(root.path(), "c4", SHARDS, SHARD);
    let group = secure_group(root.path(), true).await;
    group.two_trainers_read_everything(&files).await;
    let served = group.hub.stats.snapshot().bytes_served;
    assert_eq!(served, SHARDS as u64 * SHARD, "one copy over the long link");
    for spoke in &group.spokes {
        assert_eq!(spoke.cache.chain().peers().unwrap().reports().refusals(), 0, "no member refused another");
    }
    // Status shows the group healthy as each member sees it.
    let control =
        CacheClient::connect_with(&group.spokes[0].endpoint, &group.trainer_options()).await.unwrap();
    let status = control.status().await.unwrap();
    let states: Vec<&str> = status.members.iter().map(|m| m.state.as_str()).collect();
    assert_eq!(states.iter().filter(|s| **s == "self").count(), 1, "{states:?}");
    assert!(states.iter().all(|s| *s == "self" || *s == "serving"), "{states:?}");
}

#[tokio::test]
async fn a_secured_group_whose_members_refuse_each_other_says_so() {
    let root = tempfile::tempdir().unwrap();
    let files = make_dataset(root.path(), "c4", SHARDS, SHARD);
    let group = secure_group(root.path(), false).await;
    group.two_trainers_read_everything(&files).await;
    // Reads were all served (above), but each member fetched what it read itself.
    let served = group.hub.stats.snapshot().bytes_served;
    assert!(served > SHARDS as u64 * SHARD, "refused peers cost more than one copy: {served}");
    let refusals: u64 =
        group.spokes.iter().map(|s| s.cache.chain().peers().unwrap().reports().refusals()).sum();
    assert!(refusals > 0, "refusals are counted (shardcache_spoke_peer_refusals_total)");
    let control =
        CacheClient::connect_with(&group.spokes[0].endpoint, &group.trainer_options()).await.unwrap();
    let status = control.status().await.unwrap();
    assert!(status.peer_refusals > 0);
    assert!(status.members.iter().any(|m| m.state == "refusing this spoke"), "{:?}", status.members);
}
