//! [`Client`]: verified reads from a hub or a spoke (they serve the same API).
//!
//! Every chunk is checked before it is handed out: CRC32C against its bytes, offset and
//! length against what was asked, and one version across all chunks of a read. A read
//! that cannot be verified is an [`Error`], never data.

use std::sync::Arc;

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

pub use crate::stream::ShardStream;
use crate::{
    ConnectOptions, Credentials, Error, Result,
    connect::{AuthChannel, connect_channel, connect_channel_lazy},
    group::{self, Health},
    stream::Resume,
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

/// One server of a client: a hub, a spoke, or a member of a group of spokes.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) endpoint: String,
    reader: ShardReaderClient<AuthChannel>,
    pub(crate) health: Health,
}

/// A connection to a shardcache server, or to a group of spokes (`URL1,URL2,...`): each
/// shard is read from its owner by rendezvous hashing (`group.rs`), and from the next
/// member in its order when the owner does not answer. Cheap to clone; clones share the
/// connections.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) members: Arc<Vec<Member>>,
    /// What the client was made with (one URL, or the group's list).
    endpoint: String,
    /// The job and epoch headers reads carry ([`Client::for_job`]).
    job: Option<(MetadataValue<Ascii>, MetadataValue<Ascii>)>,
}

impl Client {
    /// Connects to `endpoint`, e.g. `http://127.0.0.1:7070`, without credentials; a
    /// comma-separated list is a group of spokes.
    pub async fn connect(endpoint: &str) -> Result<Self> {
        Self::connect_with(endpoint, &ConnectOptions::default()).await
    }

    /// Connects to `endpoint` (`https://` for TLS) with `options`' certificates and token.
    /// A group (`URL1,URL2,...`) connects to each member when first used, so a member
    /// that is down does not keep the client from starting.
    pub async fn connect_with(endpoint: &str, options: &ConnectOptions) -> Result<Self> {
        let credentials = Credentials::token(options.token.as_deref())?;
        let endpoints = group::endpoints(endpoint);
        if endpoints.len() <= 1 {
            let channel = connect_channel(endpoint.trim().trim_end_matches(','), options).await?;
            return Ok(Self::from_channel_with(channel, endpoint.trim().trim_end_matches(','), credentials));
        }
        let mut members = Vec::with_capacity(endpoints.len());
        for member in endpoints {
            let channel = connect_channel_lazy(&member, options)?;
            members.push(Member {
                reader: reader(channel, credentials.clone()),
                endpoint: member,
                health: Health::default(),
            });
        }
        Ok(Self { members: Arc::new(members), endpoint: endpoint.to_owned(), job: None })
    }

    /// Uses an existing channel (custom windows); `endpoint` names it in errors.
    pub fn from_channel(channel: Channel, endpoint: &str) -> Self {
        Self::from_channel_with(channel, endpoint, Credentials::default())
    }

