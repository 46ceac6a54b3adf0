//! [`Client`]: verified reads from a hub or a spoke (they serve the same API).
//!
//! Every chunk is checked before it is handed out (`verify`): CRC32C against its bytes,
//! offset and length against what was asked, and one version across all chunks of a
//! read. A read that cannot be verified is an [`Error`], never data. Streams of any
//! size are `stream.rs`'s.

use std::sync::Arc;
use tracing::Instrument as _;

use shardcache_proto::{
    encoding,
    v1::{
        DatasetInfo, ListDatasetsRequest, ListShardsRequest, ListShardsResponse, ReadRangesRequest,
        ShardInfo, StatShardRequest, shard_reader_client::ShardReaderClient,
    },
};
use shardcache_proto::{
    hedge::AVOID_HEADER,
    job_headers::{EPOCH_HEADER, INDEX_READ_HEADER, JOB_HEADER, check_job_name},
};
use tonic::metadata::{Ascii, MetadataValue};

use shardcache_transport::liveness::LiveChannel;

use shardcache_routing::{
    HedgeCounters, HedgePolicy, Router,
    members::{MemberSpec, Members, Slot},
};

use crate::{
    ConnectOptions, Credentials, Error, Range, Result,
    connect::AuthChannel,
    discovery,
    local::{DoorSlot, Through},
    verify::{self, Verified},
};

/// Largest response the SDK accepts: the hub's largest `--max-read` (64 MiB) plus room
/// for per-chunk framing of a `ReadRanges` batch.
pub const MAX_RESPONSE_BYTES: usize = 80 << 20;

/// A listing, and whether it may be out of date or incomplete: a spoke answers from
/// what it has cached when its hub cannot answer
/// ([`STALE_METADATA`](shardcache_proto::STALE_METADATA)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed<T> {
    pub items: Vec<T>,
    pub stale: bool,
}

/// Whether the server marked `response` as answered from what it had seen.
fn is_stale<T>(response: &tonic::Response<T>) -> bool {
    response.metadata().get(shardcache_proto::STALE_METADATA).is_some()
}

/// The span of one member's call (when traces are exported): which member, and whether
/// it was a hedge or a failover (`attempt` > 0: members were asked before it).
fn ask_span(member: &ServerSlot, attempt: usize) -> tracing::Span {
    shardcache_transport::telemetry::traced(
        || tracing::info_span!("shardcache.ask", member = %member.url, attempt, otel.kind = "client"),
    )
}

/// Whether a member answered with bytes of the owner it joined (a hedge that cost the
/// owner no race: `shardcache_proto::hedge::RELAYED_HEADER`).
fn is_relayed<T>(response: &tonic::Response<T>) -> bool {
    response.metadata().get(shardcache_proto::hedge::RELAYED_HEADER).is_some()
}

/// One server of a client: a hub, a spoke, or a member of a group of spokes.
pub(crate) type ServerSlot = Slot<Conn>;

/// What talks to a member: its read API, and its health (asked while it is failing).
#[derive(Debug, Clone)]
pub(crate) struct Conn {
    reader: ShardReaderClient<AuthChannel>,
    health: discovery::HealthClient,
    /// The member's same-node door, once one of its answers names it (`local/`).
    pub(crate) door: Arc<DoorSlot>,
    /// The token, for the door's questions (gRPC calls get it from the channel).
    credentials: Credentials,
}

/// A connection to a shardcache server, or to a group of spokes (`URL1,URL2,...`,
/// `file:PATH` or `dns+http://NAME:PORT`: see [`crate::discovery`]): each shard is read
/// from its owner (`routing`: rendezvous hashing), from the next member in its order
/// when the owner fails, and from the next as well when the owner has not answered
/// within its hedge delay. Cheap to clone; clones share the connections.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) router: Arc<Router<Conn>>,
    /// What the client was made with (one URL, or the group's list).
    endpoint: String,
    /// The job and epoch headers reads carry ([`Client::for_job`]).
    job: Option<(MetadataValue<Ascii>, MetadataValue<Ascii>)>,
    /// Reads are of a format's index ([`Client::for_index`]).
    index_read: bool,
    /// Reads ask for the bytes as they are, never compressed ([`Client::plain`]).
    plain: bool,
    /// Reads may go through a member's same-node door (`local/`); see [`Client::over_grpc`].
    pub(crate) door: bool,
}

