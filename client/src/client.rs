//! [`Client`]: verified reads from a hub or a spoke (they serve the same API).
//!
//! Every chunk is checked before it is handed out: CRC32C against its bytes, offset and
//! length against what was asked, and one version across all chunks of a read. A read
//! that cannot be verified is an [`Error`], never data.

use bytes::Bytes;
use shardcache_proto::job::{EPOCH_HEADER, JOB_HEADER, check_job_name};
use shardcache_proto::{
    checksum,
    v1::{
        Chunk, DatasetInfo, ListDatasetsRequest, ListShardsRequest, ListShardsResponse, ReadRangeRequest,
        ReadRangesRequest, ShardInfo, StatShardRequest, StreamShardRequest,
        shard_reader_client::ShardReaderClient,
    },
};
use tonic::{
    metadata::{Ascii, MetadataValue},
    transport::Channel,
};

use crate::{
    ConnectOptions, Credentials, Error, Result,
    connect::{AuthChannel, connect_channel},
};

/// Largest response the SDK accepts: the hub's largest `--max-read` (64 MiB) plus room
/// for per-chunk framing of a `ReadRanges` batch.
pub const MAX_RESPONSE_BYTES: usize = 80 << 20;

/// Bytes read from a shard, verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Offset of `data` in the shard.
    pub offset: u64,
    pub data: Bytes,
    /// Version of the shard the bytes belong to.
    pub version: String,
}

/// One range of a [`Client::read_ranges`] batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub dataset: String,
    pub shard: String,
    pub offset: u64,
    pub length: u64,
    /// When set, the read fails with ABORTED unless the shard is still at this version.
    pub expected_version: Option<String>,
}

impl Range {
    pub fn new(dataset: impl Into<String>, shard: impl Into<String>, offset: u64, length: u64) -> Self {
        Self { dataset: dataset.into(), shard: shard.into(), offset, length, expected_version: None }
    }

    fn to_request(&self) -> ReadRangeRequest {
        ReadRangeRequest {
            dataset: self.dataset.clone(),
            shard: self.shard.clone(),
            offset: self.offset,
            length: self.length,
            expected_version: self.expected_version.clone().unwrap_or_default(),
        }
    }
}

/// A connection to a shardcache server. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct Client {
    reader: ShardReaderClient<AuthChannel>,
    endpoint: String,
    /// The job and epoch headers reads carry ([`Client::for_job`]).
    job: Option<(MetadataValue<Ascii>, MetadataValue<Ascii>)>,
}

impl Client {
    /// Connects to `endpoint`, e.g. `http://127.0.0.1:7070`, without credentials.
    pub async fn connect(endpoint: &str) -> Result<Self> {
        Self::connect_with(endpoint, &ConnectOptions::default()).await
    }

    /// Connects to `endpoint` (`https://` for TLS) with `options`' certificates and token.
    pub async fn connect_with(endpoint: &str, options: &ConnectOptions) -> Result<Self> {
        let credentials = Credentials::token(options.token.as_deref())?;
        Ok(Self::from_channel_with(connect_channel(endpoint, options).await?, endpoint, credentials))
    }

    /// Uses an existing channel (custom windows); `endpoint` names it in errors.
    pub fn from_channel(channel: Channel, endpoint: &str) -> Self {
        Self::from_channel_with(channel, endpoint, Credentials::default())
    }

    /// Uses an existing channel and sends `credentials` with every request.
    pub fn from_channel_with(channel: Channel, endpoint: &str, credentials: Credentials) -> Self {
        let reader = ShardReaderClient::with_interceptor(channel, credentials)
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        Self { reader, endpoint: endpoint.to_owned(), job: None }
    }

    /// A client on the same connection whose reads say they are for `job`'s `epoch` (the
    /// `shardcache-job` and `shardcache-epoch` headers): a spoke reports reads, hits and
    /// hub bytes per job and epoch. A hub ignores them.
    pub fn for_job(&self, job: &str, epoch: u64) -> Result<Self> {
        check_job_name(job).map_err(Error::Config)?;
        let name = job.parse().map_err(|_| Error::Config(format!("job {job:?} cannot be a header")))?;
        let epoch = epoch.to_string().parse().map_err(|_| Error::Config("epoch header".into()))?;
        Ok(Self { job: Some((name, epoch)), ..self.clone() })
    }

