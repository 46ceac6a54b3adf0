//! The harness's mutations: deterministic damage to a dataset's files, of the kinds real
//! damage and hostile writers make (bit flips, length and count fields at extremes, cuts,
//! extensions, sections removed, swapped or copied, numbers in text rewritten), tar
//! checksums fixed again so most mutations reach past the first header.

use bytes::Bytes;

/// Deterministic mutations of a dataset's files: SplitMix64 seeded by (target, input).
#[derive(Debug)]
pub struct Mutator {
    state: u64,
}

/// Integers a length or count field is set to.
const EXTREMES: [u64; 16] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX,
];

/// Numbers written over a number in a text file (index.json, an .npy header, a pax record).
const TEXT_EXTREMES: [&str; 9] = [
    "0",
    "1",
    "-1",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "18446744073709551616",
    "1e308",
    "99999999999999999999999",
];

impl Mutator {
    pub fn new(target: u64, input: u64) -> Self {
        Self { state: target.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ input.wrapping_add(0x1234_5678) }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// A place in a file of `len` bytes: half the time near its start or its end, where
    /// headers, tables and footers are.
    fn place(&mut self, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        let len = len as u64;
        (match self.below(4) {
            0 => self.below(len.min(512)),
            1 => len - 1 - self.below(len.min(512)),
            _ => self.below(len),
        }) as usize
    }

    /// `files` with one of them mutated (1 to 4 mutations).
    pub fn mutate(&mut self, files: &[(String, Bytes)]) -> Vec<(String, Bytes)> {
        let mut out = files.to_vec();
        if out.is_empty() {
            return out;
        }
        let which = self.below(out.len() as u64) as usize;
        let mut data = out[which].1.to_vec();
        for _ in 0..1 + self.below(4) {
            self.once(&mut data);
        }
        if out[which].0.ends_with(".tar") && self.below(4) != 0 {
            fix_tar_checksums(&mut data); // else most mutations end at the first checksum
        }
        out[which].1 = Bytes::from(data);
        out
    }

    fn once(&mut self, data: &mut Vec<u8>) {
        let len = data.len();
        match self.below(9) {
            0 if len > 0 => {
                let at = self.place(len);
                data[at] ^= 1 << self.below(8);
            }
            1 if len > 0 => {
                let at = self.place(len);
                data[at] = [0, 1, 0x7f, 0x80, 0xff][self.below(5) as usize];
            }
            2 if len > 0 => {
                // A length or count field rewritten: 2, 4 or 8 bytes, either order.
                let width = [2usize, 4, 8][self.below(3) as usize];
                let at = self.place(len).min(len.saturating_sub(width));
                let value = match self.below(4) {
                    0 => len as u64 + self.below(3) - 1,
                    _ => EXTREMES[self.below(EXTREMES.len() as u64) as usize],
                };
                let bytes = if self.below(2) == 0 { value.to_le_bytes() } else { value.to_be_bytes() };
                let end = (at + width).min(len);
                let from = if bytes[0] == 0 && width < 8 { 8 - width } else { 0 };
                data[at..end].copy_from_slice(&bytes[from..from + end - at]);
            }
            3 => {
                let at = self.place(len);
                data.truncate(at);
            }
            4 => {
                let extra = self.below(600) as usize;
                for _ in 0..extra {
                    data.push(self.next() as u8);
                }
            }
            5 if len > 2 => {
                // A section removed.
                let at = self.place(len);
                let end = (at + 1 + self.below(256) as usize).min(len);
                data.drain(at..end);
            }
            6 if len > 2 => {
                // Two sections swapped (same length).
                let n = 1 + self.below((len / 2).min(512) as u64) as usize;
                let (a, b) = (self.below((len - n) as u64) as usize, self.below((len - n) as u64) as usize);
                let section: Vec<u8> = data[a..a + n].to_vec();
                data.copy_within(b..b + n, a);
                data[b..b + n].copy_from_slice(&section);
            }
            7 if len > 0 => {
                // A section copied over another place (a header duplicated).
                let n = 1 + self.below((len).min(512) as u64) as usize;
                let from = self.below((len - n.min(len)) as u64 + 1) as usize;
                let to = self.place(len);
                let piece: Vec<u8> = data[from..(from + n).min(len)].to_vec();
                let end = (to + piece.len()).min(len);
                data[to..end].copy_from_slice(&piece[..end - to]);
            }
            _ => self.number_in_text(data),
        }
    }

    /// A run of ASCII digits (a number in JSON, an .npy header, a pax record, a tar
    /// field) replaced with an extreme number.
    fn number_in_text(&mut self, data: &mut Vec<u8>) {
        let starts: Vec<usize> = (0..data.len())
            .filter(|&i| data[i].is_ascii_digit() && (i == 0 || !data[i - 1].is_ascii_digit()))
            .take(4096)
            .collect();
        if starts.is_empty() {
            return;
        }
        let at = starts[self.below(starts.len() as u64) as usize];
        let end = (at..data.len()).find(|&i| !data[i].is_ascii_digit()).unwrap_or(data.len());
        let number = TEXT_EXTREMES[self.below(TEXT_EXTREMES.len() as u64) as usize];
        data.splice(at..end, number.bytes());
    }
}

/// Each tar header's checksum recomputed, walking the headers as their sizes place them
/// (stops at the first that does not parse).
pub fn fix_tar_checksums(data: &mut [u8]) {
    let mut at = 0usize;
    for _ in 0..10_000 {
        let Some(block) = data.get_mut(at..at + 512) else { return };
        if block.iter().all(|&b| b == 0) {
            return;
        }
        block[148..156].fill(b' ');
        let sum: u64 = block.iter().map(|&b| u64::from(b)).sum();
        let field = format!("{sum:06o}\0 ");
        block[148..156].copy_from_slice(&field.as_bytes()[..8]);
        let size = std::str::from_utf8(&block[124..136])
            .ok()
            .and_then(|s| u64::from_str_radix(s.trim_matches(|c: char| c == '\0' || c == ' '), 8).ok());
        let Some(size) = size else { return };
        let Some(next) = (size.div_ceil(512) * 512).checked_add(512 + at as u64) else { return };
        at = match usize::try_from(next) {
            Ok(next) => next,
            Err(_) => return,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_are_the_same_for_the_same_input_and_differ_between_inputs() {
        let files = vec![("a.bin".to_owned(), Bytes::from(vec![7u8; 1000]))];
        let one = Mutator::new(3, 42).mutate(&files);
        assert_eq!(one, Mutator::new(3, 42).mutate(&files));
        let changed = (0..100).filter(|&i| Mutator::new(3, i).mutate(&files) != files).count();
        assert!(changed > 80, "{changed} of 100 inputs differ from the seed");
    }
}
