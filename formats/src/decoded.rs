//! The reads that decode what they fetch, off the runtime's threads: compressed MDS
//! shards decompressed whole, Parquet row groups decoded whole. Both take what they
//! will hold from the index's memory budget before fetching, keep the last few values
//! ([`Recent`]), and await every task they started before returning.

use std::sync::Arc;

use bytes::Bytes;
use tokio::task::JoinHandle;

use super::{Budget, Fetch, Fields, Layout, Recent, SampleIndex, budget::Held, mds, parquet};
use shardcache_client::{Error, Result};

impl SampleIndex {
    /// Parquet rows: the row groups not kept decoded read in one batch and decoded off
    /// the runtime's threads, side by side.
    pub(super) async fn read_rows<F: Fetch>(
        &self,
        client: &F,
        samples: &[(usize, u64)],
    ) -> Result<Vec<Arc<Fields>>> {
        let Layout::Rows { files, decoded } = &self.layout else { return Err(self.rows_are_values()) };
        let needed = parquet::groups_of(files, &self.dataset, samples)?;
        let mut have = decoded.find(&needed);
        let missing: Vec<(usize, usize)> =
            needed.iter().copied().filter(|key| !have.iter().any(|(k, _)| k == key)).collect();
        // What the row groups will take decoded, taken from the budget before they are
        // read: the values kept that this read does not need let go first when short.
        let mut held = Vec::with_capacity(missing.len());
        for &(s, g) in &missing {
            let what = || format!("decoding {}/{} row group {g}", self.dataset, self.shards[s]);
            held.push(take_or_shed(
                &self.budget,
                parquet::decoded_bytes(&files[s], g),
                what,
                decoded,
                &needed,
            )?);
        }
        let ranges = missing.iter().map(|&(s, g)| {
            let (offset, length) = parquet::group_at(&files[s], g);
            self.range(s, offset, length)
        });
        let data = client.fetch(ranges.collect()).await?;
        let decoding: Vec<_> = missing
            .iter()
            .zip(data)
            .zip(held)
            .map(|((&(s, g), bytes), held)| {
                let (file, name) = (files[s].clone(), format!("{}/{}", self.dataset, self.shards[s]));
                let doing = format!("{name}: decoding row group {g}");
                let task = tokio::task::spawn_blocking(move || {
                    parquet::decode_group(&name, &file, g, parquet::group_at(&file, g).0, bytes, held)
                });
                (doing, task)
            })
            .collect();
        for (key, rows) in missing.iter().zip(all_done(decoding).await?) {
            have.push((*key, Arc::new(rows)));
        }
        decoded.keep(&have);
        samples
            .iter()
            .map(|&(s, k)| {
                let (g, r) = parquet::locate(files, s, k).ok_or_else(|| self.rows_are_values())?;
                let (_, rows) =
                    have.iter().find(|(key, _)| *key == (s, g)).ok_or_else(|| self.rows_are_values())?;
                rows.rows.get(r as usize).cloned().ok_or_else(|| self.rows_are_values())
            })
            .collect()
    }

    /// Samples of compressed shards: the shards not kept decompressed fetched whole (one
    /// batch) and decompressed off the runtime's threads.
    pub(super) async fn read_packed<F: Fetch>(
        &self,
        client: &F,
        samples: &[(usize, u64)],
    ) -> Result<Vec<Bytes>> {
        let Layout::Packed { counts, sizes, raw, unpacked } = &self.layout else { return Ok(Vec::new()) };
        let mut needed: Vec<usize> = Vec::new();
        for &(shard, k) in samples {
            if counts.get(shard).is_none_or(|&c| k >= c) {
                return Err(Error::Config(format!("no sample {k} in shard {shard} of {:?}", self.dataset)));
            }
            if !needed.contains(&shard) {
                needed.push(shard);
            }
        }
        let mut have: std::collections::HashMap<usize, Arc<mds::Unpacked>> =
            unpacked.find(&needed).into_iter().collect();
        let missing: Vec<usize> = needed.iter().copied().filter(|s| !have.contains_key(s)).collect();
        // What they decompress to, taken from the budget before they are read (the kept
        // shards this read does not need let go first when short): a decompression stops
        // at what index.json said, which the budget has room for.
        let mut held = Vec::with_capacity(missing.len());
        for &s in &missing {
            let what = || format!("decompressing {}/{}", self.dataset, self.shards[s]);
            held.push(take_or_shed(&self.budget, raw[s].bytes, what, unpacked, &needed)?);
        }
        let files = missing.iter().map(|&s| self.range(s, 0, sizes[s]));
        let files = client.fetch(files.collect()).await?;
        // Every missing shard decompressed at once, side by side, then taken in turn.
        let unpacking: Vec<_> = missing
            .iter()
            .zip(files)
            .zip(held)
            .map(|((&shard, zipped), held)| {
                let (dataset, file, raw) =
                    (self.dataset.clone(), self.shards[shard].clone(), raw[shard].clone());
                let doing = format!("{}/{}: decompressing", self.dataset, self.shards[shard]);
                let unpack = move || mds::unpack(&dataset, &file, &raw, &zipped, held);
                (doing, tokio::task::spawn_blocking(unpack))
            })
            .collect();
        for (&shard, shard_data) in missing.iter().zip(all_done(unpacking).await?) {
            have.insert(shard, Arc::new(shard_data));
        }
        unpacked.keep(&needed.iter().map(|s| (*s, have[s].clone())).collect::<Vec<_>>());
        Ok(samples
            .iter()
            .map(|&(shard, k)| {
                let unpacked = &have[&shard];
                // Checked when unpacked: sorted, within the data, one more than the count.
                let (start, end) = (unpacked.bounds[k as usize], unpacked.bounds[k as usize + 1]);
                unpacked.data.slice(start as usize..end as usize)
            })
            .collect())
    }
}

/// `bytes` taken from `budget` for `what`; when short, the values `kept` that this read
/// does not need (`needed`) are let go first, then the budget is asked again.
fn take_or_shed<K: PartialEq + Copy, V>(
    budget: &Budget,
    bytes: u64,
    what: impl Fn() -> String,
    kept: &Recent<K, V>,
    needed: &[K],
) -> Result<Held> {
    budget.take(bytes, &what).or_else(|_| {
        kept.shed(needed);
        budget.take(bytes, &what)
    })
}

/// Each task's value, in order, once every task has finished; the first error (a task's,
/// or its panic: a bug, reported as an error, never a crash of the trainer) otherwise.
/// None goes on decoding, or holding its budget, after the read that started it failed.
async fn all_done<T>(tasks: Vec<(String, JoinHandle<Result<T>>)>) -> Result<Vec<T>> {
    let (mut done, mut failed) = (Vec::with_capacity(tasks.len()), None);
    for (doing, task) in tasks {
        match task.await {
            Ok(Ok(value)) => done.push(value),
            Ok(Err(e)) => failed = failed.or(Some(e)),
            Err(e) => {
                let e = Error::Config(format!(
                    "{doing} failed inside shardcache (a bug; please report it with the file): {e}"
                ));
                failed = failed.or(Some(e));
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(done),
    }
}
