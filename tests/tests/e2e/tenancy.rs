//! Several tenants on one spoke: a job's plan and counters belong to the principal that
//! set them (another cannot replace, withdraw or see them), plans are bounded per
//! principal and in all, `Status` shows the server's own figures only to a principal
//! that may control it, metric labels are the operator's, and a client certificate
//! without a grants line reads but never controls.
#![allow(clippy::unwrap_used)]

use shardcache_client::{CacheClient, Client, ConnectOptions, PlannedEpoch, Range};
use shardcache_serving::{
    auth::Authenticator,
    server::Security,
    tls::{ServerTls, ServerTlsFiles},
};
use shardcache_tests::{
    TestHub, TestSpoke, make_dataset, pki::Pki, scrape_metrics, spoke_options, token_file,
};
use spoke_cache::plans::shards::PlanLimits;
use tonic::Code;

fn token(token: &str) -> ConnectOptions {
    ConnectOptions { tls: None, token: Some(token.to_owned()) }
}

fn epoch(shards: &[&str]) -> PlannedEpoch {
    PlannedEpoch { shards: shards.iter().map(|s| (*s).to_owned()).collect(), until: Vec::new() }
}

#[tokio::test]
async fn tenants_own_their_plans_and_jobs_and_see_only_their_own() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 4, 16384);
    make_dataset(root.path(), "wiki", 2, 16384);
    let hub = TestHub::start(root.path()).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens_path = dir.path().join("tokens");
    let tokens = token_file(&tokens_path, &[("alice", "c4"), ("bob", "c4,wiki"), ("ops", "* control")]);
    let mut options = spoke_options(&hub.endpoint);
    options.security = Security { tls: None, auth: Authenticator::with_token_file(&tokens_path).unwrap() };
    options.cache.plan_limits = PlanLimits { plans_per_principal: 2, ..PlanLimits::default() };
    let cache_dir = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let mut controls = Vec::new();
    for t in &tokens {
        controls.push(CacheClient::connect_with(&spoke.endpoint, &token(t)).await.unwrap());
    }
    let [alice, bob, ops] = <[CacheClient; 3]>::try_from(controls).unwrap();
    let shards = ["shard-00000.bin", "shard-00001.bin", "shard-00002.bin", "shard-00003.bin"];

    // Alice plans job "train"; Bob, who may read c4 too, names his job "train" and
    // withdraws it (a plan with no epochs): his own, not hers.
    assert_eq!(alice.set_plan("train", 0, "c4", &[epoch(&shards)]).await.unwrap(), 4);
    bob.set_plan("train", 0, "c4", &[]).await.unwrap();
    bob.set_plan("train", 0, "c4", &[epoch(&shards[..1])]).await.unwrap();
    for (who, client) in [("alice", &alice), ("bob", &bob)] {
        let reader = Client::connect_with(&spoke.endpoint, &token(&tokens[usize::from(who == "bob")]))
            .await
            .unwrap()
            .for_job("train", 0)
            .unwrap();
        reader.read_range(&Range::new("c4", "shard-00000.bin", 0, 100)).await.unwrap();
        let status = client.status().await.unwrap();
        assert_eq!(status.principal, who);
        let plans: Vec<_> =
            status.plans.iter().map(|p| (p.principal.as_str(), p.job.as_str(), p.positions)).collect();
        let positions = if who == "alice" { 4 } else { 1 };
        assert_eq!(plans, [(who, "train", positions)], "{who} sees its own plan, and only it");
        assert!(
            !status.jobs.is_empty() && status.jobs.iter().all(|j| j.principal == who),
            "{:?}",
            status.jobs
        );
        // The server's own figures are for a principal that may control the cache.
        assert!(!status.server_view && status.hubs.is_empty() && status.capacity_bytes == 0, "{status:?}");
    }
    let datasets = |s: &shardcache_proto::v1::StatusResponse| {
        s.datasets.iter().map(|d| d.dataset.clone()).collect::<Vec<_>>()
    };
    assert!(!datasets(&alice.status().await.unwrap()).contains(&"wiki".to_owned()));

    // The operator sees every principal's plans and jobs, the hubs and the capacity.
    let all = ops.status().await.unwrap();
    assert!(all.server_view && all.hubs == [hub.endpoint.clone()] && all.capacity_bytes > 0, "{all:?}");
    let owners: Vec<_> = all.plans.iter().map(|p| p.principal.as_str()).collect();
    assert_eq!(owners, ["alice", "bob"]);
    assert!(all.jobs.iter().any(|j| j.principal == "alice") && all.jobs.iter().any(|j| j.principal == "bob"));

    // Bounded per principal, with RESOURCE_EXHAUSTED naming the bound; withdrawing
    // makes room.
    alice.set_plan("eval", 0, "c4", &[epoch(&shards[..2])]).await.unwrap();
    let refused = alice.set_plan("third", 0, "c4", &[epoch(&shards[..1])]).await.unwrap_err();
    assert_eq!(refused.code(), Some(Code::ResourceExhausted), "{refused}");
    assert!(refused.to_string().contains("--max-plans-per-principal"), "{refused}");
    bob.set_plan("third", 0, "c4", &[epoch(&shards[..1])]).await.unwrap();
    alice.set_plan("eval", 0, "c4", &[]).await.unwrap();
    alice.set_plan("third", 0, "c4", &[epoch(&shards[..1])]).await.unwrap();

    // Metric labels are the operator's: "train" is not in --metric-jobs, so it is
    // counted under "other", never as a label a client chose.
    let page = scrape_metrics(spoke.metrics_addr).await.unwrap();
    assert!(page.contains("shardcache_spoke_job_reads_total{job_id=\"other\",epoch=\"\"} 2"), "{page}");
    assert!(!page.contains("job_id=\"train\""), "{page}");
}

#[tokio::test]
async fn a_client_certificate_without_a_grants_line_reads_but_never_controls() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 1, 16384);
    let hub = TestHub::start(root.path()).await;
    let pki = Pki::new("tenancy");
    let files = ServerTlsFiles { ..pki.server("spoke-server", Some(pki.ca())) };
    let mut options = spoke_options(&hub.endpoint);
    options.security = Security { tls: Some(ServerTls::load(&files).unwrap()), auth: Authenticator::open() };
    let cache_dir = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let certified = ConnectOptions {
        tls: Some(pki.client(Some(("trainer", shardcache_tests::pki::valid())))),
        token: None,
    };

    let client = Client::connect_with(&spoke.endpoint, &certified).await.unwrap();
    assert_eq!(
        client.read_range(&Range::new("c4", "shard-00000.bin", 0, 100)).await.unwrap().data.len(),
        100
    );
    let control = CacheClient::connect_with(&spoke.endpoint, &certified).await.unwrap();
    let shard = ["shard-00000.bin".to_owned()];
    for refused in [
        control.prefetch("c4", &shard, 0).await.unwrap_err(),
        control.evict("c4", &shard).await.unwrap_err(),
        control.pin("c4", &shard, true).await.unwrap_err(),
    ] {
        assert_eq!(refused.code(), Some(Code::PermissionDenied), "{refused}");
        assert!(
            refused.to_string().contains("client certificate \"trainer\" may read but not change"),
            "{refused}"
        );
    }
    let status = control.status().await.unwrap();
    assert_eq!(status.principal, "trainer");
    assert!(!status.server_view && status.hubs.is_empty(), "{status:?}");
}
