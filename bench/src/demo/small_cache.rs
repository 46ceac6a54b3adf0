//! The demo's small-cache setups: a spoke with room for half the dataset, three epochs
//! in a new order each, evicting least recently used, or following the job's access
//! plan (`SetPlan` at each epoch's start: this epoch and the next; and, where the spoke
//! follows it sample by sample, the epoch's samples with where each is read next:
//! `PlanSamples`). Reads name the job and epoch, so each epoch's hit ratio is the spoke's
//! own per-job row. The orders: the demo's block shuffle, a uniform shuffle (one block of
//! every shard: `StreamingShardDataset(shard_block=ALL)`), and a map-style sampler's
//! permutation (`ShardSampler`'s order, read by the demo's Rust trainer, which sends the
//! whole epoch's samples at its start: the Python sampler's rolling window runs in
//! link-bench's `sampler` rows); each also read straight from the hub with no cache, its
//! baseline, over the same link. Link bytes are the emulator's counts (every byte the hub
//! sent through it), read once the spoke has nothing in flight and the link is still
//! (`shardcache_tests::wire`), with the spoke's own count of what its hub connections
//! read checked against them.

use std::time::Duration;

use futures::FutureExt;
use shardcache_client::{CacheClient, Client, PlannedEpoch, PlannedSample, order::SamplerOrder};
use shardcache_tests::{ProxyProcess, wire};

use super::{
    Workload,
    job_table::{self, Compared, JobTiming},
    readers,
    report::phase_row,
    trainer::{EpochOrder, Sample, Step, epoch_order, run_epoch_timed},
};

/// Epochs each small-cache setup runs.
pub const EPOCHS: u64 = 3;
/// The job the reads name.
const JOB: &str = "trainer";

/// One epoch of one small-cache setup.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EpochRow {
    pub setup: String,
    pub epoch: u64,
    /// Reads served wholly from the cache (the spoke's job row; none with no cache).
    pub hit_reads_pct: Option<f64>,
    /// Bytes over the link this epoch (the emulator's count), per byte of the dataset.
    pub link_bytes_per_dataset: f64,
    /// The spoke's own count of what its hub connections read, over the wire's.
    pub spoke_count_per_wire: Option<f64>,
    /// Reads the spoke had in the job's sample plan (its job row's `planned_reads`).
    pub planned_reads_pct: Option<f64>,
    pub gpu_util_pct: f64,
    pub samples_per_s: f64,
    /// GPU utilisation of the epoch's first 10 steps.
    pub first_steps_gpu_util_pct: f64,
}

/// How a small-cache setup's epochs order the samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The demo's block shuffle (`--block-shards`).
    Blocks,
    /// Every sample of the epoch in one random order (one block of every shard).
    Uniform,
    /// A map-style sampler's order (`shardcache_client::order::SamplerOrder`).
    Sampler,
}

/// One row group of the small-cache table: its name, order, whether it reads through a
/// spoke of half the dataset's size (else straight from the hub) and sends its plan.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub name: &'static str,
    pub order: Order,
    pub cached: bool,
    pub plan: bool,
}

/// The small-cache setups, each beside its baseline with no cache.
pub const SETUPS: [Setup; 8] = [
    Setup { name: "half-size spoke, LRU", order: Order::Blocks, cached: true, plan: false },
    Setup { name: "half-size spoke, plan", order: Order::Blocks, cached: true, plan: true },
    Setup { name: "block shuffle, no cache", order: Order::Blocks, cached: false, plan: false },
    Setup { name: "uniform shuffle, half-size spoke, plan", order: Order::Uniform, cached: true, plan: true },
    Setup { name: "uniform shuffle, no cache", order: Order::Uniform, cached: false, plan: false },
    Setup {
        name: "map-style, the sampler's order with its plan (Rust reader), half-size spoke",
        order: Order::Sampler,
        cached: true,
        plan: true,
    },
    Setup {
        name: "map-style, the sampler's order without a plan, half-size spoke",
        order: Order::Sampler,
        cached: true,
        plan: false,
    },
    Setup { name: "map-style, no cache", order: Order::Sampler, cached: false, plan: false },
];

