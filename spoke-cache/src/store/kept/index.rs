//! Samples kept for a later epoch (a plan followed sample by sample: `policy::keep`,
//! `plans/samples/`), in memory: which are kept and where (rebuilt at startup from the
//! packs' manifests, `store/packs.rs`), those waiting for their pack (written once
//! [`PACK_BYTES`] wait, or when the keeper flushes them), and which pack eviction takes
//! next. No I/O here: the keeper (`kept/mod.rs`) writes, reads and deletes packs, and
//! keeps the capacity in step.
//!
//! A sample is named by its shard *version* (dataset, shard, version) and offset, not by
//! a shard's store id: a shard whose chunks are evicted keeps its kept samples, and a
//! new version never finds an old one's bytes.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard},
    time::Instant,
};

use shardcache_proto::checksum::Checked;

use crate::{store::PackedSample, store::entry::Entry};

/// Bytes of samples written as one pack: a chunk's worth (one file, one ingestion, one
/// eviction per 4 MiB, as chunks have), and what waits in memory at most.
pub const PACK_BYTES: u64 = 4 << 20;

/// The samples of one pack, in ordinal order, with their bytes.
pub type PackSamples = Vec<(PackedSample, Checked)>;

/// (dataset, shard, version): a shard version, by name.
type Version = (String, String, String);

/// Where a kept sample is.
#[derive(Debug, Clone)]
enum Slot {
    /// In pack `pack` at `ordinal`.
    Packed { pack: u64, ordinal: u32, length: u64 },
    /// Waiting for its pack, at `index` of the pending samples.
    Pending { index: usize, length: u64 },
}

impl Slot {
    fn length(&self) -> u64 {
        match self {
            Slot::Packed { length, .. } | Slot::Pending { length, .. } => *length,
        }
    }
}

/// A pack on disk.
#[derive(Debug)]
struct Pack {
    bytes: u64,
    /// Its samples still kept (a pack whose samples are all forgotten is deleted).
    live: usize,
    /// When a read last used it (ms since start), for eviction.
    last_access: u64,
    /// The principal whose share it counts in (whose read kept its first sample).
    holder: String,
    /// Its samples, to forget them when it leaves.
    samples: Vec<(u32, u64)>,
}

/// A kept sample as a read finds it.
#[derive(Debug, Clone)]
pub enum Found {
    /// Waiting for its pack: its bytes (of the range asked).
    Pending(Checked),
    /// In `pack` at `ordinal`: read `length` bytes of it from its start.
    Packed { pack: u64, ordinal: u32, length: u64 },
}

/// A pack eviction may take: its id, holder, bytes and last access.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackCandidate {
    pub pack: u64,
    pub holder: String,
    pub bytes: u64,
    pub last_access: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Shard versions by name, and names by id.
    ids: HashMap<Version, u32>,
    names: Vec<Version>,
    /// Every kept sample, by (shard version id, offset).
    index: HashMap<(u32, u64), Slot>,
    packs: HashMap<u64, Pack>,
    /// Samples waiting for their pack, with the principal that kept each.
    pending: Vec<(PackedSample, Checked, String)>,
    pending_bytes: u64,
    /// Packs cut and not yet in the store: their samples' bytes, by ordinal.
    writing: HashMap<u64, Vec<Checked>>,
    /// Bytes kept in all (packed and pending).
    bytes: u64,
}

impl State {
    fn id(&mut self, version: Version) -> u32 {
        if let Some(&id) = self.ids.get(&version) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(version.clone());
        self.ids.insert(version, id);
        id
    }

    fn lookup(&self, entry: &Entry) -> Option<u32> {
        // A lookup by borrowed parts: one small key, no allocation beyond it.
        self.ids.get(&(entry.dataset.clone(), entry.shard.clone(), entry.version.clone())).copied()
    }

    /// Removes the kept sample `key`; the pack to delete and its bytes when it was the
    /// pack's last (a pending sample's bytes leave at once: returned as pack `None`).
    fn remove(&mut self, key: (u32, u64)) -> Option<(Option<u64>, u64)> {
        match self.index.remove(&key)? {
            Slot::Pending { length, .. } => {
                // Its bytes stay in `pending` until the pack is cut, which skips it.
                self.bytes -= length;
                Some((None, length))
            }
            Slot::Packed { pack, .. } => {
                let whole = self.packs.get_mut(&pack)?;
                whole.live -= 1;
                if whole.live > 0 {
                    return Some((None, 0));
                }
                let gone = self.packs.remove(&pack)?;
                self.bytes -= gone.bytes;
                Some((Some(pack), gone.bytes))
            }
        }
    }
}

