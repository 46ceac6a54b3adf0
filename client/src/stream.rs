//! [`ShardStream`]: a verified `StreamShard`. Every message is checked (offset, length,
//! CRC32C, one version across the stream); in a group of spokes, a member that fails
//! mid-stream is replaced by the next member in the shard's order, from where it stopped
//! and at the version already read.

use shardcache_proto::{
    encoding,
    v1::{Chunk, StreamShardRequest},
};
use shardcache_routing::{Judged, Verdict};

use std::{collections::VecDeque, sync::Arc};

use crate::{
    Error, Range, Result,
    client::{Ask, Client, ServerSlot, through_door},
    local::Through,
    verify::{self, Verified, checked, decoded, protocol},
};

/// The client's streams: a shard or a range of any size, chunk by chunk.
impl Client {
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
        self.stream_pinned(dataset, shard, offset, length, expected).await
    }

    /// Streams `range` (any size), at its `expected_version` when it names one: the
    /// server refuses a changed shard with ABORTED, and every message is checked.
    pub async fn stream_range(&self, range: &Range) -> Result<ShardStream> {
        let expected = range.expected_version.clone();
        self.stream_pinned(&range.dataset, &range.shard, range.offset, range.length, expected).await
    }

    async fn stream_pinned(
        &self,
        dataset: &str,
        shard: &str,
        offset: u64,
        length: u64,
        expected: Option<String>,
    ) -> Result<ShardStream> {
        let end = offset.saturating_add(length);
        let resume = |member: &str| Resume {
            client: self.clone(),
            dataset: dataset.to_owned(),
            shard: shard.to_owned(),
            tried: vec![member.to_owned()],
        };
        // The owner's same-node door, when it has one at hand: read piece by piece there.
        if self.door
            && let Some(owner) = self.router.route(Some((dataset, shard)), &[]).first()
            && let Some(max_read) = owner.conn.door_at_hand(&owner.url).await
            && max_read >= DOOR_PIECE_MIN
        {
            let piece = max_read.min(DOOR_PIECE) / DOOR_PIECE_MIN * DOOR_PIECE_MIN;
            let metadata = self.read_request((), &[]).into_parts().0;
            return Ok(ShardStream {
                endpoint: owner.url.clone(),
                shard: format!("{dataset}/{shard}"),
                stream: None,
                door: Some(DoorStream {
                    member: owner.clone(),
                    metadata,
                    ahead: VecDeque::new(),
                    next_ask: offset,
                    piece,
                }),
                next_offset: offset,
                end,
                version: expected,
                resume: resume(&owner.url),
            });
        }
        let (stream, member) =
            self.open_stream(dataset, shard, offset, end, expected.as_deref(), &[]).await?;
        Ok(ShardStream {
            endpoint: member.clone(),
            shard: format!("{dataset}/{shard}"),
            stream: Some(stream),
            door: None,
            next_offset: offset,
            end,
            version: expected,
            resume: resume(&member),
        })
    }

    /// A `StreamShard` of `[offset, end)` from the shard's owner (or the next member),
    /// leaving out `tried`; with the member that answered.
    async fn open_stream(
        &self,
        dataset: &str,
        shard: &str,
        offset: u64,
        end: u64,
        expected_version: Option<&str>,
        tried: &[String],
    ) -> Result<(tonic::Streaming<Chunk>, String)> {
        let request = StreamShardRequest {
            dataset: dataset.to_owned(),
            shard: shard.to_owned(),
            offset,
            length: Some(end - offset),
            expected_version: expected_version.unwrap_or_default().to_owned(),
        };
        self.on_members(&self.router.route(Some((dataset, shard)), tried), |asked, m| {
            let request = self.read_request(request.clone(), asked);
            async move {
                let stream = m.reader().stream_shard(request).await.map_err(|s| m.status(s))?;
                m.conn.door.heard(stream.metadata());
                Ok((stream.into_inner(), m.url.clone()))
            }
        })
        .await
    }
}

