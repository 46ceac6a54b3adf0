//! `seed-demo`: the seed experiment reproduced on this machine (`make demo` runs it).
//!
//! Generates a dataset shaped like the seed's (16 KiB samples, each a packed window of
//! 4096 LLaMA-3 token ids), starts a hub, the WAN emulator (60 ms RTT) and spokes as
//! processes, and runs a simulated trainer (16 ranks, batch 24 per rank, a fixed compute
//! time per step) in four setups:
//! 1. the trainer next to the hub (data local: no link);
//! 2. a cold spoke across the link, no prefetch (whole-shard fetch on first touch);
//! 3. a cold spoke across the link, prefetching the epoch's shard order at job start;
//! 4. the peer: nginx `proxy_cache` across the same emulator, nginx serving the files.
//!
//! Setups 2-4 run a second, warm epoch. Then compression on the link (issue 28): setup 3
//! again over a link capped at 2 Gbit/s, on data with real text's token frequencies
//! (`gen --tokens zipf`), with the hub's compression off and at its default: the cold
//! epoch's samples/s and GPU utilisation, and the bytes over the link per epoch. Then a
//! cache smaller than the data: a spoke with
//! room for half the dataset, three epochs in a new order each, evicting least recently
//! used beside following the job's access plan (eviction and prefetch), per epoch the
//! reads from cache, hub bytes, GPU utilisation and samples/s.
//!
//! Prints the tables for this run and writes them to `--out` as `results.md` and
//! `results.json`, with `results.png` and `small-cache.png` (samples/s and GPU
//! utilisation per batch).

#![allow(clippy::unwrap_used)] // a demo: failing loudly is the right response
#![allow(clippy::too_many_lines)] // a demo's main reads as its script; benches are exempt from the 80-line rule

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use clap::Parser as _;
use futures::FutureExt;
use shardcache_bench::demo::{
    flags::Args,
    group,
    job_table::{self, JobTiming},
    link, nginx,
    readers::{self, Counter, HttpCacheCounts},
    report::{self, PhaseRow},
    small_cache,
    trainer::{EpochOrder, EpochRun, JobShape, Layout, ReadBatch, Step, epoch_order, run_epoch_timed},
};
use shardcache_cli::dataset_gen::{GenSpec, Tokens, generate, shard_name};
use shardcache_client::{CacheClient, Client};
use shardcache_proto::units::ByteSize;
use shardcache_tests::{HubProcess, ProxyProcess, SpokeProcess, wire};

#[path = "seed_demo/compression.rs"]
mod compression;

const DATASET: &str = "c4";
/// 4096 tokens x 4 bytes, as in the seed.
const SAMPLE: u64 = 16 << 10;

/// Called after each epoch of a setup.
type AfterEpoch = Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

struct Demo {
    args: Args,
    layout: Layout,
    shape: JobShape,
    names: Arc<Vec<String>>,
    rows: Vec<PhaseRow>,
    series: Vec<(String, Vec<Step>)>,
    small_rows: Vec<small_cache::EpochRow>,
    small_series: Vec<(String, Vec<Step>)>,
    group_rows: Vec<group::GroupRow>,
    link_rows: Vec<link::LinkRow>,
    /// The next setup's job on its spoke, timed for the spoke's own table.
    timing: Option<JobTiming>,
    /// The spoke's tables beside the demo's rows.
    compared: Vec<job_table::Compared>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let global = args.ranks * args.batch;
    let samples_per_shard = args.shard_size.0 / SAMPLE;
    anyhow::ensure!(
        samples_per_shard > 0 && args.shard_size.0 % SAMPLE == 0,
        "--shard-size must be a multiple of 16KiB"
    );
    let shards = (args.steps * global).div_ceil(samples_per_shard as usize) as u32;
    let layout = Layout { shards, samples_per_shard, sample_bytes: SAMPLE };
    let shape = JobShape {
        ranks: args.ranks,
        batch_per_rank: args.batch,
        compute: args.compute,
        read_ahead: args.read_ahead,
        steps: args.steps,
    };

