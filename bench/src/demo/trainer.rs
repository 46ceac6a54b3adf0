//! The simulated trainer of the seed experiment: data-parallel ranks that each read one
//! batch of samples per step, a step that waits for every rank's batch (an all-reduce
//! does), and a fixed compute time per step standing in for the GPU.
//!
//! Each rank reads ahead like a PyTorch `DataLoader` (`num_workers * prefetch_factor`
//! batches in flight), so a read shorter than a step costs the GPU nothing; the step's
//! *data wait* is how long the slowest rank's next batch kept the step from starting.
//! GPU utilisation = compute / (compute + data wait).
//!
//! Sample order, as in MosaicML Streaming's block shuffles: the shards are permuted, and
//! the samples of each block of `block_shards` consecutive shards (in that order) are
//! shuffled together. A step's samples are therefore spread over a few shards, and the
//! order in which shards are first needed is known before the epoch starts: that list is
//! what the prefetch setup hands to the spoke.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{StreamExt, future::BoxFuture, stream};
use tokio::sync::mpsc;

use shardcache_client::StepTimer;
use shardcache_tests::next_random;

/// How the dataset is cut into shards and samples.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub shards: u32,
    pub samples_per_shard: u64,
    pub sample_bytes: u64,
}

/// One sample: shard index and byte offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub shard: u32,
    pub offset: u64,
}

/// The order of one epoch: every sample once, and the shards in order of first use.
#[derive(Debug, Clone)]
pub struct EpochOrder {
    pub samples: Vec<Sample>,
    pub shard_order: Vec<u32>,
}

