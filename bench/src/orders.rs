//! The orders a data loader reads a dataset of records in, and a reader that reads an
//! epoch of one through a server as the SDK's datasets do (`order-bench`, the demo's
//! any-order rows): a uniform shuffle (every record of the epoch in one random order: the
//! SDK's `SamplerOrder`, as `ShardSampler` and `StreamingShardDataset(shard_block=ALL)`
//! read), or a block shuffle (shards permuted, the records of each block of shards
//! shuffled together: `StreamingShardDataset`'s default of 4).
//!
//! With a plan the reader sends what the SDK sends: the epoch's shards in the order of
//! their first reads with their blocks (`SetPlan`), and, when the spoke answers that it
//! follows the plan sample by sample, its next records ahead of its reads with where each
//! is read next (`PlanSamples`), a window at a time.

use std::{sync::OnceLock, time::Instant};

use futures::{StreamExt, stream};
use shardcache_client::{CacheClient, Client, PlannedEpoch, PlannedSample, Range, order::SamplerOrder};

/// A dataset of `shards` shards of `shard` bytes of `record`-byte records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub shards: u32,
    pub shard: u64,
    pub record: u64,
}

impl Layout {
    pub fn records(&self) -> u64 {
        u64::from(self.shards) * (self.shard / self.record)
    }

    pub fn bytes(&self) -> u64 {
        u64::from(self.shards) * self.shard
    }

    fn per_shard(&self) -> u64 {
        self.shard / self.record
    }

    /// Record `r` as (shard, offset).
    pub fn at(&self, record: u64) -> (u32, u64) {
        ((record / self.per_shard()) as u32, record % self.per_shard() * self.record)
    }
}

/// How an epoch orders the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// One permutation of every record.
    Uniform,
    /// Shards permuted, the records of each block of this many shards shuffled together.
    Blocks(usize),
}

/// One epoch's records in reading order, and the shards of each block in order.
#[derive(Debug, Clone)]
pub struct Epoch {
    pub records: Vec<u64>,
    /// Where each record is read next epoch: a position of the next epoch (its place
    /// exactly for a uniform shuffle; its block's first place for a block shuffle).
    pub next: Vec<u64>,
}

/// A reproducible stream of numbers (an LCG: `shardcache_tests::next_random`).
fn shuffle<T>(items: &mut [T], seed: &mut u64) {
    for i in (1..items.len()).rev() {
        items.swap(i, (shardcache_tests::next_random(seed) % (i as u64 + 1)) as usize);
    }
}

/// The shards of `epoch` in order (a block shuffle's permutation).
fn shard_order(layout: Layout, seed: u64, epoch: u64) -> Vec<u32> {
    let mut state = seed ^ (epoch + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut shards: Vec<u32> = (0..layout.shards).collect();
    shuffle(&mut shards, &mut state);
    shards
}

/// Epoch `epoch` of `layout` in `order` (with `seed`), with each record's next use.
pub fn epoch(layout: Layout, order: Order, seed: u64, epoch: u64) -> Epoch {
    let n = layout.records();
    match order {
        Order::Uniform => {
            let sampler = SamplerOrder { n, seed, shuffle: true, ranks: 1, drop_last: false };
            let records = sampler.rank_samples(epoch, 0, (0, 0), n);
            let next = records.iter().map(|&r| sampler.place_of(epoch + 1, r).unwrap_or(0)).collect();
            Epoch { records, next }
        }
        Order::Blocks(block) => {
            let per_shard = layout.per_shard();
            let mut state = seed ^ 0x5eed ^ epoch.wrapping_mul(0x2545_f491_4f6c_dd1d);
            let mut records = Vec::with_capacity(n as usize);
            for shards in shard_order(layout, seed, epoch).chunks(block) {
                let mut mine: Vec<u64> = shards
                    .iter()
                    .flat_map(|&s| (0..per_shard).map(move |k| u64::from(s) * per_shard + k))
                    .collect();
                shuffle(&mut mine, &mut state);
                records.extend(mine);
            }
            let then = shard_order(layout, seed, epoch + 1);
            let mut block_start = vec![0; layout.shards as usize];
            for (at, &s) in then.iter().enumerate() {
                block_start[s as usize] = (at / block * block) as u64 * per_shard;
            }
            let next = records.iter().map(|&r| block_start[(r / per_shard) as usize]).collect();
            Epoch { records, next }
        }
    }
}

/// How a reader tells the spoke its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Not at all (a plain `RandomSampler`, or a hub).
    None,
    /// Its shards (`SetPlan`), and its samples when the spoke asks for them.
    Plan,
}

/// A reader: batches of `batch` records, `in_flight` at once (DataLoader workers times
/// their prefetch), every byte checked against `files`.
#[derive(Debug)]
pub struct Reader<'a> {
    pub client: Client,
    pub control: Option<CacheClient>,
    pub dataset: &'a str,
    pub job: &'a str,
    pub layout: Layout,
    pub files: &'a [Vec<u8>],
    pub batch: usize,
    pub in_flight: usize,
}

