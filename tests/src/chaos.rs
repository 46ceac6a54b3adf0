//! The group chaos soak: two trainer nodes read epochs of a dataset through a group of
//! three spokes while faults take turns: one member's link to the hub hangs (a gray
//! member, still SERVING), a member stops and comes back on its address with its cache,
//! the hub stalls for longer than `--hub-timeout`, and another tenant fills one member's
//! disk. What `spoke_group_chaos` checks in `make test` and `chaos-bench` runs longer.
//!
//! Bytes over the links are the emulators' counts of what they delivered to the spokes;
//! [`no_cache`] runs the same reads straight to the hub through identical links, the
//! baseline they are compared with.
//!
//! Every call is checked against the dataset's files and must finish within
//! `hung_after`. The first epoch runs before any fault (it fills the group's caches);
//! after it every shard is cached by a member, so no read may fail while a member or the
//! hub can serve it: failures are reported by fault and by status, those while the hub
//! was down apart (a shard evicted by the full disk and asked for while the hub is down
//! has no one to serve it).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use shardcache_client::{Client, Range};
use shardcache_wan::{Fault, LinkConfig, WanProxy};
use spoke_cache::PeerGroup;

use crate::{KeptAddress, TestHub, TestSpoke, disk, make_dataset, next_random, spoke_options};

/// The size of the group.
const MEMBERS: usize = 3;

/// What to read and how long each fault lasts.
#[derive(Debug, Clone)]
pub struct ChaosPlan {
    pub shards: u32,
    pub shard_size: u64,
    /// Bytes per range read, and ranges per `ReadRanges` call.
    pub record: u64,
    pub batch: usize,
    /// Epochs each node reads at least (the first before any fault).
    pub epochs: u32,
    /// How long each fault lasts, and each healthy pause between two.
    pub phase: Duration,
    /// The spokes' `--hub-timeout`; the hub stalls for longer.
    pub hub_timeout: Duration,
    /// Times the faults go round.
    pub cycles: u32,
    /// A call not done after this is hung (a failure).
    pub hung_after: Duration,
    /// Size of the tmpfs member 0's cache lives on (its disk is the one filled).
    pub disk: u64,
    /// Each member's `--capacity`: less than its share of the dataset, so that every
    /// epoch evicts and fetches again and the faults of the hub's links bite.
    pub capacity: u64,
    /// The spokes' `--revalidate-after`: cached shards are checked with the hub during
    /// the faults too.
    pub revalidate_after: Duration,
}

/// What one fault saw: the calls that overlapped it (a call spanning two phases counts
/// in both), and those of them that failed.
#[derive(Debug, Default, Clone)]
pub struct PhaseReport {
    pub name: String,
    pub calls: u64,
    pub failures: u64,
}

/// What the soak saw.
#[derive(Debug, Default)]
pub struct ChaosReport {
    pub calls: u64,
    /// Bytes returned and equal to the files.
    pub bytes: u64,
    /// Returned bytes that differ from the files (must be 0).
    pub wrong_bytes: u64,
    /// Calls not done within `hung_after` (must be 0).
    pub hung: u64,
    /// Failed calls while a member or the hub could serve, by status (must be 0).
    pub failures: BTreeMap<String, u64>,
    pub examples: BTreeMap<String, String>,
    /// Failed calls while the hub was stalled (a shard no member held).
    pub failed_while_hub_down: u64,
    /// Per phase: calls and failures (the healthy ones as "none").
    pub phases: Vec<PhaseReport>,
    /// Faults met (phases that were not healthy).
    pub faults: u64,
    /// Why a fault could not be set up (the disk without root).
    pub skipped: Vec<String>,
    pub epochs: u32,
    /// Epochs each node read.
    pub node_epochs: [u32; 2],
    pub hub_bytes: u64,
    /// Bytes the members' links delivered to them (the emulators' counts).
    pub link_bytes: u64,
    pub dataset_bytes: u64,
    pub slowest: Duration,
    pub elapsed: Duration,
}

