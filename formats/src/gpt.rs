//! Megatron-LM's GPT samples over an indexed dataset (`megatron/core/datasets/
//! gpt_dataset.py`, `GPTDataset`), computed exactly as it computes them, so that sample
//! `i` here is `GPTDataset[i]`'s tokens and last label: `seq_len + 1` tokens across
//! sequence boundaries, sequences in an order shuffled per epoch, samples shuffled.
//!
//! With `numpy.random.RandomState(seed)` (MT19937 seeded by `init_genrand`, one stream
//! used in this order): the document index (every sequence, once per epoch, shuffled;
//! the last epoch shuffled on its own when it would give under 80% of an epoch's
//! samples), the sample index (where each sample starts: a position in the document
//! index and a token offset, consecutive samples sharing one token), the shuffle index.
//! The whole dataset is the training split (`split="1,0,0"`); blends of several prefixes
//! are not computed here.

use super::Budget;
use shardcache_client::{Error, Result};

/// numpy's legacy MT19937 (`RandomState`) and its `shuffle`.
#[derive(Debug, Clone)]
pub struct Mt19937 {
    mt: Vec<u32>,
    i: usize,
}

impl Mt19937 {
    /// `RandomState(seed)` for an integer seed (`init_genrand`).
    pub fn new(seed: u32) -> Self {
        let mut mt = vec![0u32; 624];
        mt[0] = seed;
        for i in 1..624 {
            mt[i] = 1_812_433_253u32.wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_add(i as u32);
        }
        Self { mt, i: 624 }
    }

    pub fn next_u32(&mut self) -> u32 {
        if self.i >= 624 {
            for k in 0..624 {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % 624] & 0x7fff_ffff);
                self.mt[k] = self.mt[(k + 397) % 624] ^ (y >> 1) ^ if y & 1 == 1 { 0x9908_b0df } else { 0 };
            }
            self.i = 0;
        }
        let mut y = self.mt[self.i];
        self.i += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// A value in `0..=max`: numpy's legacy masked rejection (`random_interval`).
    fn interval(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mut mask = max;
        for shift in [1, 2, 4, 8, 16, 32] {
            mask |= mask >> shift;
        }
        loop {
            let value = if max <= u64::from(u32::MAX) {
                u64::from(self.next_u32()) & mask
            } else {
                ((u64::from(self.next_u32()) << 32) | u64::from(self.next_u32())) & mask
            };
            if value <= max {
                return value;
            }
        }
    }

    /// `RandomState.shuffle` of a 1-D array: Fisher-Yates from the end.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.interval(i as u64) as usize;
            items.swap(i, j);
        }
    }
}

/// The GPT samples of one indexed dataset.
#[derive(Debug, Clone)]
pub struct GptIndex {
    /// Tokens of each sequence.
    lengths: Vec<u64>,
    /// Sequence ids, epoch after epoch, shuffled.
    documents: Vec<u32>,
    /// (position in `documents`, token offset) where each sample starts; one more row.
    starts: Vec<(u32, u32)>,
    /// Sample `i` is the `shuffle[i]`th of `starts`.
    shuffle: Vec<u32>,
}

impl GptIndex {
    /// Samples of `seq_len + 1` tokens over sequences of `lengths` tokens, `seed` as
    /// Megatron's `random_seed`, enough epochs for `num_samples` (one when `None`); an
    /// error when its tables would not fit in `budget` (4 bytes a sequence an epoch, 12 a
    /// sample) or count past Megatron's 32-bit sample index.
    pub fn new(
        lengths: Vec<u64>,
        seq_len: u64,
        seed: u32,
        num_samples: Option<u64>,
        budget: &Budget,
    ) -> Result<Self> {
        let too_many = |what: String| Error::Config(format!("GPT packing: {what}"));
        // i64 as Megatron computes; the tokens are the .bin's (at most its bytes).
        let tpe =
            i64::try_from(lengths.iter().sum::<u64>()).map_err(|_| too_many("over 2^63 tokens".into()))?;
        let seq = i64::try_from(seq_len).map_err(|_| too_many(format!("seq_len {seq_len}")))?;
        let extra = 1i64;
        if tpe == 0 {
            return Err(too_many("no tokens to pack".into()));
        }
        // The fewest epochs whose tokens give num_samples samples (Megatron counts up to it).
        let epochs = match num_samples {
            Some(n) => i64::try_from(n)
                .ok()
                .and_then(|n| n.checked_mul(seq)?.checked_add(extra))
                .map(|needed| (needed - 1) / tpe + 1) // ceil without needed + tpe, which can pass i64
                .ok_or_else(|| too_many(format!("{n} samples of {seq_len} tokens")))?,
            None => 1,
        };
        let total = epochs.checked_mul(tpe).map(|t| (t - extra) / seq);
        let documents = epochs.checked_mul(lengths.len() as i64);
        let (Some(total), Some(documents)) = (total, documents) else {
            return Err(too_many(format!("{epochs} epochs of {tpe} tokens")));
        };
        if total >= i64::from(u32::MAX) || documents >= i64::from(u32::MAX) {
            return Err(too_many(format!(
                "{total} samples over {documents} documents (at most 2^32 of each)"
            )));
        }
        let memory = (total as u64 + 1) * 12 + documents as u64 * 4;
        budget.admits(memory, || format!("the GPT sample index ({total} samples of {seq_len} tokens)"))?;
        let separate = match num_samples {
            Some(n) if epochs > 1 => {
                let before_last = ((epochs - 1) * tpe - extra) / seq;
                let per_epoch = (tpe - extra) / seq;
                (n as i64 - before_last) < (0.80 * per_epoch as f64) as i64
            }
            _ => false,
        };
        let mut rs = Mt19937::new(seed);
        let ids: Vec<u32> = (0..lengths.len() as u32).collect();
        let tiled = |n: i64| -> Vec<u32> { (0..n).flat_map(|_| ids.iter().copied()).collect() };
        let documents = if separate {
            let mut first = tiled(epochs - 1);
            rs.shuffle(&mut first);
            let mut last = tiled(1);
            rs.shuffle(&mut last);
            first.extend(last);
            first
        } else {
            let mut all = tiled(epochs);
            rs.shuffle(&mut all);
            all
        };
        let total = (epochs * tpe - extra) / seq;
        let starts = sample_starts(&lengths, &documents, seq, total);
        let first = if separate { ((epochs - 1) * tpe - extra) / seq } else { total };
        let mut shuffle: Vec<u32> = (0..first as u32).collect();
        rs.shuffle(&mut shuffle);
        if first < total {
            let mut rest: Vec<u32> = (first as u32..total as u32).collect();
            rs.shuffle(&mut rest);
            shuffle.extend(rest);
        }
        Ok(Self { lengths, documents, starts, shuffle })
    }

