//! `link-bench`: what readers the spoke was not built around cost the long link. A hub
//! behind a 60 ms, 2 Gbit/s link (`wan-proxy`; the hub's compression off, so that bytes
//! on the link are the bytes fetched), 256 MiB of 16 KiB records (16 shards of 16 MiB),
//! and a spoke with room for half of it; two shuffled epochs through a fresh spoke per
//! reader:
//!
//! - `sdk`: the Rust SDK's random `ReadRanges`, batches of 32 records, 4 in flight;
//! - `mount`: 16 KiB `pread`s through `shardcache mount`, 64 threads (as `fio
//!   --bs=16k --rw=randread --numjobs=64`), every record once an epoch;
//! - `python` (with `--python PY`, a Python with this repo's SDK and torch:
//!   `scripts/link-bench.sh`): `shardcache.ShardDataset` under
//!   `DataLoader(shuffle=True, batch_size=32, num_workers=2)`, as a new user writes it,
//!   then the same straight from the hub over the same link (its baseline);
//! - `sampler` (the same Python): the same reader with `sampler=shardcache.ShardSampler(ds)`,
//!   which sends the spoke its order (a plan followed sample by sample);
//! - `s3`: 16 KiB ranged `GetObject`s through the spoke's S3 door, 64 in flight, in a
//!   shuffled order with no plan (as s3fs under a map-style dataset reads), then the same
//!   straight from versitygw serving the same files behind an identical link (its
//!   baseline, when versitygw is installed);
//! - `tenants`: on a spoke with tokens, Alice trains on 64 MiB (half the cache) for an
//!   epoch, then reads her next epoch while Bob scans 384 MiB (three times the cache)
//!   once: Alice's hits in her second epoch, and what Bob's scan cost.
//!
//! Per epoch: bytes read, bytes on the link, their ratio, the bound the issue set (what
//! was read plus the capacity), samples/s. Every byte read is checked against the files.
//! Link bytes are the emulator's `to_client` counter (every byte the hub sent through it,
//! framing, listings and stats included), read once the spoke has nothing in flight and
//! the link is still (`shardcache_tests::wire`); the spoke's own count of what its hub
//! connections read is checked against it (2%). Each no-cache row is the same reader run
//! straight to the hub through the same link, counted the same way. The tenants' epoch
//! 2 runs beside Bob's scan: the wire counts both, split between them by the spoke's
//! per-dataset counts of the hubs' answers (`upstream_wire_bytes`).
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/link-bench [--readers sdk,mount]
//! scripts/link-bench.sh   # every reader, with the Python SDK built release
//! ```

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::{os::unix::fs::FileExt, path::Path, time::Instant};

use futures::{StreamExt, stream};
use shardcache_bench::s3;
use shardcache_client::{CacheClient, Client, ConnectOptions, Range};
use shardcache_tests::{
    HubProcess, MountProcess, ProxyProcess, SpokeProcess, make_dataset, token_file,
    wire::{self, LinkCount},
};

const MIB: u64 = 1 << 20;
const RECORD: u64 = 16 << 10;
const SHARDS: u32 = 16;
const SHARD: u64 = 16 * MIB;
const CAPACITY: u64 = SHARDS as u64 * SHARD / 2;
const MOUNT_THREADS: usize = 64;
/// Ranged `GetObject`s in flight at once (the mount's threads).
const S3_IN_FLIGHT: usize = 64;

/// One epoch of one reader.
struct Row {
    reader: String,
    epoch: u32,
    read: u64,
    link: u64,
    seconds: f64,
    /// The bound the issue set for the first epoch: what was read plus the capacity.
    bound: Option<u64>,
    note: String,
}

