//! The cold open: the entry of a shard for a call that will read some of it. When the
//! cache has never seen the shard, what the reads cover is read upstream alongside its
//! `StatShard` rather than after it, so a cold read costs one round trip to the hub,
//! not two (`fetch/speculation.rs` keeps those reads until the request ends). Asked by
//! the cache's facade; it asks the lookups, the fetch owner and the admission's
//! decision (`read_ahead.rs`), never back.

use std::sync::Arc;

use shardcache_proto::names::{DatasetName, ShardName};

use crate::{
    Result,
    fetch::lookup::Lookups,
    fetch::suppliers::Chain,
    fetch::{Alongside, FetchOwner},
    observe::job_counters::JobRow,
    read::ahead::ReadAhead,
    read::index_reads::IndexReads,
    read::path::ReadFor,
    store::catalog::Catalog,
    store::entry::{ChunkIndex, Entry},
};

/// The cold open, with the parts it uses.
#[derive(Debug)]
pub struct ColdOpen {
    pub catalog: Arc<Catalog>,
    pub lookups: Arc<Lookups>,
    pub fetch: FetchOwner,
    /// Which shards this spoke fetches itself (in a group, those it owns).
    pub chain: Arc<Chain>,
    /// Where index reads fetched alongside a stat are kept.
    pub index_reads: Arc<IndexReads>,
    /// Whether a miss is stored: only chunks the admission would store are fetched whole.
    pub read_ahead: Arc<ReadAhead>,
    pub chunk_size: u64,
}

impl ColdOpen {
    /// [`Lookups::entry`] for a call that will read `reads` (`(offset, length)` pairs) of
    /// the shard, for `reader`. When the cache has never seen the shard, what those reads
    /// cover (the chunks they cover entirely, and their parts of the others) is read
    /// upstream alongside its `StatShard` rather than after it, in one batch, and taken up
    /// when it was read at the version the stat returns: a cold read costs one round trip
    /// to the hub, not two, as it does with no cache (a job's first batch came a round trip
    /// later through a cold spoke, issue 58). Nothing past what the reads name is asked
    /// for, and nothing when the in-flight byte bound has no room for it. The reads are
    /// kept until the request ends ([`Alongside`], in `ReadFor`): a chunk the admission
    /// stores takes its read up at once, a part fetched as read (its own, or one lent to
    /// its chunk's fill) takes its own.
    pub async fn entry_for(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
        reads: &[(u64, u64)],
        reader: &ReadFor,
    ) -> Result<(Arc<Entry>, Option<Arc<Alongside>>)> {
        let key = (dataset.to_string(), shard.to_string());
        // The warm path: one look at the catalog (not again in `entry`).
        if let Some(entry) = self.catalog.fresh(&key) {
            self.start_whole_chunks(&entry, reads, reader);
            return Ok((entry, None));
        }
        if self.catalog.get(&key).is_some() {
            let entry = self.lookups.entry(dataset, shard).await?;
            self.start_whole_chunks(&entry, reads, reader);
            return Ok((entry, None));
        }
        if reader.index_read {
            return Ok((self.entry_for_index(dataset, shard, reads, &reader.row).await?, None));
        }
        let chunk_size = self.chunk_size;
        // Each read cut at chunk boundaries, as the read path cuts it: whole chunks (a
        // chunk fetch takes them up) and the parts of the others (a part fetched as read
        // takes them up, its own or one lent to a fill).
        let mut chunks: Vec<ChunkIndex> = Vec::new();
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for (from, to) in reads.iter().flat_map(|&(offset, length)| cut(offset, length, chunk_size)) {
            match (from % chunk_size, to - from) {
                (0, length) if length == chunk_size => chunks.push(ChunkIndex(from / chunk_size)),
                (_, length) => ranges.push((from, length)),
            }
        }
        chunks.sort_unstable();
        chunks.dedup();
        // Ranges only for a batch of several (a trainer's samples, distinct): a lone range
        // of a chunk is as likely one of many ranks reading the same header or index at
        // once, whose overlapping ranges, each read alongside, crossed the link more than
        // once under load (`concurrent_first_reads_ending_on_one_chunk_fetch_it_once`).
        if reads.len() < 2 {
            ranges.clear();
        }
        ranges.retain(|&(from, _)| chunks.binary_search(&ChunkIndex(from / chunk_size)).is_err());
        ranges.sort_unstable();
        ranges.dedup();
        // A shard another member owns is read from it (by the fetch owner), not the hub.
        if (chunks.is_empty() && ranges.is_empty()) || !self.chain.owns(dataset.as_str(), shard.as_str()) {
            return Ok((self.lookups.entry(dataset, shard).await?, None));
        }
        let mut parts: Vec<(u64, u64)> = chunks.iter().map(|&i| (i.start(chunk_size), chunk_size)).collect();
        parts.extend(&ranges);
        self.fetch.speculate((dataset.as_str(), shard.as_str()), &parts, &reader.row);
        // Forgotten however this call ends, or when the request does.
        let alongside = Arc::new(self.fetch.alongside(dataset.as_str(), shard.as_str(), parts));
        let entry = self.lookups.entry(dataset, shard).await?;
        for &index in &chunks {
            // Past the end (a stream's head over a shorter shard, or an invalid read):
            // nothing to take up. The last chunk, shorter, takes up its read cut at the end.
            if index.start(chunk_size) < entry.size
                && self.read_ahead.stores(&entry, index, &reader.principal)
            {
                drop(self.fetch.chunk(&entry, index, reader.fetch()));
            }
        }
        Ok((entry, Some(alongside)))
    }