/// Records a reader's sample window sends ahead of its reads at least, as the Python SDK
/// (`shardcache.plans.AHEAD_SAMPLES`).
pub const AHEAD: usize = 2048;

fn name(shard: u32) -> String {
    shardcache_cli::dataset_gen::shard_name(shard)
}

impl Reader<'_> {
    /// Reads `this` (epoch `number`, the next one `next`) with `plan`; the seconds it took
    /// and whether the spoke followed samples.
    pub async fn epoch(&self, number: u64, epochs: (&Epoch, &Epoch), plan: Plan) -> (f64, bool) {
        self.epoch_timed(number, epochs, plan, &OnceLock::new()).await
    }

    /// [`Self::epoch`], setting `first` when its first batch has come back (checked).
    pub async fn epoch_timed(
        &self,
        number: u64,
        (this, next): (&Epoch, &Epoch),
        plan: Plan,
        first: &OnceLock<Instant>,
    ) -> (f64, bool) {
        let started = Instant::now();
        let client = self.client.for_job(self.job, number).unwrap();
        // The first batch is read beside the plan, not after it: the spoke checks every
        // shard a plan names upstream, a round trip the first batch need not wait for (issue
        // 58). (The Python SDK still sends its plan first: BENCHMARKS.md, cold-start-bench.)
        let head = this.records.len().min(self.batch);
        let set = async {
            match (&self.control, plan) {
                (Some(control), Plan::Plan) => self.set_plan(control, number, (this, next)).await,
                _ => false,
            }
        };
        let (samples, ()) =
            futures::future::join(set, self.read(&client, &this.records[..head], first)).await;
        let n = self.layout.records();
        let mut sent = head;
        for (at, batches) in this.records[head..].chunks(AHEAD / 2).enumerate() {
            if let (true, Some(control)) = (samples, &self.control) {
                // Keep a window of AHEAD records sent ahead of the reads.
                let upto = (head + (at + 1) * AHEAD / 2 + AHEAD).min(this.records.len());
                if upto > sent {
                    let ahead: Vec<PlannedSample> = (sent..upto)
                        .map(|place| {
                            let (shard, offset) = self.layout.at(this.records[place]);
                            PlannedSample {
                                position: number * n + place as u64,
                                shard: name(shard),
                                offset,
                                length: self.layout.record,
                                next_use: Some((number + 1) * n + this.next[place] + 1),
                            }
                        })
                        .collect();
                    control
                        .plan_samples(&format!("{}/rank0/worker0", self.job), self.dataset, n, &ahead)
                        .await
                        .unwrap();
                    sent = upto;
                }
            }
            self.read(&client, batches, first).await;
        }
        (started.elapsed().as_secs_f64(), samples)
    }

    /// Sends the epoch's and the next one's shard plan; whether the spoke follows samples.
    async fn set_plan(&self, control: &CacheClient, number: u64, (this, next): (&Epoch, &Epoch)) -> bool {
        let plan = |epoch: &Epoch| {
            let names: Vec<String> = epoch.records.iter().map(|&r| name(self.layout.at(r).0)).collect();
            PlannedEpoch::from_reads(names.iter().map(String::as_str))
        };
        let job = format!("{}/rank0/worker0", self.job);
        control.plan(&job, number, self.dataset, &[plan(this), plan(next)]).await.unwrap().samples
    }

    async fn read(&self, client: &Client, records: &[u64], first: &OnceLock<Instant>) {
        stream::iter(records.chunks(self.batch))
            .map(|batch| {
                let ranges: Vec<Range> = batch
                    .iter()
                    .map(|&r| {
                        let (shard, offset) = self.layout.at(r);
                        Range::new(self.dataset, name(shard), offset, self.layout.record)
                    })
                    .collect();
                async move { (batch, client.read_ranges(&ranges).await.unwrap()) }
            })
            .buffer_unordered(self.in_flight)
            .for_each(|(batch, read)| {
                for (&r, got) in batch.iter().zip(read) {
                    let (shard, offset) = self.layout.at(r);
                    let want =
                        &self.files[shard as usize][offset as usize..(offset + self.layout.record) as usize];
                    assert!(got.data == want, "record {r}");
                }
                first.get_or_init(Instant::now);
                async {}
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_order_reads_every_record_once_an_epoch_and_knows_where_it_is_read_next() {
        let layout = Layout { shards: 6, shard: 4 << 10, record: 1 << 10 };
        for order in [Order::Uniform, Order::Blocks(2)] {
            let (this, then) = (epoch(layout, order, 3, 0), epoch(layout, order, 3, 1));
            let mut sorted = this.records.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..24).collect::<Vec<_>>(), "{order:?}");
            for (place, &r) in this.records.iter().enumerate() {
                let at = then.records.iter().position(|&x| x == r).unwrap() as u64;
                match order {
                    Order::Uniform => assert_eq!(this.next[place], at),
                    // A block of 2 shards is 8 records: read within it.
                    Order::Blocks(_) => assert!((this.next[place]..this.next[place] + 8).contains(&at)),
                }
            }
        }
    }
}
