//! A dataset's index read through a spoke (`shardcache-formats`): the headers of every
//! shard are read in one batch and marked as index reads, so opening a dataset does not
//! start a background fetch of each of its shards; reading a sample does, as any read.
//! (The formats themselves are checked against their own readers in
//! client/python/tests/test_formats.py.)
#![allow(clippy::unwrap_used)]

use shardcache_client::Range;
use shardcache_formats::{Format, SampleIndex};
use shardcache_tests::{TestHub, TestSpoke, spoke_options};

/// An `.npy` file of `count` uint16 values.
fn npy(count: u64) -> Vec<u8> {
    let mut out = shardcache_formats::tokens::npy_header("<u2", &format!("({count},)"));
    out.extend((0..count).flat_map(|i| (i as u16).to_le_bytes()));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_an_index_fetches_no_whole_shard_and_reading_a_sample_does() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("tokens")).unwrap();
    // Four files of 6 MiB of tokens: more than one 4 MiB chunk each.
    for i in 0..4 {
        std::fs::write(root.path().join(format!("tokens/part-{i}.npy")), npy(3 << 20)).unwrap();
    }
    let hub = TestHub::start(root.path()).await;
    let cache = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(cache.path(), spoke_options(&hub.endpoint)).await;
    let client = spoke.client().await;
    let fetches = "shardcache_spoke_whole_shard_fetches_total";

    let format = Format::Tokens { seq_len: 2047, dtype: None };
    let index = SampleIndex::open(&client, "tokens", &format).await.unwrap();
    assert_eq!(index.counts().iter().sum::<u64>(), (4 * (3 << 20) - 2048) / 2047 + 1);
    assert_eq!(spoke.metric(fetches).await, 0.0, "reading four headers started no shard fetch");

    // A sample, read as a trainer reads, in a chunk of part-1 the header read did not
    // touch (past its first 4 MiB): the miss starts the rest of the shard.
    let sample = index.read(&client, &[(1, 1100)]).await.unwrap();
    // Window counts[0] + 1100 of all the tokens, the files end to end; part-1 counts from 0.
    let start = (index.counts()[0] + 1100) * 2047 - (3 << 20);
    assert!(128 + 2 * start > 4 << 20, "the sample is in part-1's second chunk");
    let expected: Vec<u8> = (start..start + 2048).flat_map(|t| (t as u16).to_le_bytes()).collect();
    assert_eq!(sample[0].as_ref(), expected.as_slice());
    assert_eq!(spoke.metric(fetches).await, 1.0, "a sample's miss fetches the rest of its shard");
    // An unmarked miss in a shard whose header was read (its second chunk, never read)
    // starts one too: the mark, not the shard, kept the first one from starting.
    client.read_range(&Range::new("tokens", "part-2.npy", 5 << 20, 4096)).await.unwrap();
    assert_eq!(spoke.metric(fetches).await, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_changed_after_its_index_was_read_fails_its_reads_and_never_mixes_versions() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("tokens")).unwrap();
    for i in 0..2 {
        std::fs::write(root.path().join(format!("tokens/part-{i}.npy")), npy(100_000)).unwrap();
    }
    let hub = TestHub::start(root.path()).await;
    let client = shardcache_client::Client::connect(&hub.endpoint).await.unwrap();
    let index =
        SampleIndex::open(&client, "tokens", &Format::Tokens { seq_len: 99, dtype: None }).await.unwrap();
    assert_eq!(index.read(&client, &[(1, 3)]).await.unwrap()[0].len(), 200);

    // part-1 rewritten with other tokens (a new version): its old windows are gone.
    let mut changed = shardcache_formats::tokens::npy_header("<u2", "(100000,)");
    changed.extend((0..100_000u32).rev().flat_map(|i| (i as u16).to_le_bytes()));
    std::thread::sleep(std::time::Duration::from_millis(20)); // a later mtime, a new version
    std::fs::write(root.path().join("tokens/part-1.npy"), &changed).unwrap();
    let err = index.read(&client, &[(1, 3)]).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Aborted), "{err}");
    // The other shard is unchanged and still reads.
    assert_eq!(index.read(&client, &[(0, 3)]).await.unwrap()[0].len(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_an_index_brings_only_its_headers_across_and_opening_it_again_nothing() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("tokens")).unwrap();
    // Eight files of 1 MiB: each is one chunk, which a header's read used to fetch whole
    // (the whole dataset, for its headers).
    for i in 0..8 {
        std::fs::write(root.path().join(format!("tokens/part-{i}.npy")), npy(1 << 19)).unwrap();
    }
    let hub = TestHub::start(root.path()).await;
    let cache = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(cache.path(), spoke_options(&hub.endpoint)).await;
    let client = spoke.client().await;
    let upstream = "shardcache_spoke_upstream_bytes_total{dataset=\"tokens\"}";

    let format = Format::Tokens { seq_len: 1023, dtype: None };
    let index = SampleIndex::open(&client, "tokens", &format).await.unwrap();
    let headers = spoke.metric(upstream).await;
    assert!(
        headers > 0.0 && headers <= 8.0 * 64.0 * 1024.0,
        "only the headers' reads crossed: {headers} bytes"
    );
    // Opened again (a DataLoader worker, the next epoch): nothing more upstream.
    let again = SampleIndex::open(&client, "tokens", &format).await.unwrap();
    assert_eq!(again.counts(), index.counts());
    assert_eq!(spoke.metric(upstream).await, headers, "the headers were kept");
    // A sample's read is a read like any other: its chunk is fetched and stored.
    let sample = index.read(&client, &[(3, 10)]).await.unwrap();
    let start = (index.counts()[..3].iter().sum::<u64>() + 10) * 1023 - 3 * (1 << 19);
    let expected: Vec<u8> = (start..start + 1024).flat_map(|t| (t as u16).to_le_bytes()).collect();
    assert_eq!(sample[0].as_ref(), expected.as_slice());
    spoke.settled().await;
    let after = spoke.metric(upstream).await;
    assert!(after >= headers + (1 << 20) as f64, "part-3's chunk was fetched: {headers} then {after}");
}
