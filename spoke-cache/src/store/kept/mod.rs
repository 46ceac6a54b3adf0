//! The keeper: samples kept for a later epoch, in and out of the store. A job followed
//! sample by sample (`plans/samples/`) reads samples its plan reads again; the keep rule
//! (`policy::keep`) says which the cache keeps, the index (`index.rs`) where each is, and
//! the keeper writes them many to a pack (one file, `store/packs.rs`), reads them back
//! and takes them out (eviction, a version the hub replaced, a copy that failed its
//! check), keeping the capacity it shares with the chunks (`capacity.rs`) in step.

pub mod index;

use std::sync::{Arc, atomic::Ordering::Relaxed};

use shardcache_proto::checksum::Checked;

use self::index::{Found, KeptSamples};
use crate::{
    Result,
    observe::metrics::Metrics,
    policy::{keep, window},
    store::{PageFault, Store, admission::Admission, blocking, capacity::Capacity, entry::Entry},
};

/// Samples kept for later epochs and their packs on the disk.
#[derive(Debug)]
pub struct Keeper {
    store: Arc<Store>,
    capacity: Arc<Capacity>,
    metrics: Arc<Metrics>,
    /// For a store that fails (a full disk lowers the capacity, as for chunks).
    admission: Arc<Admission>,
    samples: KeptSamples,
}

impl Keeper {
    /// The keeper of `samples` (`KeptSamples::load`, their bytes counted in `capacity`).
    pub fn new(samples: KeptSamples, admission: Arc<Admission>, metrics: Arc<Metrics>) -> Self {
        let (store, capacity) = (admission.store().clone(), admission.capacity().clone());
        Self { store, capacity, metrics, admission, samples }
    }

    /// Which samples are kept, and where.
    pub fn samples(&self) -> &KeptSamples {
        &self.samples
    }

    /// Keeps `bytes` (verified), the sample at `offset` of `entry` read for `principal`,
    /// whose next read the plan puts at `next_use`, if the keep rule takes it (read again,
    /// and room below the keep limit: `policy::keep`); a pack is written once one's worth
    /// waits. Whether it is kept (now or before).
    pub fn keep(
        self: &Arc<Self>,
        entry: &Entry,
        offset: u64,
        bytes: Checked,
        principal: &str,
        next_use: Option<u64>,
    ) -> bool {
        let length = bytes.data.len() as u64;
        if self.samples.holds(entry, offset, length) {
            return true;
        }
        // Its room taken in the same step as the check: concurrent reads each seeing room
        // for one more sample kept one past the limit (CI of 71c5749).
        let limit = window::keep_limit(self.capacity.capacity());
        if !keep::keeps_within(next_use, || self.capacity.added_within(length, limit)) {
            return false;
        }
        let Some(full) = self.samples.add(entry, offset, bytes, principal) else {
            self.capacity.removed(length); // kept already, and counted then
            return true;
        };
        if full {
            let keeper = self.clone();
            tokio::spawn(async move { keeper.flush().await });
        }
        true
    }

    /// Writes the kept samples waiting as one pack; samples that could not be written are
    /// no longer kept (a full disk lowers the capacity, as for chunks).
    pub async fn flush(&self) {
        let Some((pack, samples)) = self.samples.cut() else { return };
        let store = self.store.clone();
        match blocking(move || store.write_pack(pack, &samples)).await {
            Ok(()) => {
                self.metrics.kept_packs_written.fetch_add(1, Relaxed);
                if !self.samples.written(pack) {
                    // Every sample of it was forgotten while it was written.
                    self.delete_pack(pack).await;
                }
            }
            Err(e) => {
                self.capacity.removed(self.samples.unpacked(pack));
                self.admission.storing_failed("a pack of kept samples", &e);
            }
        }
    }

    /// `length` bytes of the kept sample at `offset` of `entry`: from memory while its
    /// pack is written, else from the store; `None` when it is not kept, or its stored
    /// copy failed its check (it is then forgotten: the read fetches it).
    pub async fn read(&self, entry: &Entry, offset: u64, length: u64) -> Result<Option<Checked>> {
        let (pack, ordinal) = match self.samples.find(entry, offset, length) {
            None => return Ok(None),
            Some(Found::Pending(bytes)) => return Ok(Some(bytes)),
            Some(Found::Packed { pack, ordinal, .. }) => (pack, ordinal),
        };
        let store = self.store.clone();
        match blocking(move || store.read_sample(pack, ordinal, 0, length)).await? {
            Ok(bytes) => Ok(Some(bytes)),
            Err(fault) => {
                match &fault {
                    PageFault::Corrupt { .. } => self.metrics.checksum_failures.fetch_add(1, Relaxed),
                    PageFault::Unreadable { .. } => self.metrics.store_read_errors.fetch_add(1, Relaxed),
                    PageFault::Missing { .. } => 0,
                };
                tracing::error!(dataset = %entry.dataset, shard = %entry.shard, offset, ?fault, "a kept sample could not be read back; fetching it");
                let (gone, bytes) = self.samples.forget(entry, offset);
                self.capacity.removed(bytes);
                if let Some(pack) = gone {
                    self.delete_pack(pack).await;
                }
                Ok(None)
            }
        }
    }

    /// Forgets the kept samples of `entry`'s version (the hub has another, or none).
    pub async fn forget_version(&self, entry: &Entry) {
        let (packs, bytes) = self.samples.forget_version(entry);
        self.capacity.removed(bytes);
        for pack in packs {
            self.delete_pack(pack).await;
        }
    }

    /// Evicts pack `pack` (its samples and its file); the bytes it freed.
    pub async fn evict_pack(&self, pack: u64) -> u64 {
        let bytes = self.samples.unpacked(pack);
        if bytes > 0 {
            self.capacity.removed(bytes);
            self.delete_pack(pack).await;
            self.metrics.evicted_bytes.fetch_add(bytes, Relaxed);
        }
        bytes
    }

    async fn delete_pack(&self, pack: u64) {
        let store = self.store.clone();
        if let Err(e) = blocking(move || store.delete_pack(pack)).await {
            tracing::error!(error = %e, pack, "could not delete a pack of kept samples");
        }
    }
}
