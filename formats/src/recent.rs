//! The last few values a [`SampleIndex`](super::SampleIndex) made from fetched bytes
//! (MDS's decompressed shards, Parquet's decoded row groups).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Values by key, the most recently used last.
type Entries<K, V> = Vec<(K, Arc<V>)>;

/// The last few values made from fetched bytes (decompressed shards, decoded row
/// groups), the most recently used last; clones of a `SampleIndex` share them.
#[derive(Debug)]
pub struct Recent<K, V> {
    keep: usize,
    items: Arc<Mutex<Entries<K, V>>>,
}

// Not derived: a clone shares the values, whatever V is.
impl<K, V> Clone for Recent<K, V> {
    fn clone(&self) -> Self {
        Self { keep: self.keep, items: self.items.clone() }
    }
}

impl<K: PartialEq + Copy, V> Recent<K, V> {
    pub(super) fn new(keep: usize) -> Self {
        Self { keep, items: Default::default() }
    }

    fn lock(&self) -> MutexGuard<'_, Entries<K, V>> {
        self.items.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Those of `keys` kept.
    pub(super) fn find(&self, keys: &[K]) -> Entries<K, V> {
        self.lock().iter().filter(|(k, _)| keys.contains(k)).map(|(k, v)| (*k, v.clone())).collect()
    }

    /// Lets go of every value but those of `keys` (a read short of memory).
    pub(super) fn shed(&self, keys: &[K]) {
        self.lock().retain(|(k, _)| keys.contains(k));
    }

    /// `used` (the values a read needed) kept as the most recent, the oldest dropped
    /// past the bound (never one of `used`).
    pub(super) fn keep(&self, used: &[(K, Arc<V>)]) {
        let mut items = self.lock();
        for (key, value) in used {
            items.retain(|(k, _)| k != key);
            items.push((*key, value.clone()));
        }
        let over = items.len().saturating_sub(self.keep.max(used.len()));
        items.drain(..over);
    }
}