impl Row {
    /// `reader`'s `epoch` through the half-size spoke: its first epoch is held to the
    /// bound (what it read plus the capacity).
    /// `(link, spoke)`: the wire's bytes, and the spoke's count of what its hub
    /// connections read (none with no cache), shown beside them.
    fn half_size(
        reader: &str,
        epoch: u32,
        read: u64,
        (link, spoke): (u64, Option<u64>),
        seconds: f64,
    ) -> Self {
        let bound = (epoch == 1).then_some(read + CAPACITY);
        let note =
            spoke.map_or(String::new(), |s| format!("spoke's count / wire {:.4}", s as f64 / link as f64));
        Row { reader: reader.into(), epoch, read, link, seconds, bound, note }
    }
}

/// Every record of `shards` shards, in a shuffled order (shard, offset).
fn shuffled(shards: u32, shard: u64, seed: u64) -> Vec<(u32, u64)> {
    shardcache_tests::shuffled_records(shards, shard, RECORD, seed)
}

fn name(shard: u32) -> String {
    shardcache_cli::dataset_gen::shard_name(shard)
}

/// The link's count once the spoke (if any) has nothing in flight and the link is still.
async fn settled(link: &ProxyProcess, control: Option<&CacheClient>) -> (LinkCount, u64) {
    match control {
        Some(control) => wire::settled_spoke(link, control).await,
        None => (wire::settled_link(link).await, 0),
    }
}

/// What crossed the link toward the reader between `before` and now, once it is still;
/// with a spoke, the spoke's own count of what its hub connections read meanwhile, which
/// must agree.
async fn link_since(
    link: &ProxyProcess,
    control: Option<&CacheClient>,
    before: (LinkCount, u64),
) -> (u64, Option<u64>) {
    let (after, received) = settled(link, control).await;
    let wire = after.since(before.0).to_client;
    let spoke = control.map(|_| received - before.1);
    if let Some(received) = spoke {
        assert!(
            wire::agrees(received, wire),
            "the spoke's hub connections read {received} bytes, the wire {wire}"
        );
    }
    (wire, spoke)
}

/// Bytes the hubs' answers of `dataset` took, as the spoke counts them (its split of the
/// wire between datasets read at once).
async fn spoke_counted(control: &CacheClient, dataset: &str) -> u64 {
    let status = control.status().await.unwrap();
    status.datasets.iter().find(|d| d.dataset == dataset).map_or(0, |d| d.upstream_wire_bytes)
}

/// `order` read in batches of 32 through `client`, 4 in flight, checked against `files`.
async fn read_batches(client: &Client, dataset: &str, files: &[Vec<u8>], order: &[(u32, u64)]) {
    stream::iter(order.chunks(32))
        .map(|batch| {
            let client = client.clone();
            let ranges: Vec<Range> =
                batch.iter().map(|&(s, o)| Range::new(dataset, name(s), o, RECORD)).collect();
            async move { (batch, client.read_ranges(&ranges).await.unwrap()) }
        })
        .buffer_unordered(4)
        .for_each(|(batch, read)| {
            for (&(s, o), got) in batch.iter().zip(read) {
                assert!(got.data == files[s as usize][o as usize..(o + RECORD) as usize], "shard {s} at {o}");
            }
            async {}
        })
        .await;
}

/// `order` read with one ranged `GetObject` a record, [`S3_IN_FLIGHT`] at once, from
/// `bucket` through `s3`; checked against `files`.
async fn ranged_gets(s3: &aws_sdk_s3::Client, bucket: &str, files: &[Vec<u8>], order: &[(u32, u64)]) {
    stream::iter(order)
        .map(|&(s, o)| {
            let s3 = s3.clone();
            async move {
                let range = format!("bytes={o}-{}", o + RECORD - 1);
                let got = s3.get_object().bucket(bucket).key(name(s)).range(range).send().await.unwrap();
                (s, o, got.body.collect().await.unwrap().into_bytes())
            }
        })
        .buffer_unordered(S3_IN_FLIGHT)
        .for_each(|(s, o, got)| {
            assert!(got == files[s as usize][o as usize..(o + RECORD) as usize], "shard {s} at {o}");
            async {}
        })
        .await;
}

/// The hub behind the link, and a fresh spoke with room for half the dataset.
struct Setup {
    _hub: HubProcess,
    link: ProxyProcess,
    root: tempfile::TempDir,
    files: Vec<Vec<u8>>,
}