/// The small-cache setups' rows, steps, and the spoke's tables beside them.
pub type SmallCacheRun = (Vec<EpochRow>, Vec<(String, Vec<Step>)>, Vec<Compared>);

/// Runs every setup of [`SETUPS`] against the hub behind `link`, each through a fresh
/// spoke of `capacity` bytes with `--plan-window plan_window` where it has one, and
/// prints its rows; every setup's rows and steps.
pub async fn run_setups(
    link: &ProxyProcess,
    work: &std::path::Path,
    (capacity, plan_window): (u64, &str),
    job: Workload<'_>,
) -> anyhow::Result<SmallCacheRun> {
    let (mut rows, mut series, mut compared) = (Vec::new(), Vec::new(), Vec::new());
    for setup in SETUPS {
        println!("\n== {}", setup.name);
        let cache = tempfile::tempdir_in(work)?;
        let capacity = format!("{capacity}B");
        let spoke = setup.cached.then(|| {
            let args = ["--capacity", capacity.as_str(), "--plan-window", plan_window];
            shardcache_tests::SpokeProcess::start(&link.endpoint, cache.path(), &args)
        });
        let server = spoke.as_ref().map_or(link.endpoint.as_str(), |s| s.endpoint.as_str());
        let small = SmallCache { spoke: server, link, job, order: setup.order, cached: setup.cached };
        let (epochs, steps, tables) = small.run(setup.name, setup.plan).await?;
        for r in &epochs {
            println!("{}", markdown_row(r));
        }
        if !tables.is_empty() {
            print!("   the spoke's own table of the job:\n{}", job_table::markdown(&tables));
        }
        compared.extend(tables);
        rows.extend(epochs);
        series.push((setup.name.to_owned(), steps));
    }
    Ok((rows, series, compared))
}

/// A small-cache setup: the server to read through (a spoke, or the hub: `cached` false),
/// the link to the hub, the job and its order.
#[derive(Debug, Clone)]
pub struct SmallCache<'a> {
    pub spoke: &'a str,
    pub link: &'a ProxyProcess,
    pub job: Workload<'a>,
    pub order: Order,
    pub cached: bool,
}

