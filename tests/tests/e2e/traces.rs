//! Distributed traces as an operator debugging a slow batch sees them in a real
//! OpenTelemetry Collector (`shardcache_tests::otel`, with the shipped
//! `deploy/otel/collector.yaml`): a cold read through a group, from the trainer to the
//! member it asked, the owner that member asked and the hub across a 60 ms link, is one
//! trace, each hop a span whose parent is the hop before it, naming its waits; the
//! collector keeps that trace (the spoke marked the read slower than its job's p99) and
//! drops the reads that were not marked.
//!
//! The hub and the spokes are processes of their own (each exports as its own service);
//! the trainer is this test, its SDK calls under a span of its own, exported on this
//! thread only (a current-thread runtime with a scoped subscriber), so that the other
//! tests of this binary export nothing.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use shardcache_client::{Client, Range};
use shardcache_tests::{
    HubProcess, SpokeProcess, free_loopback_addr, make_dataset,
    otel::{Collector, ExportedSpan},
};
use shardcache_transport::telemetry::Telemetry;
use shardcache_wan::{LinkConfig, WanProxy};
use tracing::Instrument as _;
use tracing_subscriber::layer::SubscriberExt as _;

const MIB: u64 = 1 << 20;
const JOB: &str = "traced-job";

#[test]
fn a_cold_read_through_a_group_is_one_trace_from_the_trainer_to_the_hub_and_is_kept() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(cold_read_through_a_group());
}

/// The processes of the test, each exporting its traces to the collector; the hub 60 ms
/// away behind the emulator.
struct Deployment {
    _hub: HubProcess,
    _link: WanProxy,
    spokes: Vec<SpokeProcess>,
    _data: tempfile::TempDir,
    _caches: [tempfile::TempDir; 2],
}

/// A hub serving 8 shards of 1 MiB in `data`, and a group of two spokes, `spoke-a` and
/// `spoke-b`, in front of it.
async fn deploy(collector: &Collector, data: tempfile::TempDir) -> Deployment {
    let exporting = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()),
        // Spans leave each process within 100 ms (the default waits 5 s).
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("RUST_LOG", "warn"),
    ];
    make_dataset(data.path(), "ds", 8, MIB);
    let hub = HubProcess::start_with_env(
        data.path(),
        &[],
        &[exporting.as_slice(), &[("OTEL_SERVICE_NAME", "hub")]].concat(),
        std::process::Stdio::inherit(),
    );
    let link = WanProxy::start(
        "127.0.0.1:0".parse().unwrap(),
        hub.endpoint.trim_start_matches("http://").parse().unwrap(),
        LinkConfig::rtt(Duration::from_millis(60)),
    )
    .await
    .unwrap();
    let addrs = [free_loopback_addr(), free_loopback_addr()];
    let urls: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
    let peers = urls.join(",");
    let caches = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let spokes = ["a", "b"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let service = format!("spoke-{name}");
            let args = ["--peers", &peers, "--peer-self", &urls[i], "--chunk-size", "1MiB"];
            let env = [exporting.as_slice(), &[("OTEL_SERVICE_NAME", service.as_str())]].concat();
            SpokeProcess::start_at_with_env(&link.endpoint(), caches[i].path(), &addrs[i], &args, &env)
        })
        .collect();
    Deployment { _hub: hub, _link: link, spokes, _data: data, _caches: caches }
}