impl Setup {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let dir = make_dataset(root.path(), "c4", SHARDS, SHARD);
        make_dataset(root.path(), "train", 4, SHARD);
        make_dataset(root.path(), "scan", 24, SHARD);
        let files = (0..SHARDS).map(|s| std::fs::read(dir.join(name(s))).unwrap()).collect();
        let hub = HubProcess::start(root.path(), &["--link-compression-level", "0"]);
        let addr = hub.endpoint.trim_start_matches("http://").parse().unwrap();
        let link = ProxyProcess::start(addr, &["--rtt", "60ms", "--rate", "2Gbit"]);
        Self { _hub: hub, link, root, files }
    }

    fn spoke(&self, cache: &Path, extra: &[&str]) -> SpokeProcess {
        let capacity = format!("{CAPACITY}B");
        let mut args = vec!["--capacity", capacity.as_str()];
        args.extend_from_slice(extra);
        SpokeProcess::start(&self.link.endpoint, cache, &args)
    }
}

async fn sdk(setup: &Setup) -> Vec<Row> {
    let cache = tempfile::tempdir().unwrap();
    let spoke = setup.spoke(cache.path(), &[]);
    let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    let hub = Client::connect(&setup.link.endpoint).await.unwrap();
    let mut rows = Vec::new();
    for epoch in 1..=2 {
        let order = shuffled(SHARDS, SHARD, u64::from(epoch));
        let (before, started) = (settled(&setup.link, Some(&control)).await, Instant::now());
        read_batches(&client.for_job("sdk", u64::from(epoch)).unwrap(), "c4", &setup.files, &order).await;
        let seconds = started.elapsed().as_secs_f64();
        let link = link_since(&setup.link, Some(&control), before).await;
        let read = order.len() as u64 * RECORD;
        rows.push(Row::half_size("SDK ReadRanges", epoch, read, link, seconds));
    }
    // The same reads straight from the hub over the same link, counted the same way.
    for epoch in 1..=2 {
        let order = shuffled(SHARDS, SHARD, u64::from(epoch));
        let (before, started) = (settled(&setup.link, None).await, Instant::now());
        read_batches(&hub, "c4", &setup.files, &order).await;
        let seconds = started.elapsed().as_secs_f64();
        let link = link_since(&setup.link, None, before).await;
        let read = order.len() as u64 * RECORD;
        rows.push(Row::half_size("SDK ReadRanges, no cache", epoch, read, link, seconds));
    }
    rows
}

/// The plan-less S3 reader through the spoke's door, then straight from versitygw over an
/// identical link (no cache).
async fn s3_reader(setup: &Setup) -> Vec<Row> {
    let cache = tempfile::tempdir().unwrap();
    let spoke = setup.spoke(cache.path(), &["--s3-listen", "127.0.0.1:0"]);
    let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
    let door =
        s3::client(format!("http://{}", spoke.s3_addr.clone().unwrap()), ("anykey", "anysecret")).await;
    let mut rows = Vec::new();
    for epoch in 1..=2 {
        let order = shuffled(SHARDS, SHARD, 20 + u64::from(epoch));
        let (before, started) = (settled(&setup.link, Some(&control)).await, Instant::now());
        ranged_gets(&door, "c4", &setup.files, &order).await;
        let seconds = started.elapsed().as_secs_f64();
        let link = link_since(&setup.link, Some(&control), before).await;
        let read = order.len() as u64 * RECORD;
        rows.push(Row::half_size("S3 ranged GetObject, door", epoch, read, link, seconds));
    }
    // versitygw refuses bucket names under 3 characters: the same files, linked into `corpus`.
    let peer_root = tempfile::tempdir_in(setup.root.path().parent().unwrap()).unwrap();
    std::fs::create_dir(peer_root.path().join("corpus")).unwrap();
    for s in 0..SHARDS {
        let file = setup.root.path().join("c4").join(name(s));
        std::fs::hard_link(file, peer_root.path().join("corpus").join(name(s))).unwrap();
    }
    let Some(peer) = s3::versitygw(peer_root.path()) else { return rows };
    let peer_link = ProxyProcess::start(peer.addr, &["--rtt", "60ms", "--rate", "2Gbit"]);
    let direct = s3::client(peer_link.endpoint.clone(), s3::VERSITYGW_KEY).await;
    for epoch in 1..=2 {
        let order = shuffled(SHARDS, SHARD, 20 + u64::from(epoch));
        let (before, started) = (settled(&peer_link, None).await, Instant::now());
        ranged_gets(&direct, "corpus", &setup.files, &order).await;
        let seconds = started.elapsed().as_secs_f64();
        let link = link_since(&peer_link, None, before).await;
        let read = order.len() as u64 * RECORD;
        rows.push(Row::half_size("S3 ranged GetObject, no cache (versitygw)", epoch, read, link, seconds));
    }
    rows
}