/// The phase calls are counted in, and whether the hub is down.
#[derive(Debug, Default)]
struct Now {
    phase: AtomicUsize,
    hub_down: AtomicBool,
    /// Hub stalls begun: a call during which one began overlapped it.
    hub_outages: AtomicU32,
    /// Epochs both nodes have finished.
    epochs: [AtomicU32; 2],
    /// The faults have run their course.
    done: AtomicBool,
}

/// Runs the soak (see the module's documentation).
pub async fn run(plan: &ChaosPlan) -> ChaosReport {
    let root = tempfile::tempdir().unwrap();
    let files = make_dataset(root.path(), "ds", plan.shards, plan.shard_size);
    let mut options = crate::test_options();
    options.limits.max_read = 16 << 20;
    let hub = TestHub::start_with(root.path(), options).await;
    // Each member reaches the hub through its own link.
    let mut links = Vec::new();
    for _ in 0..MEMBERS {
        let link = WanProxy::start("127.0.0.1:0".parse().unwrap(), hub.addr, LinkConfig::rtt(Duration::ZERO));
        links.push(link.await.unwrap());
    }
    let addresses: Vec<KeptAddress> = (0..MEMBERS).map(|_| KeptAddress::new()).collect();
    let urls: Vec<String> = addresses.iter().map(KeptAddress::url).collect();
    let tmpfs = disk::Tmpfs::mount(plan.disk);
    let dirs: Vec<tempfile::TempDir> = (0..MEMBERS).map(|_| tempfile::tempdir().unwrap()).collect();
    let cache_dir = |i: usize| match (&tmpfs, i) {
        (Some(fs), 0) => fs.path().join("cache"),
        _ => dirs[i].path().to_owned(),
    };
    let start = |i: usize| {
        let listener = addresses[i].listener();
        let mut options = spoke_options(&links[i].endpoint());
        options.hub_transport.timeout = plan.hub_timeout;
        options.cache.capacity = plan.capacity;
        options.cache.revalidate_after = plan.revalidate_after;
        options.group =
            Some(PeerGroup { spec: urls.join(","), me: urls[i].clone(), credentials: Default::default() });
        let dir = cache_dir(i);
        async move { TestSpoke::start_on(listener, &dir, options).await }
    };
    let mut spokes = Vec::new();
    for i in 0..MEMBERS {
        spokes.push(Some(start(i).await));
    }

    let content = contents(&files);
    let now = Now::default();
    let report = Mutex::new(ChaosReport {
        dataset_bytes: u64::from(plan.shards) * plan.shard_size,
        phases: vec![PhaseReport { name: "none (first epoch)".into(), ..Default::default() }],
        ..Default::default()
    });
    let started = Instant::now();
    let nodes =
        [Client::connect(&urls.join(",")).await.unwrap(), Client::connect(&urls.join(",")).await.unwrap()];
    let readers =
        nodes.iter().enumerate().map(|(n, node)| read_epochs(n, node, plan, &content, &now, &report));
    let faults = async {
        // After the first epoch: every shard is in the group.
        while now.epochs.iter().any(|e| e.load(Relaxed) < 1) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for _ in 0..plan.cycles {
            run_faults(plan, &links, &mut spokes, &start, tmpfs.as_ref(), &now, &report).await;
        }
        now.done.store(true, Relaxed);
    };
    tokio::join!(futures::future::join_all(readers), faults);
    for spoke in spokes.iter().flatten() {
        spoke.settled().await;
    }
    let mut link_bytes = 0;
    for link in &links {
        link_bytes += crate::wire::settled_link(link).await.to_client;
    }
    let mut report = report.into_inner().unwrap();
    report.node_epochs = [now.epochs[0].load(Relaxed), now.epochs[1].load(Relaxed)];
    report.epochs = report.node_epochs.into_iter().min().unwrap_or(0);
    report.hub_bytes = hub.stats.snapshot().bytes_served;
    report.link_bytes = link_bytes;
    report.elapsed = started.elapsed();
    report
}

