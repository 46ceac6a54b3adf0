//! The store against a real RocksDB in a temporary directory: presence from files,
//! strays removed at open, group-committed admissions, the legacy layout dropped.

use bytes::Bytes;

use super::{layout::ChunkIndex, *};
use shardcache_proto::checksum::crc32c;

const CHUNK: u64 = 256 << 10;

fn record(id: u64, size: u64) -> ShardRecord {
    ShardRecord { id, version: "v1".into(), size, chunk_size: CHUNK as u32, ..Default::default() }
}

/// `data` as a verified chunk.
fn checked(data: &[u8]) -> Checked {
    Checked::new(Bytes::copy_from_slice(data))
}

/// `store.read`'s bytes, checking the checksum it combined from the pages.
fn read(store: &Store, id: u64, offset: u64, len: u64) -> Result<Result<Vec<u8>, PageFault>> {
    Ok(store.read(id, offset, len)?.map(|read| {
        assert_eq!(read.crc32c, crc32c(&read.data), "the combined checksum is the bytes'");
        read.data.to_vec()
    }))
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len as u32).map(|i| (i % 251) as u8).collect()
}

#[test]
fn rocksdb_pages_options_apply_or_stop_the_start_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let tuned = StoreOptions { pages_options: "max_write_buffer_number=3".into(), ..StoreOptions::default() };
    let store = Store::open(dir.path(), &tuned).unwrap();
    let data = vec![7u8; 200_000];
    store.put_record("ds", "s", &record(1, data.len() as u64)).unwrap();
    store.admit_chunk(1, 0, &checked(&data)).unwrap();
    assert_eq!(read(&store, 1, 0, data.len() as u64).unwrap().unwrap(), data);
    drop(store);

    let bad = StoreOptions { pages_options: "no_such_option=1".into(), ..StoreOptions::default() };
    let Err(err) = Store::open(dir.path(), &bad) else { panic!("an unknown option must not be ignored") };
    let err = err.to_string();
    assert!(err.contains("--rocksdb-pages-options") && err.contains("no_such_option"), "{err}");
}

#[test]
fn chunks_are_present_exactly_when_their_file_is_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(300_000);
    {
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        store.put_record("ds", "s", &record(7, data.len() as u64)).unwrap();
        store.admit_chunk(7, 0, &checked(&data[..CHUNK as usize])).unwrap();
        assert_eq!(read(&store, 7, 1000, 70_000).unwrap().unwrap(), data[1000..71_000]);
        // The second chunk is not there yet.
        assert_eq!(read(&store, 7, 270_000, 10).unwrap(), Err(PageFault::Missing { page: 4 }));
    }
    {
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let records = store.load_records().unwrap();
        assert_eq!(records.len(), 1);
        assert!(
            records[0].2.has_chunk(ChunkIndex(0)) && !records[0].2.has_chunk(ChunkIndex(1)),
            "presence comes from the files"
        );
        store.admit_chunk(7, CHUNK, &checked(&data[CHUNK as usize..])).unwrap();
    }
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let records = store.load_records().unwrap();
    assert_eq!(records[0].2.cached_bytes(), data.len() as u64);
    assert_eq!(read(&store, 7, 0, data.len() as u64).unwrap().unwrap(), data);
    // A stored chunk is what was checked: one whose bytes do not match the checksum it
    // came with is refused, and nothing is stored.
    let mut altered = checked(&data[..CHUNK as usize]);
    altered.crc32c ^= 1;
    let refused = store.admit_chunk(8, 0, &altered).unwrap_err().to_string();
    assert!(refused.contains("changed between its check and its store"), "{refused}");
    assert_eq!(read(&store, 8, 0, 1).unwrap(), Err(PageFault::Missing { page: 0 }));
    store.delete_shard(7, Some(("ds", "s"))).unwrap();
    assert!(store.load_records().unwrap().is_empty());
    assert_eq!(read(&store, 7, 0, 1).unwrap(), Err(PageFault::Missing { page: 0 }));
    assert!(store.disk_bytes() < 64 << 10, "the chunk files left the disk");
}

