//! `order-bench`: any order at the cost of a sequential read. A hub behind a 60 ms,
//! 2 Gbit/s link (`wan-proxy`; the hub's compression off, so link bytes are bytes),
//! 256 MiB of 16 KiB records in 16 shards of 16 MiB, read three epochs in a new order
//! each, by a reader as the SDK's datasets read (`bench/src/orders.rs`: batches of 32, 8 in
//! flight, every byte checked), each setup on a fresh spoke process:
//!
//! - a uniform shuffle (every record of the epoch in one random order: the order of
//!   `ShardSampler`, `StreamingShardDataset(shard_block=16)`) through a spoke half the dataset's size,
//!   with its plan (followed sample by sample) and without (a plain `RandomSampler`);
//! - the default block shuffle (`shard_block=4`) through the same spoke, with its plan:
//!   the order the spoke was built around, the speed to match;
//! - a uniform shuffle through a spoke a tenth of the dataset's size, beside the block
//!   shuffle through a spoke larger than the dataset;
//! - the block shuffle of 8 shards of 4 MiB through a spoke of 16 MiB (a block is the
//!   whole cache);
//! - and the uniform and block readers straight from the hub over the same link, no cache.
//!
//! Per epoch: bytes over the link per byte read, counted at the wire (the emulator's
//! `to_client` counter: every byte the hub sent through it, listings, stats and framing
//! included, read once the spoke has nothing in flight and the link is still:
//! `shardcache_tests::wire`), and beside it what the spoke's hub connections read
//! (`hub_bytes_received`), which must agree within 2%; the no-cache rows are the same
//! reader run straight to the hub through the same link, counted the same way.
//! Records/s, the share of reads from the cache (the spoke's job row; none without a
//! cache), whether the spoke followed the plan sample by sample, and the peak of the
//! cache directory (sampled every millisecond: chunk and pack files, those being written
//! included, against `--capacity`; and RocksDB's own files beside it, issue 48).
//!
//! The uniform order is the one the SDK's `ShardSampler` and
//! `StreamingShardDataset(shard_block=ALL)` read, read here by a Rust reader sending the
//! plans the SDK sends (`bench/src/orders.rs`); link-bench's `sampler` rows run the
//! Python `ShardSampler` itself.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/order-bench [--only NAME]
//! ```

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use shardcache_bench::orders::{Epoch, Layout, Order, Plan, Reader, epoch};
use shardcache_client::{CacheClient, Client};
use shardcache_tests::{
    HubProcess, ProxyProcess, SpokeProcess,
    disk::{DiskPeak, Peak},
    make_dataset,
    wire::{self, LinkCount},
};

const MIB: u64 = 1 << 20;
const EPOCHS: u64 = 3;
const SEED: u64 = 47;

/// One setup: a dataset, an order, a spoke's capacity (`None`: no cache), a plan.
struct Setup {
    name: &'static str,
    dataset: &'static str,
    order: Order,
    capacity: Option<u64>,
    plan: Plan,
}

/// One epoch's row.
struct Row {
    setup: &'static str,
    epoch: u64,
    link_per_read: f64,
    /// What the spoke's hub connections read over what the wire carried (spoke setups).
    spoke_count: Option<f64>,
    records_per_s: f64,
    /// The share of reads from the cache (spoke setups).
    hit_share: Option<f64>,
    samples: bool,
    /// The cache directory's peak during the epoch, and the capacity (spoke setups).
    disk: Option<(Peak, u64)>,
}

/// The two datasets, their hub behind the link.
struct World {
    _root: tempfile::TempDir,
    _hub: HubProcess,
    link: ProxyProcess,
    files: std::collections::HashMap<&'static str, (Layout, Vec<Vec<u8>>)>,
}

impl World {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let mut files = std::collections::HashMap::new();
        for (name, layout) in [
            ("c4", Layout { shards: 16, shard: 16 * MIB, record: 16 << 10 }),
            ("big-shards", Layout { shards: 8, shard: 4 * MIB, record: 16 << 10 }),
        ] {
            let dir = make_dataset(root.path(), name, layout.shards, layout.shard);
            let read = (0..layout.shards)
                .map(|s| std::fs::read(dir.join(shardcache_cli::dataset_gen::shard_name(s))).unwrap())
                .collect();
            files.insert(name, (layout, read));
        }
        let hub = HubProcess::start(root.path(), &["--link-compression-level", "0"]);
        let addr = hub.endpoint.trim_start_matches("http://").parse().unwrap();
        let link = ProxyProcess::start(addr, &["--rtt", "60ms", "--rate", "2Gbit"]);
        Self { _root: root, _hub: hub, link, files }
    }
}

/// The link's count once it is still (and the spoke's count of what its hub connections
/// read, with a spoke: nothing of it in flight).
async fn settled(link: &ProxyProcess, control: Option<&CacheClient>) -> (LinkCount, u64) {
    match control {
        Some(control) => wire::settled_spoke(link, control).await,
        None => (wire::settled_link(link).await, 0),
    }
}

/// The job's hit reads and reads in `epoch`, as the spoke counts them.
async fn job_reads(control: &CacheClient, job: &str, epoch: u64) -> (u64, u64) {
    let status = control.status().await.unwrap();
    let row = status.jobs.iter().find(|j| j.job == job && j.epoch == epoch);
    (row.map_or(0, |r| r.hit_reads), row.map_or(0, |r| r.reads))
}

