//! The demo's group setups: two trainer nodes (the 16 ranks' batches alternate between
//! them) across the 60 ms link, either with a spoke each (today: each fetches the whole
//! dataset) or through a group of three spokes (`--peers`: each shard fetched once, by
//! its owner). Two epochs; per epoch the bytes the spokes fetched from the hub, the
//! epoch's wall time and GPU utilisation.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use futures::FutureExt;
use shardcache_client::Client;
use shardcache_tests::{SpokeProcess, free_loopback_addr, scrape_metrics};

use super::{
    Workload, metric_sum, readers,
    report::phase_row,
    trainer::{ReadBatch, epoch_order, run_epoch},
};

/// One epoch of one group setup.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupRow {
    pub setup: String,
    pub epoch: u64,
    /// Bytes the spokes fetched from the hub (over the link), per byte of the dataset.
    pub link_bytes_per_dataset: f64,
    pub wall_s: f64,
    pub gpu_util_pct: f64,
    pub samples_per_s: f64,
}

/// What the setups share: the hub across the link (the WAN emulator's address), where
/// the spokes keep their caches, and the job.
#[derive(Debug)]
pub struct Groups<'a> {
    pub hub: &'a str,
    pub work: &'a std::path::Path,
    pub job: Workload<'a>,
}

impl Groups<'_> {
    /// `nodes` clients (one per trainer node) and the spokes behind them: a spoke per
    /// node, or one group of `members` every node reads through.
    fn start(&self, grouped: bool, members: usize) -> anyhow::Result<(Vec<String>, Vec<SpokeProcess>)> {
        let addrs: Vec<String> = (0..members).map(|_| free_loopback_addr()).collect();
        let urls: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
        let peers = urls.join(",");
        let mut spokes = Vec::new();
        for (addr, url) in addrs.iter().zip(&urls) {
            let dir = tempfile::tempdir_in(self.work)?.keep();
            let extra: Vec<&str> =
                if grouped { vec!["--peers", &peers, "--peer-self", url] } else { Vec::new() };
            spokes.push(SpokeProcess::start_at(self.hub, &dir, addr, &extra));
        }
        let endpoints = if grouped { vec![peers.clone(), peers] } else { urls };
        Ok((endpoints, spokes))
    }

    /// Runs two epochs; returns each epoch's row.
    pub async fn run(&self, setup: &str, grouped: bool) -> anyhow::Result<Vec<GroupRow>> {
        let members = if grouped { 3 } else { 2 };
        let (endpoints, spokes) = self.start(grouped, members)?;
        let mut nodes = Vec::new();
        for endpoint in &endpoints {
            let client = Client::connect(endpoint).await?;
            nodes.push(readers::grpc(
                client,
                self.job.dataset,
                self.job.names.clone(),
                self.job.sample_bytes,
            ));
        }
        // The ranks' batches alternate between the two nodes.
        let turn = Arc::new(AtomicUsize::new(0));
        let read: ReadBatch = Arc::new(move |batch| {
            let node = &nodes[turn.fetch_add(1, Relaxed) % nodes.len()];
            node(batch)
        });
        let dataset_bytes =
            u64::from(self.job.layout.shards) * self.job.layout.samples_per_shard * self.job.sample_bytes;
        let global = self.job.shape.ranks * self.job.shape.batch_per_rank;
        let mut rows = Vec::new();
        let mut fetched_before = 0.0;
        for epoch in 0..2 {
            let order = epoch_order(self.job.layout, self.job.block_shards, 21 + epoch);
            let started = Instant::now();
            let run =
                run_epoch(&order, self.job.shape, read.clone(), Duration::ZERO, |_| async {}.boxed()).await?;
            let wall = started.elapsed().as_secs_f64();
            let fetched = settled_fetched(&spokes).await?;
            let row = phase_row(setup, "", &run.steps, &[], global, None);
            rows.push(GroupRow {
                setup: setup.to_owned(),
                epoch: epoch + 1,
                link_bytes_per_dataset: (fetched - fetched_before) / dataset_bytes as f64,
                wall_s: wall,
                gpu_util_pct: row.gpu_util_pct,
                samples_per_s: row.samples_per_s,
            });
            fetched_before = fetched;
        }
        Ok(rows)
    }
}

/// Bytes the spokes fetched from the hub, once that stops growing (whole-shard fetches
/// may still run after the last read): unchanged over 200 ms, at most 10 s.
async fn settled_fetched(spokes: &[SpokeProcess]) -> anyhow::Result<f64> {
    let fetched = || async {
        let mut sum = 0.0;
        for spoke in spokes {
            let page = scrape_metrics(spoke.metrics_addr.as_str()).await?;
            sum += metric_sum(&page, "shardcache_spoke_upstream_bytes_total");
        }
        anyhow::Ok(sum)
    };
    let mut last = fetched().await?;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = fetched().await?;
        if now == last {
            break;
        }
        last = now;
    }
    Ok(last)
}

/// The group table.
pub fn markdown(rows: &[GroupRow]) -> String {
    let mut out = String::from(
        "| setup | epoch | link bytes / dataset | epoch wall time | GPU util | samples/s |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out += &format!(
            "| {} | {} | {:.2} | {:.1} s | {:.1}% | {:.0} |\n",
            r.setup, r.epoch, r.link_bytes_per_dataset, r.wall_s, r.gpu_util_pct, r.samples_per_s
        );
    }
    out
}
