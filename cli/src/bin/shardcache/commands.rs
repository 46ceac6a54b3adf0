//! The CLI's subcommands, each a thin layer over the SDK.

use std::{
    io::{IsTerminal, Write},
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use shardcache_cli::dataset_gen::{GenSpec, generate as generate_dataset};
use shardcache_client::{CacheClient, Client, ConnectOptions};
use shardcache_proto::units::ByteSize;
use tokio::io::AsyncWriteExt;

/// The server a command talks to, and how.
#[derive(Debug)]
pub struct Server {
    pub endpoint: String,
    pub options: ConnectOptions,
}

impl Server {
    async fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::connect_with(&self.endpoint, &self.options).await?)
    }

    async fn cache(&self) -> anyhow::Result<CacheClient> {
        Ok(CacheClient::connect_with(&self.endpoint, &self.options).await?)
    }
}

/// Exits non-zero unless the server reports SERVING for `service`.
pub async fn health(server: &Server, service: &str) -> anyhow::Result<()> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let channel = shardcache_client::connect::connect_channel(&server.endpoint, &server.options).await?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest { service: service.to_owned() })
        .await
        .with_context(|| format!("health check of {}", server.endpoint))?;
    let status = response.into_inner().status();
    println!("{}", status.as_str_name());
    anyhow::ensure!(status == tonic_health::pb::health_check_response::ServingStatus::Serving, "not serving");
    // A spoke stays SERVING through a hub outage (its cache still serves); say so, and
    // why, when it tells this caller (a hub, or a token without `control`, does not).
    if let Some(status) = hub_status(server).await.filter(|s| !s.hub_trouble.is_empty()) {
        println!("{}", hubs_unreachable(status.hub_trouble_age_s, &status.hub_trouble));
    }
    Ok(())
}

/// The spoke's status, when `server` is a spoke that shows it to this caller within
/// two seconds.
async fn hub_status(server: &Server) -> Option<shardcache_proto::v1::StatusResponse> {
    let ask = async { server.cache().await.ok()?.status().await.ok() };
    tokio::time::timeout(std::time::Duration::from_secs(2), ask).await.ok().flatten()
}

/// The line `status` and `health` print for a spoke that cannot reach its hubs.
fn hubs_unreachable(age_s: u64, trouble: &str) -> String {
    format!(
        "hubs: UNREACHABLE {age_s} s ago: {trouble} (the cache serves what it holds; misses fail until a hub answers)"
    )
}