async fn cold_read_through_a_group() {
    let collector = Collector::start("3s");
    let data = tempfile::tempdir().unwrap();
    let root = data.path().to_owned();
    let deployment = deploy(&collector, data).await;
    let spokes = &deployment.spokes;
    let (member_a, member_b) = (&spokes[0].endpoint, &spokes[1].endpoint);

    // A shard spoke-a owns, read warm many times, and one spoke-b owns, read through
    // spoke-a cold: member -> owner -> hub.
    let peers = format!("{member_a},{member_b}");
    let group = Client::connect(&peers).await.unwrap();
    let names: Vec<String> = (0..8).map(shardcache_cli::dataset_gen::shard_name).collect();
    let owned_by = |member: &str| names.iter().find(|s| group.owners("ds", s)[0] == member).unwrap().clone();
    let (warm, cold) = (owned_by(member_a), owned_by(member_b));
    let trainer = Telemetry::start("trainer", &collector.endpoint).unwrap();
    let _exporting_here =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(trainer.layer()));
    let client = Client::connect(member_a).await.unwrap().for_job(JOB, 0).unwrap();
    let warm_range = [Range::new("ds", &warm, 0, 64 << 10)];
    for batch in 0..150u64 {
        let span = tracing::info_span!("batch", batch, shard = %warm);
        client.read_ranges(&warm_range).instrument(span).await.unwrap();
    }
    let cold_range = [Range::new("ds", &cold, 0, 256 << 10)];
    let span = tracing::info_span!("batch", batch = 150u64, shard = %cold);
    let got = client.read_ranges(&cold_range).instrument(span).await.unwrap();
    let file = std::fs::read(root.join("ds").join(&cold)).unwrap();
    assert!(got[0].data[..] == file[..256 << 10], "the cold read's bytes are the shard's");
    let flushed = tokio::task::spawn_blocking(move || {
        trainer.flush();
        trainer
    });
    let _trainer = flushed.await.unwrap();

    // The collector decides 3 s after a trace's first span, then writes it.
    let cold_trace = |spans: &[ExportedSpan]| {
        let root = spans.iter().find(|s| s.service == "trainer" && s.attribute("shard") == cold)?;
        let trace: Vec<_> = spans.iter().filter(|s| s.trace_id == root.trace_id).cloned().collect();
        let hub_read = |s: &ExportedSpan| s.service == "hub" && s.attribute("method").contains("/Read");
        trace.iter().any(hub_read).then_some(trace)
    };
    let mut trace = None;
    for _ in 0..300 {
        trace = cold_trace(&collector.spans());
        if trace.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let spans = collector.spans();
    let trace =
        trace.unwrap_or_else(|| panic!("no whole trace of the cold read; the collector kept {spans:#?}"));
    assert_hops(&trace, member_a, member_b);

    assert_only_marked_traces_kept(&spans);
    assert_warm_batches_not_marked(&spans, &warm);
}

/// The warm batches were not marked slow: a read is marked when it is slower than every
/// one of its phase's reads so far (the p99 of the first 100 and more), which a warm read
/// from the store beside other warm reads is not, while the cold read across the link
/// is. At most 2 of the 50 warm batches past the 100th may be (a read stalled by this
/// busy machine can be its phase's slowest yet, by chance); a spoke that marked every read
/// past its 100th would have all 50 kept.
fn assert_warm_batches_not_marked(spans: &[ExportedSpan], warm: &str) {
    let mut kept: Vec<&str> = spans
        .iter()
        .filter(|s| s.service == "trainer" && s.name == "batch" && s.attribute("shard") == warm)
        .map(|s| s.trace_id.as_str())
        .collect();
    kept.sort_unstable();
    kept.dedup();
    assert!(kept.len() <= 2, "{} of the 150 warm batches were marked slow and kept", kept.len());
}

/// Kept by the collector's tail sampling: every trace it wrote holds a read the spoke
/// marked slower than its job's p99 (the share of the rest is 0% here), so most of the
/// 150 warm batches, with no mark, are not there.
fn assert_only_marked_traces_kept(spans: &[ExportedSpan]) {
    let mut traces: Vec<&str> = spans.iter().map(|s| s.trace_id.as_str()).collect();
    traces.sort_unstable();
    traces.dedup();
    for id in &traces {
        assert!(
            spans.iter().any(|s| s.trace_id == *id && s.attribute("shardcache.slow") == "true"),
            "trace {id} was kept without a slow read: {:#?}",
            spans.iter().filter(|s| s.trace_id == *id).collect::<Vec<_>>()
        );
    }
    assert!(traces.len() < 150, "{} traces kept of 151 batches: the unmarked ones are dropped", traces.len());
}

