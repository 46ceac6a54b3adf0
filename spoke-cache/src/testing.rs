//! What the unit tests of the fetch owner, the lookups and the admission run against:
//! the parts of a cache over a real store (RocksDB in a temporary directory), assembled
//! as `Cache::open` assembles them, with a [`FakeSupply`] in place of the chain of peers
//! and hubs, as mountpoint-s3 tests its file system against a mock client and foyer its
//! parts against its test utilities.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst},
    },
    time::Duration,
};

use bytes::Bytes;
use futures::{FutureExt, future::BoxFuture};
use shardcache_proto::{
    checksum::Checked,
    names::{DatasetName, ShardName},
    v1::ShardInfo,
};

use crate::{
    Error, Result,
    fetch::FetchOwner,
    fetch::lookup::Lookups,
    fetch::suppliers::{Joined, Supplied, SuppliedBy, Supply, Want},
    observe::metrics::Metrics,
    policy::speculation::Speculation,
    store::admission::Admission,
    store::capacity::Capacity,
    store::catalog::Catalog,
    store::entry::Entry,
    store::kept::Keeper,
    store::{Store, StoreOptions},
};

/// A wrong answer the fake gives on command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wrong {
    /// One byte fewer than asked.
    Short,
    /// The asked length, at another version than asked.
    OtherVersion,
}

/// Shards held in memory and answered as a supplier would: after `latency`, at their
/// current version (a fetch at another version fails ABORTED, as a hub's does), and on
/// command failing UNAVAILABLE or answering wrong bytes. It counts what it was asked.
#[derive(Debug, Default)]
pub struct FakeSupply {
    /// (dataset, shard) -> (version, bytes).
    shards: Mutex<HashMap<(String, String), (String, Bytes)>>,
    latency: Mutex<Duration>,
    /// Calls (fetches and stats) still to fail.
    failures: AtomicUsize,
    wrong: Mutex<Option<Wrong>>,
    /// Ranges asked for (one each, batched or not), and calls that asked for several.
    pub fetches: AtomicUsize,
    pub batches: AtomicUsize,
    pub stats: AtomicUsize,
    /// Bytes being fetched now, and the most there ever were at once.
    fetching: AtomicU64,
    pub most_fetching: AtomicU64,
}

impl FakeSupply {
    /// `dataset/shard` at `version` with `data` (replacing what it held).
    pub fn put(&self, dataset: &str, shard: &str, version: &str, data: Vec<u8>) {
        let key = (dataset.to_owned(), shard.to_owned());
        self.shards.lock().unwrap().insert(key, (version.to_owned(), Bytes::from(data)));
    }

    /// What it holds, to change at will (a shard deleted upstream: removed here).
    pub fn shards_mut(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), (String, Bytes)>> {
        self.shards.lock().unwrap()
    }

    pub fn set_latency(&self, latency: Duration) {
        *self.latency.lock().unwrap() = latency;
    }

    /// The next `calls` calls fail as a hub that cannot be reached.
    pub fn fail_next(&self, calls: usize) {
        self.failures.store(calls, SeqCst);
    }

    /// Every fetch answers `wrong` from now on (`None`: right again).
    pub fn answer(&self, wrong: Option<Wrong>) {
        *self.wrong.lock().unwrap() = wrong;
    }

    async fn call(&self) -> Result<()> {
        let latency = *self.latency.lock().unwrap();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let failing = self.failures.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok();
        if failing {
            return Err(Error::HubUnavailable { hub: "fake".into(), message: "told to fail".into() });
        }
        Ok(())
    }

    fn held(&self, dataset: &str, shard: &str) -> Result<(String, Bytes)> {
        let shards = self.shards.lock().unwrap();
        let held = shards.get(&(dataset.to_owned(), shard.to_owned())).cloned();
        held.ok_or_else(|| Error::Hub {
            hub: "fake".into(),
            code: tonic::Code::NotFound,
            message: "no such shard".into(),
        })
    }

    async fn supply(&self, want: Want<'_>) -> Result<Supplied> {
        self.fetches.fetch_add(1, SeqCst);
        let now = self.fetching.fetch_add(want.length, SeqCst) + want.length;
        self.most_fetching.fetch_max(now, SeqCst);
        let answer = self.answer_for(want).await;
        self.fetching.fetch_sub(want.length, SeqCst);
        answer
    }

    async fn answer_for(&self, want: Want<'_>) -> Result<Supplied> {
        self.call().await?;
        self.answer_now(want)
    }

    /// The answer to `want`, with no latency and no failure on command.
    fn answer_now(&self, want: Want<'_>) -> Result<Supplied> {
        let (mut version, data) = self.held(want.dataset, want.shard)?;
        if want.version.is_some_and(|v| v != version) {
            let message = format!("{} is at {version}", want.shard);
            return Err(Error::Hub { hub: "fake".into(), code: tonic::Code::Aborted, message });
        }
        let end = (want.offset + want.length).min(data.len() as u64);
        let mut part = data.slice(want.offset as usize..end as usize);
        match *self.wrong.lock().unwrap() {
            Some(Wrong::Short) => part = part.slice(..part.len() - 1),
            Some(Wrong::OtherVersion) => version = format!("{version}+other"),
            None => {}
        }
        let wire_len = part.len() as u64;
        Ok(Supplied { data: Checked::new(part), version, from: SuppliedBy::Hub, wire_len })
    }
}

