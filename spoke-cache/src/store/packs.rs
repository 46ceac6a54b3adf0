//! Kept samples, on disk: samples of any shards written together as one *pack*, an SST
//! file of the `samples` column family ingested as a chunk's file is (`ingest.rs`),
//! written once, dropped whole when the pack is evicted.
//!
//! Why packs: a job following its plan sample by sample keeps samples of 16 KiB to a
//! few MiB from every shard at once. A file each would be millions of files (RocksDB's
//! per-file costs grow with their number: `store-scale-bench`); written through the
//! memtable they would be copied, flushed and compacted again and again. A pack of a few
//! MiB is one file, and one eviction.
//!
//! Layout: key = pack id (u64 BE) + ordinal (u32 BE); value = the sample's CRC32C (u32
//! LE) and its bytes. The pack's manifest, what each ordinal is (dataset, shard,
//! version, offset, length: named by version, not by a shard's store id, so that a shard
//! whose chunks are evicted keeps its kept samples), is its last key (ordinal
//! `u32::MAX`), in the same file: the file is the commit, as a chunk's is. At startup
//! each live file's manifest (one point read a pack) says what it holds; a file that is
//! not one whole pack is removed.

use rocksdb::{DB, LiveFile};
use shardcache_proto::checksum::{Checked, crc32c};

use super::{
    ingest::Ingester,
    layout::{PAGE_HEADER, PageFault, db_error},
};
use crate::{Error, Result};

/// The column family of packs.
pub const CF_SAMPLES: &str = "samples";

/// The manifest's ordinal: after every sample's.
const MANIFEST: u32 = u32::MAX;

/// What a pack holds at one ordinal: a range of a shard version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PackedSample {
    pub dataset: String,
    pub shard: String,
    pub version: String,
    pub offset: u64,
    pub length: u64,
}

/// A pack's manifest: its shard versions once each, and each ordinal's sample.
#[derive(Clone, PartialEq, prost::Message)]
struct Manifest {
    #[prost(message, repeated, tag = "1")]
    shards: Vec<ManifestShard>,
    #[prost(message, repeated, tag = "2")]
    samples: Vec<ManifestSample>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ManifestShard {
    #[prost(string, tag = "1")]
    dataset: String,
    #[prost(string, tag = "2")]
    shard: String,
    #[prost(string, tag = "3")]
    version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ManifestSample {
    /// Index into `shards`.
    #[prost(uint32, tag = "1")]
    shard: u32,
    #[prost(uint64, tag = "2")]
    offset: u64,
    #[prost(uint64, tag = "3")]
    length: u64,
}

impl Manifest {
    fn of<'a>(samples: impl Iterator<Item = &'a PackedSample>) -> Self {
        let mut manifest = Manifest::default();
        let mut index: std::collections::HashMap<(&str, &str, &str), u32> = Default::default();
        for sample in samples {
            let key = (sample.dataset.as_str(), sample.shard.as_str(), sample.version.as_str());
            let next = manifest.shards.len() as u32;
            let shard = *index.entry(key).or_insert_with(|| {
                manifest.shards.push(ManifestShard {
                    dataset: sample.dataset.clone(),
                    shard: sample.shard.clone(),
                    version: sample.version.clone(),
                });
                next
            });
            manifest.samples.push(ManifestSample { shard, offset: sample.offset, length: sample.length });
        }
        manifest
    }

    /// Its samples; `None` when one names a shard it does not list.
    fn samples(self) -> Option<Vec<PackedSample>> {
        self.samples
            .into_iter()
            .map(|s| {
                let shard = self.shards.get(s.shard as usize)?;
                Some(PackedSample {
                    dataset: shard.dataset.clone(),
                    shard: shard.shard.clone(),
                    version: shard.version.clone(),
                    offset: s.offset,
                    length: s.length,
                })
            })
            .collect()
    }
}

/// Key of ordinal `ordinal` of pack `pack`.
pub fn sample_key(pack: u64, ordinal: u32) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&pack.to_be_bytes());
    key[8..].copy_from_slice(&ordinal.to_be_bytes());
    key
}

fn parse_key(key: &[u8]) -> Option<(u64, u32)> {
    let key: &[u8; 12] = key.try_into().ok()?;
    let (pack, ordinal) = key.split_at(8);
    Some((u64::from_be_bytes(pack.try_into().ok()?), u32::from_be_bytes(ordinal.try_into().ok()?)))
}