/// Every record of `order` read with `pread` through the mount at `mnt`, by
/// [`MOUNT_THREADS`] threads taking them in turn; checked against `files`.
fn preads(mnt: &Path, files: &[Vec<u8>], order: &[(u32, u64)]) {
    std::thread::scope(|scope| {
        for t in 0..MOUNT_THREADS {
            scope.spawn(move || {
                let opened: Vec<std::fs::File> =
                    (0..SHARDS).map(|s| std::fs::File::open(mnt.join("c4").join(name(s))).unwrap()).collect();
                let mut buffer = vec![0; RECORD as usize];
                for &(s, o) in order.iter().skip(t).step_by(MOUNT_THREADS) {
                    opened[s as usize].read_exact_at(&mut buffer, o).unwrap();
                    assert!(
                        buffer == files[s as usize][o as usize..(o + RECORD) as usize],
                        "shard {s} at {o}"
                    );
                }
            });
        }
    });
}

async fn mount(setup: &Setup) -> Vec<Row> {
    if let Some(why) = MountProcess::unavailable() {
        eprintln!("mount: skipped ({why})");
        return Vec::new();
    }
    let (cache, mnt, logs) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spoke = setup.spoke(cache.path(), &[]);
    let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
    let mut rows = Vec::new();
    for epoch in 1..=2 {
        // A fresh mount each epoch: the kernel's page cache starts empty.
        let _mount = MountProcess::start(
            &spoke.endpoint,
            mnt.path(),
            &[],
            &logs.path().join(format!("mount-{epoch}.log")),
        );
        let order = shuffled(SHARDS, SHARD, 10 + u64::from(epoch));
        let (before, started) = (settled(&setup.link, Some(&control)).await, Instant::now());
        tokio::task::block_in_place(|| preads(mnt.path(), &setup.files, &order));
        let seconds = started.elapsed().as_secs_f64();
        let link = link_since(&setup.link, Some(&control), before).await;
        let read = order.len() as u64 * RECORD;
        rows.push(Row::half_size("mount pread", epoch, read, link, seconds));
    }
    rows
}

/// The Python map-style reader (`link/map_style.py`) through a fresh half-size spoke, or
/// (`spoke` false) straight from the hub over the link; `sampler`: with ShardSampler.
async fn python(setup: &Setup, python: &str, (spoke, sampler): (bool, bool)) -> Vec<Row> {
    let cache = tempfile::tempdir().unwrap();
    let spoke = spoke.then(|| setup.spoke(cache.path(), &[]));
    let endpoint = spoke.as_ref().map_or(setup.link.endpoint.clone(), |s| s.endpoint.clone());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/link/map_style.py");
    let files = setup.root.path().join("c4");
    let counters = setup.link.counters_file.to_str().unwrap();
    let mut args = vec![
        script,
        "--endpoint",
        &endpoint,
        "--dataset",
        "c4",
        "--files",
        files.to_str().unwrap(),
        "--counters",
        counters,
    ];
    if sampler {
        args.push("--sampler");
    }
    let reader = match (&spoke, sampler) {
        (Some(_), false) => "Python ShardDataset, DataLoader(shuffle=True)",
        (Some(_), true) => "Python ShardDataset, DataLoader(sampler=ShardSampler)",
        (None, _) => "Python ShardDataset, DataLoader(shuffle=True), no cache",
    };
    let out = std::process::Command::new(python).args(&args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let read = v["read"].as_u64().unwrap();
            let epoch = v["epoch"].as_u64().unwrap() as u32;
            let (link, seconds) = (v["link"].as_u64().unwrap(), v["seconds"].as_f64().unwrap());
            if let Some(received) = v["spoke_received"].as_u64() {
                assert!(
                    wire::agrees(received, link),
                    "{reader} epoch {epoch}: the spoke {received}, the wire {link}"
                );
            }
            Row::half_size(reader, epoch, read, (link, v["spoke_received"].as_u64()), seconds)
        })
        .collect()
}

