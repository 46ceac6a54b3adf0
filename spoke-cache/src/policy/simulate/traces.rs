//! Traces of readers a cache meets, for the tests and `policy-bench`.

use super::Read;

/// A reproducible stream of numbers (xorshift64*).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

fn nth(principal: u8, shard_base: u32, i: u64, per_shard: u64, size: u64) -> Read {
    Read { principal, shard: shard_base + (i / per_shard) as u32, offset: i % per_shard * size, length: size }
}

/// `epochs` shuffled epochs over every `record`-byte record of `shards` shards of
/// `shard_size` (a map-style dataset under `DataLoader(shuffle=True)`).
pub fn shuffled_epochs(shards: u32, shard_size: u64, record: u64, epochs: u32, seed: u64) -> Vec<Read> {
    let per_shard = shard_size / record;
    let total = u64::from(shards) * per_shard;
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity((total * u64::from(epochs)) as usize);
    for _ in 0..epochs {
        let mut order: Vec<u64> = (0..total).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        out.extend(order.into_iter().map(|i| nth(0, 0, i, per_shard, record)));
    }
    out
}

/// Epoch `epoch` of `samples` 16 KiB samples (one shard) as `DistributedSampler` deals
/// them to `ranks` ranks reading in lockstep (`drop_last=False`): a permutation padded
/// with its first samples to a multiple of the ranks, read in its order.
pub fn distributed_sampler_epoch(samples: u64, ranks: u64, epoch: u64) -> Vec<Read> {
    let mut rng = Rng::new(0x5a3b_1e00 + epoch);
    let mut order: Vec<u64> = (0..samples).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let padding = samples.div_ceil(ranks) * ranks - samples;
    let padded: Vec<u64> = order.iter().chain(order.iter().take(padding as usize)).copied().collect();
    padded
        .into_iter()
        .map(|i| Read { principal: 0, shard: 0, offset: i * (16 << 10), length: 16 << 10 })
        .collect()
}

/// `epochs` epochs over every `record`-byte record of `shards` shards of `shard_size`
/// as the SDK's `StreamingShardDataset` reads them without a plan (and `plan-bench`):
/// the shards permuted per epoch, the records of each block of `block` shards
/// shuffled together.
pub fn block_shuffled_epochs(
    (shards, shard_size, record): (u32, u64, u64),
    block: usize,
    epochs: u32,
    seed: u64,
) -> Vec<Vec<Read>> {
    fn shuffle<T>(items: &mut [T], rng: &mut Rng) {
        for i in (1..items.len()).rev() {
            items.swap(i, rng.below(i as u64 + 1) as usize);
        }
    }
    let per_shard = shard_size / record;
    let mut rng = Rng::new(seed);
    (0..epochs)
        .map(|_| {
            let mut order: Vec<u32> = (0..shards).collect();
            shuffle(&mut order, &mut rng);
            let mut epoch = Vec::new();
            for block in order.chunks(block.max(1)) {
                let mut records: Vec<Read> = block
                    .iter()
                    .flat_map(|&s| (0..per_shard).map(move |i| nth(0, s, i, per_shard, record)))
                    .collect();
                shuffle(&mut records, &mut rng);
                epoch.extend(records);
            }
            epoch
        })
        .collect()
}

/// `passes` over `shards` shards read in order in `piece`-byte reads (a scan, or a
/// loop when `passes` > 1); by `principal`, shards numbered from `shard_base`.
pub fn sequential(
    principal: u8,
    shard_base: u32,
    shards: u32,
    shard_size: u64,
    piece: u64,
    passes: u32,
) -> Vec<Read> {
    let per_shard = shard_size / piece;
    let total = u64::from(shards) * per_shard;
    (0..passes)
        .flat_map(|_| (0..total).map(move |i| nth(principal, shard_base, i, per_shard, piece)))
        .collect()
}

/// `count` records drawn by Zipf's law (exponent `s`) over the records of `shards`
/// shards, the popular ones spread over the dataset.
pub fn zipf(shards: u32, shard_size: u64, record: u64, count: usize, s: f64, seed: u64) -> Vec<Read> {
    let per_shard = shard_size / record;
    let total = u64::from(shards) * per_shard;
    let weights: Vec<f64> = (1..=total).map(|rank| 1.0 / (rank as f64).powf(s)).collect();
    let sum: f64 = weights.iter().sum();
    let mut cumulative = Vec::with_capacity(weights.len());
    let mut acc = 0.0;
    for w in weights {
        acc += w / sum;
        cumulative.push(acc);
    }
    // Rank r is record (r * a large odd number) mod total: popular records are not
    // neighbours.
    let spread = |rank: u64| (rank.wrapping_mul(0x9E37_79B9) + 7) % total;
    let mut rng = Rng::new(seed);
    (0..count)
        .map(|_| {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let rank = cumulative.partition_point(|&c| c < u) as u64;
            nth(0, 0, spread(rank.min(total - 1)), per_shard, record)
        })
        .collect()
}

/// Two readers: principal 0 reads a shuffled epoch of its dataset (`working` shards
/// from 0), then principal `scanner` scans `scanned` other shards once in `piece`
/// reads, then principal 0 reads another epoch; as three phases, or, `together`, two
/// (the scan and the second epoch interleaved so that they end together).
pub fn working_set_and_scan(
    (scanner, together): (u8, bool),
    working: u32,
    scanned: u32,
    shard_size: u64,
    (record, piece): (u64, u64),
) -> Vec<Vec<Read>> {
    let epochs = shuffled_epochs(working, shard_size, record, 2, 7);
    let (first, second) = epochs.split_at(epochs.len() / 2);
    let scan = sequential(scanner, working, scanned, shard_size, piece, 1);
    if !together {
        return vec![first.to_vec(), scan, second.to_vec()];
    }
    let mut both = Vec::with_capacity(second.len() + scan.len());
    let mut scan = scan.iter().copied().enumerate().peekable();
    let total = scan.len().max(1) as f64;
    for (i, &read) in second.iter().enumerate() {
        both.push(read);
        let due = (i + 1) as f64 / second.len() as f64;
        while let Some((_, scanned)) = scan.next_if(|(j, _)| (*j as f64 / total) < due) {
            both.push(scanned);
        }
    }
    both.extend(scan.map(|(_, read)| read));
    vec![first.to_vec(), both]
}