async fn run(world: &World, setup: &Setup) -> Vec<Row> {
    let (layout, files) = &world.files[setup.dataset];
    let cache = tempfile::tempdir().unwrap();
    let spoke = setup.capacity.map(|capacity| {
        SpokeProcess::start(&world.link.endpoint, cache.path(), &["--capacity", &format!("{capacity}B")])
    });
    let endpoint = spoke.as_ref().map_or(world.link.endpoint.clone(), |s| s.endpoint.clone());
    let control = match &spoke {
        Some(s) => Some(CacheClient::connect(&s.endpoint).await.unwrap()),
        None => None,
    };
    let reader = Reader {
        client: Client::connect(&endpoint).await.unwrap(),
        control: control.clone(),
        dataset: setup.dataset,
        job: "trainer",
        layout: *layout,
        files,
        batch: 32,
        in_flight: 8,
    };
    let epochs: Vec<Epoch> = (0..=EPOCHS).map(|e| epoch(*layout, setup.order, SEED, e)).collect();
    let mut rows = Vec::new();
    let mut before = settled(&world.link, control.as_ref()).await;
    for number in 0..EPOCHS {
        let sampler = setup.capacity.map(|capacity| (DiskPeak::start(cache.path()), capacity));
        let (seconds, samples) =
            reader.epoch(number, (&epochs[number as usize], &epochs[number as usize + 1]), setup.plan).await;
        let disk = sampler.map(|(sampler, capacity)| (sampler.stop(), capacity));
        if let Some((peak, _)) = disk {
            assert!(peak.samples > 10, "{}: the cache directory was sampled through the epoch", setup.name);
        }
        // Fills still arriving after the last read are this epoch's.
        let after = settled(&world.link, control.as_ref()).await;
        let wire = after.0.since(before.0).to_client;
        let (spoke_count, hit_share) = match &control {
            Some(c) => {
                let received = after.1 - before.1;
                assert!(
                    wire::agrees(received, wire),
                    "{} epoch {}: the spoke's hub connections read {received} bytes, the wire carried {wire}",
                    setup.name,
                    number + 1
                );
                let (hits, reads) = job_reads(c, "trainer", number).await;
                assert_eq!(reads, layout.records(), "{}: every record read once an epoch", setup.name);
                // Nothing crossed (a warm epoch): nothing to compare.
                let count = (wire > 0).then(|| received as f64 / wire as f64);
                (count, Some(hits as f64 / reads as f64))
            }
            None => (None, None),
        };
        rows.push(Row {
            setup: setup.name,
            epoch: number + 1,
            link_per_read: wire as f64 / layout.bytes() as f64,
            spoke_count,
            records_per_s: layout.records() as f64 / seconds,
            hit_share,
            samples,
            disk,
        });
        before = after;
    }
    rows
}

/// The setups, in the order they run.
fn setups() -> Vec<Setup> {
    let (half, tenth) = (128 * MIB, 256 * MIB / 10);
    let setup = |name, dataset, order, capacity, plan| Setup { name, dataset, order, capacity, plan };
    vec![
        setup("uniform, plan, half-size spoke", "c4", Order::Uniform, Some(half), Plan::Plan),
        setup("uniform, no plan, half-size spoke", "c4", Order::Uniform, Some(half), Plan::None),
        setup("blocks of 4, plan, half-size spoke", "c4", Order::Blocks(4), Some(half), Plan::Plan),
        setup("uniform, no cache", "c4", Order::Uniform, None, Plan::None),
        setup("blocks of 4, no cache", "c4", Order::Blocks(4), None, Plan::None),
        setup("uniform, plan, tenth-size spoke", "c4", Order::Uniform, Some(tenth), Plan::Plan),
        setup(
            "blocks of 4, plan, spoke larger than the data",
            "c4",
            Order::Blocks(4),
            Some(512 * MIB),
            Plan::Plan,
        ),
        setup(
            "8 x 4 MiB in blocks of 4, plan, 16 MiB spoke",
            "big-shards",
            Order::Blocks(4),
            Some(16 * MIB),
            Plan::Plan,
        ),
        setup("8 x 4 MiB in blocks of 4, no cache", "big-shards", Order::Blocks(4), None, Plan::None),
    ]
}

fn print(rows: &[Row]) {
    println!(
        "256 MiB of 16 KiB records (16 x 16 MiB; and 32 MiB in 8 x 4 MiB), 60 ms 2 Gbit/s link, hub compression off; \
         link bytes from the emulator's counters, each no-cache row run through the same link"
    );
    println!(
        "| setup | epoch | link / read (wire) | spoke's count / wire | records/s | reads from the cache | followed | peak chunk files / capacity (+ RocksDB's own) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        let disk = r.disk.map_or("-".to_owned(), |(peak, capacity)| {
            format!("{:.3} (+{} KiB)", peak.data as f64 / capacity as f64, peak.own >> 10)
        });
        let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
        println!(
            "| {} | {} | {:.3} | {} | {:.0} | {} | {} | {disk} |",
            r.setup,
            r.epoch,
            r.link_per_read,
            or_dash(r.spoke_count.map(|c| format!("{c:.4}"))),
            r.records_per_s,
            or_dash(r.hit_share.map(|h| format!("{:.1}%", 100.0 * h))),
            if r.samples { "samples" } else { "-" },
        );
    }
}

#[tokio::main]
async fn main() {
    let only = std::env::args().skip_while(|a| a != "--only").nth(1);
    let world = World::new();
    let mut rows = Vec::new();
    for setup in setups().iter().filter(|s| only.as_deref().is_none_or(|o| s.name.contains(o))) {
        rows.extend(run(&world, setup).await);
    }
    print(&rows);
}