impl Supply for FakeSupply {
    fn fetch<'a>(&'a self, want: Want<'a>, _avoid: &'a [String]) -> BoxFuture<'a, Result<Supplied>> {
        self.supply(want).boxed()
    }

    /// One call for all of `wants` (one latency, one failure), each its own answer, as a
    /// hub's `ReadRanges`.
    fn fetch_many<'a>(
        &'a self,
        wants: &'a [Want<'a>],
        _avoid: &'a [String],
    ) -> BoxFuture<'a, Vec<Result<Supplied>>> {
        async move {
            self.batches.fetch_add(1, SeqCst);
            let length: u64 = wants.iter().map(|w| w.length).sum();
            let now = self.fetching.fetch_add(length, SeqCst) + length;
            self.most_fetching.fetch_max(now, SeqCst);
            let called = self.call().await;
            let mut answers = Vec::with_capacity(wants.len());
            for &want in wants {
                self.fetches.fetch_add(1, SeqCst);
                answers.push(match &called {
                    Ok(()) => self.answer_now(want),
                    Err(e) => Err(e.clone()),
                });
            }
            self.fetching.fetch_sub(length, SeqCst);
            answers
        }
        .boxed()
    }

    fn join_owner<'a>(&'a self, _want: Want<'a>, _avoid: &'a [String]) -> BoxFuture<'a, Joined> {
        futures::future::ready(Joined::NotThere).boxed()
    }

    fn stat<'a>(&'a self, dataset: &'a str, shard: &'a str) -> BoxFuture<'a, Result<ShardInfo>> {
        async move {
            self.stats.fetch_add(1, SeqCst);
            self.call().await?;
            let (version, data) = self.held(dataset, shard)?;
            Ok(ShardInfo {
                dataset: dataset.to_owned(),
                shard: shard.to_owned(),
                size: data.len() as u64,
                version,
                ..Default::default()
            })
        }
        .boxed()
    }
}

/// The parts of a cache over a store in a temporary directory, fetching from a
/// [`FakeSupply`].
#[derive(Debug)]
pub struct Parts {
    pub supply: Arc<FakeSupply>,
    pub store: Arc<Store>,
    pub catalog: Arc<Catalog>,
    pub capacity: Arc<Capacity>,
    pub admission: Arc<Admission>,
    pub lookups: Arc<Lookups>,
    pub fetch: FetchOwner,
    pub metrics: Arc<Metrics>,
    _dir: tempfile::TempDir,
}

/// [`Parts`] with chunks of `chunk_size`, room for `capacity` bytes and at most
/// `bytes_in_flight` fetched and not yet stored.
pub fn parts(chunk_size: u64, capacity: u64, bytes_in_flight: u64) -> Parts {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), &StoreOptions::default()).unwrap());
    let (catalog, used) = Catalog::load(store.clone(), chunk_size, Duration::from_secs(60)).unwrap();
    let catalog = Arc::new(catalog);
    let capacity = Arc::new(Capacity::new(capacity, 0.95, 0.85, used).with_chunk_files(chunk_size));
    let metrics = Arc::new(Metrics::default());
    let speculation = Arc::new(Speculation::new(capacity.capacity()));
    let (kept, _) = crate::store::kept::index::KeptSamples::load(store.load_packs().unwrap());
    let admission = Arc::new(Admission::new(
        store.clone(),
        catalog.clone(),
        (capacity.clone(), speculation),
        metrics.clone(),
    ));
    let supply = Arc::new(FakeSupply::default());
    let lookups = Arc::new(Lookups::new(
        catalog.clone(),
        supply.clone(),
        (admission.clone(), Arc::new(Keeper::new(kept, admission.clone(), metrics.clone()))),
        metrics.clone(),
        chunk_size,
        1 << 10,
    ));
    let fetch = FetchOwner::new(
        supply.clone(),
        (admission.clone(), capacity.clone()),
        metrics.clone(),
        bytes_in_flight,
        chunk_size,
    );
    Parts { supply, store, catalog, capacity, admission, lookups, fetch, metrics, _dir: dir }
}

impl Parts {
    /// The entry of `dataset/shard` (looked up through the fake).
    pub async fn entry(&self, dataset: &str, shard: &str) -> Result<Arc<Entry>> {
        let (dataset, shard) = (DatasetName::new(dataset).unwrap(), ShardName::new(shard).unwrap());
        self.lookups.entry(&dataset, &shard).await
    }

    /// `[offset, offset + length)` of `entry` as the store holds it (`None`: not all there).
    pub fn stored(&self, entry: &Entry, offset: u64, length: u64) -> Option<Vec<u8>> {
        self.store.read(entry.id, offset, length).unwrap().ok().map(|read| read.data.to_vec())
    }
}

/// `len` bytes that differ from one offset to the next.
pub fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ salt).collect()
}
