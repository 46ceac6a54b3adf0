//! WebDataset tar shards, read as the `webdataset` package groups them: the regular
//! files of each `.tar`, in archive order, a sample per run of files with the same key
//! (the path up to the first dot of the file's name; the rest, lowercased, is the
//! field: `0001.jpg`, `0001.cls` -> sample `0001` with fields `jpg` and `cls`); names
//! without a dot and `__meta__` files are skipped, as there.
//!
//! The members' headers are found by walking each shard with windows of
//! [`WINDOW`] bytes (every header a window holds is parsed from it; all shards advance
//! together, one batch of ranged reads a step), so small members cost one read per
//! window, not per member. ustar names with their prefix, GNU long names (`L`) and
//! pax `path`/`size` records are understood.

use std::collections::HashMap;

use bytes::Bytes;
use shardcache_proto::v1::ShardInfo;

use super::{Layout, SampleIndex, listed_range, read_batched};
use crate::{Client, Error, Result};

/// Bytes read at a time while walking a shard's headers.
pub const WINDOW: u64 = 64 << 10;
const BLOCK: u64 = 512;

/// One sample: its key and its fields' (name, offset, length) in the shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub key: String,
    pub fields: Vec<(String, u64, u64)>,
}

/// A regular file of a tar: its name and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    name: String,
    offset: u64,
    size: u64,
}

/// Where a shard's walk is: the next header's offset, names or sizes an extension
/// header gave for the next entry, and the members found.
#[derive(Debug, Default)]
struct Walk {
    at: u64,
    long_name: Option<String>,
    pax: HashMap<String, String>,
    members: Vec<Member>,
    done: bool,
}

/// What one header in a window says.
enum Step {
    /// The archive ends here.
    End,
    /// The header (or its extension data) runs past the window: read `needed` bytes from `at`.
    More(u64),
    /// An entry: go on at `next`.
    Next(u64),
}

/// The samples of every `.tar` of `listed`.
pub async fn open(client: &Client, dataset: &str, listed: &[ShardInfo]) -> Result<SampleIndex> {
    let tars: Vec<&ShardInfo> = listed.iter().filter(|s| s.shard.ends_with(".tar")).collect();
    if tars.is_empty() {
        return Err(Error::Config(format!("dataset {dataset:?} has no .tar shards")));
    }
    let mut walks: Vec<Walk> = tars.iter().map(|_| Walk::default()).collect();
    let mut want: Vec<u64> = vec![WINDOW; tars.len()];
    loop {
        let open: Vec<usize> = (0..tars.len()).filter(|&i| !walks[i].done).collect();
        if open.is_empty() {
            break;
        }
        let reads = open
            .iter()
            .map(|&i| {
                let length = want[i].min(tars[i].size.saturating_sub(walks[i].at));
                listed_range(dataset, tars[i], walks[i].at, length)
            })
            .collect();
        for (&i, window) in open.iter().zip(read_batched(client, reads).await?) {
            want[i] = advance(&tars[i].shard, &mut walks[i], &window, tars[i].size)?;
        }
    }
    let mut groups = Vec::with_capacity(tars.len());
    for (tar, walk) in tars.iter().zip(&walks) {
        groups.push(group(&tar.shard, &walk.members)?);
    }
    Ok(SampleIndex {
        dataset: dataset.to_owned(),
        shards: tars.iter().map(|s| s.shard.clone()).collect(),
        versions: tars.iter().map(|s| s.version.clone()).collect(),
        layout: Layout::Groups(groups),
        dtype: None,
        columns: None,
    })
}

/// Parses the headers `window` (read at `walk.at`) holds; returns how many bytes to
/// read next.
fn advance(shard: &str, walk: &mut Walk, window: &Bytes, size: u64) -> Result<u64> {
    let start = walk.at;
    loop {
        if walk.at + BLOCK > size {
            walk.done = true; // no room for another header: the end (however marked)
            return Ok(WINDOW);
        }
        let offset = (walk.at - start) as usize;
        match header(shard, walk, &window[offset.min(window.len())..], size)? {
            Step::End => {
                walk.done = true;
                return Ok(WINDOW);
            }
            // The next read starts at this header, with room for what it needs.
            Step::More(needed) => return Ok(WINDOW.max(needed)),
            Step::Next(next) => walk.at = next,
        }
    }
}