/// What the reads of a soak that read `node_epochs` cost with no cache, run: a hub as the
/// soak's, each node reading its epochs (the same orders) straight from it through a link
/// of its own, identical to the members' (no faults). Returns the bytes those links
/// delivered, the bytes the hub served (decoded: what the soak's `hub_bytes` counts), and
/// the reads' report (every byte checked against the files).
pub async fn no_cache(plan: &ChaosPlan, node_epochs: [u32; 2]) -> (u64, u64, ChaosReport) {
    let root = tempfile::tempdir().unwrap();
    let files = make_dataset(root.path(), "ds", plan.shards, plan.shard_size);
    let mut options = crate::test_options();
    options.limits.max_read = 16 << 20;
    let hub = TestHub::start_with(root.path(), options).await;
    let content = contents(&files);
    let now = Now::default();
    now.done.store(true, Relaxed);
    let report = Mutex::new(ChaosReport {
        dataset_bytes: u64::from(plan.shards) * plan.shard_size,
        phases: vec![PhaseReport { name: "no cache".into(), ..Default::default() }],
        ..Default::default()
    });
    let mut links = Vec::new();
    for _ in 0..2 {
        let link = WanProxy::start("127.0.0.1:0".parse().unwrap(), hub.addr, LinkConfig::rtt(Duration::ZERO));
        links.push(link.await.unwrap());
    }
    let mut nodes = Vec::new();
    for link in &links {
        nodes.push(Client::connect(&link.endpoint()).await.unwrap());
    }
    let plans: Vec<ChaosPlan> =
        node_epochs.iter().map(|&epochs| ChaosPlan { epochs, ..plan.clone() }).collect();
    let readers = nodes
        .iter()
        .zip(&plans)
        .enumerate()
        .map(|(n, (node, plan))| read_epochs(n, node, plan, &content, &now, &report));
    futures::future::join_all(readers).await;
    let mut bytes = 0;
    for link in &links {
        bytes += crate::wire::settled_link(link).await.to_client;
    }
    (bytes, hub.stats.snapshot().bytes_served, report.into_inner().unwrap())
}

/// Every shard of the dataset in `files`, by name.
fn contents(files: &std::path::Path) -> HashMap<String, Vec<u8>> {
    std::fs::read_dir(files)
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect()
}

/// Starts a new phase named `name` (calls from now on count in it); `fault`: one of the
/// faults, not a healthy pause or a recovery.
fn phase(now: &Now, report: &Mutex<ChaosReport>, name: &str, fault: bool) {
    let mut report = report.lock().unwrap();
    report.phases.push(PhaseReport { name: name.to_owned(), ..Default::default() });
    report.faults += u64::from(fault);
    now.phase.store(report.phases.len() - 1, Relaxed);
}

/// One round of the faults, each between healthy pauses.
#[allow(clippy::too_many_arguments)]
async fn run_faults<F, Fut>(
    plan: &ChaosPlan,
    links: &[WanProxy],
    spokes: &mut [Option<TestSpoke>],
    start: &F,
    tmpfs: Option<&disk::Tmpfs>,
    now: &Now,
    report: &Mutex<ChaosReport>,
) where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = TestSpoke>,
{
    let pause = |name: &'static str, fault: bool| {
        phase(now, report, name, fault);
        tokio::time::sleep(plan.phase)
    };
    pause("none", false).await;
    // A gray member: its link to the hub hangs while it says SERVING.
    links[2].set_fault(Fault::Stall);
    pause("member 2's hub link stalled", true).await;
    links[2].set_fault(Fault::None);
    pause("none", false).await;
    // A member stops, then comes back on its address with its cache.
    phase(now, report, "member 1 stopped", true);
    spokes[1].take().unwrap().stop().await;
    tokio::time::sleep(plan.phase).await;
    spokes[1] = Some(start(1).await);
    pause("member 1 restarted", false).await;
    // The hub stalls past --hub-timeout.
    phase(now, report, "hub stalled past --hub-timeout", true);
    now.hub_down.store(true, Relaxed);
    now.hub_outages.fetch_add(1, Relaxed);
    for link in links {
        link.set_fault(Fault::Stall);
    }
    tokio::time::sleep(plan.hub_timeout + plan.phase).await;
    for link in links {
        link.set_fault(Fault::None);
    }
    now.hub_down.store(false, Relaxed);
    pause("none", false).await;
    // Another tenant fills member 0's disk.
    match tmpfs {
        Some(fs) => {
            let tenant = disk::fill(fs.path(), 1 << 20);
            pause("member 0's disk full", true).await;
            let _ = std::fs::remove_file(tenant);
        }
        None => report.lock().unwrap().skipped.push("member 0's disk full: a tmpfs needs root".into()),
    }
    pause("none", false).await;
}