impl Client {
    /// Connects to `endpoint`, e.g. `http://127.0.0.1:7070`, without credentials; a
    /// comma-separated list is a group of spokes.
    pub async fn connect(endpoint: &str) -> Result<Self> {
        Self::connect_with(endpoint, &ConnectOptions::default()).await
    }

    /// Connects to `endpoint` (`https://` for TLS) with `options`' certificates and token.
    /// A group connects to each member when first used, so a member that is down does
    /// not keep a client from starting; a `file:` or `dns+` group is kept current.
    pub async fn connect_with(endpoint: &str, options: &ConnectOptions) -> Result<Self> {
        let credentials = Credentials::token(options.token.as_deref())?;
        let connected = discovery::connect_one_or_group(endpoint, options, move |channel| {
            Conn::new(channel, credentials.clone(), true)
        })
        .await?;
        if connected.group {
            discovery::probe_failed(&connected.members, |conn: &Conn| discovery::serving(&conn.health));
        }
        Ok(Self::with_members(connected.members, &connected.name))
    }

    /// Uses an existing channel (custom windows); `endpoint` names it in errors. A tonic
    /// `Channel` is used as it is; a [`LiveChannel`] made by this SDK's connectors keeps
    /// its calls from outliving its connections.
    pub fn from_channel(channel: impl Into<LiveChannel>, endpoint: &str) -> Self {
        Self::from_channel_with(channel, endpoint, Credentials::default())
    }

    /// Uses an existing channel and sends `credentials` with every request. Reads go
    /// over that channel only, never through a spoke's same-node door (`local/`): a
    /// spoke's clients of its hubs and peers are such clients, and a member of a group
    /// on the same machine as another (a test, a demo) reads it as across nodes.
    pub fn from_channel_with(
        channel: impl Into<LiveChannel>,
        endpoint: &str,
        credentials: Credentials,
    ) -> Self {
        let one = [MemberSpec::new(endpoint)];
        let mut conn = Some(Conn::new(channel.into(), credentials, false));
        let members = Members::new(&one, |_| conn.take().ok_or(())).unwrap_or_else(|()| unreachable!());
        Self::with_members(Arc::new(members), endpoint)
    }