    std::fs::create_dir_all(&args.out)?;
    let work = tempfile::tempdir_in(&args.out)?;
    let data = work.path().join("data");
    println!(
        "dataset: {shards} shards x {} = {} of 16 KiB samples (4096 tokens); {} ranks x batch {} = {global} samples/step, {} steps/epoch, compute {:?}/step, link RTT {}",
        args.shard_size,
        ByteSize(u64::from(shards) * args.shard_size.0),
        args.ranks,
        args.batch,
        args.steps,
        args.compute,
        args.rtt
    );
    generate(&GenSpec {
        dir: data.clone(),
        dataset: DATASET.into(),
        shards,
        shard_size: args.shard_size.0,
        record_size: SAMPLE,
        seed: 0,
        tokens: Default::default(),
    })?;
    let names = Arc::new((0..shards).map(shard_name).collect::<Vec<_>>());
    let mut demo = Demo {
        args,
        layout,
        shape,
        names,
        rows: Vec::new(),
        series: Vec::new(),
        small_rows: Vec::new(),
        small_series: Vec::new(),
        group_rows: Vec::new(),
        link_rows: Vec::new(),
        timing: None,
        compared: Vec::new(),
    };

    // The hub, behind the emulator every setup across the link shares: the emulator counts
    // what crosses it (`shardcache_tests::wire`).
    let level = demo.args.hub_compression_level.map(|l| l.to_string());
    let mut hub_args = Vec::new();
    if let Some(level) = &level {
        hub_args.extend(["--link-compression-level", level.as_str()]);
    }
    let hub = HubProcess::start(&data, &hub_args);
    let hub_addr = hub.endpoint.trim_start_matches("http://").parse()?;
    let rtt = demo.args.rtt.clone();
    let link = ["--rtt", rtt.as_str()];
    let proxy = ProxyProcess::start(hub_addr, &link);

    if !demo.args.small_cache_only && !demo.args.group_only {
        demo.seed_setups(&hub, &proxy, work.path(), &data, &link).await?;
    }
    if !demo.args.skip_compression && !demo.args.small_cache_only && !demo.args.group_only {
        demo.compression_setups(work.path()).await?;
    }

    // 5. and 6. Room for half the dataset, in each order: least recently used, the access
    // plan, and no cache at all.
    if !demo.args.skip_small_cache && !demo.args.group_only {
        let spoke = (demo.dataset_bytes() / 2, demo.args.plan_window.as_str());
        let (rows, series, tables) =
            small_cache::run_setups(&proxy, work.path(), spoke, demo.workload()).await?;
        demo.small_rows.extend(rows);
        demo.small_series.extend(series);
        demo.compared.extend(tables);
    }
    // 7. to 9. Two trainer nodes: a spoke each, a group of three spokes, and the group
    // losing a member mid-epoch.
    if !demo.args.skip_group && !demo.args.small_cache_only {
        let (mut rows_of_groups, mut tables_of_groups) = (Vec::new(), Vec::new());
        let groups = group::Groups { link: &proxy, work: work.path(), job: demo.workload() };
        for (setup, spokes) in [
            ("2 nodes, a spoke each", group::Spokes::Each),
            ("2 nodes, a group of 3 spokes", group::Spokes::Group),
            ("2 nodes, a group of 3, one killed mid-epoch 1", group::Spokes::GroupLosingOne),
        ] {
            println!("\n== {setup}");
            let (rows, tables) = groups.run(setup, spokes).await?;
            print!("{}", group::markdown(&rows));
            print!("   the spokes' own table of the job:\n{}", job_table::markdown(&tables));
            rows_of_groups.extend(rows);
            tables_of_groups.extend(tables);
        }
        demo.group_rows = rows_of_groups;
        demo.compared.extend(tables_of_groups);
    }
    demo.finish()
}