/// A verified stream of a shard's chunks, from [`Client::stream_shard`].
#[derive(Debug)]
pub struct ShardStream {
    /// The member streaming it.
    pub(crate) endpoint: String,
    pub(crate) shard: String,
    /// The `StreamShard` it reads; `None` while it reads through a same-node door.
    pub(crate) stream: Option<tonic::Streaming<Chunk>>,
    pub(crate) door: Option<DoorStream>,
    pub(crate) next_offset: u64,
    pub(crate) end: u64,
    pub(crate) version: Option<String>,
    /// What it takes to go on from the next member of a group when this one fails.
    pub(crate) resume: Resume,
}

/// A stream's client, shard and the members it has tried.
#[derive(Debug)]
pub(crate) struct Resume {
    pub(crate) client: Client,
    pub(crate) dataset: String,
    pub(crate) shard: String,
    /// Endpoints of the members it has tried.
    pub(crate) tried: Vec<String>,
}

/// A stream read through its owner's same-node door (`local/`): pieces of up to
/// [`DOOR_PIECE`] bytes (ending on their multiples), [`DOOR_AHEAD`] asked at once.
#[derive(Debug)]
pub(crate) struct DoorStream {
    member: Arc<ServerSlot>,
    /// The read's headers (its job, its epoch).
    metadata: tonic::metadata::MetadataMap,
    ahead: VecDeque<tokio::task::JoinHandle<Result<Through>>>,
    /// Where the next piece to ask for starts.
    next_ask: u64,
    /// Bytes per piece: [`DOOR_PIECE`], or less where the spoke's `--max-read` is less.
    piece: u64,
}

/// Bytes a stream reads through a door per call, where the spoke's `--max-read` allows:
/// node-bench's door rows read 2.3 GB/s with 1 MiB pieces and 3.4 GB/s with 4 MiB with
/// one reader (fewer calls: less of the spoke's and the reader's time per byte).
const DOOR_PIECE: u64 = 4 << 20;
/// The least: the gRPC stream's message size (a spoke's `--max-read` is at least that).
const DOOR_PIECE_MIN: u64 = 1 << 20;
/// Pieces asked ahead of the reader: one being read while the reader takes another.
const DOOR_AHEAD: usize = 2;

impl Drop for DoorStream {
    fn drop(&mut self) {
        for piece in &self.ahead {
            piece.abort();
        }
    }
}

impl DoorStream {
    /// The next piece, asking for more ahead; `None`: read the rest over gRPC.
    async fn next(&mut self, shard: &Resume, end: u64, version: Option<&str>) -> Result<Option<Verified>> {
        while self.ahead.len() < DOOR_AHEAD && self.next_ask < end {
            let length = (self.piece - self.next_ask % self.piece).min(end - self.next_ask);
            let mut range = Range::new(shard.dataset.as_str(), shard.shard.as_str(), self.next_ask, length);
            range.expected_version = version.map(str::to_owned);
            let (member, metadata) = (self.member.clone(), self.metadata.clone());
            self.ahead
                .push_back(tokio::spawn(async move { through_door(&member, &metadata, &[&range]).await }));
            self.next_ask += length;
        }
        let Some(piece) = self.ahead.pop_front() else { return Ok(None) };
        let through = piece
            .await
            .map_err(|e| Error::Config(format!("a read through the same-node door failed: {e}")))?;
        match through? {
            Through::Read(mut read) => Ok(read.pop()),
            Through::Grpc | Through::Broken => Ok(None),
        }
    }
}