    /// Uses an existing channel and sends `credentials` with every request.
    pub fn from_channel_with(channel: Channel, endpoint: &str, credentials: Credentials) -> Self {
        let member = Member {
            endpoint: endpoint.to_owned(),
            reader: reader(channel, credentials),
            health: Health::default(),
        };
        Self { members: Arc::new(vec![member]), endpoint: endpoint.to_owned(), job: None }
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

    /// The members' endpoints, in the order given.
    pub fn members(&self) -> Vec<&str> {
        self.members.iter().map(|m| m.endpoint.as_str()).collect()
    }

    /// The members in the order they own `dataset/shard` (the owner first), as indices
    /// into [`Client::members`].
    pub fn owners(&self, dataset: &str, shard: &str) -> Vec<usize> {
        let names: Vec<(&str, f64)> = self.members.iter().map(|m| (m.endpoint.as_str(), 1.0)).collect();
        group::rendezvous(&names, dataset, shard)
    }

    /// Whom to try for `dataset/shard` (or, for `None`, a call about no one shard): the
    /// live members first, owners first, leaving out `tried`.
    fn route(&self, shard: Option<(&str, &str)>, tried: &[usize]) -> Vec<usize> {
        let order = match shard {
            Some((dataset, shard)) => self.owners(dataset, shard),
            None => (0..self.members.len()).collect(),
        };
        let order = order.into_iter().filter(|i| !tried.contains(i)).collect();
        group::live_first(order, |i| self.members[i].health.is_live())
    }

    /// Runs `call` on the members of `route` in turn until one answers: a member's
    /// failure (down, unreachable, shedding, garbled) sends the call to the next and
    /// pauses the member; any other error is the answer. One member: one try.
    async fn on_members<T, F, Fut>(&self, route: Vec<usize>, call: F) -> Result<T>
    where
        F: Fn(usize) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut last = None;
        for i in route {
            let member = &self.members[i];
            match call(i).await {
                Ok(answer) => {
                    member.health.answered();
                    return Ok(answer);
                }
                Err(e) if self.members.len() > 1 && member_failed(&e) => {
                    member.health.failed();
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Config("the client has no members to ask".into())))
    }

    /// Every dataset the server has.
    pub async fn list_datasets(&self) -> Result<Vec<DatasetInfo>> {
        self.on_members(self.route(None, &[]), |i| async move {
            let m = &self.members[i];
            let response = m.reader.clone().list_datasets(ListDatasetsRequest {}).await;
            Ok(response.map_err(|s| m.status(s))?.into_inner().datasets)
        })
        .await
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
        self.on_members(self.route(None, &[]), |i| {
            let (m, request) = (&self.members[i], request.clone());
            async move { Ok(m.reader.clone().list_shards(request).await.map_err(|s| m.status(s))?.into_inner()) }
        })
        .await
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

    /// Size, version and chunk size of one shard (from its owner in a group).
    pub async fn stat(&self, dataset: &str, shard: &str) -> Result<ShardInfo> {
        let request = StatShardRequest { dataset: dataset.to_owned(), shard: shard.to_owned() };
        self.on_members(self.route(Some((dataset, shard)), &[]), |i| {
            let (m, request) = (&self.members[i], request.clone());
            async move { Ok(m.reader.clone().stat_shard(request).await.map_err(|s| m.status(s))?.into_inner()) }
        })
        .await
    }

    /// Reads one range in one call (at most the server's `--max-read`).
    pub async fn read_range(&self, range: &Range) -> Result<Verified> {
        self.on_members(self.route(Some((&range.dataset, &range.shard)), &[]), |i| async move {
            let m = &self.members[i];
            let request = self.read_request(range.to_request());
            let chunk = m.reader.clone().read_range(request).await.map_err(|s| m.status(s))?;
            m.verify(range, chunk.into_inner())
        })
        .await
    }

    /// Reads many ranges in one round trip; results are in the order of `ranges`. In a
    /// group, the batch is split by owner, the parts read at once and put back in order.
    pub async fn read_ranges(&self, ranges: &[Range]) -> Result<Vec<Verified>> {
        let all: Vec<usize> = (0..ranges.len()).collect();
        let mut verified: Vec<Option<Verified>> = vec![None; ranges.len()];
        for (i, read) in self.read_parts(ranges, all, Vec::new()).await? {
            verified[i] = Some(read);
        }
        // Every slot is filled (each part answers for all its ranges, or the call fails);
        // an empty one would be a bug here, and is an error rather than empty data.
        let verified: Vec<Verified> = verified
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                v.ok_or_else(|| protocol(&self.endpoint, format!("range {i} of the batch went unanswered")))
            })
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

    /// Ranges `wanted` (indices into `ranges`) from their owners, leaving out the members
    /// in `tried`; a part whose member fails is read again from the next members.
    fn read_parts<'a>(
        &'a self,
        ranges: &'a [Range],
        wanted: Vec<usize>,
        tried: Vec<usize>,
    ) -> futures::future::BoxFuture<'a, Result<Vec<(usize, Verified)>>> {
        Box::pin(async move {
            let mut parts: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
            for i in wanted {
                let r = &ranges[i];
                let Some(&member) = self.route(Some((&r.dataset, &r.shard)), &tried).first() else {
                    return Err(Error::Config("every member of the group failed this read".into()));
                };
                parts.entry(member).or_default().push(i);
            }
            let reads = parts.into_iter().map(|(member, indices)| {
                let tried = tried.clone();
                async move {
                    let m = &self.members[member];
                    match m
                        .read_batch(self.read_request(ReadRangesRequest::default()), ranges, &indices)
                        .await
                    {
                        Ok(read) => {
                            m.health.answered();
                            Ok(indices.into_iter().zip(read).collect::<Vec<_>>())
                        }
                        Err(e) if self.members.len() > tried.len() + 1 && member_failed(&e) => {
                            m.health.failed();
                            let tried = tried.into_iter().chain([member]).collect();
                            self.read_parts(ranges, indices, tried).await
                        }
                        Err(e) => Err(e),
                    }
                }
            });
            Ok(futures::future::try_join_all(reads).await?.into_iter().flatten().collect())
        })
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
        let expected = (!expected_version.is_empty()).then_some(expected_version);
        let end = offset.saturating_add(length);
        let (stream, member) =
            self.open_stream(dataset, shard, offset, end, expected.as_deref(), &[]).await?;
        Ok(ShardStream {
            endpoint: self.members[member].endpoint.clone(),
            shard: format!("{dataset}/{shard}"),
            stream,
            next_offset: offset,
            end,
            version: expected,
            resume: Resume {
                client: self.clone(),
                dataset: dataset.to_owned(),
                shard: shard.to_owned(),
                tried: vec![member],
            },
        })
    }

    /// A `StreamShard` of `[offset, end)` from the shard's owner (or the next member),
    /// leaving out `tried`; with the member that answered.
    pub(crate) async fn open_stream(
        &self,
        dataset: &str,
        shard: &str,
        offset: u64,
        end: u64,
        expected_version: Option<&str>,
        tried: &[usize],
    ) -> Result<(tonic::Streaming<Chunk>, usize)> {
        let request = StreamShardRequest {
            dataset: dataset.to_owned(),
            shard: shard.to_owned(),
            offset,
            length: Some(end - offset),
            expected_version: expected_version.unwrap_or_default().to_owned(),
        };
        self.on_members(self.route(Some((dataset, shard)), tried), |i| {
            let (m, request) = (&self.members[i], self.read_request(request.clone()));
            async move {
                let stream = m.reader.clone().stream_shard(request).await.map_err(|s| m.status(s))?;
                Ok((stream.into_inner(), i))
            }
        })
        .await
    }
}

