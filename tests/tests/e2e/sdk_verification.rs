//! The SDK never hands out bytes it could not verify. A test server wraps the real read
//! service and damages its answers on the wire (a flipped bit with the CRC left as it
//! was, a wrong offset, a version change mid-stream, a stream cut short); the SDK must
//! report each one.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use hub_server::source::{HubSource, local::LocalSource};
use shardcache_client::{Client, Error, Range};
use shardcache_proto::v1::{
    Chunk, ListDatasetsRequest, ListDatasetsResponse, ListShardsRequest, ListShardsResponse,
    ReadRangeRequest, ReadRangesRequest, ReadRangesResponse, ShardInfo, StatShardRequest, StreamShardRequest,
    shard_reader_server::ShardReader,
};
use shardcache_reader::ReadService;
use shardcache_tests::{serve_reader, test_options, write_pattern};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Damage {
    Nothing,
    FlipBit,
    WrongOffset,
    VersionChangesAfterFirstChunk,
    /// Every chunk claims another version than the shard's.
    WrongVersion,
    DropLastChunk,
}

struct Damaging {
    inner: ReadService<HubSource<Arc<LocalSource>>>,
    damage: Damage,
}

impl Damaging {
    fn damage(&self, mut chunk: Chunk, index: usize) -> Chunk {
        match self.damage {
            Damage::FlipBit if !chunk.data.is_empty() => {
                let mut data = chunk.data.to_vec();
                let middle = data.len() / 2;
                data[middle] ^= 0x10;
                chunk.data = data.into();
            }
            Damage::WrongOffset => chunk.offset += 1,
            Damage::VersionChangesAfterFirstChunk if index > 0 => chunk.version.push_str("-new"),
            Damage::WrongVersion => chunk.version.push_str("-other"),
            _ => {}
        }
        chunk
    }
}

type ChunkStream = std::pin::Pin<Box<dyn Stream<Item = Result<Chunk, Status>> + Send>>;

#[tonic::async_trait]
impl ShardReader for Damaging {
    async fn list_datasets(
        &self,
        r: Request<ListDatasetsRequest>,
    ) -> Result<Response<ListDatasetsResponse>, Status> {
        self.inner.list_datasets(r).await
    }
    async fn list_shards(
        &self,
        r: Request<ListShardsRequest>,
    ) -> Result<Response<ListShardsResponse>, Status> {
        self.inner.list_shards(r).await
    }
    async fn stat_shard(&self, r: Request<StatShardRequest>) -> Result<Response<ShardInfo>, Status> {
        self.inner.stat_shard(r).await
    }
    async fn read_range(&self, r: Request<ReadRangeRequest>) -> Result<Response<Chunk>, Status> {
        let chunk = self.inner.read_range(r).await?.into_inner();
        Ok(Response::new(self.damage(chunk, 0)))
    }
    async fn read_ranges(
        &self,
        r: Request<ReadRangesRequest>,
    ) -> Result<Response<ReadRangesResponse>, Status> {
        let chunks = self.inner.read_ranges(r).await?.into_inner().chunks;
        let chunks = chunks.into_iter().enumerate().map(|(i, c)| self.damage(c, i)).collect();
        Ok(Response::new(ReadRangesResponse { chunks }))
    }

    type StreamShardStream = ChunkStream;

    async fn stream_shard(&self, r: Request<StreamShardRequest>) -> Result<Response<ChunkStream>, Status> {
        let chunks: Vec<_> = self.inner.stream_shard(r).await?.into_inner().collect().await;
        let mut chunks: Vec<Result<Chunk, Status>> =
            chunks.into_iter().enumerate().map(|(i, c)| c.map(|c| self.damage(c, i))).collect();
        if self.damage == Damage::DropLastChunk {
            chunks.pop();
        }
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }
}

async fn damaging_server(root: &std::path::Path, damage: Damage) -> Client {
    let source = Arc::new(LocalSource::new(root).unwrap());
    let inner = ReadService::new(HubSource(source), test_options().limits, Arc::new(()));
    let endpoint = serve_reader(Arc::new(Damaging { inner, damage })).await;
    Client::connect(&endpoint).await.unwrap()
}

async fn read_stream(client: &Client, length: Option<u64>) -> Result<Vec<u8>, Error> {
    client.stream_shard("ds", "s.bin", 0, length).await?.read_to_end().await
}