/// The kept samples.
#[derive(Debug)]
pub struct KeptSamples {
    state: Mutex<State>,
    /// Samples kept: a read looks no further while there are none.
    count: std::sync::atomic::AtomicUsize,
    next_pack: std::sync::atomic::AtomicU64,
    /// The clock of `last_access`.
    started: Instant,
}

impl KeptSamples {
    /// The kept samples of `packs` (as the store loaded them), with the bytes they hold.
    pub fn load(packs: Vec<(u64, Vec<PackedSample>)>) -> (Self, u64) {
        let mut state = State::default();
        let next_pack = packs.iter().map(|(pack, _)| pack + 1).max().unwrap_or(1);
        for (pack, samples) in packs {
            let mut whole =
                Pack { bytes: 0, live: 0, last_access: 0, holder: String::new(), samples: Vec::new() };
            for (ordinal, sample) in samples.into_iter().enumerate() {
                let id = state.id((sample.dataset, sample.shard, sample.version));
                let slot = Slot::Packed { pack, ordinal: ordinal as u32, length: sample.length };
                whole.bytes += sample.length;
                if state.index.insert((id, sample.offset), slot).is_none() {
                    whole.live += 1;
                    whole.samples.push((id, sample.offset));
                }
            }
            state.bytes += whole.bytes;
            state.packs.insert(pack, whole);
        }
        let bytes = state.bytes;
        let kept = Self {
            count: std::sync::atomic::AtomicUsize::new(state.index.len()),
            state: Mutex::new(state),
            next_pack: std::sync::atomic::AtomicU64::new(next_pack),
            started: Instant::now(),
        };
        (kept, bytes)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Bytes kept (packed and waiting), and packs on disk.
    pub fn bytes_and_packs(&self) -> (u64, usize) {
        let state = self.state();
        (state.bytes, state.packs.len())
    }

    /// Whether `[offset, offset + length)` of `entry` is a kept sample's start.
    pub fn holds(&self, entry: &Entry, offset: u64, length: u64) -> bool {
        if self.count.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return false;
        }
        let state = self.state();
        state
            .lookup(entry)
            .and_then(|id| state.index.get(&(id, offset)))
            .is_some_and(|slot| slot.length() >= length)
    }

    /// The kept sample that begins at `offset` of `entry` and holds `length` bytes, if
    /// one does; a read of it marks its pack used.
    pub fn find(&self, entry: &Entry, offset: u64, length: u64) -> Option<Found> {
        let now = self.now();
        let mut state = self.state();
        let id = state.lookup(entry)?;
        match state.index.get(&(id, offset))? {
            Slot::Pending { index, length: held } if *held >= length => {
                let (_, bytes, _) = state.pending.get(*index)?;
                Some(Found::Pending(bytes.part(0, length as usize)))
            }
            &Slot::Packed { pack, ordinal, length: held } if held >= length => {
                if let Some(whole) = state.packs.get_mut(&pack) {
                    whole.last_access = now;
                }
                if let Some(bytes) = state.writing.get(&pack).and_then(|w| w.get(ordinal as usize)) {
                    return Some(Found::Pending(bytes.part(0, length as usize)));
                }
                Some(Found::Packed { pack, ordinal, length })
            }
            _ => None,
        }
    }

    /// Keeps `bytes` (verified), the sample at `offset` of `entry`, for `principal`; the
    /// pack to write when [`PACK_BYTES`] now wait. `false` when it is kept already.
    pub fn add(&self, entry: &Entry, offset: u64, bytes: Checked, principal: &str) -> Option<bool> {
        let mut state = self.state();
        let id = state.id((entry.dataset.clone(), entry.shard.clone(), entry.version.clone()));
        if state.index.contains_key(&(id, offset)) {
            return None;
        }
        let length = bytes.data.len() as u64;
        let index = state.pending.len();
        let sample = PackedSample {
            dataset: entry.dataset.clone(),
            shard: entry.shard.clone(),
            version: entry.version.clone(),
            offset,
            length,
        };
        state.pending.push((sample, bytes, principal.to_owned()));
        state.index.insert((id, offset), Slot::Pending { index, length });
        state.pending_bytes += length;
        state.bytes += length;
        self.counted(&state);
        Some(state.pending_bytes >= PACK_BYTES)
    }

