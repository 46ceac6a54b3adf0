//! Every read RPC of the hub returns exactly the bytes of the file: at chunk edges,
//! empty ranges, whole shards, the last partial chunk, nested shard paths.

#![allow(clippy::unwrap_used)]

use shardcache_client::Range;
use shardcache_tests::{TestHub, make_dataset, sha256, test_options, write_pattern};

const CHUNK: u64 = 64 << 10; // test_options().limits.message_size

#[tokio::test]
async fn lists_datasets_and_pages_through_shards() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 5, 64 << 10);
    write_pattern(&root.path().join("raw/nested/dir/part.bin"), 1000, 1);
    // Hidden files and the dataset metadata file are not shards.
    write_pattern(&root.path().join("raw/.hidden"), 10, 2);
    let hub = TestHub::start(root.path()).await;
    let client = hub.client().await;

    let datasets = client.list_datasets().await.unwrap();
    let names: Vec<_> =
        datasets.iter().map(|d| (d.name.as_str(), d.shard_count, d.total_bytes, d.record_size)).collect();
    assert_eq!(names, [("c4", 5, 5 * (64 << 10), 16384), ("raw", 1, 1000, 0)]);

    // Pages of 2: the SDK follows the tokens to the end.
    let mut reader =
        shardcache_proto::v1::shard_reader_client::ShardReaderClient::connect(hub.endpoint.clone())
            .await
            .unwrap();
    let mut seen = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = reader
            .list_shards(shardcache_proto::v1::ListShardsRequest {
                dataset: "c4".into(),
                page_size: 2,
                page_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.shards.len() <= 2);
        seen.extend(page.shards.into_iter().map(|s| s.shard));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    let expected: Vec<_> = (0..5).map(shardcache_cli::dataset_gen::shard_name).collect();
    assert_eq!(seen, expected);
    let all = client.list_shards("c4").await.unwrap();
    assert_eq!(all.iter().map(|s| s.shard.clone()).collect::<Vec<_>>(), expected);
    assert!(all.iter().all(|s| s.size == 64 << 10 && !s.version.is_empty() && s.record_size == 16384));

    let nested = client.list_shards("raw").await.unwrap();
    assert_eq!(nested.len(), 1);
    assert_eq!(nested[0].shard, "nested/dir/part.bin");
}

#[tokio::test]
async fn stat_reports_size_version_and_message_size() {
    let root = tempfile::tempdir().unwrap();
    write_pattern(&root.path().join("ds/a.bin"), 12345, 0);
    let hub = TestHub::start(root.path()).await;
    let info = hub.client().await.stat("ds", "a.bin").await.unwrap();
    assert_eq!(info.size, 12345);
    assert_eq!(u64::from(info.message_size), CHUNK);
    assert!(!info.version.is_empty());
}

#[tokio::test]
async fn read_range_returns_the_exact_bytes_at_every_edge() {
    let root = tempfile::tempdir().unwrap();
    // 3.5 chunks: the last chunk is partial.
    let len = (3 * CHUNK + CHUNK / 2) as usize;
    let data = write_pattern(&root.path().join("ds/s.bin"), len, 7);
    let hub = TestHub::start(root.path()).await;
    let client = hub.client().await;
    let c = CHUNK;
    let cases: &[(u64, u64)] = &[
        (0, 0),          // empty at the start
        (len as u64, 0), // empty at the end
        (0, 1),
        (c - 1, 2),          // straddles a chunk edge
        (c, c),              // exactly one aligned chunk
        (c - 1, c + 2),      // spans three chunks
        (3 * c, c / 2),      // the last partial chunk
        (len as u64 - 1, 1), // the last byte
        (0, len as u64),     // the whole shard
        (12345, 16384),      // one unaligned sample
    ];
    for &(offset, length) in cases {
        let got = client.read_range(&Range::new("ds", "s.bin", offset, length)).await.unwrap();
        let want = &data[offset as usize..(offset + length) as usize];
        assert_eq!(got.offset, offset);
        assert_eq!(sha256(&got.data), sha256(want), "range {offset}+{length}");
    }
}

#[tokio::test]
async fn read_ranges_returns_a_batch_in_request_order() {
    let root = tempfile::tempdir().unwrap();
    let dir = make_dataset(root.path(), "c4", 3, 256 << 10);
    let hub = TestHub::start(root.path()).await;
    let client = hub.client().await;
    let record = 16u64 << 10;
    // A training batch: 24 samples from three shards, out of order, one repeated, one empty.
    let mut batch: Vec<Range> = (0..23u64)
        .map(|i| {
            Range::new(
                "c4",
                shardcache_cli::dataset_gen::shard_name((i % 3) as u32),
                ((i * 7) % 16) * record,
                record,
            )
        })
        .collect();
    batch.push(Range::new("c4", "shard-00001.bin", 100, 0));
    batch.push(batch[0].clone());
    let got = client.read_ranges(&batch).await.unwrap();
    assert_eq!(got.len(), batch.len());
    for (range, chunk) in batch.iter().zip(&got) {
        let file = std::fs::read(dir.join(&range.shard)).unwrap();
        let want = &file[range.offset as usize..(range.offset + range.length) as usize];
        assert_eq!(sha256(&chunk.data), sha256(want), "{range:?}");
    }
}