    /// Starts fetching whole the chunks of `entry` that `reads` cover entirely (a stream's
    /// head, a read of whole chunks) and the store lacks, where the admission stores them:
    /// the reads then wait one round trip for them. Left to the read path, a stream's
    /// first message would fill its chunk beside it, and the rest of the chunk cross only
    /// once that message had (two round trips: a GetObject through the S3 door after its
    /// HeadObject, as MosaicML Streaming asks, took 135-149 ms for a cold 4 MiB shard on a
    /// 60 ms link, BENCHMARKS.md). A read of parts of chunks (a batch's samples) starts
    /// nothing here.
    fn start_whole_chunks(&self, entry: &Arc<Entry>, reads: &[(u64, u64)], reader: &ReadFor) {
        if reader.index_read {
            return;
        }
        let chunk_size = self.chunk_size;
        for &(offset, length) in reads {
            // Up to the shard's end: the last chunk, shorter, is covered too.
            let length = length.min(entry.size.saturating_sub(offset));
            for (from, to) in cut(offset, length, chunk_size) {
                let index = ChunkIndex(from / chunk_size);
                if (from, to - from) == entry.chunk_range(index)
                    && !entry.has_chunk(index)
                    && self.fetch.running(entry, index).is_none()
                    && self.read_ahead.stores(entry, index, &reader.principal)
                {
                    drop(self.fetch.chunk(entry, index, reader.fetch()));
                }
            }
        }
    }

    /// [`ColdOpen::entry_for`] for a format's index reads of a shard never seen: the reads,
    /// cut at chunk boundaries as the read path cuts them, are read alongside the
    /// `StatShard` (not their whole chunks: `index_reads.rs`) and kept with the index
    /// reads when they were read at the version the stat returns, so a cold index read
    /// costs one round trip to the hub.
    async fn entry_for_index(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
        reads: &[(u64, u64)],
        row: &JobRow,
    ) -> Result<Arc<Entry>> {
        let parts: Vec<(u64, u64)> = reads
            .iter()
            .flat_map(|&(offset, length)| cut(offset, length, self.chunk_size))
            .map(|(from, to)| (from, to - from))
            .filter(|&(_, length)| IndexReads::keeps(length))
            .collect();
        let (ds, sh) = (dataset.as_str(), shard.as_str());
        if parts.is_empty() || !self.chain.owns(ds, sh) {
            return self.lookups.entry(dataset, shard).await;
        }
        self.fetch.speculate((ds, sh), &parts, row);
        let _forget = self.fetch.alongside(ds, sh, parts.clone());
        let entry = self.lookups.entry(dataset, shard).await?;
        for &(offset, length) in &parts {
            let Some(read) = self.fetch.speculation(ds, sh, offset, length) else { continue };
            let read = read.await.filter(|(data, version)| {
                *version == entry.version && data.data.len() as u64 == length && offset + length <= entry.size
            });
            if let Some((data, _)) = read {
                self.index_reads.put((entry.id, offset, length), data);
            }
        }
        Ok(entry)
    }
}

/// `[offset, offset + length)` cut at chunk boundaries, as the read path cuts a read:
/// `(from, to)` of each piece, none empty. Saturating: the request's ranges are checked
/// against the shard after this.
fn cut(offset: u64, length: u64, chunk_size: u64) -> impl Iterator<Item = (u64, u64)> {
    let end = offset.saturating_add(length);
    (offset / chunk_size..end.div_ceil(chunk_size))
        .map(move |i| (offset.max(i * chunk_size), end.min((i + 1).saturating_mul(chunk_size))))
        .filter(|(from, to)| from < to)
}