    /// `message` as a read request, with the job headers when there are any.
    fn read_request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some((job, epoch)) = &self.job {
            request.metadata_mut().insert(JOB_HEADER, job.clone());
            request.metadata_mut().insert(EPOCH_HEADER, epoch.clone());
        }
        request
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn status(&self, status: tonic::Status) -> Error {
        Error::Status { endpoint: self.endpoint.clone(), status }
    }

    fn protocol(&self, detail: String) -> Error {
        Error::Protocol { endpoint: self.endpoint.clone(), detail }
    }

    /// Every dataset the server has.
    pub async fn list_datasets(&self) -> Result<Vec<DatasetInfo>> {
        let response = self.reader.clone().list_datasets(ListDatasetsRequest {}).await;
        Ok(response.map_err(|s| self.status(s))?.into_inner().datasets)
    }

    /// One page of `dataset`'s shards (`page_size` 0: the server's default).
    pub async fn list_shards_page(
        &self,
        dataset: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<ListShardsResponse> {
        let request =
            ListShardsRequest { dataset: dataset.to_owned(), page_size, page_token: page_token.to_owned() };
        Ok(self.reader.clone().list_shards(request).await.map_err(|s| self.status(s))?.into_inner())
    }

    /// Every shard of `dataset`, following pages to the end.
    pub async fn list_shards(&self, dataset: &str) -> Result<Vec<ShardInfo>> {
        let mut shards = Vec::new();
        let mut page_token = String::new();
        loop {
            let page = self.list_shards_page(dataset, 0, &page_token).await?;
            shards.extend(page.shards);
            if page.next_page_token.is_empty() {
                return Ok(shards);
            }
            page_token = page.next_page_token;
        }
    }

    /// Size, version and chunk size of one shard.
    pub async fn stat(&self, dataset: &str, shard: &str) -> Result<ShardInfo> {
        let request = StatShardRequest { dataset: dataset.to_owned(), shard: shard.to_owned() };
        Ok(self.reader.clone().stat_shard(request).await.map_err(|s| self.status(s))?.into_inner())
    }

    /// Reads one range in one call (at most the server's `--max-read`).
    pub async fn read_range(&self, range: &Range) -> Result<Verified> {
        let request = self.read_request(range.to_request());
        let chunk = self.reader.clone().read_range(request).await.map_err(|s| self.status(s))?;
        self.verify(range, chunk.into_inner())
    }

    /// Reads many ranges in one round trip; results are in the order of `ranges`.
    pub async fn read_ranges(&self, ranges: &[Range]) -> Result<Vec<Verified>> {
        let request =
            self.read_request(ReadRangesRequest { ranges: ranges.iter().map(Range::to_request).collect() });
        let chunks =
            self.reader.clone().read_ranges(request).await.map_err(|s| self.status(s))?.into_inner().chunks;
        if chunks.len() != ranges.len() {
            return Err(self.protocol(format!("{} chunks for {} ranges", chunks.len(), ranges.len())));
        }
        let verified: Vec<Verified> = ranges
            .iter()
            .zip(chunks)
            .map(|(range, chunk)| self.verify(range, chunk))
            .collect::<Result<_>>()?;
        // Every range of one shard was read at one version: a batch never mixes two.
        let mut versions: std::collections::HashMap<(&str, &str), &str> = std::collections::HashMap::new();
        for (range, read) in ranges.iter().zip(&verified) {
            let first = *versions.entry((&range.dataset, &range.shard)).or_insert(&read.version);
            if first != read.version {
                return Err(Error::VersionChanged {
                    shard: format!("{}/{}", range.dataset, range.shard),
                    expected: first.to_owned(),
                    found: read.version.clone(),
                });
            }
        }
        Ok(verified)
    }

    /// Streams `[offset, offset + length)` of a shard, or to its end when `length` is
    /// `None` (then the shard is stat'ed first and the stream pinned to that version).
    pub async fn stream_shard(
        &self,
        dataset: &str,
        shard: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Result<ShardStream> {
        let (length, expected_version) = match length {
            Some(length) => (length, String::new()),
            None => {
                let info = self.stat(dataset, shard).await?;
                (info.size.saturating_sub(offset), info.version)
            }
        };
        let request = self.read_request(StreamShardRequest {
            dataset: dataset.to_owned(),
            shard: shard.to_owned(),
            offset,
            length: Some(length),
            expected_version: expected_version.clone(),
        });
        let stream =
            self.reader.clone().stream_shard(request).await.map_err(|s| self.status(s))?.into_inner();
        Ok(ShardStream {
            client: self.clone(),
            shard: format!("{dataset}/{shard}"),
            stream,
            next_offset: offset,
            end: offset.saturating_add(length),
            version: (!expected_version.is_empty()).then_some(expected_version),
        })
    }

    fn verify(&self, range: &Range, chunk: Chunk) -> Result<Verified> {
        if chunk.offset != range.offset || chunk.data.len() as u64 != range.length {
            return Err(self.protocol(format!(
                "asked for {} bytes at offset {} of {}/{}, got {} bytes at offset {}",
                range.length,
                range.offset,
                range.dataset,
                range.shard,
                chunk.data.len(),
                chunk.offset
            )));
        }
        if let Some(expected) = range.expected_version.as_deref().filter(|v| *v != chunk.version) {
            return Err(Error::VersionChanged {
                shard: format!("{}/{}", range.dataset, range.shard),
                expected: expected.to_owned(),
                found: chunk.version,
            });
        }
        self.checked(chunk)
    }

    fn checked(&self, chunk: Chunk) -> Result<Verified> {
        checksum::verify(chunk.offset, &chunk.data, chunk.crc32c)
            .map_err(|source| Error::Checksum { endpoint: self.endpoint.clone(), source })?;
        Ok(Verified { offset: chunk.offset, data: chunk.data, version: chunk.version })
    }
}

/// A verified stream of a shard's chunks, from [`Client::stream_shard`].
#[derive(Debug)]
pub struct ShardStream {
    client: Client,
    shard: String,
    stream: tonic::Streaming<Chunk>,
    next_offset: u64,
    end: u64,
    version: Option<String>,
}

impl ShardStream {
    /// The next verified chunk; `Ok(None)` once the whole range has arrived.
    pub async fn next_chunk(&mut self) -> Result<Option<Verified>> {
        let Some(chunk) = self.stream.message().await.map_err(|s| self.client.status(s))? else {
            if self.next_offset != self.end {
                return Err(self.client.protocol(format!(
                    "stream of {} ended at offset {} before the end of the range at {}",
                    self.shard, self.next_offset, self.end
                )));
            }
            return Ok(None);
        };
        let len = chunk.data.len() as u64;
        if chunk.offset != self.next_offset || len == 0 || self.next_offset + len > self.end {
            return Err(self.client.protocol(format!(
                "stream of {} sent {len} bytes at offset {}, expected data at {} before {}",
                self.shard, chunk.offset, self.next_offset, self.end
            )));
        }
        match &self.version {
            Some(expected) if *expected != chunk.version => {
                return Err(Error::VersionChanged {
                    shard: self.shard.clone(),
                    expected: expected.clone(),
                    found: chunk.version,
                });
            }
            Some(_) => {}
            None => self.version = Some(chunk.version.clone()),
        }
        let verified = self.client.checked(chunk)?;
        self.next_offset += len;
        Ok(Some(verified))
    }

    /// The rest of the range, verified, in one buffer.
    pub async fn read_to_end(mut self) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity((self.end - self.next_offset) as usize);
        while let Some(chunk) = self.next_chunk().await? {
            out.extend_from_slice(&chunk.data);
        }
        Ok(out)
    }

    /// Offset the next chunk will start at.
    pub fn position(&self) -> u64 {
        self.next_offset
    }

    /// Offset where the stream ends.
    pub fn end(&self) -> u64 {
        self.end
    }
}