/// The cold read's hops, each under the one before: the trainer's batch, its call to
/// member a, member a's request and its fetch from a group member (the owner), member
/// b's request and its fetch from the hub across the link, the hub's request.
fn assert_hops(trace: &[ExportedSpan], member_a: &str, member_b: &str) {
    let child = |parent: &ExportedSpan, service: &str, name: &str| {
        trace
            .iter()
            .find(|s| s.service == service && s.name == name && s.parent == parent.span_id)
            .unwrap_or_else(|| panic!("no {service} span {name:?} under {parent:?}: {trace:#?}"))
    };
    let batch = trace.iter().find(|s| s.service == "trainer" && s.name == "batch").unwrap();
    assert_eq!(batch.parent, "", "the trainer's batch is the trace's root");
    let ask = child(batch, "trainer", "shardcache.ask");
    assert_eq!((ask.attribute("member"), ask.attribute("attempt")), (member_a, "0"));
    let a_request = child(ask, "spoke-a", "rpc");
    assert_eq!(a_request.attribute("method"), "/shardcache.v1.ShardReader/ReadRanges");
    assert_eq!(a_request.attribute("shardcache.slow"), "true", "slower than the job's p99");
    assert_eq!(a_request.attribute("bytes"), (256 << 10).to_string(), "the request names what it reads");
    // What the spoke decided for the read, on its request's span.
    assert_eq!((a_request.attribute("hits"), a_request.attribute("misses")), ("0", "1"));
    assert!(!a_request.attribute("admission").is_empty(), "{a_request:?}");
    assert!(!a_request.attribute("fetch_us").is_empty(), "{a_request:?}");
    // Member b's fetch from the hub, under one of member a's fetches from its owner (a
    // miss's part and the rest of its chunk are two: the owner's chunk fetch is under
    // whichever of them reached it first).
    let b_fetch = trace
        .iter()
        .find(|s| {
            s.service == "spoke-b"
                && s.name == "spoke.fetch"
                && s.attribute("supplier") == "hub"
                && descends(trace, s, a_request)
        })
        .unwrap_or_else(|| panic!("no fetch from the hub by member b under member a's read: {trace:#?}"));
    let parent = |span: &ExportedSpan| trace.iter().find(|s| s.span_id == span.parent).unwrap().clone();
    let mut b_request = parent(b_fetch);
    while b_request.service == "spoke-b" && b_request.name != "rpc" {
        b_request = parent(&b_request);
    }
    assert_eq!(b_request.service, "spoke-b", "{b_fetch:?} is under a request to member b");
    assert!(b_request.attribute("method").starts_with("/shardcache.v1.ShardReader/"), "{b_request:?}");
    let a_ask = parent(&b_request);
    assert_eq!((a_ask.service.as_str(), a_ask.name.as_str()), ("spoke-a", "shardcache.ask"));
    assert_eq!(a_ask.attribute("member"), member_b, "member a asked the owner");
    let a_fetch = parent(&a_ask);
    assert_eq!((a_fetch.name.as_str(), a_fetch.parent.as_str()), ("spoke.fetch", a_request.span_id.as_str()));
    assert_eq!(a_fetch.attribute("supplier"), "group member", "{a_fetch:?}");
    for waited in ["queued_us", "fetch_us", "wire_bytes"] {
        assert!(!b_fetch.attribute(waited).is_empty(), "the hub fetch names {waited}: {b_fetch:?}");
    }
    // Across the emulated 60 ms link, a fetch cannot take less than its round trip.
    assert!(b_fetch.attribute("fetch_us").parse::<u64>().unwrap() >= 60_000, "{b_fetch:?}");
    let hub_request = child(child(b_fetch, "spoke-b", "shardcache.ask"), "hub", "rpc");
    assert!(
        hub_request.attribute("method").starts_with("/shardcache.v1.ShardReader/Read"),
        "{hub_request:?}"
    );
    assert!(!hub_request.attribute("bytes").is_empty(), "{hub_request:?}");
}

/// Whether `span` is `ancestor` or below it in `trace`.
fn descends(trace: &[ExportedSpan], span: &ExportedSpan, ancestor: &ExportedSpan) -> bool {
    let mut at = span;
    for _ in 0..trace.len() {
        if at.span_id == ancestor.span_id {
            return true;
        }
        match trace.iter().find(|s| s.span_id == at.parent) {
            Some(parent) => at = parent,
            None => return false,
        }
    }
    false
}