/// Writes pack `pack` of `samples` (each a range of a shard version, its bytes verified
/// against their CRC32C) as one file and ingests it: all of it is in the store once this
/// returns `Ok`, and none of it before.
pub(super) fn write(
    ingester: &Ingester,
    db: &DB,
    pack: u64,
    samples: &[(PackedSample, Checked)],
) -> Result<()> {
    let path = ingester.path(pack);
    let written = (|| {
        let mut writer = ingester.writer(&path)?;
        let mut value = Vec::new();
        for (ordinal, (sample, bytes)) in samples.iter().enumerate() {
            // What is stored is what was checked: a sample whose bytes no longer match
            // the checksum they were verified with is never written.
            if sample.length != bytes.data.len() as u64 || crc32c(&bytes.data) != bytes.crc32c {
                return Err(Error::Internal(format!(
                    "a kept sample ({}/{} at {}) changed between its check and its store; pack not stored",
                    sample.dataset, sample.shard, sample.offset
                )));
            }
            value.clear();
            value.extend_from_slice(&bytes.crc32c.to_le_bytes());
            value.extend_from_slice(&bytes.data);
            let ordinal =
                u32::try_from(ordinal).map_err(|_| Error::Internal("a pack of 4 billion samples".into()))?;
            writer.put(sample_key(pack, ordinal), &value).map_err(db_error("writing a pack"))?;
        }
        let manifest = Manifest::of(samples.iter().map(|(s, _)| s));
        writer
            .put(sample_key(pack, MANIFEST), prost::Message::encode_to_vec(&manifest))
            .map_err(db_error("writing a pack"))?;
        writer.finish().map_err(db_error("finishing a pack"))
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    ingester.ingest(db, path)
}

/// `[from, from + length)` of the sample at `ordinal` of `pack` (offsets within the
/// sample), its whole stored value checked against its CRC32C; a fault when it is
/// missing, damaged or unreadable (the caller fetches it instead).
pub(super) fn read(
    db: &DB,
    pack: u64,
    ordinal: u32,
    (from, length): (u64, u64),
) -> Result<Result<Checked, PageFault>> {
    let family =
        db.cf_handle(CF_SAMPLES).ok_or_else(|| Error::Internal("no samples column family".into()))?;
    let page = u64::from(ordinal);
    let value = match db.get_pinned_cf(&family, sample_key(pack, ordinal)) {
        Ok(Some(value)) => value,
        Ok(None) => return Ok(Err(PageFault::Missing { page })),
        Err(e) if e.kind() == rocksdb::ErrorKind::Corruption => return Ok(Err(PageFault::Corrupt { page })),
        Err(e) => return Ok(Err(PageFault::Unreadable { page, error: e.into_string() })),
    };
    if value.len() < PAGE_HEADER {
        return Ok(Err(PageFault::Corrupt { page }));
    }
    let (header, data) = value.split_at(PAGE_HEADER);
    let stored = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let end = from.checked_add(length).filter(|&end| end <= data.len() as u64);
    let Some(end) = end else { return Ok(Err(PageFault::Missing { page })) };
    if crc32c(data) != stored {
        return Ok(Err(PageFault::Corrupt { page }));
    }
    Ok(Ok(Checked::new(bytes::Bytes::copy_from_slice(&data[from as usize..end as usize]))))
}

/// Drops pack `pack`'s file (its disk space with it).
pub(super) fn delete(db: &DB, pack: u64) -> Result<()> {
    let family =
        db.cf_handle(CF_SAMPLES).ok_or_else(|| Error::Internal("no samples column family".into()))?;
    let (start, end) = (sample_key(pack, 0), sample_key(pack, MANIFEST));
    // A pack is one file of exactly its keys: it goes whole. (A file that is not, a
    // damaged or foreign one, is found and removed at the next start: `load`.)
    db.delete_file_in_range_cf(&family, start, end).map_err(db_error("deleting a pack"))
}

/// Removes every key in `[start, end]` of the samples family, a file that is not ours
/// included (one RocksDB flushed itself lies in level 0, which a file-level delete
/// leaves): deleted by range, flushed and compacted away, as the pages' strays are.
fn remove_keys(db: &DB, start: &[u8], end: &[u8]) -> Result<()> {
    let family =
        db.cf_handle(CF_SAMPLES).ok_or_else(|| Error::Internal("no samples column family".into()))?;
    db.delete_file_in_range_cf(&family, start, end).map_err(db_error("deleting a stray pack"))?;
    let past_end = [end, &[0u8][..]].concat();
    db.delete_range_cf(&family, start, &past_end).map_err(db_error("deleting a stray pack"))?;
    db.flush_cf(&family).map_err(db_error("deleting a stray pack"))?;
    let mut options = rocksdb::CompactOptions::default();
    options.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
    db.compact_range_cf_opt(&family, Some(start), Some(&past_end[..]), &options);
    Ok(())
}

/// Every whole pack in the store with what it holds, for startup; a file that is not one
/// whole pack (its keys span packs, or its manifest is missing or unreadable) is removed.
pub(super) fn load(db: &DB) -> Result<Vec<(u64, Vec<PackedSample>)>> {
    let files = db.live_files().map_err(db_error("listing the cache's files"))?;
    let mut packs = Vec::new();
    for file in files.iter().filter(|f| f.column_family_name == CF_SAMPLES) {
        match whole_pack(db, file) {
            Some(pack) => packs.push(pack),
            None => {
                let (start, end) =
                    (file.start_key.clone().unwrap_or_default(), file.end_key.clone().unwrap_or_default());
                tracing::warn!(file = %file.name, "removing a samples file that is not one whole pack");
                remove_keys(db, &start, &end)?;
            }
        }
    }
    Ok(packs)
}

/// The pack `file` holds whole, with its manifest.
fn whole_pack(db: &DB, file: &LiveFile) -> Option<(u64, Vec<PackedSample>)> {
    let (pack, first) = parse_key(file.start_key.as_deref()?)?;
    let (last_pack, last) = parse_key(file.end_key.as_deref()?)?;
    if pack != last_pack || first != 0 || last != MANIFEST || file.num_deletions != 0 {
        return None;
    }
    let family = db.cf_handle(CF_SAMPLES)?;
    let manifest = db.get_pinned_cf(&family, sample_key(pack, MANIFEST)).ok()??;
    let samples = <Manifest as prost::Message>::decode(&manifest[..]).ok()?.samples()?;
    // Entry counts not loaded read 0 (see `files.rs`): then the key range decides.
    let entries = samples.len() as u64 + 1;
    (file.num_entries == 0 || file.num_entries == entries).then_some((pack, samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_by_pack_then_ordinal_with_the_manifest_last() {
        assert!(sample_key(1, 5) < sample_key(1, 6));
        assert!(sample_key(1, MANIFEST) < sample_key(2, 0));
        assert_eq!(parse_key(&sample_key(7, 9)), Some((7, 9)));
        assert_eq!(parse_key(&[0; 11]), None);
    }
}