    fn with_members(members: Arc<Members<Conn>>, endpoint: &str) -> Self {
        let router = Router::new(members, HedgePolicy::MEMBERS, Arc::default());
        Self {
            router: Arc::new(router),
            endpoint: endpoint.to_owned(),
            job: None,
            index_read: false,
            plain: false,
            door: true,
        }
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

    /// This client for reads of a dataset format's index (headers, offset tables): a
    /// spoke neither reads ahead nor fetches the rest of their shards for them
    /// (`shardcache_proto::job_headers::INDEX_READ_HEADER`); not the job's reads ([`Client::untagged`]).
    pub fn for_index(&self) -> Self {
        Self { index_read: true, ..self.untagged() }
    }

    /// This client asking for bytes as they are: by default reads say they take zstd
    /// (`shardcache-accept-encoding`), and a hub compresses what pays on the link.
    pub fn plain(&self) -> Self {
        Self { plain: true, ..self.clone() }
    }

    /// This client reading over gRPC only, never through a spoke's same-node door (a
    /// bench's gRPC rows; see [`crate::local`] for the environment variable that turns
    /// the door off for a whole process).
    pub fn over_grpc(&self) -> Self {
        Self { door: false, ..self.clone() }
    }

    /// This client saying its reads take zstd again (undoes [`Client::plain`]).
    pub fn compressing(&self) -> Self {
        Self { plain: false, ..self.clone() }
    }

    /// This client without its job (`for_job`): reads that are no step of the job's
    /// plan (opening a dataset's index) are neither counted as its reads nor move it.
    pub fn untagged(&self) -> Self {
        Self { job: None, ..self.clone() }
    }

    /// `message` as a read request, with the job headers when there are any, and the
    /// members `asked` before this one (a hedge or a failover: see
    /// `shardcache_proto::hedge`).
    pub(crate) fn read_request<T>(&self, message: T, asked: &[Arc<ServerSlot>]) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some((job, epoch)) = &self.job {
            request.metadata_mut().insert(JOB_HEADER, job.clone());
            request.metadata_mut().insert(EPOCH_HEADER, epoch.clone());
        }
        if self.index_read {
            request.metadata_mut().insert(INDEX_READ_HEADER, MetadataValue::from_static("1"));
        }
        if !self.plain {
            request
                .metadata_mut()
                .insert(encoding::ACCEPT_ENCODING_HEADER, MetadataValue::from_static(encoding::ZSTD));
        }
        if !asked.is_empty() {
            let urls: Vec<&str> = asked.iter().map(|m| m.url.as_str()).collect();
            if let Ok(value) = urls.join(",").parse() {
                request.metadata_mut().insert(AVOID_HEADER, value);
            }
        }
        request
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The members' endpoints now, in the order given.
    pub fn members(&self) -> Vec<String> {
        self.router.members().current().iter().map(|m| m.url.clone()).collect()
    }

    /// The members skipped now: they failed a call and have not answered a health
    /// check since, or they were demoted for losing their hedges and no call has found
    /// them answering first since (on probation, one call at a time tries them).
    pub fn failing_members(&self) -> Vec<String> {
        let list = self.router.members().current();
        list.iter().filter(|m| m.health.is_suspect()).map(|m| m.url.clone()).collect()
    }

    /// What hedging has done: hedges sent, hedges that answered first, members demoted.
    pub fn hedges(&self) -> &HedgeCounters {
        self.router.counters()
    }

    /// The members' endpoints in the order they own `dataset/shard` now (the owner
    /// first).
    pub fn owners(&self, dataset: &str, shard: &str) -> Vec<String> {
        self.router.ranked(Some((dataset, shard))).iter().map(|m| m.url.clone()).collect()
    }

    /// Asks the members of `route` in turn (hedged: `routing`): a member's failure
    /// (down, unreachable, shedding, garbled) sends the call to the next and pauses the
    /// member; any other error is the answer. `call(asked, member)` asks `member`, the
    /// members in `asked` having been asked before it.
    pub(crate) async fn on_members<T, F, Fut>(&self, route: &[Arc<ServerSlot>], mut call: F) -> Result<T>
    where
        F: FnMut(&[Arc<ServerSlot>], Arc<ServerSlot>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        self.router
            .call(route, |i, member| call(&route[..i], member.clone()).instrument(ask_span(member, i)))
            .await
            .map_err(|e| e.unwrap_or_else(|| Error::Config("the client has no members to ask".into())))
    }

    /// [`Client::on_members`] for reads whose answer says whether it was relayed from the
    /// member asked first (`call` answers `(answer, relayed)`: see
    /// `shardcache_proto::hedge::RELAYED_HEADER`).
    async fn on_members_relayed<T, F, Fut>(&self, route: &[Arc<ServerSlot>], mut call: F) -> Result<T>
    where
        F: FnMut(&[Arc<ServerSlot>], Arc<ServerSlot>) -> Fut,
        Fut: std::future::Future<Output = Result<(T, bool)>>,
    {
        self.router
            .call_relayed(
                route,
                |i, member| call(&route[..i], member.clone()).instrument(ask_span(member, i)),
                |(_, relayed)| *relayed,
            )
            .await
            .map(|(answer, _)| answer)
            .map_err(|e| e.unwrap_or_else(|| Error::Config("the client has no members to ask".into())))
    }

    /// Every dataset the server has.
    pub async fn list_datasets(&self) -> Result<Vec<DatasetInfo>> {
        Ok(self.list_datasets_marked().await?.items)
    }

    /// Every dataset the server has, and whether a spoke answered from its cache because
    /// its hub could not answer ([`Listed::stale`]).
    pub async fn list_datasets_marked(&self) -> Result<Listed<DatasetInfo>> {
        self.on_members(&self.router.route(None, &[]), |_, m| async move {
            let response = m.reader().list_datasets(ListDatasetsRequest {}).await.map_err(|s| m.status(s))?;
            let stale = is_stale(&response);
            Ok(Listed { items: response.into_inner().datasets, stale })
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
        Ok(self.list_shards_page_marked(dataset, page_size, page_token).await?.0)
    }

    /// [`Client::list_shards_page`], and whether the page is stale.
    async fn list_shards_page_marked(
        &self,
        dataset: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<(ListShardsResponse, bool)> {
        let request =
            ListShardsRequest { dataset: dataset.to_owned(), page_size, page_token: page_token.to_owned() };
        self.on_members(&self.router.route(None, &[]), |_, m| {
            let request = request.clone();
            async move {
                let response = m.reader().list_shards(request).await.map_err(|s| m.status(s))?;
                let stale = is_stale(&response);
                Ok((response.into_inner(), stale))
            }
        })
        .await
    }

    /// Every shard of `dataset`, following pages to the end.
    pub async fn list_shards(&self, dataset: &str) -> Result<Vec<ShardInfo>> {
        Ok(self.list_shards_marked(dataset).await?.items)
    }

    /// Every shard of `dataset`, and whether any page was answered from a spoke's cache
    /// (then shards never read through that spoke are missing).
    pub async fn list_shards_marked(&self, dataset: &str) -> Result<Listed<ShardInfo>> {
        let mut listed = Listed { items: Vec::new(), stale: false };
        let mut page_token = String::new();
        loop {
            let (page, stale) = self.list_shards_page_marked(dataset, 0, &page_token).await?;
            listed.items.extend(page.shards);
            listed.stale |= stale;
            if page.next_page_token.is_empty() {
                return Ok(listed);
            }
            page_token = page.next_page_token;
        }
    }

    /// Size, version and chunk size of one shard (from its owner in a group).
    pub async fn stat(&self, dataset: &str, shard: &str) -> Result<ShardInfo> {
        let request = StatShardRequest { dataset: dataset.to_owned(), shard: shard.to_owned() };
        self.on_members(&self.router.route(Some((dataset, shard)), &[]), |_, m| {
            let request = request.clone();
            async move {
                let info = m.reader().stat_shard(request).await.map_err(|s| m.status(s))?;
                m.conn.door.heard(info.metadata());
                Ok(info.into_inner())
            }
        })
        .await
    }

    /// Reads one range in one call (at most the server's `--max-read`).
    pub async fn read_range(&self, range: &Range) -> Result<Verified> {
        self.on_members_relayed(&self.router.route(Some((&range.dataset, &range.shard)), &[]), |asked, m| {
            let request = self.read_request(range.to_request(), asked);
            async move {
                if self.door
                    && let Through::Read(mut read) = through_door(&m, request.metadata(), &[range]).await?
                    && let Some(read) = read.pop()
                {
                    return Ok((read, false));
                }
                let chunk = m.reader().read_range(request).await.map_err(|s| m.status(s))?;
                m.conn.door.heard(chunk.metadata());
                let relayed = is_relayed(&chunk);
                Ok((verify::range(&m.url, range, chunk.into_inner())?, relayed))
            }
        })
        .await
    }

    /// Reads many ranges in one round trip; results are in the order of `ranges`. In a
    /// group, the batch is split by owner, the parts read at once and put back in order;
    /// a part whose owner fails (or is late) is read from the next member of its first
    /// range's order.
    pub async fn read_ranges(&self, ranges: &[Range]) -> Result<Vec<Verified>> {
        let mut parts: std::collections::BTreeMap<String, (Vec<Arc<ServerSlot>>, Vec<usize>)> =
            Default::default();
        for (i, r) in ranges.iter().enumerate() {
            let route = self.router.route(Some((&r.dataset, &r.shard)), &[]);
            let Some(owner) = route.first() else {
                return Err(Error::Config("the client has no members to ask".into()));
            };
            parts.entry(owner.url.clone()).or_insert_with(|| (route.clone(), Vec::new())).1.push(i);
        }
        let reads = parts.into_values().map(|(route, indices)| async move {
            let read = self
                .on_members_relayed(&route, |asked, m| {
                    let request = self.read_request(ReadRangesRequest::default(), asked);
                    let indices = &indices;
                    async move { read_batch(&m, request, ranges, indices, self.door).await }
                })
                .await?;
            Ok::<_, Error>(indices.into_iter().zip(read).collect::<Vec<_>>())
        });
        let mut verified: Vec<Option<Verified>> = vec![None; ranges.len()];
        for (i, read) in futures::future::try_join_all(reads).await?.into_iter().flatten() {
            verified[i] = Some(read);
        }
        // Every slot is filled (each part answers for all its ranges, or the call fails);
        // an empty one would be a bug here, and is an error rather than empty data.
        let verified: Vec<Verified> = verified
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                v.ok_or_else(|| {
                    verify::protocol(&self.endpoint, format!("range {i} of the batch went unanswered"))
                })
            })
            .collect::<Result<_>>()?;
        // Every range of one shard was read at one version: a batch never mixes two.
        let mut versions: std::collections::HashMap<(&str, &str), &str> = std::collections::HashMap::new();
        for (range, read) in ranges.iter().zip(&verified) {
            let first = *versions.entry((&range.dataset, &range.shard)).or_insert(&read.version);
            verify::same_version(&format!("{}/{}", range.dataset, range.shard), first, &read.version)?;
        }
        Ok(verified)
    }
}

impl Conn {
    /// The most a call through the member's same-node door may read, when it has one
    /// open (opened now if it was named).
    pub(crate) async fn door_at_hand(&self, url: &str) -> Option<u64> {
        Some(self.door.door(url, self.credentials.bearer()).await?.max_read)
    }

    /// A member's connection; `door`: its same-node door may be used once it names one.
    fn new(channel: LiveChannel, credentials: Credentials, door: bool) -> Self {
        let reader = ShardReaderClient::with_interceptor(channel.clone(), credentials.clone())
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        let health = discovery::HealthClient::new(channel);
        let door = Arc::new(if door { DoorSlot::default() } else { DoorSlot::never() });
        Self { reader, health, door, credentials }
    }
}

/// What the client asks of one member (a routing `Slot`, so a trait rather than methods
/// of its own).
pub(crate) trait Ask {
    /// Its read API.
    fn reader(&self) -> ShardReaderClient<AuthChannel>;
    /// `status` as this member's answer.
    fn status(&self, status: tonic::Status) -> Error;
}

impl Ask for ServerSlot {
    fn reader(&self) -> ShardReaderClient<AuthChannel> {
        self.conn.reader.clone()
    }

    fn status(&self, status: tonic::Status) -> Error {
        Error::Status { endpoint: self.url.clone(), status }
    }
}

/// `ranges` read through `member`'s same-node door when it has one at hand (`local/`);
/// [`Through::Grpc`]: read them over gRPC. A door that breaks is not used again.
pub(crate) async fn through_door(
    member: &ServerSlot,
    metadata: &tonic::metadata::MetadataMap,
    ranges: &[&Range],
) -> Result<Through> {
    let bearer = member.conn.credentials.bearer();
    let Some(door) = member.conn.door.door(&member.url, bearer).await else { return Ok(Through::Grpc) };
    match door.read(&member.url, metadata, bearer, ranges).await? {
        Through::Broken => {
            member.conn.door.shut();
            Ok(Through::Grpc)
        }
        through => Ok(through),
    }
}

/// `ranges[indices]` in one `ReadRanges` call to `member` (through its same-node door
/// first, where `door` and it has one), verified; `request` carries the call's headers.
async fn read_batch(
    member: &ServerSlot,
    mut request: tonic::Request<ReadRangesRequest>,
    ranges: &[Range],
    indices: &[usize],
    door: bool,
) -> Result<(Vec<Verified>, bool)> {
    let asked: Vec<&Range> = indices.iter().map(|&i| &ranges[i]).collect();
    if door && let Through::Read(read) = through_door(member, request.metadata(), &asked).await? {
        return Ok((read, false));
    }
    request.get_mut().ranges = asked.iter().map(|r| r.to_request()).collect();
    let response = member.reader().read_ranges(request).await.map_err(|s| member.status(s))?;
    member.conn.door.heard(response.metadata());
    let relayed = is_relayed(&response);
    let chunks = response.into_inner().chunks;
    if chunks.len() != indices.len() {
        let detail = format!("{} chunks for {} ranges", chunks.len(), indices.len());
        return Err(verify::protocol(&member.url, detail));
    }
    let read: Result<Vec<Verified>> =
        indices.iter().zip(chunks).map(|(&i, chunk)| verify::range(&member.url, &ranges[i], chunk)).collect();
    Ok((read?, relayed))
}