impl ShardStream {
    /// The next verified chunk; `Ok(None)` once the whole range has arrived.
    pub async fn next_chunk(&mut self) -> Result<Option<Verified>> {
        if let Some(door) = &mut self.door
            && self.next_offset < self.end
        {
            match door.next(&self.resume, self.end, self.version.as_deref()).await? {
                Some(read) => return self.door_piece(read).map(Some),
                // Not stored (or the door broke): the rest over gRPC, at the version read.
                None => self.leave_door().await?,
            }
        }
        if self.door.is_some() {
            // The whole range came through the door.
            return Ok(None);
        }
        let chunk = loop {
            let Some(stream) = &mut self.stream else { return Ok(None) };
            let message = stream.message().await;
            match message.map_err(|status| Error::Status { endpoint: self.endpoint.clone(), status }) {
                Ok(chunk) => break chunk,
                Err(e) => self.resume_after(e).await?,
            }
        };
        let endpoint = &self.endpoint;
        let Some(chunk) = chunk else {
            if self.next_offset != self.end {
                return Err(protocol(
                    endpoint,
                    format!(
                        "stream of {} ended at offset {} before the end of the range at {}",
                        self.shard, self.next_offset, self.end
                    ),
                ));
            }
            return Ok(None);
        };
        // A message decodes to at most the rest of the range, and to at most the largest
        // message a server sends: a frame claiming more is refused before any allocation.
        let most = self.end.saturating_sub(self.next_offset).min(encoding::MAX_MESSAGE);
        let (chunk, wire_len) = decoded(endpoint, chunk, most)?;
        let len = chunk.data.len() as u64;
        if chunk.offset != self.next_offset || len == 0 || self.next_offset + len > self.end {
            return Err(protocol(
                endpoint,
                format!(
                    "stream of {} sent {len} bytes at offset {}, expected data at {} before {}",
                    self.shard, chunk.offset, self.next_offset, self.end
                ),
            ));
        }
        match &self.version {
            Some(expected) => verify::same_version(&self.shard, expected, &chunk.version)?,
            None => self.version = Some(chunk.version.clone()),
        }
        let verified = checked(&self.endpoint, chunk, wire_len)?;
        self.next_offset += len;
        Ok(Some(verified))
    }

    /// A piece read through the door, as the stream's next chunk: where the stream is, at
    /// its version.
    fn door_piece(&mut self, read: Verified) -> Result<Verified> {
        let len = read.data.len() as u64;
        if read.offset != self.next_offset || len == 0 || self.next_offset + len > self.end {
            let detail = format!(
                "a piece of {} at {} read through the door, expected {}",
                self.shard, read.offset, self.next_offset
            );
            return Err(protocol(&self.endpoint, detail));
        }
        match &self.version {
            Some(expected) => verify::same_version(&self.shard, expected, &read.version)?,
            None => self.version = Some(read.version.clone()),
        }
        self.next_offset += len;
        Ok(read)
    }

    /// Goes on over gRPC from where the door left off.
    async fn leave_door(&mut self) -> Result<()> {
        self.door = None;
        let r = &self.resume;
        let version = self.version.as_deref();
        let (stream, member) =
            r.client.open_stream(&r.dataset, &r.shard, self.next_offset, self.end, version, &[]).await?;
        self.endpoint = member;
        self.stream = Some(stream);
        Ok(())
    }

    /// After `failure` of the member streaming: in a group whose other members have not
    /// all been tried, the rest of the range from the next one (at the version already
    /// read, if any), else `failure`.
    async fn resume_after(&mut self, failure: Error) -> Result<()> {
        let r = &mut self.resume;
        let members = r.client.router.members().current();
        if members.len() <= r.tried.len() || failure.verdict() != Verdict::Unwell {
            return Err(failure);
        }
        if let Some(failed) = r.tried.last().and_then(|url| members.iter().find(|m| m.url == *url)) {
            failed.health.failed();
        }
        let version = self.version.as_deref();
        let (stream, member) =
            r.client.open_stream(&r.dataset, &r.shard, self.next_offset, self.end, version, &r.tried).await?;
        self.endpoint = member.clone();
        r.tried.push(member);
        self.stream = Some(stream);
        Ok(())
    }

    /// The rest of the range, verified, in one buffer.
    pub async fn read_to_end(mut self) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity((self.end - self.next_offset) as usize);
        while let Some(chunk) = self.next_chunk().await? {
            out.extend_from_slice(&chunk.data);
        }
        Ok(out)
    }

    /// The server streaming it now (in a group, the member it went on from after a
    /// failure).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
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