fn shuffle<T>(items: &mut [T], rng: &mut u64) {
    for i in (1..items.len()).rev() {
        let j = (next_random(rng) % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// A block shuffle of `layout` for one epoch (different `seed`, different order).
pub fn epoch_order(layout: Layout, block_shards: u32, seed: u64) -> EpochOrder {
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut shard_order: Vec<u32> = (0..layout.shards).collect();
    shuffle(&mut shard_order, &mut rng);
    let mut samples = Vec::with_capacity((u64::from(layout.shards) * layout.samples_per_shard) as usize);
    for block in shard_order.chunks(block_shards.max(1) as usize) {
        let start = samples.len();
        for &shard in block {
            samples.extend(
                (0..layout.samples_per_shard).map(|i| Sample { shard, offset: i * layout.sample_bytes }),
            );
        }
        shuffle(&mut samples[start..], &mut rng);
    }
    EpochOrder { samples, shard_order }
}

/// Reads one batch; returns the bytes read. Errors end the run (a demo must not hide
/// a failed read).
pub type ReadBatch = Arc<dyn Fn(Vec<Sample>) -> BoxFuture<'static, anyhow::Result<u64>> + Send + Sync>;

/// The simulated job.
#[derive(Debug, Clone, Copy)]
pub struct JobShape {
    pub ranks: usize,
    pub batch_per_rank: usize,
    pub compute: Duration,
    /// Batches each rank reads ahead (`num_workers * prefetch_factor` in PyTorch).
    pub read_ahead: usize,
    /// Steps to run (at most the epoch's samples / global batch).
    pub steps: usize,
}

impl JobShape {
    /// Steps that run over `order`: `steps`, or fewer when the epoch runs out of samples.
    pub fn steps_over(&self, order: &EpochOrder) -> usize {
        self.steps.min(order.samples.len() / (self.ranks * self.batch_per_rank))
    }
}

/// What one step saw.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Step {
    /// Time the step waited for the slowest rank's batch.
    pub data_wait_s: f64,
    pub compute_s: f64,
    /// Slowest batch read of this step (request to last byte).
    pub read_latency_max_s: f64,
    pub bytes: u64,
}

/// One epoch's steps, plus every batch read's latency by step.
#[derive(Debug, Clone)]
pub struct EpochRun {
    pub steps: Vec<Step>,
    /// `(step, latency)` of every batch read.
    pub reads: Vec<(usize, Duration)>,
}

/// Runs `shape.steps` steps over `order`, reading with `read`. Each rank's loader starts
/// at once; the first step starts after `startup` (model loading), during which the
/// loaders (and a prefetch, if the caller started one) already work. `on_step` is
/// called after each step (to take counters at phase boundaries).
pub async fn run_epoch(
    order: &EpochOrder,
    shape: JobShape,
    read: ReadBatch,
    startup: Duration,
    on_step: impl FnMut(usize) -> BoxFuture<'static, ()>,
) -> anyhow::Result<EpochRun> {
    run_epoch_timed(order, shape, read, startup, on_step, &mut []).await
}

/// [`run_epoch`], each rank's batches also timed by its `timers[rank]` (the Rust SDK's
/// `StepTimer`, as a real trainer's loop would: it asks for every rank's batch when the
/// step starts, and has it when the rank's loader hands it over). Their epoch is the
/// caller's to start.
pub async fn run_epoch_timed(
    order: &EpochOrder,
    shape: JobShape,
    read: ReadBatch,
    startup: Duration,
    mut on_step: impl FnMut(usize) -> BoxFuture<'static, ()>,
    timers: &mut [StepTimer],
) -> anyhow::Result<EpochRun> {
    let global = shape.ranks * shape.batch_per_rank;
    let steps = shape.steps_over(order);
    let mut loaders = Vec::new();
    for rank in 0..shape.ranks {
        // Capacity 1: the read-ahead is the `buffered` window below, as in a DataLoader.
        let (tx, rx) = mpsc::channel::<anyhow::Result<(u64, Duration)>>(1);
        let batches: Vec<Vec<Sample>> = (0..steps)
            .map(|step| {
                let start = step * global + rank * shape.batch_per_rank;
                order.samples[start..start + shape.batch_per_rank].to_vec()
            })
            .collect();
        let read = read.clone();
        tokio::spawn(async move {
            // Each read in its own task (a DataLoader worker): it makes progress, and
            // consumes its response, while this loader waits for the step loop. Reads left
            // unpolled would hold their responses' HTTP/2 flow-control window on the
            // shared connection and could stall the rank the step is waiting for.
            let mut batches = stream::iter(batches)
                .map(|batch| {
                    let read = read.clone();
                    let task = tokio::spawn(async move {
                        let started = Instant::now();
                        read(batch).await.map(|bytes| (bytes, started.elapsed()))
                    });
                    async move { task.await.map_err(anyhow::Error::from).and_then(|r| r) }
                })
                .buffered(shape.read_ahead.max(1));
            while let Some(batch) = batches.next().await {
                if tx.send(batch).await.is_err() {
                    return;
                }
            }
        });
        loaders.push(rx);
    }
    tokio::time::sleep(startup).await;

    let mut run = EpochRun { steps: Vec::with_capacity(steps), reads: Vec::new() };
    for step in 0..steps {
        let waiting = Instant::now();
        timers.iter_mut().for_each(StepTimer::waiting);
        let (mut bytes, mut slowest) = (0, Duration::ZERO);
        for (rank, loader) in loaders.iter_mut().enumerate() {
            let (n, latency) =
                loader.recv().await.ok_or_else(|| anyhow::anyhow!("a loader stopped early"))??;
            if let Some(timer) = timers.get_mut(rank) {
                timer.arrived(shape.batch_per_rank as u32);
            }
            bytes += n;
            slowest = slowest.max(latency);
            run.reads.push((step, latency));
        }
        let data_wait = waiting.elapsed();
        tokio::time::sleep(shape.compute).await;
        run.steps.push(Step {
            data_wait_s: data_wait.as_secs_f64(),
            compute_s: shape.compute.as_secs_f64(),
            read_latency_max_s: slowest.as_secs_f64(),
            bytes,
        });
        on_step(step + 1).await;
    }
    // The loop asks for one more batch and finds the epoch over: the last step's work ends.
    timers.iter_mut().for_each(StepTimer::waiting);
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epoch_reads_every_sample_once_in_shard_blocks() {
        let layout = Layout { shards: 10, samples_per_shard: 8, sample_bytes: 16 };
        let order = epoch_order(layout, 3, 1);
        let mut seen: Vec<_> = order.samples.iter().map(|s| (s.shard, s.offset)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 80, "every sample exactly once");
        let mut shards = order.shard_order.clone();
        shards.sort_unstable();
        assert_eq!(shards, (0..10).collect::<Vec<_>>());
        // The first 24 samples come from the first block of 3 shards only.
        let first_block = &order.shard_order[..3];
        assert!(order.samples[..24].iter().all(|s| first_block.contains(&s.shard)));
        assert_ne!(order.samples, epoch_order(layout, 3, 2).samples, "another epoch, another order");
    }
}
