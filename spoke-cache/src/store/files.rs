//! Which chunks are present, read from the pages column family's live files.
//!
//! Every chunk is written as one SST file holding exactly its pages (`ingest.rs`), and a
//! file is live only once its ingestion committed, so at startup the live files say which
//! chunks are whole: a file whose keys are the pages of one chunk of a recorded shard,
//! or of consecutive chunks (a merged shard, `Store::merge_shard`), one entry per page
//! and no deletions. Anything else (a file of a shard with no record, a file cut at other
//! boundaries) is not accounted for by any record and is removed.

use std::collections::HashMap;

use rocksdb::LiveFile;

use super::layout::{CF_PAGES, ShardRecord};

/// What one live file holds, as far as its key range and counts say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FileUse {
    /// Chunks `first..first + count` of shard `id`, whole.
    Chunks { id: u64, first: u64, count: u64 },
    /// Not a chunk of any record: to be removed. Keys `[start, end]`, inclusive.
    Stray { start: Vec<u8>, end: Vec<u8> },
}

/// The page a 16-byte page key names.
fn parse_key(key: &[u8]) -> Option<(u64, u64)> {
    let key: &[u8; 16] = key.try_into().ok()?;
    let (id, page) = key.split_at(8);
    Some((u64::from_be_bytes(id.try_into().ok()?), u64::from_be_bytes(page.try_into().ok()?)))
}

/// Classifies the pages column family's files against the shard records (by id).
pub(super) fn classify(
    files: &[LiveFile],
    records: &HashMap<u64, ShardRecord>,
    page_size: u64,
) -> Vec<FileUse> {
    files
        .iter()
        .filter(|f| f.column_family_name == CF_PAGES)
        .map(|file| {
            chunk_of(file, records, page_size).unwrap_or_else(|| FileUse::Stray {
                start: file.start_key.clone().unwrap_or_default(),
                end: file.end_key.clone().unwrap_or_default(),
            })
        })
        .collect()
}

fn chunk_of(file: &LiveFile, records: &HashMap<u64, ShardRecord>, page_size: u64) -> Option<FileUse> {
    let (id, first) = parse_key(file.start_key.as_deref()?)?;
    let (end_id, last) = parse_key(file.end_key.as_deref()?)?;
    let record = records.get(&id)?;
    let chunk_size = u64::from(record.chunk_size);
    if end_id != id || file.num_deletions != 0 || chunk_size == 0 || !chunk_size.is_multiple_of(page_size) {
        return None;
    }
    let index = first * page_size / chunk_size;
    let chunk_start = index * chunk_size;
    // The chunk holding the file's last page, and the pages from the first chunk's start
    // to that chunk's end: all of them, if the file is whole chunks.
    let last_index = last * page_size / chunk_size;
    let chunk_len = record.chunk_len(super::layout::ChunkIndex(last_index));
    let pages = (last_index * chunk_size + chunk_len).div_ceil(page_size).saturating_sub(first);
    // An entry count of 0 means "not loaded" (RocksDB reads a file's properties at open
    // only for the files it opens then, see `--max-open-files`), never an empty file (an
    // SST file cannot be empty): judged by its key range alone then. A file short of a
    // page in the middle would then be taken for whole; its read finds the page missing
    // and the chunk is fetched again, so no wrong byte is served.
    let whole = chunk_len > 0
        && first * page_size == chunk_start
        && last == first + pages - 1
        && (file.num_entries == pages || file.num_entries == 0);
    whole.then_some(FileUse::Chunks { id, first: index, count: last_index - index + 1 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::page_key;

    fn file(start: [u8; 16], end: [u8; 16], entries: u64) -> LiveFile {
        LiveFile {
            column_family_name: CF_PAGES.into(),
            name: "/000123.sst".into(),
            size: 1,
            level: 6,
            start_key: Some(start.to_vec()),
            end_key: Some(end.to_vec()),
            num_entries: entries,
            num_deletions: 0,
        }
    }

    #[test]
    fn whole_chunks_of_recorded_shards_count_and_nothing_else_does() {
        let page = 64 << 10;
        // Shard 5: 2.5 chunks of 256 KiB (4 pages each), so the last chunk has 2 pages.
        let record = ShardRecord { id: 5, size: 640 << 10, chunk_size: 256 << 10, ..Default::default() };
        let records = HashMap::from([(5, record)]);
        let files = [
            file(page_key(5, 0), page_key(5, 3), 4),  // chunk 0
            file(page_key(5, 8), page_key(5, 9), 2),  // chunk 2, short
            file(page_key(5, 4), page_key(5, 7), 3),  // a page missing (counts loaded)
            file(page_key(5, 2), page_key(5, 5), 4),  // not on chunk boundaries
            file(page_key(6, 0), page_key(6, 3), 4),  // no record
            file(page_key(5, 0), page_key(6, 3), 8),  // two shards
            file(page_key(5, 4), page_key(5, 11), 8), // past the end of the shard
        ];
        let uses = classify(&files, &records, page);
        assert_eq!(uses[0], FileUse::Chunks { id: 5, first: 0, count: 1 });
        assert_eq!(uses[1], FileUse::Chunks { id: 5, first: 2, count: 1 });
        for (i, used) in uses.iter().enumerate().skip(2) {
            assert!(matches!(used, FileUse::Stray { .. }), "file {i}: {used:?}");
        }
        // Entry counts not loaded (0): the key range decides.
        assert_eq!(
            classify(&[file(page_key(5, 4), page_key(5, 7), 0)], &records, page)[0],
            FileUse::Chunks { id: 5, first: 1, count: 1 }
        );
        // A merged shard: its three chunks in one file, whole; short of a page, not.
        assert_eq!(
            classify(&[file(page_key(5, 0), page_key(5, 9), 10)], &records, page)[0],
            FileUse::Chunks { id: 5, first: 0, count: 3 }
        );
        assert_eq!(
            classify(&[file(page_key(5, 4), page_key(5, 9), 6)], &records, page)[0],
            FileUse::Chunks { id: 5, first: 1, count: 2 }
        );
        assert!(matches!(
            classify(&[file(page_key(5, 0), page_key(5, 9), 9)], &records, page)[0],
            FileUse::Stray { .. }
        ));
        assert!(matches!(
            classify(&[file(page_key(5, 0), page_key(5, 6), 7)], &records, page)[0],
            FileUse::Stray { .. }
        ));
        let mut other_family = file(page_key(5, 4), page_key(5, 7), 4);
        other_family.column_family_name = "shards".into();
        assert!(classify(&[other_family], &records, page).is_empty());
    }
}