impl SmallCache<'_> {
    fn order(&self, epoch: u64) -> EpochOrder {
        let layout = self.job.layout;
        // Seeds 11, 12, ...: other orders than the seed setups' epochs.
        match self.order {
            Order::Blocks => epoch_order(layout, self.job.block_shards, 11 + epoch),
            Order::Uniform => epoch_order(layout, layout.shards, 11 + epoch),
            Order::Sampler => {
                let n = u64::from(layout.shards) * layout.samples_per_shard;
                let sampler = SamplerOrder { n, seed: 11, shuffle: true, ranks: 1, drop_last: false };
                let samples: Vec<Sample> = sampler
                    .rank_samples(epoch, 0, (0, 0), n)
                    .into_iter()
                    .map(|i| Sample {
                        shard: (i / layout.samples_per_shard) as u32,
                        offset: i % layout.samples_per_shard * layout.sample_bytes,
                    })
                    .collect();
                let mut shard_order: Vec<u32> = Vec::new();
                for s in &samples {
                    if !shard_order.contains(&s.shard) {
                        shard_order.push(s.shard);
                    }
                }
                EpochOrder { samples, shard_order }
            }
        }
    }

    /// Sends the spoke epoch `epoch`'s samples (positions counted across epochs), each
    /// with the position of its read in the next epoch, as the SDK does for a plan the
    /// spoke follows sample by sample (here all of an epoch at its start, in calls of
    /// 8192: the spoke fetches the nearest first whatever it holds).
    async fn plan_samples(&self, control: &CacheClient, epoch: u64) -> anyhow::Result<()> {
        let (this, next) = (self.order(epoch), self.order(epoch + 1));
        let n = this.samples.len() as u64;
        let at: std::collections::HashMap<(u32, u64), u64> =
            next.samples.iter().enumerate().map(|(i, s)| ((s.shard, s.offset), i as u64)).collect();
        let reads: Vec<PlannedSample> = this
            .samples
            .iter()
            .enumerate()
            .map(|(i, s)| PlannedSample {
                position: epoch * n + i as u64,
                shard: self.job.names[s.shard as usize].clone(),
                offset: s.offset,
                length: self.job.sample_bytes,
                next_use: at.get(&(s.shard, s.offset)).map(|p| (epoch + 1) * n + p),
            })
            .collect();
        for window in reads.chunks(8192) {
            control.plan_samples(&format!("{JOB}/all-ranks"), self.job.dataset, n, window).await?;
        }
        Ok(())
    }

    fn plan(&self, epoch: u64) -> PlannedEpoch {
        let order = self.order(epoch);
        PlannedEpoch::from_reads(order.samples.iter().map(|s| self.job.names[s.shard as usize].as_str()))
    }

    /// One plan for the job: every rank reads its slice of each step, in step order, so
    /// the job as a whole reads the epoch order.
    async fn send_plan(&self, control: &CacheClient, epoch: u64) -> anyhow::Result<()> {
        let epochs = [self.plan(epoch), self.plan(epoch + 1)];
        let answer = control.plan(&format!("{JOB}/all-ranks"), epoch, self.job.dataset, &epochs).await?;
        if answer.samples {
            self.plan_samples(control, epoch).await?;
        }
        Ok(())
    }

    /// The spoke's table of the job once it has all `steps`, beside the demo's `rows`.
    async fn spokes_table(
        setup: &str,
        timing: JobTiming,
        rows: &[EpochRow],
        steps: usize,
    ) -> anyhow::Result<Vec<Compared>> {
        let table = timing.table(steps as u64).await?;
        let demo: Vec<_> = rows.iter().map(|r| (r.epoch, r.gpu_util_pct, r.samples_per_s)).collect();
        Ok(job_table::compare_epochs(setup, &demo, &table))
    }

    /// Runs [`EPOCHS`] epochs (the first with no head start: the job's first step comes
    /// as soon as its first batches do); returns each epoch's row and every step.
    pub async fn run(
        &self,
        setup: &str,
        with_plan: bool,
    ) -> anyhow::Result<(Vec<EpochRow>, Vec<Step>, Vec<Compared>)> {
        let control = match self.cached {
            true => Some(CacheClient::connect(self.spoke).await?),
            false => None,
        };
        // Through a spoke, the ranks report their steps: its table is printed beside.
        let mut timing = control.as_ref().map(|c| JobTiming::new(c.clone(), JOB, self.job.shape.ranks));
        let mut timers = timing.as_mut().map_or(Vec::new(), |t| std::mem::take(&mut t.timers));
        let dataset_bytes =
            u64::from(self.job.layout.shards) * self.job.layout.samples_per_shard * self.job.sample_bytes;
        let global = self.job.shape.ranks * self.job.shape.batch_per_rank;
        let (mut rows, mut all) = (Vec::new(), Vec::new());
        let mut before = self.settled(control.as_ref()).await;
        for epoch in 0..EPOCHS {
            if let (true, Some(control)) = (with_plan, &control) {
                self.send_plan(control, epoch).await?;
            }
            let client = Client::connect(self.spoke).await?.for_job(JOB, epoch)?;
            let read = readers::grpc(client, self.job.dataset, self.job.names.clone(), self.job.sample_bytes);
            let order = self.order(epoch);
            timers.iter_mut().for_each(|t| t.start_epoch(epoch));
            let run = run_epoch_timed(
                &order,
                self.job.shape,
                read,
                Duration::ZERO,
                |_| async {}.boxed(),
                &mut timers,
            )
            .await?;
            // Fetches of this epoch's samples and shards may still be running (a
            // whole-shard fetch after the last read): their bytes are this epoch's.
            let after = self.settled(control.as_ref()).await;
            let wire = after.0.since(before.0).to_client;
            let reads: Vec<Duration> = run.reads.iter().map(|(_, d)| *d).collect();
            let whole = phase_row(setup, "", &run.steps, &reads, global, None);
            let first = phase_row(setup, "", &run.steps[..10.min(run.steps.len())], &[], global, None);
            let mut row = EpochRow {
                setup: setup.to_owned(),
                epoch: epoch + 1,
                hit_reads_pct: None,
                link_bytes_per_dataset: wire as f64 / dataset_bytes as f64,
                spoke_count_per_wire: None,
                planned_reads_pct: None,
                gpu_util_pct: whole.gpu_util_pct,
                samples_per_s: whole.samples_per_s,
                first_steps_gpu_util_pct: first.gpu_util_pct,
            };
            if let Some(control) = &control {
                let reads = (run.steps.len() * global) as u64;
                Self::spokes_counts(control, (epoch, reads), (wire, after.1 - before.1), &mut row).await?;
            }
            rows.push(row);
            all.extend(run.steps);
            before = after;
        }
        let compared = match timing {
            Some(mut timing) => {
                timing.timers = timers;
                Self::spokes_table(setup, timing, &rows, all.len()).await?
            }
            None => Vec::new(),
        };
        Ok((rows, all, compared))
    }
}