    pub fn len(&self) -> usize {
        self.shuffle.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shuffle.is_empty()
    }

    /// Sample `i` as (sequence, token offset, tokens) spans, in order.
    pub fn spans(&self, i: usize) -> Option<Vec<(u32, u64, u64)>> {
        let j = *self.shuffle.get(i)? as usize;
        let ((d_first, o_first), (d_last, o_last)) = (*self.starts.get(j)?, *self.starts.get(j + 1)?);
        let mut spans = Vec::new();
        for d in d_first..=d_last {
            let sequence = *self.documents.get(d as usize)?;
            let offset = if d == d_first { u64::from(o_first) } else { 0 };
            let end =
                if d == d_last { u64::from(o_last) + 1 } else { *self.lengths.get(sequence as usize)? };
            // Checked: sequences of no tokens can put a sample's end before its start.
            spans.push((sequence, offset, end.checked_sub(offset)?));
        }
        Some(spans)
    }
}

/// Megatron's `build_sample_idx`: where each of `total` samples of `seq + 1` tokens
/// starts in the token stream of `documents`, consecutive samples sharing a token.
fn sample_starts(lengths: &[u64], documents: &[u32], seq: i64, total: i64) -> Vec<(u32, u32)> {
    let mut starts = vec![(0u32, 0u32)];
    let (mut d, mut offset) = (0usize, 0i64);
    for _ in 0..total {
        let mut remaining = seq + 1;
        while remaining != 0 {
            let left = lengths[documents[d] as usize] as i64 - offset;
            remaining -= left;
            if remaining <= 0 {
                offset += remaining + left - 1;
                remaining = 0;
            } else if d == documents.len() - 1 {
                offset = lengths[documents[d] as usize] as i64 - 1;
                break;
            } else {
                d += 1;
                offset = 0;
            }
        }
        starts.push((d as u32, offset as u32));
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_count_near_two_to_the_63_is_an_error_not_a_wrap() {
        // needed + tokens per epoch passed i64 (a panic in debug, one epoch in release).
        let asked = Some((i64::MAX - 1) as u64);
        assert!(GptIndex::new(vec![10], 1, 1234, asked, &Budget::default()).is_err());
    }

    #[test]
    fn mt19937_is_numpys() {
        // numpy.random.RandomState(1234).randint(0, 2**32, dtype=numpy.uint32)[:1] draws
        // the first tempered output; the reference value of init_genrand(5489) is 3499211612.
        assert_eq!(Mt19937::new(5489).next_u32(), 3_499_211_612);
    }

    #[test]
    fn samples_are_seq_len_plus_one_tokens_sharing_one() {
        let index = GptIndex::new(vec![5, 3, 7, 2, 9, 4], 4, 1234, Some(20), &Budget::default()).unwrap();
        assert!(index.len() >= 20);
        for i in 0..index.len() {
            let spans = index.spans(i).unwrap();
            assert_eq!(spans.iter().map(|s| s.2).sum::<u64>(), 5, "sample {i}: {spans:?}");
        }
    }

    #[test]
    fn a_claim_of_more_samples_than_memory_holds_is_refused_at_once() {
        // 2^62 samples used to count epochs one at a time (a hang), then overflow.
        let err = GptIndex::new(vec![5, 3], 4, 1234, Some(1 << 62), &Budget::default()).unwrap_err();
        assert!(err.to_string().contains("GPT packing"), "{err}");
        let err = GptIndex::new(vec![1 << 20; 64], 1, 1234, None, &Budget::new(1 << 20)).unwrap_err();
        assert!(matches!(err, Error::OverBudget { .. }), "{err}");
    }
}