    /// The samples waiting, cut into a pack to write (its id), those forgotten meanwhile
    /// left out; `None` when none wait. Until [`KeptSamples::written`] or [`KeptSamples::unpacked`],
    /// reads take their bytes from memory.
    pub fn cut(&self) -> Option<(u64, PackSamples)> {
        let mut state = self.state();
        let pending = std::mem::take(&mut state.pending);
        state.pending_bytes = 0;
        let mut live = Vec::with_capacity(pending.len());
        let mut holder = None;
        for (index, (sample, bytes, principal)) in pending.into_iter().enumerate() {
            let Some(id) = state
                .ids
                .get(&(sample.dataset.clone(), sample.shard.clone(), sample.version.clone()))
                .copied()
            else {
                continue;
            };
            // Still this sample's slot (not forgotten, nor forgotten and kept again since).
            if matches!(state.index.get(&(id, sample.offset)), Some(Slot::Pending { index: i, .. }) if *i == index)
            {
                holder.get_or_insert(principal);
                live.push((sample, bytes));
            }
        }
        if live.is_empty() {
            return None;
        }
        let pack = self.next_pack.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        state.writing.insert(pack, live.iter().map(|(_, bytes)| bytes.clone()).collect());
        let mut samples = Vec::with_capacity(live.len());
        for (ordinal, (sample, _)) in live.iter().enumerate() {
            let id = state.id((sample.dataset.clone(), sample.shard.clone(), sample.version.clone()));
            state.index.insert(
                (id, sample.offset),
                Slot::Packed { pack, ordinal: ordinal as u32, length: sample.length },
            );
            samples.push((id, sample.offset));
        }
        let bytes = live.iter().map(|(s, _)| s.length).sum();
        let holder = holder.unwrap_or_default();
        let now = self.now();
        let live_count = samples.len();
        state.packs.insert(pack, Pack { bytes, live: live_count, last_access: now, holder, samples });
        Some((pack, live))
    }

    /// Pack `pack` is in the store: reads take it from there. `false` when all its
    /// samples were forgotten while it was written (the caller deletes it).
    pub fn written(&self, pack: u64) -> bool {
        let mut state = self.state();
        state.writing.remove(&pack);
        state.packs.contains_key(&pack)
    }

    /// Pack `pack` could not be written, or is evicted: its samples are no longer kept;
    /// the bytes that leave (0 when it was gone).
    pub fn unpacked(&self, pack: u64) -> u64 {
        let mut state = self.state();
        state.writing.remove(&pack);
        let Some(gone) = state.packs.remove(&pack) else { return 0 };
        for key in &gone.samples {
            if matches!(state.index.get(key), Some(Slot::Packed { pack: p, .. }) if *p == pack) {
                state.index.remove(key);
            }
        }
        state.bytes -= gone.bytes;
        self.counted(&state);
        gone.bytes
    }