impl SmallCache<'_> {
    /// Fills `row` of epoch `epoch` (of `reads` reads) with the spoke's own counts: its
    /// hits and planned reads (its job row, which must have counted every read), and its
    /// count of what its hub connections read (`received`) beside the wire's `wire`,
    /// which must agree.
    async fn spokes_counts(
        control: &CacheClient,
        (epoch, reads): (u64, u64),
        (wire, received): (u64, u64),
        row: &mut EpochRow,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            wire::agrees(received, wire),
            "{} epoch {}: the spoke's hub connections read {received} bytes, the wire carried {wire}",
            row.setup,
            epoch + 1
        );
        let status = control.status().await?;
        let job = status
            .jobs
            .iter()
            .find(|j| j.job == JOB && j.epoch == epoch)
            .ok_or_else(|| anyhow::anyhow!("the spoke has no row for {JOB} epoch {epoch}"))?;
        anyhow::ensure!(
            job.reads == reads,
            "the spoke counted {} reads for epoch {epoch}, the trainer made {reads}",
            job.reads
        );
        let share = |part: u64| Some(part as f64 * 100.0 / job.reads.max(1) as f64);
        row.hit_reads_pct = share(job.hit_reads);
        row.planned_reads_pct = share(job.planned_reads);
        // Nothing crossed (a warm epoch): nothing to compare.
        row.spoke_count_per_wire = (wire > 0).then(|| received as f64 / wire as f64);
        Ok(())
    }

    /// The link's count once it is still, with the spoke's count of what its hub
    /// connections read (0 with no cache).
    async fn settled(&self, control: Option<&CacheClient>) -> (wire::LinkCount, u64) {
        match control {
            Some(control) => wire::settled_spoke(self.link, control).await,
            None => (wire::settled_link(self.link).await, 0),
        }
    }
}

/// One row of the small-cache table, without the line end.
pub fn markdown_row(r: &EpochRow) -> String {
    let pct = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}%"));
    format!(
        "| {} | {} | {} | {:.3} | {} | {} | {:.1}% ({:.1}%) | {:.0} |",
        r.setup,
        r.epoch,
        pct(r.hit_reads_pct),
        r.link_bytes_per_dataset,
        r.spoke_count_per_wire.map_or("-".to_owned(), |c| format!("{c:.4}")),
        pct(r.planned_reads_pct),
        r.gpu_util_pct,
        r.first_steps_gpu_util_pct,
        r.samples_per_s
    )
}

/// The small-cache table: per setup and epoch, with the bound no policy beats after
/// the first epoch.
pub fn markdown(rows: &[EpochRow], bound_hits_pct: f64) -> String {
    let mut out = String::from(
        "| setup | epoch | reads from cache | link bytes / dataset (wire) | spoke's count / wire | reads planned | GPU util (first 10 steps) | samples/s |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out += &markdown_row(r);
        out.push('\n');
    }
    out += &format!(
        "\nBound after epoch 1 (room for half the dataset, less the block being read and the plan window \
         ahead of it): {bound_hits_pct:.1}% of reads from cache, {:.2} x the dataset over the link.\n",
        1.0 - bound_hits_pct / 100.0
    );
    out
}