/// Whether `error` says the member failed (rather than the request): worth asking the
/// next member of a group.
pub(crate) fn member_failed(error: &Error) -> bool {
    use tonic::Code;
    match error {
        Error::Status { status, .. } => matches!(
            status.code(),
            Code::Unavailable
                | Code::Unknown
                | Code::DeadlineExceeded
                | Code::ResourceExhausted
                | Code::Cancelled
        ),
        Error::Connect { .. } | Error::Checksum { .. } | Error::Protocol { .. } => true,
        Error::Config(_) | Error::Endpoint { .. } | Error::VersionChanged { .. } => false,
    }
}

fn reader(channel: Channel, credentials: Credentials) -> ShardReaderClient<AuthChannel> {
    ShardReaderClient::with_interceptor(channel, credentials).max_decoding_message_size(MAX_RESPONSE_BYTES)
}

impl Member {
    fn status(&self, status: tonic::Status) -> Error {
        Error::Status { endpoint: self.endpoint.clone(), status }
    }

    fn protocol(&self, detail: String) -> Error {
        protocol(&self.endpoint, detail)
    }

    /// `ranges[indices]` in one `ReadRanges` call, verified; `request` carries the
    /// call's headers.
    async fn read_batch(
        &self,
        mut request: tonic::Request<ReadRangesRequest>,
        ranges: &[Range],
        indices: &[usize],
    ) -> Result<Vec<Verified>> {
        request.get_mut().ranges = indices.iter().map(|&i| ranges[i].to_request()).collect();
        let chunks =
            self.reader.clone().read_ranges(request).await.map_err(|s| self.status(s))?.into_inner().chunks;
        if chunks.len() != indices.len() {
            return Err(self.protocol(format!("{} chunks for {} ranges", chunks.len(), indices.len())));
        }
        indices.iter().zip(chunks).map(|(&i, chunk)| self.verify(&ranges[i], chunk)).collect()
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
        checked(&self.endpoint, chunk)
    }
}

pub(crate) fn protocol(endpoint: &str, detail: String) -> Error {
    Error::Protocol { endpoint: endpoint.to_owned(), detail }
}

/// `chunk` as verified bytes, or the CRC32C mismatch `endpoint` sent.
pub(crate) fn checked(endpoint: &str, chunk: Chunk) -> Result<Verified> {
    checksum::verify(chunk.offset, &chunk.data, chunk.crc32c)
        .map_err(|source| Error::Checksum { endpoint: endpoint.to_owned(), source })?;
    Ok(Verified { offset: chunk.offset, data: chunk.data, version: chunk.version })
}