#[test]
fn files_no_record_accounts_for_are_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(CHUNK as usize);
    {
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        store.put_record("ds", "kept", &record(1, CHUNK)).unwrap();
        store.admit_chunk(1, 0, &checked(&data)).unwrap();
        // A crash between a record's deletion and its files' (or a file of an id whose
        // record never reached the disk): a file no record accounts for.
        store.admit_chunk(2, 0, &checked(&data)).unwrap();
        // And a half-written chunk file in ingest/.
        std::fs::write(dir.path().join("ingest/chunk-0000000000000003-000000000000-9.sst"), b"partial")
            .unwrap();
        std::fs::write(dir.path().join("ingest/notes.txt"), b"not ours").unwrap();
    }
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let records = store.load_records().unwrap();
    assert_eq!(records.len(), 1);
    assert!(records[0].2.has_chunk(ChunkIndex(0)));
    assert_eq!(read(&store, 2, 0, 10).unwrap(), Err(PageFault::Missing { page: 0 }), "the stray is gone");
    assert_eq!(read(&store, 1, 0, CHUNK).unwrap().unwrap(), data);
    let left: Vec<_> =
        std::fs::read_dir(dir.path().join("ingest")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left, ["notes.txt"], "only our own partial file was removed");
    let files =
        store.db.live_files().unwrap().into_iter().filter(|f| f.column_family_name == CF_PAGES).count();
    assert_eq!(files, 1);
}

#[test]
fn a_chunk_deleted_after_a_bad_read_can_be_admitted_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    store.put_record("ds", "s", &record(4, 2 * CHUNK)).unwrap();
    let (old, new) = (vec![1u8; CHUNK as usize], vec![2u8; CHUNK as usize]);
    store.admit_chunk(4, 0, &checked(&old)).unwrap();
    store.admit_chunk(4, CHUNK, &checked(&old)).unwrap();
    store.delete_chunk(4, CHUNK, CHUNK).unwrap();
    assert_eq!(read(&store, 4, CHUNK, 1).unwrap(), Err(PageFault::Missing { page: 4 }));
    assert_eq!(read(&store, 4, 0, CHUNK).unwrap().unwrap(), old, "the neighbour stays");
    store.admit_chunk(4, CHUNK, &checked(&new)).unwrap();
    assert_eq!(read(&store, 4, CHUNK, CHUNK).unwrap().unwrap(), new);
    drop(store);
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    assert_eq!(store.load_records().unwrap()[0].2.cached_bytes(), 2 * CHUNK);
}