fn dataset() -> (tempfile::TempDir, Vec<u8>) {
    let root = tempfile::tempdir().unwrap();
    // 3.5 chunks of 64 KiB.
    let data = write_pattern(&root.path().join("ds/s.bin"), 7 * (32 << 10), 5);
    (root, data)
}

#[tokio::test]
async fn a_flipped_bit_is_caught_on_every_rpc() {
    let (root, _) = dataset();
    let client = damaging_server(root.path(), Damage::FlipBit).await;
    let err = client.read_range(&Range::new("ds", "s.bin", 100, 5000)).await.unwrap_err();
    assert!(matches!(err, Error::Checksum { .. }), "{err}");
    assert!(err.to_string().contains("checksum mismatch at offset 100"), "{err}");
    let batch = [Range::new("ds", "s.bin", 0, 10), Range::new("ds", "s.bin", 70_000, 16384)];
    assert!(matches!(client.read_ranges(&batch).await.unwrap_err(), Error::Checksum { .. }));
    assert!(matches!(read_stream(&client, None).await.unwrap_err(), Error::Checksum { .. }));
}

#[tokio::test]
async fn the_same_wrapper_without_damage_verifies() {
    // Control: the wrapper itself does not break anything.
    let (root, data) = dataset();
    let client = damaging_server(root.path(), Damage::Nothing).await;
    assert_eq!(client.read_range(&Range::new("ds", "s.bin", 100, 5000)).await.unwrap().data, data[100..5100]);
    let batch = [Range::new("ds", "s.bin", 0, 10), Range::new("ds", "s.bin", 70_000, 16384)];
    let got = client.read_ranges(&batch).await.unwrap();
    assert_eq!(got[1].data, data[70_000..70_000 + 16384]);
    assert_eq!(read_stream(&client, None).await.unwrap(), data);
}

#[tokio::test]
async fn wrong_offsets_mixed_versions_and_short_streams_are_refused() {
    let (root, data) = dataset();
    let client = damaging_server(root.path(), Damage::WrongOffset).await;
    assert!(matches!(
        client.read_range(&Range::new("ds", "s.bin", 0, 10)).await.unwrap_err(),
        Error::Protocol { .. }
    ));
    assert!(matches!(
        read_stream(&client, Some(data.len() as u64)).await.unwrap_err(),
        Error::Protocol { .. }
    ));

    let client = damaging_server(root.path(), Damage::VersionChangesAfterFirstChunk).await;
    let err = read_stream(&client, Some(data.len() as u64)).await.unwrap_err();
    assert!(matches!(err, Error::VersionChanged { .. }), "{err}");
    // With no length the SDK pins the stat'ed version, and the server itself refuses nothing
    // here, so the SDK's own check is what catches it.
    assert!(matches!(read_stream(&client, None).await.unwrap_err(), Error::VersionChanged { .. }));

    // A batch whose ranges of one shard come back at two versions: refused, ABORTED.
    let batch = [Range::new("ds", "s.bin", 0, 10), Range::new("ds", "s.bin", 70_000, 16384)];
    let err = client.read_ranges(&batch).await.unwrap_err();
    assert!(matches!(err, Error::VersionChanged { .. }), "{err}");
    assert_eq!(err.code(), Some(tonic::Code::Aborted));

    // A read pinned to a version that comes back at another: refused on ReadRange and in
    // a batch; unpinned, any one version is accepted.
    let client = damaging_server(root.path(), Damage::WrongVersion).await;
    let version = client.stat("ds", "s.bin").await.unwrap().version;
    let mut pinned = Range::new("ds", "s.bin", 0, 10);
    pinned.expected_version = Some(version);
    let err = client.read_range(&pinned).await.unwrap_err();
    assert!(matches!(err, Error::VersionChanged { .. }) && err.to_string().contains("-other"), "{err}");
    assert!(matches!(client.read_ranges(&[pinned]).await.unwrap_err(), Error::VersionChanged { .. }));
    assert_eq!(client.read_range(&Range::new("ds", "s.bin", 0, 10)).await.unwrap().data, data[..10]);

    let client = damaging_server(root.path(), Damage::DropLastChunk).await;
    let err = read_stream(&client, None).await.unwrap_err();
    assert!(
        err.to_string().contains("ended at offset 196608 before the end of the range at 229376"),
        "{err}"
    );
}