pub fn generate(spec: &GenSpec) -> anyhow::Result<()> {
    let started = Instant::now();
    let report = generate_dataset(spec)?;
    println!(
        "generated {}: {} shards x {} = {} bytes, {} records of {} ({} tokens each, {:?}), seed {}, in {:.2} s",
        report.dataset_dir.display(),
        spec.shards,
        ByteSize(spec.shard_size),
        report.bytes,
        report.records,
        ByteSize(spec.record_size),
        spec.record_size / 4,
        spec.tokens,
        spec.seed,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

pub async fn ls(server: &Server, dataset: Option<&str>) -> anyhow::Result<()> {
    let client = server.client().await?;
    let mut out = std::io::stdout().lock();
    match dataset {
        // Asked before the header is printed: a failure prints no half table.
        None => {
            let datasets = client.list_datasets_marked().await?;
            warn_if_stale(datasets.stale);
            writeln!(out, "{:<32} {:>8} {:>16} {:>12}", "DATASET", "SHARDS", "BYTES", "RECORD")?;
            for d in datasets.items {
                let record =
                    if d.record_size == 0 { "-".into() } else { ByteSize(d.record_size.into()).to_string() };
                let bytes = ByteSize(d.total_bytes).human();
                writeln!(out, "{:<32} {:>8} {:>16} {:>12}", d.name, d.shard_count, bytes, record)?;
            }
        }
        Some(dataset) => {
            let shards = client.list_shards_marked(dataset).await?;
            warn_if_stale(shards.stale);
            writeln!(out, "{:<40} {:>14}  VERSION", "SHARD", "BYTES")?;
            for s in shards.items {
                writeln!(out, "{:<40} {:>14}  {}", s.shard, ByteSize(s.size).human(), s.version)?;
            }
        }
    }
    Ok(())
}

/// A listing a spoke answered from its cache says so on stderr (the table stays
/// parseable on stdout; the exit status stays 0: it is what the spoke knows).
fn warn_if_stale(stale: bool) {
    if stale {
        eprintln!(
            "shardcache: STALE LISTING: the spoke cannot reach its hub and answered from its cache: it may be out of \
             date, and shards never read through this spoke are missing (`shardcache status` says why)"
        );
    }
}

pub async fn stat(server: &Server, dataset: &str, shard: &str) -> anyhow::Result<()> {
    let info = server.client().await?.stat(dataset, shard).await?;
    println!("dataset:     {}", info.dataset);
    println!("shard:       {}", info.shard);
    println!("size:        {} bytes", info.size);
    println!("version:     {}", info.version);
    println!("message size: {}", ByteSize(info.message_size.into()));
    let record =
        if info.record_size == 0 { "unknown".into() } else { ByteSize(info.record_size.into()).to_string() };
    println!("record size: {record}");
    Ok(())
}

pub async fn get(server: &Server, dataset: &str, shard: &str, output: &Path) -> anyhow::Result<()> {
    let client = server.client().await?;
    let started = Instant::now();
    let mut stream = client.stream_shard(dataset, shard, 0, None).await?;
    let progress = progress_bar(stream.end());
    let mut sink = Output::open(output).await?;
    let result = async {
        let (mut chunks, mut version) = (0u64, String::new());
        while let Some(chunk) = stream.next_chunk().await? {
            sink.write(&chunk.data).await?;
            progress.inc(chunk.data.len() as u64);
            chunks += 1;
            version = chunk.version;
        }
        anyhow::Ok((chunks, version))
    }
    .await;
    progress.finish_and_clear();
    let (chunks, version) = match result {
        Ok(done) => {
            sink.commit().await?;
            done
        }
        Err(e) => {
            sink.abandon().await;
            return Err(e);
        }
    };
    let (bytes, secs) = (stream.end(), started.elapsed().as_secs_f64());
    eprintln!(
        "{dataset}/{shard} -> {}: {bytes} bytes in {chunks} chunks, CRC32C verified, version {version}, \
         {secs:.2} s ({:.1} MB/s)",
        output.display(),
        bytes as f64 / secs.max(1e-9) / 1e6
    );
    Ok(())
}

/// Where `get` writes. A regular file (or a path that does not exist yet) is written to a
/// hidden partial file beside it and renamed over it when complete, so a reader never
/// sees half a shard. Anything else (a device such as `/dev/null`, a FIFO, a socket) is
/// written in place: renaming a file over `/dev/null` would replace the device for every
/// program on the machine. `-` is standard output.
enum Output {
    Stdout(tokio::io::Stdout),
    InPlace { file: tokio::fs::File, path: PathBuf },
    Renamed { file: tokio::fs::File, partial: PathBuf, path: PathBuf },
}

impl Output {
    async fn open(path: &Path) -> anyhow::Result<Self> {
        if path.as_os_str() == "-" {
            return Ok(Self::Stdout(tokio::io::stdout()));
        }
        let path = path.to_path_buf();
        let existing = match tokio::fs::metadata(&path).await {
            Ok(meta) => Some(meta),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("cannot inspect {}", path.display())),
        };
        if let Some(meta) = existing.filter(|meta| !meta.is_file()) {
            anyhow::ensure!(!meta.is_dir(), "{} is a directory; give a file name", path.display());
            // No create, no truncate: the path is a device, FIFO or socket that exists.
            let file = tokio::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .await
                .with_context(|| format!("cannot open {}", path.display()))?;
            return Ok(Self::InPlace { file, path });
        }
        let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("shard");
        let partial = path.with_file_name(format!(".{file_name}.partial"));
        let file = tokio::fs::File::create(&partial)
            .await
            .with_context(|| format!("cannot create {}", partial.display()))?;
        Ok(Self::Renamed { file, partial, path })
    }

    async fn write(&mut self, data: &[u8]) -> anyhow::Result<()> {
        match self {
            Self::Stdout(out) => out.write_all(data).await.context("cannot write to standard output"),
            Self::InPlace { file, path } | Self::Renamed { file, partial: path, .. } => {
                file.write_all(data).await.with_context(|| format!("cannot write {}", path.display()))
            }
        }
    }

    /// Makes the written bytes the output: flushed, and for a regular file synced and
    /// renamed into place.
    async fn commit(self) -> anyhow::Result<()> {
        match self {
            Self::Stdout(mut out) => out.flush().await.context("cannot write to standard output"),
            Self::InPlace { mut file, path } => {
                file.flush().await.with_context(|| format!("cannot write {}", path.display()))
            }
            Self::Renamed { file, partial, path } => {
                let done = async {
                    file.sync_all().await?;
                    tokio::fs::rename(&partial, &path).await
                }
                .await;
                if done.is_err() {
                    let _ = tokio::fs::remove_file(&partial).await;
                }
                done.with_context(|| format!("cannot write {}", path.display()))
            }
        }
    }

    /// After a failed transfer: removes the partial file; a device or pipe keeps what
    /// reached it (there is nothing of ours to remove).
    async fn abandon(self) {
        if let Self::Renamed { partial, .. } = self {
            let _ = tokio::fs::remove_file(&partial).await;
        }
    }
}

pub async fn cat(
    server: &Server,
    dataset: &str,
    shard: &str,
    offset: u64,
    length: Option<u64>,
) -> anyhow::Result<()> {
    // A shard is binary and large (64 MiB in the seed): not for a terminal, unasked.
    anyhow::ensure!(
        length.is_some() || !std::io::stdout().is_terminal(),
        "cat would write all of {dataset}/{shard} (binary) to the terminal: give --length N, or redirect or pipe \
         the output (`| od -t u4 | head`), or use `get` to write it to a file"
    );
    let client = server.client().await?;
    let mut stream = client.stream_shard(dataset, shard, offset, length).await?;
    let mut out = tokio::io::stdout();
    while let Some(chunk) = stream.next_chunk().await? {
        out.write_all(&chunk.data).await?;
    }
    out.flush().await?;
    Ok(())
}

/// A byte progress bar on stderr when it is a terminal; hidden otherwise (pipes, CI).
fn progress_bar(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
    {
        bar.set_style(style);
    }
    bar
}

pub async fn status(server: &Server) -> anyhow::Result<()> {
    let status = server.cache().await?.status().await?;
    if status.server_view {
        let percent = status.used_bytes as f64 * 100.0 / status.capacity_bytes.max(1) as f64;
        println!(
            "cache: {} of {} used ({percent:.1}%; RocksDB's own files {} beside it), {} shards evicted ({}), \
             {} checksum failures, hubs {}",
            ByteSize(status.used_bytes).human(),
            ByteSize(status.capacity_bytes).human(),
            ByteSize(status.store_own_bytes).human(),
            status.evicted_shards,
            ByteSize(status.evicted_bytes).human(),
            status.checksum_failures,
            status.hubs.join(",")
        );
        if !status.hub_trouble.is_empty() {
            println!("{}", hubs_unreachable(status.hub_trouble_age_s, &status.hub_trouble));
        }
        println!(
            "speculation: {:.0}% of what read-ahead and whole-shard fetches brought lately was read, {} unread",
            status.speculation_useful_share * 100.0,
            ByteSize(status.speculation_unread_bytes).human()
        );
        println!(
            "hub fetches: {} as they are, {} asked for zstd (--hub-compression); {} received from the hubs in \
             all (framing, listings and stats included), {} fetches running",
            status.hub_fetches_plain,
            status.hub_fetches_zstd,
            ByteSize(status.hub_bytes_received).human(),
            status.fetches_in_flight
        );
        if status.kept_sample_bytes > 0 || status.staged_sample_bytes > 0 {
            println!(
                "samples: {} kept for later epochs in {} packs, {} fetched ahead of reads (window {})",
                ByteSize(status.kept_sample_bytes).human(),
                status.kept_sample_packs,
                ByteSize(status.staged_sample_bytes).human(),
                ByteSize(status.sample_window_bytes).human()
            );
        }
    } else {
        println!(
            "cache: as {:?}: your datasets, jobs and plans (capacity, hubs and global counters need a token with \
             `control`)",
            status.principal
        );
    }
    print_datasets(&status);
    print_principals(&status);
    print_jobs(&status);
    print_group(&status);
    if !status.plans.is_empty() {
        println!();
        println!("{:<32} {:>10} {:>10} {:>6} {:>8}", "PLAN", "CURSOR", "POSITIONS", "LAG", "FOLLOWED");
        for p in &status.plans {
            let job = owned_by(&p.principal, &p.job, &status.principal);
            let followed = if p.samples { "samples" } else { "shards" };
            println!("{job:<32} {:>10} {:>10} {:>6} {followed:>8}", p.cursor, p.positions, p.lag);
        }
    }
    Ok(())
}

/// A row per dataset: what is cached, hits and misses, bytes fetched and on the link.
fn print_datasets(status: &shardcache_proto::v1::StatusResponse) {
    println!(
        "{:<24} {:>7} {:>14} {:>6} {:>10} {:>10} {:>8} {:>14} {:>14} {:>10}",
        "DATASET",
        "SHARDS",
        "CACHED",
        "PINNED",
        "HITS",
        "MISSES",
        "HIT%",
        "UPSTREAM",
        "ON THE LINK",
        "LINK/READ"
    );
    for d in &status.datasets {
        let total = d.hit_requests + d.miss_requests;
        let hit = if total == 0 {
            "-".to_owned()
        } else {
            format!("{:.1}", d.hit_requests as f64 * 100.0 / total as f64)
        };
        println!(
            "{:<24} {:>7} {:>14} {:>6} {:>10} {:>10} {:>8} {:>14} {:>14} {:>10}",
            d.dataset,
            d.cached_shards,
            ByteSize(d.cached_bytes).human(),
            d.pinned_shards,
            d.hit_requests,
            d.miss_requests,
            hit,
            ByteSize(d.upstream_bytes).human(),
            // What the upstream bytes took on the link (the hub compresses what pays); "-"
            // from a spoke too old to count it.
            match (d.upstream_wire_bytes, d.upstream_bytes) {
                (0, fetched) if fetched > 0 => "-".to_owned(),
                (wire, _) => ByteSize(wire).human(),
            },
            // Bytes over the long link per byte read: 1 is what reading with no cache
            // would cost, less is what the cache saves.
            per_byte(d.upstream_wire_bytes, d.hit_bytes + d.miss_bytes),
        );
    }
}

/// What each principal holds against its share of the capacity.
fn print_principals(status: &shardcache_proto::v1::StatusResponse) {
    if !status.principals.is_empty() {
        println!();
        println!("{:<32} {:>14} {:>14}", "PRINCIPAL", "HELD", "SHARE");
        for p in &status.principals {
            let name = if p.principal.is_empty() { "(open)" } else { p.principal.as_str() };
            let (held, share) = (ByteSize(p.held_bytes).human(), ByteSize(p.share_bytes).human());
            println!("{name:<32} {held:>14} {share:>14}");
        }
    }
}

/// Per job and epoch (reads say which with the SDK's job headers; "" for those that do
/// not, and for Prefetch calls).
fn print_jobs(status: &shardcache_proto::v1::StatusResponse) {
    if !status.jobs.is_empty() {
        println!();
        println!(
            "{:<32} {:>6} {:>10} {:>8} {:>14} {:>14} {:>10}",
            "JOB", "EPOCH", "READS", "HIT%", "BYTES", "HUB BYTES", "LINK/READ"
        );
        for j in &status.jobs {
            let hit = if j.reads == 0 {
                "-".to_owned()
            } else {
                format!("{:.1}", j.hit_reads as f64 * 100.0 / j.reads as f64)
            };
            let job = if j.job.is_empty() { "(untagged)" } else { j.job.as_str() };
            let job = owned_by(&j.principal, job, &status.principal);
            let (bytes, hub_bytes) = (ByteSize(j.bytes).human(), ByteSize(j.hub_bytes).human());
            let link = per_byte(j.link_bytes, j.bytes);
            println!(
                "{job:<32} {:>6} {:>10} {hit:>8} {bytes:>14} {hub_bytes:>14} {link:>10}",
                j.epoch, j.reads
            );
        }
    }
}

/// `over` per byte of `per`, two decimals ("-" for nothing read).
fn per_byte(over: u64, per: u64) -> String {
    if per == 0 { "-".to_owned() } else { format!("{:.2}", over as f64 / per as f64) }
}

/// Each member's view of the group: a member refusing another's credentials means the
/// group fetches more than one copy over the long link.
fn print_group(status: &shardcache_proto::v1::StatusResponse) {
    if status.members.is_empty() {
        return;
    }
    println!();
    println!("{:<32} {:<24} SEEN BY", "MEMBER", "STATE");
    for m in &status.members {
        println!("{:<32} {:<24} {}", m.url, m.state, m.seen_by);
    }
    if status.peer_refusals > 0 {
        println!(
            "members refused each other's credentials {} times: the group is not sharing one copy (see the \
             spokes' logs for the fix)",
            status.peer_refusals
        );
    }
}

/// Job `job`'s own table (`principal`'s, for an operator), as markdown; its timeline
/// into `png` when given.
pub async fn report(server: &Server, job: &str, principal: &str, png: Option<&Path>) -> anyhow::Result<()> {
    let report = server.cache().await?.job_report(job, principal).await?;
    print!("{}", shardcache_client::report::markdown(&report));
    if let Some(png) = png {
        shardcache_cli::timeline::write_png(&report, png)?;
        println!("\nwrote the timeline to {}", png.display());
    }
    Ok(())
}

/// The access plans the caller may see (its own; an operator's: everyone's).
pub async fn plans(server: &Server) -> anyhow::Result<()> {
    let status = server.cache().await?.status().await?;
    println!("{:<24} {:<40} {:>10} {:>10} {:>6}", "PRINCIPAL", "PLAN", "CURSOR", "POSITIONS", "LAG");
    for p in &status.plans {
        let principal = if p.principal.is_empty() { "-" } else { p.principal.as_str() };
        println!("{principal:<24} {:<40} {:>10} {:>10} {:>6}", p.job, p.cursor, p.positions, p.lag);
    }
    Ok(())
}

/// Withdraws the caller's plans of `job` and of its readers (`JOB/...`).
pub async fn drop_plans(server: &Server, job: &str) -> anyhow::Result<()> {
    let cache = server.cache().await?;
    let status = cache.status().await?;
    let mine = |p: &&shardcache_proto::v1::PlanStatus| {
        p.principal == status.principal && (p.job == job || p.job.starts_with(&format!("{job}/")))
    };
    let names: std::collections::BTreeSet<&str> =
        status.plans.iter().filter(mine).map(|p| p.job.as_str()).collect();
    anyhow::ensure!(
        !names.is_empty(),
        "no plan of job {job:?} for {:?} here (`shardcache plans` lists them)",
        status.principal
    );
    for name in &names {
        cache.set_plan(name, 0, "", &[]).await?;
    }
    println!("dropped {} plans of job {job}", names.len());
    Ok(())
}

/// A job's name as a status table shows it: with its principal when that is not the
/// caller (an operator sees every principal's jobs).
fn owned_by(principal: &str, job: &str, caller: &str) -> String {
    if principal == caller || principal.is_empty() { job.to_owned() } else { format!("{principal}:{job}") }
}

pub async fn warm(server: &Server, dataset: &str, shards: &[String], parallelism: u32) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut stream = server.cache().await?.prefetch(dataset, shards, parallelism).await?;
    let mut bar: Option<ProgressBar> = None;
    let mut last = Default::default();
    while let Some(progress) = stream.next().await? {
        let bar = bar.get_or_insert_with(|| progress_bar(progress.bytes_total));
        bar.set_position(progress.bytes_done);
        last = progress;
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let last: shardcache_proto::v1::PrefetchProgress = last;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "warmed {dataset}: {} shards, {} bytes cached, {} fetched from the hub in {secs:.2} s ({:.1} MB/s)",
        last.shards_done,
        last.bytes_done,
        last.bytes_fetched,
        last.bytes_fetched as f64 / secs.max(1e-9) / 1e6
    );
    // A group's members that answered warmed their shards; the others are named, and
    // the command fails: what was asked is not all cached.
    let silent = stream.not_answering();
    for (member, why) in silent {
        eprintln!("member {member} did not warm its shards: {why}");
    }
    anyhow::ensure!(
        silent.is_empty(),
        "{} member(s) of the group did not answer; warm again once they serve (reads fetch their shards meanwhile)",
        silent.len()
    );
    Ok(())
}

pub async fn evict(server: &Server, dataset: &str, shards: &[String]) -> anyhow::Result<()> {
    let evicted = server.cache().await?.evict(dataset, shards).await?;
    println!("evicted {} shards, {} bytes", evicted.shards, evicted.bytes);
    Ok(())
}

pub async fn pin(server: &Server, dataset: &str, shards: &[String], pinned: bool) -> anyhow::Result<()> {
    let changed = server.cache().await?.pin(dataset, shards, pinned).await?;
    println!("{} {changed} shards", if pinned { "pinned" } else { "unpinned" });
    Ok(())
}

/// `shardcache mount`: serves the mount until it is unmounted; prints a line once it is
/// in place (the contract for scripts and tests).
pub async fn mount(
    server: &Server,
    mountpoint: &std::path::Path,
    options: shardcache_cli::mount::MountOptions,
) -> anyhow::Result<()> {
    let _traces = shardcache_serving::server::init_tracing("shardcache-mount");
    shardcache_serving::allocator::rerun_with_malloc_tunables("mount");
    let client = server.client().await?;
    shardcache_cli::mount::serve(client, mountpoint, options, || {
        println!("shardcache mounted {} on {}", server.endpoint, mountpoint.display());
    })
    .await
}