#[tokio::test]
async fn a_read_cut_at_the_end_gets_what_lies_inside_the_shard() {
    // What a spoke reads alongside its first stat of a shard of a size it does not know
    // yet: cut at the end, a range past it reads the tail, one from the end on reads
    // nothing; the same ranges uncut are refused as past the end.
    let root = tempfile::tempdir().unwrap();
    let data = write_pattern(&root.path().join("ds/s.bin"), 100_000, 4);
    let hub = TestHub::start(root.path()).await;
    let client = hub.client().await;
    let cut = |offset, length| Range::new("ds", "s.bin", offset, length).cut_at_end();
    let got = client
        .read_ranges(&[cut(0, 64 << 10), cut(64 << 10, 64 << 10), cut(128 << 10, 64 << 10)])
        .await
        .unwrap();
    assert!(got[0].data == data[..64 << 10], "a range inside: all of it");
    assert!(got[1].data == data[64 << 10..], "a range over the end: to the end");
    assert_eq!((got[2].offset, got[2].data.len()), (128 << 10, 0), "a range past the end: nothing");
    let one = client.read_range(&cut(90_000, 64 << 10)).await.unwrap();
    assert!(one.data == data[90_000..], "one range on its own, to the end");

    let err = client.read_range(&Range::new("ds", "s.bin", 64 << 10, 64 << 10)).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "uncut, past the end is refused: {err}");
}

#[tokio::test]
async fn stream_shard_sends_aligned_chunks_of_the_exact_bytes() {
    let root = tempfile::tempdir().unwrap();
    let len = (3 * CHUNK + 1000) as usize;
    let data = write_pattern(&root.path().join("ds/deep/s.bin"), len, 3);
    let hub = TestHub::start(root.path()).await;
    let client = hub.client().await;
    let cases: &[(u64, Option<u64>)] = &[
        (0, None),
        (0, Some(len as u64)),
        (100, None),
        (CHUNK - 1, Some(2)),
        (CHUNK, Some(CHUNK)),
        (len as u64, None),
        (5, Some(0)),
    ];
    for &(offset, length) in cases {
        let mut stream = client.stream_shard("ds", "deep/s.bin", offset, length).await.unwrap();
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        while let Some(chunk) = stream.next_chunk().await.unwrap() {
            // Every chunk after the first starts on a chunk boundary.
            if !got.is_empty() {
                assert_eq!(chunk.offset % CHUNK, 0);
            }
            sizes.push(chunk.data.len());
            got.extend_from_slice(&chunk.data);
        }
        let end = length.map_or(len as u64, |l| offset + l);
        assert_eq!(sha256(&got), sha256(&data[offset as usize..end as usize]), "stream {offset}+{length:?}");
        assert!(sizes.iter().all(|&s| s as u64 <= CHUNK));
    }
    // One shard read whole: ceil(len / chunk) messages.
    let mut stream = client.stream_shard("ds", "deep/s.bin", 0, None).await.unwrap();
    let mut messages = 0;
    while stream.next_chunk().await.unwrap().is_some() {
        messages += 1;
    }
    assert_eq!(messages, 4);
}

#[tokio::test]
async fn generated_dataset_streams_back_identical() {
    let root = tempfile::tempdir().unwrap();
    let dir = make_dataset(root.path(), "c4", 2, 1 << 20);
    let hub = TestHub::start_with(root.path(), test_options()).await;
    let client = hub.client().await;
    for shard in client.list_shards("c4").await.unwrap() {
        let mut stream = client.stream_shard("c4", &shard.shard, 0, None).await.unwrap();
        let mut got = Vec::new();
        while let Some(chunk) = stream.next_chunk().await.unwrap() {
            assert_eq!(chunk.version, shard.version);
            got.extend_from_slice(&chunk.data);
        }
        assert_eq!(sha256(&got), sha256(&std::fs::read(dir.join(&shard.shard)).unwrap()));
    }
    hub.stop().await.unwrap();
}

#[tokio::test]
async fn graceful_shutdown_lets_an_open_stream_finish() {
    let root = tempfile::tempdir().unwrap();
    let data = write_pattern(&root.path().join("ds/s.bin"), 32 * CHUNK as usize, 2);
    let hub = TestHub::start(root.path()).await;
    // Small windows keep the stream really in flight when the stop begins.
    let client = hub.client_with_small_windows().await;
    let mut stream = client.stream_shard("ds", "s.bin", 0, None).await.unwrap();
    let mut got = stream.next_chunk().await.unwrap().unwrap().data.to_vec();
    let stopping = tokio::spawn(hub.stop());
    while let Some(chunk) = stream.next_chunk().await.unwrap() {
        got.extend_from_slice(&chunk.data);
    }
    assert_eq!(sha256(&got), sha256(&data));
    stopping.await.unwrap().unwrap();
    // And once stopped, it no longer accepts work.
    assert!(client.stat("ds", "s.bin").await.is_err());
}
