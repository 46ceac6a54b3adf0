//! The read path's samples: a range read whole as a sample its job's plan fetched ahead
//! (`samples/`) or one kept for a later epoch (`kept.rs`), when its chunks are not stored.

use std::sync::Arc;

use super::{Part, Provenance, ReadPath};
use crate::{Result, plans::Step, store::entry::Entry};

impl ReadPath {
    /// The range `[offset, offset + length)` of `entry` read whole as a sample, when its
    /// chunks are not all stored: a sample fetched ahead for its job (`samples/`), or one
    /// kept for this epoch (`kept.rs`).
    pub(super) fn sample_part<'a>(
        &self,
        (want, step): (usize, Step),
        entry: &'a Arc<Entry>,
        offset: u64,
        length: u64,
    ) -> Option<Part<'a>> {
        let end = offset + length;
        let index = entry.chunk_of(offset);
        if entry.chunks_of(offset, end).all(|i| entry.has_chunk(i)) {
            return None;
        }
        let part = |provenance, missed, pending| Part {
            want,
            step,
            entry,
            index,
            from: offset,
            to: end,
            provenance,
            missed,
            bytes: None,
            placed: None,
            pending,
        };
        // Kept first: a copy fetched ahead meanwhile (a race with the keep) is dropped.
        if self.keeper.samples().holds(entry, offset, length) {
            drop(self.plans.staged.take(&(entry.id, offset, length)));
            return Some(part(Provenance::KeptSample, false, None));
        }
        let staged = self.plans.staged.take(&(entry.id, offset, length))?;
        Some(part(Provenance::Staged, true, Some(staged)))
    }

    /// Reads the parts that are kept samples; one whose stored copy fails is fetched as
    /// read instead (the keeper forgot it).
    pub(super) async fn read_kept_samples(&self, parts: &mut [Part<'_>]) -> Result<()> {
        for part in parts.iter_mut().filter(|p| matches!(p.provenance, Provenance::KeptSample)) {
            match self.keeper.read(part.entry, part.from, part.to - part.from).await? {
                Some(bytes) => part.bytes = Some(bytes),
                None => {
                    (part.provenance, part.missed) = (Provenance::Direct, true);
                }
            }
        }
        Ok(())
    }
}