    fn counted(&self, state: &State) {
        self.count.store(state.index.len(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Forgets the kept sample at `offset` of `entry` (its stored copy failed its check):
    /// the pack to delete and the bytes that leave when it was the pack's last.
    pub fn forget(&self, entry: &Entry, offset: u64) -> (Option<u64>, u64) {
        let mut state = self.state();
        let Some(id) = state.lookup(entry) else { return (None, 0) };
        let removed = state.remove((id, offset)).unwrap_or((None, 0));
        self.counted(&state);
        removed
    }

    /// Forgets every kept sample of `entry`'s version (the hub has another version, or
    /// none): the packs to delete, and the bytes that leave.
    pub fn forget_version(&self, entry: &Entry) -> (Vec<u64>, u64) {
        let mut state = self.state();
        let Some(id) = state.lookup(entry) else { return (Vec::new(), 0) };
        let keys: Vec<(u32, u64)> = state.index.keys().filter(|(of, _)| *of == id).copied().collect();
        let (mut packs, mut bytes) = (Vec::new(), 0);
        for key in keys {
            if let Some((pack, freed)) = state.remove(key) {
                packs.extend(pack);
                bytes += freed;
            }
        }
        self.counted(&state);
        (packs, bytes)
    }

    /// Every pack eviction may take.
    pub fn candidates(&self) -> Vec<PackCandidate> {
        let state = self.state();
        state
            .packs
            .iter()
            .map(|(&pack, p)| PackCandidate {
                pack,
                holder: p.holder.clone(),
                bytes: p.bytes,
                last_access: p.last_access,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ShardRecord;

    fn entry(version: &str) -> Entry {
        let record = ShardRecord {
            id: 1,
            version: version.into(),
            size: 1 << 20,
            chunk_size: 1 << 16,
            ..Default::default()
        };
        Entry::new("ds".into(), "s".into(), record, 0)
    }

    fn bytes(n: usize) -> Checked {
        Checked::new(bytes::Bytes::from(vec![7u8; n]))
    }

    #[test]
    fn a_kept_sample_is_found_by_its_version_pending_then_packed() {
        let (kept, _) = KeptSamples::load(Vec::new());
        let v1 = entry("v1");
        assert_eq!(kept.add(&v1, 100, bytes(50), "alice"), Some(false));
        assert_eq!(kept.add(&v1, 100, bytes(50), "alice"), None, "kept once");
        assert!(matches!(kept.find(&v1, 100, 40), Some(Found::Pending(b)) if b.data.len() == 40));
        assert!(kept.find(&v1, 100, 51).is_none() && kept.find(&v1, 101, 1).is_none());
        assert!(kept.find(&entry("v2"), 100, 50).is_none(), "another version never finds it");
        let (pack, samples) = kept.cut().unwrap();
        assert_eq!(samples.len(), 1);
        assert_eq!(kept.candidates()[0].holder, "alice", "the pack counts in the share of who kept it");
        assert!(matches!(kept.find(&v1, 100, 50), Some(Found::Pending(_))), "from memory while written");
        assert!(kept.written(pack));
        assert!(
            matches!(kept.find(&v1, 100, 50), Some(Found::Packed { pack: p, ordinal: 0, length: 50 }) if p == pack)
        );
        assert_eq!(kept.bytes_and_packs(), (50, 1));
        assert_eq!(kept.forget_version(&v1), (vec![pack], 50));
        assert!(kept.find(&v1, 100, 50).is_none() && kept.bytes_and_packs() == (0, 0));
    }

    #[test]
    fn a_sample_forgotten_before_its_pack_is_cut_is_left_out_and_a_full_pack_is_cut() {
        let (kept, _) = KeptSamples::load(Vec::new());
        let v1 = entry("v1");
        kept.add(&v1, 0, bytes(10), "a");
        kept.add(&v1, 10, bytes(10), "a");
        assert_eq!(kept.forget(&v1, 0), (None, 10));
        let (_, samples) = kept.cut().unwrap();
        assert_eq!(samples.iter().map(|(s, _)| s.offset).collect::<Vec<_>>(), [10]);
        assert!(kept.cut().is_none(), "nothing waits");
        assert_eq!(
            kept.add(&v1, 1 << 20, bytes(PACK_BYTES as usize), "a"),
            Some(true),
            "a pack's worth waits"
        );
    }

    #[test]
    fn packs_load_again_with_their_samples_and_the_next_pack_is_new() {
        let sample = |offset| PackedSample {
            dataset: "ds".into(),
            shard: "s".into(),
            version: "v1".into(),
            offset,
            length: 8,
        };
        let (kept, bytes) = KeptSamples::load(vec![(7, vec![sample(0), sample(8)])]);
        assert_eq!(bytes, 16);
        assert!(matches!(
            kept.find(&entry("v1"), 8, 8),
            Some(Found::Packed { pack: 7, ordinal: 1, length: 8 })
        ));
        kept.add(&entry("v1"), 64, super::tests::bytes(8), "a");
        assert_eq!(kept.cut().unwrap().0, 8, "pack ids go on from the loaded ones");
        assert_eq!(kept.forget(&entry("v1"), 0), (None, 0), "its pack still holds another");
        assert_eq!(kept.forget(&entry("v1"), 8), (Some(7), 16), "the last one takes the pack");
    }
}