impl Demo {
    /// Setups 1-4: the seed's table.
    async fn seed_setups(
        &mut self,
        hub: &HubProcess,
        proxy: &ProxyProcess,
        work: &std::path::Path,
        data: &std::path::Path,
        link: &[&str],
    ) -> anyhow::Result<()> {
        let demo = self;
        // 1. Data local: the trainer reads the hub directly.
        let read = readers::grpc(Client::connect(&hub.endpoint).await?, DATASET, demo.names.clone(), SAMPLE);
        demo.run("hub (data local)", read, None, None).await?;

        // 2. and 3. A cold spoke across the link, without and with prefetch.
        for prefetch in [false, true] {
            let cache = tempfile::tempdir_in(work)?;
            let spoke = SpokeProcess::start(&proxy.endpoint, cache.path(), &["--capacity", "8GiB"]);
            // The trainer's reads name its job, and its ranks report their steps: the
            // spoke's own table of the job is printed beside the demo's.
            let job = if prefetch { "demo-prefetch" } else { "demo-cold" };
            let client = Client::connect(&spoke.endpoint).await?.for_job(job, 0)?;
            let read = readers::grpc(client, DATASET, demo.names.clone(), SAMPLE);
            let counter = readers::spoke_counter(&spoke.metrics_addr);
            let name = if prefetch { "spoke, cold + prefetch" } else { "spoke, cold, no prefetch" };
            let control = if prefetch { Some(CacheClient::connect(&spoke.endpoint).await?) } else { None };
            demo.timing =
                Some(JobTiming::new(CacheClient::connect(&spoke.endpoint).await?, job, demo.shape.ranks));
            demo.run(name, read, Some(counter), control).await?;
        }

        // 4. The peer: nginx proxy_cache across the same emulator.
        match nginx::find() {
            _ if demo.args.skip_nginx => println!("\nnginx row skipped (--skip-nginx)"),
            Err(why) => println!("\nnginx row skipped: {why}"),
            Ok(binary) => {
                let origin = nginx::Nginx::origin(&binary, &work.join("nginx-origin"), data)?;
                let origin_addr = format!("127.0.0.1:{}", origin.port).parse()?;
                let peer_proxy = ProxyProcess::start(origin_addr, link);
                let cache = nginx::Nginx::cache(&binary, &work.join("nginx-cache"), peer_proxy.addr.port())?;
                let counts = Arc::new(HttpCacheCounts::default());
                let read =
                    readers::http(&cache.base_url(), DATASET, demo.names.clone(), SAMPLE, counts.clone());
                let counter: Counter = Arc::new(move || {
                    let counts = counts.clone();
                    async move {
                        use std::sync::atomic::Ordering::Relaxed;
                        (counts.hits.load(Relaxed), counts.reads.load(Relaxed))
                    }
                    .boxed()
                });
                demo.run("nginx proxy_cache (peer)", read, Some(counter), None).await?;
            }
        }
        Ok(())
    }