/// Alice's 64 MiB for an epoch, then her next epoch while Bob scans 384 MiB.
async fn tenants(setup: &Setup) -> Vec<Row> {
    let (cache, secrets) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let tokens_path = secrets.path().join("tokens");
    let tokens = token_file(&tokens_path, &[("alice", "train"), ("bob", "scan"), ("ops", "* control")]);
    let spoke = setup.spoke(cache.path(), &["--token-file", tokens_path.to_str().unwrap()]);
    let with = |t: &str| ConnectOptions { tls: None, token: Some(t.to_owned()) };
    let alice = Client::connect_with(&spoke.endpoint, &with(&tokens[0])).await.unwrap();
    let bob = Client::connect_with(&spoke.endpoint, &with(&tokens[1])).await.unwrap();
    let ops = CacheClient::connect_with(&spoke.endpoint, &with(&tokens[2])).await.unwrap();
    let train: Vec<Vec<u8>> =
        (0..4).map(|s| std::fs::read(setup.root.path().join("train").join(name(s))).unwrap()).collect();
    let mut rows = Vec::new();
    for epoch in 1..=2u32 {
        let order = shuffled(4, SHARD, 20 + u64::from(epoch));
        let before = settled(&setup.link, Some(&ops)).await;
        let (alice_before, bob_before) =
            (spoke_counted(&ops, "train").await, spoke_counted(&ops, "scan").await);
        let started = Instant::now();
        let reader = alice.for_job("train", u64::from(epoch)).unwrap();
        let scanning = (epoch == 2).then(|| {
            let (bob, root) = (bob.clone(), setup.root.path().join("scan"));
            tokio::spawn(async move {
                let started = Instant::now();
                for s in 0..24 {
                    let mut stream = bob.stream_shard("scan", &name(s), 0, None).await.unwrap();
                    let mut got = Vec::new();
                    while let Some(chunk) = stream.next_chunk().await.unwrap() {
                        got.extend_from_slice(&chunk.data);
                    }
                    assert!(got == std::fs::read(root.join(name(s))).unwrap(), "scan shard {s}");
                }
                started.elapsed().as_secs_f64()
            })
        });
        read_batches(&reader, "train", &train, &order).await;
        let seconds = started.elapsed().as_secs_f64();
        let scan_seconds = match scanning {
            Some(scan) => Some(scan.await.unwrap()),
            None => None,
        };
        let (wire, _) = link_since(&setup.link, Some(&ops), before).await;
        let (alice_link, bob_link) = (
            spoke_counted(&ops, "train").await - alice_before,
            spoke_counted(&ops, "scan").await - bob_before,
        );
        // The spoke's split of the wire: its counts of the two datasets' answers, which
        // are the wire's less its framing, listings and stats.
        assert!(
            alice_link + bob_link <= wire && wire::agrees(alice_link + bob_link, wire),
            "the spoke's split {alice_link} + {bob_link} of the wire's {wire} bytes"
        );
        let status = ops.status().await.unwrap();
        let row = status.jobs.iter().find(|j| j.job == "train" && j.epoch == u64::from(epoch)).unwrap();
        let hits = row.hit_bytes as f64 * 100.0 / row.bytes.max(1) as f64;
        let read = order.len() as u64 * RECORD;
        let split = if scan_seconds.is_some() { ", the spoke's split of the wire" } else { "" };
        rows.push(Row {
            reader: "tenant Alice (64 MiB, half the cache)".into(),
            epoch,
            read,
            // Alone, all the wire's; beside Bob's scan, her share of it.
            link: if scan_seconds.is_some() { alice_link } else { wire },
            seconds,
            bound: None,
            note: format!("{hits:.1}% hits{split}; wire {:.1} MiB", wire as f64 / MIB as f64),
        });
        if let Some(scan_seconds) = scan_seconds {
            rows.push(Row {
                reader: "tenant Bob (scans 384 MiB once, beside her epoch 2)".into(),
                epoch: 1,
                read: 24 * SHARD,
                link: bob_link,
                seconds: scan_seconds,
                bound: None,
                note: "the spoke's split of the wire".into(),
            });
        }
    }
    rows
}