/// The header at the start of `bytes` (at `walk.at` in the shard).
fn header(shard: &str, walk: &mut Walk, bytes: &[u8], size: u64) -> Result<Step> {
    let bad = |why: String| {
        Error::Config(format!("{shard} is not a tar this reader takes: {why} at byte {}", walk.at))
    };
    if (bytes.len() as u64) < BLOCK {
        return Ok(Step::More(BLOCK));
    }
    let block = &bytes[..BLOCK as usize];
    if block.iter().all(|&b| b == 0) {
        return Ok(Step::End);
    }
    let stored = number(&block[148..156]).unwrap_or(u64::MAX);
    let sum: u64 =
        block.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u64::from(b) }).sum();
    if stored != sum {
        return Err(bad(format!("header checksum {stored} where the header sums to {sum}")));
    }
    let mut length = number(&block[124..136]).ok_or_else(|| bad("a size that is not a number".into()))?;
    if let Some(size) = walk.pax.get("size").and_then(|s| s.parse().ok()) {
        length = size;
    }
    let data = walk.at + BLOCK;
    let next = data + length.div_ceil(BLOCK) * BLOCK;
    if data + length > size {
        return Err(bad(format!("an entry of {length} bytes past the end of the file ({size})")));
    }
    let body = || -> Option<&[u8]> { bytes.get(BLOCK as usize..(BLOCK + length) as usize) };
    match block[156] {
        b'L' => {
            let Some(name) = body() else { return Ok(Step::More(BLOCK + length)) };
            walk.long_name = Some(text(name));
        }
        b'x' => {
            let Some(records) = body() else { return Ok(Step::More(BLOCK + length)) };
            walk.pax = pax(records);
        }
        b'0' | 0 | b'7' => {
            let mut name = text(&block[..100]);
            if &block[257..262] == b"ustar" && block[345] != 0 {
                name = format!("{}/{name}", text(&block[345..500]));
            }
            let name = walk.long_name.take().or_else(|| walk.pax.remove("path")).unwrap_or(name);
            walk.pax.clear();
            walk.members.push(Member { name, offset: data, size: length });
        }
        _ => {
            // Directories, links, global pax headers...: not files of a sample.
            walk.long_name = None;
            walk.pax.clear();
        }
    }
    Ok(Step::Next(next))
}

/// A NUL-terminated field as text.
fn text(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// A numeric header field: octal digits (space or NUL terminated), or GNU's base-256.
fn number(field: &[u8]) -> Option<u64> {
    if field[0] & 0x80 != 0 {
        return Some(field[1..].iter().fold(u64::from(field[0] & 0x7f), |n, &b| (n << 8) | u64::from(b)));
    }
    let digits = field.iter().skip_while(|&&b| b == b' ').take_while(|b| b.is_ascii_digit());
    let mut seen = false;
    let value = digits.fold(0u64, |n, b| {
        seen = true;
        n * 8 + u64::from(b - b'0')
    });
    (seen || field.iter().all(|&b| b == 0 || b == b' ')).then_some(value)
}

/// pax records: "LENGTH KEY=VALUE\n" each.
fn pax(records: &[u8]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut rest = records;
    while let Some(space) = rest.iter().position(|&b| b == b' ') {
        let Some(length) = std::str::from_utf8(&rest[..space]).ok().and_then(|l| l.parse::<usize>().ok())
        else {
            break;
        };
        let Some(record) = rest.get(space + 1..length.saturating_sub(1).max(space + 1)) else { break };
        if let Some((key, value)) = String::from_utf8_lossy(record).split_once('=') {
            out.insert(key.to_owned(), value.to_owned());
        }
        rest = &rest[length.min(rest.len())..];
    }
    out
}

/// The key and field of a file name as webdataset splits it (`^((?:.*/|)[^.]+)[.]([^/]*)$`),
/// `None` for a name without a dot in its last part.
fn key_and_field(name: &str) -> Option<(&str, String)> {
    let base_at = name.rfind('/').map_or(0, |i| i + 1);
    let dot = base_at + name[base_at..].find('.')?;
    if dot == base_at {
        return None; // "[^.]+": at least one character before the dot
    }
    Some((&name[..dot], name[dot + 1..].to_lowercase()))
}

/// Whether webdataset skips `name` as metadata (`__[^/]*__($|/)` at its start).
fn is_meta(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("__") else { return false };
    let part = rest.split('/').next().unwrap_or_default();
    part.len() >= 2 && part.ends_with("__")
}

/// Consecutive members with one key, as samples.
fn group(shard: &str, members: &[Member]) -> Result<Vec<Group>> {
    let mut groups: Vec<Group> = Vec::new();
    for member in members.iter().filter(|m| !is_meta(&m.name)) {
        let Some((key, field)) = key_and_field(&member.name) else { continue };
        if groups.last().is_none_or(|g| g.key != key) {
            groups.push(Group { key: key.to_owned(), fields: Vec::new() });
        }
        let current = groups.last_mut().ok_or_else(|| Error::Config("no sample".into()))?;
        if current.fields.iter().any(|(f, _, _)| *f == field) {
            return Err(Error::Config(format!(
                "{shard}: {}: field {field} twice in sample {key}",
                member.name
            )));
        }
        current.fields.push((field, member.offset, member.size));
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_into_keys_and_fields_as_webdataset_does() {
        assert_eq!(key_and_field("a/b/0001.seg.PNG"), Some(("a/b/0001", "seg.png".into())));
        assert_eq!(key_and_field("0001.cls"), Some(("0001", "cls".into())));
        assert_eq!(key_and_field("dir.v2/0001.txt"), Some(("dir.v2/0001", "txt".into())));
        assert_eq!(key_and_field("README"), None);
        assert_eq!(key_and_field("x/.hidden"), None);
        assert!(is_meta("__index__") && is_meta("__meta__/x") && !is_meta("__x") && !is_meta("a/__m__"));
        assert_eq!(number(b"0000644\0"), Some(0o644));
        assert_eq!(number(b"     17 \0"), Some(0o17));
        assert_eq!(pax(b"20 path=some/name.x\n11 size=42\n").get("size").map(String::as_str), Some("42"));
    }
}
