//! What the cache bets on beyond a read: whether a missed chunk is stored (the
//! admission, `policy::admit`) and the read-ahead and whole-shard fetches after a read,
//! under their feedback (`policy::speculation`). Asked by the read path and the cold
//! open; it asks the fetch owner and the evictor, never back.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use crate::{
    fetch::{FetchFor, FetchOwner},
    observe::job_counters::JobRow,
    observe::metrics::Metrics,
    plans::Plans,
    policy::admit::AdmissionFilter,
    store::admission::Admission,
    store::capacity::Capacity,
    store::entry::{ChunkIndex, Entry},
    store::evict::Evictor,
};

/// How long the value of the chunks an admission would displace is taken as known:
/// finding the victim walks every entry, which a miss must not do each time.
pub const VICTIM_REFRESH: Duration = Duration::from_millis(100);

/// Whole-shard background fetches at once: each keeps `--shard-fetch-parallelism`
/// chunks in flight, so a few dozen fill the link; more only queue behind them and hold
/// memory.
pub const WHOLE_SHARD_FETCHES: usize = 32;

/// Read-ahead, whole-shard fetches and the admission's decision, with the parts they use.
#[derive(Debug)]
pub struct ReadAhead {
    /// `--fetch-whole-shard`: a shard's first stored miss fetches the rest of it.
    pub fetch_whole_shard: bool,
    /// `--read-ahead-chunks` at most, for a sequential reader.
    pub read_ahead_chunks: u64,
    /// `--shard-fetch-parallelism` of a whole-shard fetch.
    pub shard_fetch_parallelism: usize,
    pub capacity: Arc<Capacity>,
    pub plans: Arc<Plans>,
    /// How much each chunk has been read lately, and which misses that makes worth
    /// storing (`policy::admit`); the read path counts the reads in it.
    pub filter: Arc<AdmissionFilter>,
    pub admission: Arc<Admission>,
    pub fetch: FetchOwner,
    /// Which shard an admission would displace.
    pub evictor: Evictor,
    pub metrics: Arc<Metrics>,
    /// Per principal: what the chunks its admission would displace were read lately,
    /// and when that was found (recomputed every [`VICTIM_REFRESH`]).
    pub victims: Mutex<HashMap<String, (Instant, u64)>>,
    /// Whole-shard background fetches running (at most [`WHOLE_SHARD_FETCHES`]).
    pub whole_fetches: Arc<AtomicUsize>,
}

impl ReadAhead {
    /// Whether a miss of chunk `index` of `entry` by `principal` is stored (its chunk
    /// fetched whole) rather than fetched as read (`policy::admit`): while the cache has
    /// room below its low watermark; when a plan reads the shard (the plans decide what
    /// stays); or when the chunk has been read lately far more than what its admission
    /// would displace.
    pub fn stores(&self, entry: &Entry, index: ChunkIndex, principal: &str) -> bool {
        self.capacity.has_room(entry.chunk_range(index).1)
            || self.plans.shards.next_use(&(entry.dataset.clone(), entry.shard.clone())).is_some()
            || self.filter.admits(entry.chunk_key(index), self.victim_value(principal))
    }

    /// Bytes read lately per chunk of the shard an admission by `principal` would
    /// displace (its eviction's next victim), known within [`VICTIM_REFRESH`].
    fn victim_value(&self, principal: &str) -> u64 {
        let mut victims = self.victims.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&(at, value)) = victims.get(principal)
            && at.elapsed() < VICTIM_REFRESH
        {
            return value;
        }
        let value = self.evictor.victim_for(Some(principal)).map_or(0, |victim| {
            let present: Vec<ChunkIndex> =
                (0..victim.chunk_count()).map(ChunkIndex).filter(|&i| victim.has_chunk(i)).collect();
            self.filter.mean_value(present.into_iter().map(|i| victim.chunk_key(i)))
        });
        // Principals are an operator's names (a token file's lines): few.
        if victims.len() > 4096 {
            victims.clear();
        }
        victims.insert(principal.to_owned(), (Instant::now(), value));
        value
    }

    /// Speculation after a read of `entry` that ended in chunk `last` (`run`: the reads in
    /// a row of the shard that began where the one before ended; `stored_miss`: a chunk
    /// it missed is being stored): the rest of the shard fetched in the background on its
    /// first stored miss, or chunks read ahead of a sequential reader; each only while
    /// such bets pay and within speculation's share of the capacity
    /// (`policy::speculation`), and only into room below the low watermark, so that
    /// speculation never evicts.
    pub fn after_read(
        &self,
        entry: &Arc<Entry>,
        (last, run): (ChunkIndex, u32),
        stored_miss: bool,
        reader: (&JobRow, &Arc<str>),
    ) {
        let (row, principal) = reader;
        let speculation = self.admission.speculation();
        let fits = |bytes: u64| {
            self.capacity.has_room(bytes) && speculation.has_room(bytes, self.capacity.reserved())
        };
        let fetch = FetchFor::speculation(row, principal);
        if stored_miss && self.fetch_whole_shard && self.start_whole_fetch(entry, &fits) {
            self.metrics.whole_shard_fetches.fetch_add(1, Relaxed);
            let (owner, entry, row) = (self.fetch.clone(), entry.clone(), row.clone());
            let (principal, parallelism) = (principal.clone(), self.shard_fetch_parallelism);
            let running = self.whole_fetches.clone();
            tokio::spawn(async move {
                let fetch = FetchFor::speculation(&row, &principal);
                if let Err(e) = owner.fetch_shard(&entry, parallelism, fetch).await {
                    tracing::warn!(dataset = %entry.dataset, shard = %entry.shard, error = %e, "background shard fetch failed");
                }
                running.fetch_sub(1, Relaxed);
            });
            return;
        }
        let ahead = speculation.read_ahead(self.read_ahead_chunks, run);
        let ahead = (last.0 + 1..=last.0.saturating_add(ahead)).take_while(|&i| i < entry.chunk_count());
        for index in ahead.map(ChunkIndex) {
            if entry.has_chunk(index) || self.fetch.running(entry, index).is_some() {
                continue;
            }
            if !fits(entry.chunk_range(index).1) {
                break;
            }
            // Started by `chunk` itself; the result is only wanted in the store.
            drop(self.fetch.chunk(entry, index, fetch));
        }
    }

    /// Whether a whole-shard fetch of `entry` may start now, counted as running if so:
    /// its first, at most [`WHOLE_SHARD_FETCHES`] at once, when the rest of the shard
    /// `fits`, while such fetches pay (`Speculation::whole_shards`).
    fn start_whole_fetch(&self, entry: &Entry, fits: &dyn Fn(u64) -> bool) -> bool {
        if entry.state().whole_fetch_started || !fits(entry.size.saturating_sub(entry.cached_bytes())) {
            return false;
        }
        if self.whole_fetches.fetch_add(1, Relaxed) >= WHOLE_SHARD_FETCHES
            || !self.admission.speculation().whole_shards()
        {
            self.whole_fetches.fetch_sub(1, Relaxed);
            return false;
        }
        // Once per entry (a lost race here costs a fetch that finds its chunks running).
        let mut state = entry.state();
        if std::mem::replace(&mut state.whole_fetch_started, true) {
            drop(state);
            self.whole_fetches.fetch_sub(1, Relaxed);
            return false;
        }
        true
    }
}