/// Node `n` reads epochs (each record once, shuffled, in batches) until it has read
/// `plan.epochs` and the faults are done.
async fn read_epochs(
    n: usize,
    node: &Client,
    plan: &ChaosPlan,
    content: &HashMap<String, Vec<u8>>,
    now: &Now,
    report: &Mutex<ChaosReport>,
) {
    let mut names: Vec<&String> = content.keys().collect();
    names.sort();
    let records: Vec<(&String, u64)> = names
        .iter()
        .flat_map(|name| (0..plan.shard_size / plan.record).map(move |i| (*name, i * plan.record)))
        .collect();
    let mut epoch = 0u32;
    while epoch < plan.epochs || !now.done.load(Relaxed) {
        let mut order = records.clone();
        let mut seed = (n as u64 + 1) * 1_000_003 + u64::from(epoch);
        for i in (1..order.len()).rev() {
            order.swap(i, (next_random(&mut seed) % (i as u64 + 1)) as usize);
        }
        for batch in order.chunks(plan.batch) {
            let ranges: Vec<Range> =
                batch.iter().map(|(name, at)| Range::new("ds", name.as_str(), *at, plan.record)).collect();
            let (phase, outages) = (now.phase.load(Relaxed), now.hub_outages.load(Relaxed));
            let down_at_start = now.hub_down.load(Relaxed);
            let called = Instant::now();
            let answer = tokio::time::timeout(plan.hung_after, node.read_ranges(&ranges)).await;
            let took = called.elapsed();
            // The hub was stalled at some time during the call.
            let hub_down =
                down_at_start || now.hub_down.load(Relaxed) || now.hub_outages.load(Relaxed) != outages;
            // Every phase the call overlapped met it.
            let phases = phase..=now.phase.load(Relaxed);
            let mut report = report.lock().unwrap();
            report.calls += 1;
            report.slowest = report.slowest.max(took);
            for p in phases.clone() {
                report.phases[p].calls += 1;
            }
            let failure = match answer {
                Err(_) => {
                    report.hung += 1;
                    Some(("hung".to_owned(), format!("not done in {:?}", plan.hung_after)))
                }
                Ok(Err(e)) => Some((format!("{:?}", e.code()), e.to_string())),
                Ok(Ok(read)) => {
                    for ((name, at), got) in batch.iter().zip(&read) {
                        let want = &content[*name][*at as usize..(*at + plan.record) as usize];
                        if got.data != want {
                            let differ = got.data.iter().zip(want).filter(|(a, b)| a != b).count();
                            report.wrong_bytes += (differ + got.data.len().abs_diff(want.len())) as u64;
                        } else {
                            report.bytes += plan.record;
                        }
                    }
                    None
                }
            };
            if let Some((kind, message)) = failure {
                for p in phases {
                    report.phases[p].failures += 1;
                }
                if hub_down {
                    report.failed_while_hub_down += 1;
                } else {
                    *report.failures.entry(kind.clone()).or_default() += 1;
                    report.examples.entry(kind).or_insert(message);
                }
            }
        }
        epoch += 1;
        now.epochs[n].store(epoch, Relaxed);
    }
}
