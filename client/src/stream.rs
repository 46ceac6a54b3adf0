//! [`ShardStream`]: a verified `StreamShard`. Every message is checked (offset, length,
//! CRC32C, one version across the stream); in a group of spokes, a member that fails
//! mid-stream is replaced by the next member in the shard's order, from where it stopped
//! and at the version already read.

use shardcache_proto::{
    encoding,
    v1::{Chunk, StreamShardRequest},
};
use shardcache_routing::{Judged, Verdict};

use crate::{
    Error, Range, Result,
    client::{Ask, Client},
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
        let (stream, member) =
            self.open_stream(dataset, shard, offset, end, expected.as_deref(), &[]).await?;
        Ok(ShardStream {
            endpoint: member.clone(),
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
    pub(crate) stream: tonic::Streaming<Chunk>,
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

impl ShardStream {
    /// The next verified chunk; `Ok(None)` once the whole range has arrived.
    pub async fn next_chunk(&mut self) -> Result<Option<Verified>> {
        let chunk = loop {
            let message = self.stream.message().await;
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
        self.stream = stream;
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
