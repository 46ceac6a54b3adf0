//! What a supply answers, below the chain (`mod.rs`) and each supplier (`peers.rs`,
//! `hubs.rs`): what is wanted, what was supplied and by whom, a supplier's failure, a
//! join's answer, and the [`Supply`] the fetch owner and the lookups ask.

use futures::{FutureExt, future::BoxFuture};
use shardcache_proto::{checksum::Checked, v1::ShardInfo};
use shardcache_routing::{Judged, Verdict};

use crate::{Error, Result};

/// Who supplied a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuppliedBy {
    /// A member of the spoke's group, over the local network.
    Peer,
    /// A hub, over the long link.
    Hub,
}

/// Bytes a supplier answered, verified (with their checksum), with the version they
/// belong to and who sent them.
#[derive(Debug, Clone)]
pub struct Supplied {
    pub data: Checked,
    pub version: String,
    pub from: SuppliedBy,
    /// Bytes it took on the link (less than `data`'s where the hub compressed them).
    pub wire_len: u64,
}

/// What is wanted: `[offset, offset + length)` of `dataset/shard`, at `version` or (a
/// first read's speculation, `None`) at whatever version the supplier has.
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub dataset: &'a str,
    pub shard: &'a str,
    pub offset: u64,
    pub length: u64,
    pub version: Option<&'a str>,
}

/// A supplier's failure, with what it says about the supplier.
#[derive(Debug)]
pub struct Failed {
    pub error: Error,
    pub verdict: Verdict,
}

impl Failed {
    pub fn unwell(error: Error) -> Self {
        Self { error, verdict: Verdict::Unwell }
    }

    pub fn not_here(error: Error) -> Self {
        Self { error, verdict: Verdict::NotHere }
    }

    pub fn judged(error: Error) -> Self {
        let verdict = error.verdict();
        Self { error, verdict }
    }
}

impl Judged for Failed {
    fn verdict(&self) -> Verdict {
        self.verdict
    }
}

/// What the owner a client asked first answered `Chain::join_owner`.
#[derive(Debug)]
pub enum Joined {
    /// The bytes, from its store or the fetch it was running.
    Bytes(Supplied),
    /// It is down (or was found unwell): this spoke may take its shard over.
    Down,
    /// It neither holds nor fetches them, or did not answer within a fetch's time.
    NotThere,
}

/// What the fetch owner and the lookups ask of the suppliers: chunks, joins and stats.
/// In a spoke it is the `Chain` of peers and hubs; in the unit tests of the fetch
/// owner, the lookups and the admission, a fake that answers with a latency, fails,
/// sends the wrong bytes or a new version on command (`crate::testing`), as
/// mountpoint-s3 tests its file system against a mock client. Futures are boxed: the
/// owner and the lookups hold an `Arc<dyn Supply>`, one allocation per upstream call.
pub trait Supply: std::fmt::Debug + Send + Sync {
    /// `want` from the first supplier that has it, leaving out the members in `avoid`
    /// (a client already asked them).
    fn fetch<'a>(&'a self, want: Want<'a>, avoid: &'a [String]) -> BoxFuture<'a, Result<Supplied>>;

    /// `wants` in as few calls as the suppliers allow (ranges a hub serves, many to one
    /// `ReadRanges`), each with its own answer, in order: a batch of a reader's misses
    /// costs the long link one round trip, not one per range. By default, one `fetch`
    /// each, all at once.
    fn fetch_many<'a>(
        &'a self,
        wants: &'a [Want<'a>],
        avoid: &'a [String],
    ) -> BoxFuture<'a, Vec<Result<Supplied>>> {
        futures::future::join_all(wants.iter().map(|&want| self.fetch(want, avoid))).boxed()
    }

    /// `want` from the owner its client asked first (`Chain::join_owner`).
    fn join_owner<'a>(&'a self, want: Want<'a>, avoid: &'a [String]) -> BoxFuture<'a, Joined>;

    /// The size and version of `dataset/shard`, from the authority (the hubs).
    fn stat<'a>(&'a self, dataset: &'a str, shard: &'a str) -> BoxFuture<'a, Result<ShardInfo>>;
}