    fn workload(&self) -> shardcache_bench::demo::Workload<'_> {
        shardcache_bench::demo::Workload {
            dataset: DATASET,
            names: &self.names,
            layout: self.layout,
            shape: self.shape,
            block_shards: self.args.block_shards,
            sample_bytes: SAMPLE,
        }
    }

    fn dataset_bytes(&self) -> u64 {
        u64::from(self.layout.shards) * self.layout.samples_per_shard * SAMPLE
    }

    /// Epoch 1 (cold, with phases) and, for setups with a cache, epoch 2 (warm).
    async fn run(
        &mut self,
        setup: &str,
        read: ReadBatch,
        counter: Option<Counter>,
        prefetch: Option<CacheClient>,
    ) -> anyhow::Result<()> {
        self.run_marked(setup, read, counter, prefetch, None).await
    }

    /// [`Demo::run`], calling `after_epoch` after each epoch (epoch 1 once its prefetch
    /// is done).
    async fn run_marked(
        &mut self,
        setup: &str,
        read: ReadBatch,
        counter: Option<Counter>,
        prefetch: Option<CacheClient>,
        after_epoch: Option<AfterEpoch>,
    ) -> anyhow::Result<()> {
        println!("\n== {setup}");
        let global = self.shape.ranks * self.shape.batch_per_rank;
        let order = epoch_order(self.layout, self.args.block_shards, 1);
        let prefetching = prefetch.map(|control| {
            let plan: Vec<String> =
                order.shard_order.iter().map(|&i| self.names[i as usize].clone()).collect();
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let done = control.prefetch(DATASET, &plan, 0).await?.finish().await?;
                println!(
                    "   prefetch of {} shards ({}) done in {:.1} s",
                    done.shards_done,
                    ByteSize(done.bytes_fetched),
                    started.elapsed().as_secs_f64()
                );
                anyhow::Ok(())
            })
        });
        let mut timing = self.timing.take();
        let mut timers = timing.as_mut().map_or(Vec::new(), |t| std::mem::take(&mut t.timers));
        timers.iter_mut().for_each(|t| t.start_epoch(1));
        let epoch1 =
            self.epoch(&order, read.clone(), counter.clone(), self.args.startup, &mut timers).await?;
        let phases =
            [("batches 0-100", 0, 100), ("batches 100-150", 100, 150), ("steady (150-end)", 150, usize::MAX)];
        for (i, (phase, from, to)) in phases.into_iter().enumerate() {
            let to = to.min(epoch1.run.steps.len());
            if from >= to {
                continue;
            }
            let share = epoch1.cache_share(i, i + 1);
            self.rows.push(epoch1.row(setup, phase, from, to, global, share));
        }
        let mut steps = epoch1.run.steps.clone();
        if let Some(prefetching) = prefetching {
            prefetching.await?.context("prefetch")?;
        }
        if let Some(after) = &after_epoch {
            after().await;
        }
        if counter.is_some() {
            let order2 = epoch_order(self.layout, self.args.block_shards, 2);
            timers.iter_mut().for_each(|t| t.start_epoch(2));
            let epoch2 = self.epoch(&order2, read, counter, Duration::ZERO, &mut timers).await?;
            let n = epoch2.run.steps.len();
            let share = epoch2.cache_share(0, epoch2.marks.len() - 1);
            self.rows.push(epoch2.row(setup, "epoch 2 (warm)", 0, n, global, share));
            steps.extend(epoch2.run.steps);
            if let Some(after) = &after_epoch {
                after().await;
            }
        }
        for row in self.rows.iter().filter(|r| r.setup == setup) {
            println!("{}", report::markdown_row(row));
        }
        if let Some(mut timing) = timing {
            timing.timers = timers;
            let table = timing.table(steps.len() as u64).await?;
            let compared = job_table::compare(setup, &self.rows, &table);
            print!("   the spoke's own table of the job:\n{}", job_table::markdown(&compared));
            self.compared.extend(compared);
        }
        self.series.push((setup.to_owned(), steps));
        Ok(())
    }

    /// One epoch, with cache counters taken at the start, at steps 100 and 150, and at
    /// the end.
    async fn epoch(
        &self,
        order: &EpochOrder,
        read: ReadBatch,
        counter: Option<Counter>,
        startup: Duration,
        timers: &mut [shardcache_client::StepTimer],
    ) -> anyhow::Result<Epoch> {
        let marks = Arc::new(Mutex::new(Vec::new()));
        if let Some(counter) = &counter {
            let first = counter().await;
            marks.lock().unwrap().push(first);
        }
        let steps = self.shape.steps_over(order);
        let on_step = {
            let (marks, counter) = (marks.clone(), counter.clone());
            move |done: usize| {
                let (marks, counter) = (marks.clone(), counter.clone());
                async move {
                    if let Some(counter) = counter.filter(|_| done == 100 || done == 150 || done == steps) {
                        let mark = counter().await;
                        marks.lock().unwrap().push(mark);
                    }
                }
                .boxed()
            }
        };
        let run = run_epoch_timed(order, self.shape, read, startup, on_step, timers).await?;
        let marks = marks.lock().unwrap().clone();
        Ok(Epoch { run, marks })
    }

    fn finish(self) -> anyhow::Result<()> {
        let table = report::markdown(&self.rows);
        println!("\n{table}");
        let ratios = report::ratios(&self.rows);
        if !ratios.is_empty() {
            println!("{ratios}");
        }
        let out = &self.args.out;
        let half = self.dataset_bytes() / 2;
        // The block being read and the window ahead of it stream through; the rest stays.
        let block = u64::from(self.args.block_shards) * self.args.shard_size.0;
        let window = match self.args.plan_window.as_str() {
            "auto" => block,
            bytes => bytes.parse::<ByteSize>().map_or(block, |b| b.0),
        };
        let streamed = block + window;
        let bound = half.saturating_sub(streamed) as f64 * 100.0 / self.dataset_bytes() as f64;
        let small = if self.small_rows.is_empty() {
            String::new()
        } else {
            format!(
                "\nA cache half the size of the dataset:\n\n{}",
                small_cache::markdown(&self.small_rows, bound)
            )
        };
        println!("{small}");
        let grouped = if self.group_rows.is_empty() {
            String::new()
        } else {
            format!(
                "\nTwo trainer nodes, a spoke each or a group of three:\n\n{}",
                group::markdown(&self.group_rows)
            )
        };
        println!("{grouped}");
        let linked = link::markdown(&self.link_rows, self.dataset_bytes());
        println!("{linked}");
        let tables = if self.compared.is_empty() {
            String::new()
        } else {
            format!(
                "\nThe spoke's own table of each job (`shardcache report`), beside the demo's:\n\n{}",
                job_table::markdown(&self.compared)
            )
        };
        println!("{tables}");
        std::fs::write(out.join("results.md"), format!("{table}\n{ratios}{small}{grouped}{linked}{tables}"))?;
        let steps: std::collections::BTreeMap<_, _> = self.series.iter().cloned().collect();
        let json = serde_json::json!({
            "config": {
                "ranks": self.shape.ranks, "batch_per_rank": self.shape.batch_per_rank,
                "steps_per_epoch": self.shape.steps, "compute_ms": self.shape.compute.as_secs_f64() * 1e3,
                "startup_ms": self.args.startup.as_secs_f64() * 1e3, "read_ahead": self.shape.read_ahead,
                "block_shards": self.args.block_shards, "shards": self.layout.shards,
                "shard_bytes": self.args.shard_size.0, "sample_bytes": SAMPLE, "rtt": self.args.rtt,
            },
            "rows": self.rows,
            "steps": steps,
            "group": self.group_rows,
            "link_compression": self.link_rows,
            "spoke_tables": self.compared,
            "small_cache": {
                "capacity_bytes": half, "plan_window_bytes": window, "streamed_bytes": streamed,
                "bound_hits_pct": bound, "rows": self.small_rows,
                "steps": self.small_series.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            },
        });
        std::fs::write(out.join("results.json"), serde_json::to_string_pretty(&json)?)?;
        let global = self.shape.ranks * self.shape.batch_per_rank;
        let plotted = report::plot(&out.join("results.png"), &self.series, global, self.shape.steps)
            .and_then(|()| {
                if self.small_series.is_empty() {
                    return Ok(());
                }
                report::plot(&out.join("small-cache.png"), &self.small_series, global, self.shape.steps)
            });
        match plotted {
            Ok(()) => println!(
                "wrote {0}/results.md, {0}/results.json, {0}/results.png, {0}/small-cache.png",
                out.display()
            ),
            Err(e) => println!("wrote {0}/results.md, {0}/results.json; no plot: {e:#}", out.display()),
        }
        Ok(())
    }
}

/// One epoch's run and its counter marks.
struct Epoch {
    run: EpochRun,
    marks: Vec<(u64, u64)>,
}

impl Epoch {
    fn row(
        &self,
        setup: &str,
        phase: &str,
        from: usize,
        to: usize,
        global: usize,
        share: Option<f64>,
    ) -> PhaseRow {
        let reads: Vec<Duration> =
            self.run.reads.iter().filter(|(s, _)| (from..to).contains(s)).map(|(_, d)| *d).collect();
        report::phase_row(setup, phase, &self.run.steps[from..to], &reads, global, share)
    }

    /// Hit share between marks `a` and `b`, in percent.
    fn cache_share(&self, a: usize, b: usize) -> Option<f64> {
        let ((h0, r0), (h1, r1)) = (*self.marks.get(a)?, *self.marks.get(b)?);
        (r1 > r0).then(|| (h1 - h0) as f64 * 100.0 / (r1 - r0) as f64)
    }
}