#[test]
fn concurrent_admissions_are_group_committed_and_all_land() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(Store::open(dir.path(), &StoreOptions::default()).unwrap());
    let shards = 8u64;
    for id in 1..=shards {
        store.put_record("ds", &format!("s{id}"), &record(id, 4 * CHUNK)).unwrap();
    }
    let writers: Vec<_> = (1..=shards)
        .map(|id| {
            let store = store.clone();
            std::thread::spawn(move || {
                for index in 0..4u64 {
                    store
                        .admit_chunk(
                            id,
                            index * CHUNK,
                            &checked(&vec![(id * 10 + index) as u8; CHUNK as usize]),
                        )
                        .unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    for id in 1..=shards {
        for index in 0..4u64 {
            let got = read(&store, id, index * CHUNK, CHUNK).unwrap().unwrap();
            assert!(got.iter().all(|&b| b == (id * 10 + index) as u8), "shard {id} chunk {index}");
        }
    }
    let files = store.db.live_files().unwrap();
    let pages = files.iter().filter(|f| f.column_family_name == CF_PAGES);
    assert!(
        pages.clone().all(|f| f.level == 6),
        "every chunk file sits in the bottom level, never compacted"
    );
    assert_eq!(pages.count() as u64, shards * 4);
}

#[test]
fn a_cache_of_the_memtable_layout_opens_with_its_pages_dropped_and_records_kept() {
    let dir = tempfile::tempdir().unwrap();
    {
        // The layout before ingestion: pages in a `pages` family, presence in records.
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        let db = DB::open_cf(&options, dir.path(), [CF_LEGACY_PAGES, CF_SHARDS]).unwrap();
        let mut old = record(3, CHUNK);
        old.set_chunk(ChunkIndex(0), true);
        db.put_cf(
            &db.cf_handle(CF_SHARDS).unwrap(),
            shard_key("ds", "s"),
            prost::Message::encode_to_vec(&old),
        )
        .unwrap();
        db.put_cf(&db.cf_handle(CF_LEGACY_PAGES).unwrap(), page_key(3, 0), vec![0u8; 100]).unwrap();
    }
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let records = store.load_records().unwrap();
    assert_eq!(records.len(), 1, "the record is kept");
    assert_eq!(records[0].2.cached_bytes(), 0, "no chunk is taken for present without its file");
    assert!(!DB::list_cf(&Options::default(), dir.path()).unwrap().iter().any(|cf| cf == CF_LEGACY_PAGES));
}

#[test]
fn every_chunk_file_counts_after_reopen_though_only_some_are_opened_then() {
    // RocksDB opens (and reads the entry counts of) only a few files at start.
    let dir = tempfile::tempdir().unwrap();
    let chunk = 64 << 10;
    let rec = ShardRecord {
        id: 9,
        version: "v".into(),
        size: 40 * chunk,
        chunk_size: chunk as u32,
        ..Default::default()
    };
    {
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        store.put_record("ds", "s", &rec).unwrap();
        for index in 0..40 {
            store.admit_chunk(9, index * chunk, &checked(&vec![index as u8; chunk as usize])).unwrap();
        }
    }
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    assert_eq!(
        store.load_records().unwrap()[0].2.cached_bytes(),
        40 * chunk,
        "no chunk file was taken for a stray"
    );
    assert_eq!(read(&store, 9, 39 * chunk, 1).unwrap().unwrap()[0], 39);
}

#[test]
fn presence_bits() {
    let mut rec = record(1, CHUNK * 3 + 5);
    assert_eq!(rec.chunk_count(), 4);
    assert_eq!(rec.chunk_len(ChunkIndex(3)), 5);
    rec.set_chunk(ChunkIndex(3), true);
    rec.set_chunk(ChunkIndex(9), true);
    rec.set_chunk(ChunkIndex(9), false);
    assert!(rec.has_chunk(ChunkIndex(3)) && !rec.has_chunk(ChunkIndex(0)) && !rec.has_chunk(ChunkIndex(9)));
    assert_eq!(rec.cached_bytes(), 5);
}

#[test]
fn a_merged_shard_is_one_file_read_and_reopened_whole_and_evicted_whole() {
    let dir = tempfile::tempdir().unwrap();
    let merging = StoreOptions { merge_above_files: 0, ..StoreOptions::default() };
    let (a, b) = (pattern(3 * CHUNK as usize + 5000), pattern(2 * CHUNK as usize));
    {
        let store = Store::open(dir.path(), &merging).unwrap();
        store.put_record("ds", "a", &record(1, a.len() as u64)).unwrap();
        store.put_record("ds", "b", &record(2, b.len() as u64)).unwrap();
        for (id, data) in [(1, &a), (2, &b)] {
            for (i, chunk) in data.chunks(CHUNK as usize).enumerate() {
                store.admit_chunk(id, i as u64 * CHUNK, &checked(chunk)).unwrap();
            }
        }
        assert_eq!(store.page_files_count(), 6, "one file per chunk");
        assert!(store.merge_shard(1, a.len() as u64).unwrap());
        assert_eq!(store.page_files_count(), 3, "shard 1 is one file, shard 2 two");
        assert_eq!(read(&store, 1, 0, a.len() as u64).unwrap().unwrap(), a);
    }
    let store =
        Store::open(dir.path(), &StoreOptions { merge_above_files: 100, ..StoreOptions::default() }).unwrap();
    let records = store.load_records().unwrap();
    // Below the threshold nothing is merged.
    assert!(!store.merge_shard(2, b.len() as u64).unwrap());
    assert_eq!(store.page_files_count(), 3, "the merged file was recognised, not removed");
    let merged = records.iter().find(|(_, shard, _)| shard == "a").unwrap();
    assert_eq!(merged.2.cached_bytes(), a.len() as u64, "every chunk of the merged file is present");
    assert_eq!(read(&store, 1, 0, a.len() as u64).unwrap().unwrap(), a);
    // A damaged chunk inside the merged file is removed alone; the rest still reads.
    store.delete_chunk(1, CHUNK, CHUNK).unwrap();
    assert!(matches!(read(&store, 1, CHUNK, 10).unwrap(), Err(PageFault::Missing { .. })));
    assert_eq!(read(&store, 1, 0, CHUNK).unwrap().unwrap(), a[..CHUNK as usize]);
    assert_eq!(read(&store, 1, 2 * CHUNK, 5000).unwrap().unwrap(), a[2 * CHUNK as usize..][..5000]);
    store.admit_chunk(1, CHUNK, &checked(&a[CHUNK as usize..2 * CHUNK as usize])).unwrap();
    assert_eq!(read(&store, 1, 0, a.len() as u64).unwrap().unwrap(), a);
    // Eviction takes the merged shard whole and leaves the other.
    store.delete_shard(1, Some(("ds", "a"))).unwrap();
    assert_eq!(read(&store, 1, 0, 1).unwrap(), Err(PageFault::Missing { page: 0 }));
    assert_eq!(read(&store, 2, 0, b.len() as u64).unwrap().unwrap(), b);
    assert_eq!(store.page_files_count(), 2);
}

#[test]
fn a_page_the_disk_cannot_read_is_a_fault_to_refetch_and_the_chunk_can_be_admitted_again() {
    let dir = tempfile::tempdir().unwrap();
    // 20 open files at most (RocksDB keeps 10 of them for tables): reading 30 chunk files
    // closes the first ones, so their next read opens them again.
    let store =
        Store::open(dir.path(), &StoreOptions { max_open_files: 20, ..StoreOptions::default() }).unwrap();
    let data = pattern(CHUNK as usize);
    for id in 1..=30 {
        store.put_record("ds", &format!("s{id}"), &record(id, CHUNK)).unwrap();
        store.admit_chunk(id, 0, &checked(&data)).unwrap();
    }
    for id in 1..=30 {
        assert!(read(&store, id, 0, CHUNK).unwrap().unwrap() == data);
    }
    // One file goes from under the store (a disk that fails, an operator's mistake).
    // Which files RocksDB holds open is its business: every file is taken away, the
    // reads tell which could not be read, and all but the first of those come back.
    let aside = tempfile::tempdir().unwrap();
    let files: Vec<_> =
        store.db.live_files().unwrap().into_iter().filter(|f| f.column_family_name == CF_PAGES).collect();
    let path = |name: &str| dir.path().join(name.trim_start_matches('/'));
    for f in &files {
        std::fs::rename(path(&f.name), aside.path().join(f.name.trim_start_matches('/'))).unwrap();
    }
    let mut unreadable = None;
    for id in 1..=30 {
        match read(&store, id, 0, CHUNK).unwrap() {
            Ok(read) => assert!(read == data, "a file still open reads right"),
            Err(fault) => {
                // An I/O error, not damage, and not a failed read.
                assert!(matches!(fault, PageFault::Unreadable { page: 0, .. }), "{fault:?}");
                unreadable = unreadable.or(Some(id));
            }
        }
    }
    let lost = unreadable.expect("every file was still open: the test proves nothing");
    for f in &files {
        if f.start_key.as_deref() != Some(&page_key(lost, 0)[..]) {
            std::fs::rename(aside.path().join(f.name.trim_start_matches('/')), path(&f.name)).unwrap();
        }
    }
    // Forgotten and admitted again, it reads; so do the others.
    store.delete_chunk(lost, 0, CHUNK).unwrap();
    store.admit_chunk(lost, 0, &checked(&data)).unwrap();
    for id in 1..=30 {
        assert!(read(&store, id, 0, CHUNK).unwrap().unwrap() == data, "shard {id}");
    }
}

/// A sample of `dataset/s` at `offset` with `data`.
fn sample(offset: u64, data: &[u8]) -> (PackedSample, Checked) {
    let name = PackedSample {
        dataset: "ds".into(),
        shard: "s".into(),
        version: "v1".into(),
        offset,
        length: data.len() as u64,
    };
    (name, checked(data))
}

#[test]
fn a_pack_of_samples_is_one_file_read_back_checked_kept_across_reopen_and_dropped_whole() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(100_000);
    let samples = vec![
        sample(0, &data[..16_384]),
        sample(50_000, &data[50_000..66_384]),
        sample(90_000, &data[90_000..]),
    ];
    {
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        store.write_pack(3, &samples).unwrap();
        let second = store.read_sample(3, 1, 0, 16_384).unwrap().unwrap();
        assert_eq!(second.data[..], data[50_000..66_384]);
        assert_eq!(second.crc32c, crc32c(&second.data));
        assert_eq!(store.read_sample(3, 2, 0, 5_000).unwrap().unwrap().data[..], data[90_000..95_000]);
        assert_eq!(
            store.read_sample(3, 2, 0, 10_001).unwrap(),
            Err(PageFault::Missing { page: 2 }),
            "past its end"
        );
        assert_eq!(store.read_sample(4, 0, 0, 1).unwrap(), Err(PageFault::Missing { page: 0 }));
        // A sample whose bytes are not what they were checked as is never written.
        let mut bad = sample(0, &data[..100]);
        bad.1.crc32c ^= 1;
        assert!(store.write_pack(5, &[bad]).is_err());
    }
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let packs = store.load_packs().unwrap();
    assert_eq!(packs, vec![(3, samples.iter().map(|(s, _)| s.clone()).collect())], "pack 5 never was");
    assert_eq!(store.read_sample(3, 0, 0, 16_384).unwrap().unwrap().data[..], data[..16_384]);
    let before = store.disk_bytes();
    store.delete_pack(3).unwrap();
    assert!(store.disk_bytes() < before, "its file is gone");
    assert_eq!(store.read_sample(3, 0, 0, 1).unwrap(), Err(PageFault::Missing { page: 0 }));
    assert!(store.load_packs().unwrap().is_empty());
}

#[test]
fn a_samples_file_that_is_not_one_whole_pack_is_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        store.write_pack(1, &[sample(0, b"kept")]).unwrap();
        // A file RocksDB wrote itself (keys through the memtable, no manifest).
        let family = store.db.cf_handle(CF_SAMPLES).unwrap();
        store.db.put_cf(&family, packs::sample_key(9, 0), b"stray").unwrap();
        store.db.flush_cf(&family).unwrap();
    }
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let packs = store.load_packs().unwrap();
    assert_eq!(packs.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [1]);
    assert_eq!(
        store.read_sample(9, 0, 0, 1).unwrap(),
        Err(PageFault::Missing { page: 0 }),
        "the stray is gone"
    );
    assert_eq!(store.read_sample(1, 0, 0, 4).unwrap().unwrap().data[..], b"kept"[..]);
}

/// `[offset, offset + len)` as a reader of the same-node door reads it: each placed
/// page read from its file and checked against the CRC32C stored in front of it.
fn read_placed(store: &Store, id: u64, offset: u64, len: u64) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let spans = store.locate(id, offset, len, &mut locate::Opened::new(64))?;
    let mut out = Vec::new();
    for span in spans {
        let mut value = vec![0u8; PAGE_HEADER + span.page_len as usize];
        span.file.read_exact_at(&mut value, span.at).unwrap();
        let (header, page) = value.split_at(PAGE_HEADER);
        assert_eq!(crc32c(page).to_le_bytes(), header, "page at {} fails its CRC32C", span.at);
        out.extend_from_slice(&page[span.from as usize..span.to as usize]);
    }
    Some(out)
}