#[tokio::main]
async fn main() {
    let arg = |flag: &str| {
        let args: Vec<String> = std::env::args().collect();
        args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1).cloned())
    };
    let python_bin = arg("--python");
    let wanted = arg("--readers").unwrap_or_else(|| "sdk,mount,python,sampler,s3,tenants".into());
    let setup = Setup::new();
    let mut rows = Vec::new();
    for reader in wanted.split(',') {
        match reader {
            "sdk" => rows.extend(sdk(&setup).await),
            "mount" => rows.extend(mount(&setup).await),
            "python" => match &python_bin {
                Some(bin) => {
                    rows.extend(python(&setup, bin, (true, false)).await);
                    rows.extend(python(&setup, bin, (false, false)).await);
                }
                None => eprintln!("python: skipped (give --python PY, or run scripts/link-bench.sh)"),
            },
            "sampler" => match &python_bin {
                Some(bin) => rows.extend(python(&setup, bin, (true, true)).await),
                None => eprintln!("sampler: skipped (give --python PY, or run scripts/link-bench.sh)"),
            },
            "s3" => rows.extend(s3_reader(&setup).await),
            "tenants" => rows.extend(tenants(&setup).await),
            other => panic!("unknown reader {other:?}: sdk, mount, python, sampler, s3, tenants"),
        }
    }
    println!(
        "256 MiB of 16 KiB records, a spoke with room for 128 MiB, a 60 ms 2 Gbit/s link, the hub's compression off"
    );
    println!(
        "| reader | epoch | MiB read | MiB on the link | link / read | bound (read + capacity) | samples/s | |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let bound = r.bound.map_or("-".to_owned(), |b| {
            format!("{:.0} MiB: {}", b as f64 / MIB as f64, if r.link <= b { "met" } else { "NOT met" })
        });
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.3} | {bound} | {:.0} | {} |",
            r.reader,
            r.epoch,
            r.read as f64 / MIB as f64,
            r.link as f64 / MIB as f64,
            r.link as f64 / r.read.max(1) as f64,
            (r.read / RECORD) as f64 / r.seconds,
            r.note
        );
    }
    // The plan-less S3 reader against the same reads with no cache (issue 60: >= 0.95x).
    for epoch in 1..=2 {
        let rate = |reader: &str| {
            rows.iter().find(|r| r.reader == reader && r.epoch == epoch).map(|r| r.read as f64 / r.seconds)
        };
        if let (Some(door), Some(none)) =
            (rate("S3 ranged GetObject, door"), rate("S3 ranged GetObject, no cache (versitygw)"))
        {
            println!(
                "S3 ranged GetObject, epoch {epoch}: the door at {:.2}x no cache's samples/s",
                door / none
            );
        }
    }
    // What the bench claims, checked: every first epoch went through a cold spoke.
    assert!(
        rows.iter().filter(|r| r.epoch == 1 && r.bound.is_some()).all(|r| r.link > 0),
        "cold epochs fetched"
    );
}