#[test]
fn the_door_places_every_page_in_chunk_files_and_merged_ones_and_a_held_file_outlives_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let merging = StoreOptions { merge_above_files: 0, ..StoreOptions::default() };
    let store = Store::open(dir.path(), &merging).unwrap();
    let a = pattern(3 * CHUNK as usize + 5000);
    store.put_record("ds", "a", &record(1, a.len() as u64)).unwrap();
    for (i, chunk) in a.chunks(CHUNK as usize).enumerate() {
        store.admit_chunk(1, i as u64 * CHUNK, &checked(chunk)).unwrap();
    }
    let ranges = [(0, a.len() as u64), (1000, 70_000), (CHUNK - 7, 20), (3 * CHUNK, 5000), (5, 1)];
    for (offset, len) in ranges {
        let placed = read_placed(&store, 1, offset, len).expect("chunk files are placed");
        assert_eq!(placed, a[offset as usize..][..len as usize], "chunk files, {offset}+{len}");
    }
    // A merged shard, a chunk dropped from inside it and admitted again (RocksDB rewrites
    // the merged file around the hole): placed anew each time.
    assert!(store.merge_shard(1, a.len() as u64).unwrap());
    assert_eq!(read_placed(&store, 1, 0, a.len() as u64).expect("merged"), a);
    store.delete_chunk(1, CHUNK, CHUNK).unwrap();
    assert!(read_placed(&store, 1, CHUNK, 10).is_none(), "a dropped chunk is not placed");
    assert_eq!(read_placed(&store, 1, 0, CHUNK).expect("the rest"), a[..CHUNK as usize]);
    store.admit_chunk(1, CHUNK, &checked(&a[CHUNK as usize..2 * CHUNK as usize])).unwrap();
    assert_eq!(read_placed(&store, 1, 0, a.len() as u64).expect("whole again"), a);

    // A reader holds a file when the shard is evicted: the file's bytes stay as they were
    // until it lets go, and nothing of the shard is placed any more.
    // A call opens so many files and no more: past them, pages are not placed (but read).
    assert!(store.locate(1, 0, 100, &mut locate::Opened::new(0)).is_none());
    let held = store.locate(1, 0, 100, &mut locate::Opened::new(64)).expect("placed");
    store.delete_shard(1, Some(("ds", "a"))).unwrap();
    assert!(store.locate(1, 0, 100, &mut locate::Opened::new(64)).is_none());
    let mut value = vec![0u8; PAGE_HEADER + held[0].page_len as usize];
    std::os::unix::fs::FileExt::read_exact_at(&*held[0].file, &mut value, held[0].at).unwrap();
    assert_eq!(value[PAGE_HEADER..][..100], a[..100]);
}

#[test]
fn pages_in_blocks_of_another_shape_are_not_placed_and_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let large_blocks = StoreOptions {
        pages_options: "block_based_table_factory={block_size=1048576}".into(),
        ..Default::default()
    };
    let store = Store::open(dir.path(), &large_blocks).unwrap();
    let data = pattern(2 * CHUNK as usize);
    store.put_record("ds", "s", &record(4, data.len() as u64)).unwrap();
    store.admit_chunk(4, 0, &checked(&data[..CHUNK as usize])).unwrap();
    assert!(read_placed(&store, 4, 0, 1000).is_none(), "several pages per block: not placed");
    assert_eq!(read(&store, 4, 0, CHUNK).unwrap().unwrap(), data[..CHUNK as usize]);
}
