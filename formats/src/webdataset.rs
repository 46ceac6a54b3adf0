//! WebDataset tar shards, read as the `webdataset` package groups them: the regular
//! files of each `.tar`, in archive order, a sample per run of files with the same key
//! (the path up to the first dot of the file's name; the rest, lowercased, is the
//! field: `0001.jpg`, `0001.cls` -> sample `0001` with fields `jpg` and `cls`); names
//! without a dot and `__meta__` files are skipped, as there.
//!
//! A tar has no index: its members' headers are spread through it, one before each
//! member, so finding them means reading it (webdataset streams each shard whole;
//! its indexed `wids` downloads each first). Each shard is streamed once, in one
//! request ([`WALKS`] shards at a time), and its headers parsed as the bytes pass:
//! one round trip and the shard's bytes, not a round trip per window of headers. These
//! are ordinary reads, not index reads: a spoke stores the chunks they fetch, and the
//! epoch's reads of the same shards find them there. ustar names with their prefix, GNU
//! long names (`L`) and pax `path`/`size` records are understood.

use std::collections::HashMap;

use bytes::{Buf, BytesMut};
use futures::{StreamExt, TryStreamExt};
use shardcache_proto::v1::ShardInfo;

use super::{Budget, Fetch, Layout, SampleIndex, damaged, listed_range};
use shardcache_client::{Error, Result};

/// Shards walked at once: enough streams to fill a long link, each holding one message.
pub const WALKS: usize = 16;
const BLOCK: u64 = 512;
/// The longest name (GNU `L`) or pax record set an entry may have: a header is held
/// whole until parsed (taken from the reader's budget). libarchive refuses pax headers
/// over 1 MiB too; a real name is at most PATH_MAX (4 KiB).
pub const MAX_EXTENSION: u64 = 1 << 20;

/// One sample: its key and its fields' (name, offset, length) in the shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub key: String,
    pub fields: Vec<(String, u64, u64)>,
}

/// A regular file of a tar: its name and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TarMember {
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
    members: Vec<TarMember>,
    done: bool,
}

/// What one header in a window says.
enum Step {
    /// The archive ends here.
    End,
    /// The header (or its extension data) runs past the bytes held: wait for more.
    More,
    /// An entry: go on at `next`.
    Next(u64),
}

/// The samples of every `.tar` of `listed`; `client` reads as the epoch will (not
/// marked as index reads: the walk reads every byte, which the epoch reads again).
pub async fn open<F: Fetch>(
    client: &F,
    dataset: &str,
    listed: &[ShardInfo],
    budget: &Budget,
) -> Result<SampleIndex> {
    let tars: Vec<&ShardInfo> = listed.iter().filter(|s| s.shard.ends_with(".tar")).collect();
    if tars.is_empty() {
        return Err(Error::Config(format!("dataset {dataset:?} has no .tar shards")));
    }
    // Owned shards: a closure over borrowed ones makes a future rustc cannot prove Send
    // for every lifetime (the Python binding runs it on the runtime).
    let owned: Vec<ShardInfo> = tars.iter().map(|&tar| tar.clone()).collect();
    let walks = futures::stream::iter(owned.into_iter().map(|tar| walk(client, dataset, tar, budget)));
    let members: Vec<Vec<TarMember>> = walks.buffered(WALKS).try_collect().await?;
    let mut groups = Vec::with_capacity(tars.len());
    for (tar, members) in tars.iter().zip(&members) {
        groups.push(group(dataset, &tar.shard, members)?);
    }
    // As webdataset's own check: tars with no sample at all are a mistake (files named
    // without a KEY.FIELD, the wrong folder), not an empty epoch.
    if groups.iter().all(Vec::is_empty) {
        return Err(Error::Config(format!(
            "dataset {dataset:?}: its .tar shards hold no samples (no member named KEY.FIELD, e.g. 000001.jpg)"
        )));
    }
    Ok(SampleIndex {
        dataset: dataset.to_owned(),
        shards: tars.iter().map(|s| s.shard.clone()).collect(),
        versions: tars.iter().map(|s| s.version.clone()).collect(),
        layout: Layout::Groups(groups),
        dtype: None,
        columns: None,
        budget: budget.clone(),
    })
}

/// The members of `tar`, its headers parsed from one stream of it (at its listed
/// version); only a header not yet whole is held, the members' bytes pass by. What is
/// held is taken from `budget` before it is copied.
async fn walk<F: Fetch>(
    client: &F,
    dataset: &str,
    tar: ShardInfo,
    budget: &Budget,
) -> Result<Vec<TarMember>> {
    let (mut walk, mut held, mut held_at) = (Walk::default(), BytesMut::new(), 0u64);
    let name = format!("{dataset}/{}", tar.shard);
    let mut holding = budget.take(0, String::new)?;
    let headers = |held: &BytesMut, held_at: u64, walk: &mut Walk| -> Result<()> {
        // Every header the held bytes hold whole.
        while !walk.done {
            if walk.at == 0 && tar.size < BLOCK {
                // Not even one header (tarfile: "empty file", "truncated header").
                return Err(damaged(
                    dataset,
                    &tar.shard,
                    0,
                    format!("{} bytes: too short for a tar", tar.size),
                ));
            } else if walk.at > tar.size {
                // Writers pad every entry to a block: a file that ends inside the padding
                // was cut short (webdataset's streaming tarfile stops there too).
                return Err(damaged(
                    dataset,
                    &tar.shard,
                    tar.size,
                    "the tar ends inside its last entry's padding",
                ));
            } else if walk.at.checked_add(BLOCK).is_none_or(|end| end > tar.size) {
                walk.done = true; // no room for another header: the end (however marked)
            } else if walk.at >= held_at + held.len() as u64 {
                break;
            } else {
                let from = (walk.at - held_at) as usize;
                match header(&name, walk, &held[from..], tar.size)? {
                    Step::End => walk.done = true,
                    Step::More => break,
                    Step::Next(next) => walk.at = next,
                }
            }
        }
        Ok(())
    };
    headers(&held, held_at, &mut walk)?;
    let range = listed_range(dataset, &tar, 0, tar.size);
    let ended = walk.done
        || client
            .scan(&range, |offset, data| {
                // Bytes before the next header are a member's: not kept, nor copied. What
                // is held then starts at the next header, or nothing is.
                let passed = walk.at.saturating_sub(held_at).min(held.len() as u64);
                held.advance(passed as usize);
                held_at += passed;
                let skip = if held.is_empty() {
                    let skip = walk.at.saturating_sub(offset).min(data.len() as u64);
                    held_at = offset + skip;
                    skip
                } else {
                    0 // the held header's rest: this chunk follows it
                };
                let keep = (held.len() + data.len()) as u64 - skip;
                holding.resize(keep, || format!("walking the tar headers of {name}"))?;
                held.extend_from_slice(&data[skip as usize..]);
                headers(&held, held_at, &mut walk)?;
                Ok(!walk.done)
            })
            .await?;
    match walk.done {
        // A long name or pax records and then the end: the entry they were for was cut off.
        true if walk.long_name.is_some() || !walk.pax.is_empty() => Err(damaged(
            dataset,
            &tar.shard,
            walk.at,
            "an extension header (a long name, pax records) with no entry after it",
        )),
        true => Ok(walk.members),
        false if ended => Err(damaged(dataset, &tar.shard, walk.at, "the tar ends inside a header")),
        false => Err(damaged(dataset, &tar.shard, walk.at, "the walk stopped before the archive's end")),
    }
}

/// The header at the start of `bytes` (at `walk.at` in the shard `name`, a file of `size`
/// bytes).
fn header(name: &str, walk: &mut Walk, bytes: &[u8], size: u64) -> Result<Step> {
    let bad = |why: String| Error::Damaged { file: name.to_owned(), offset: Some(walk.at), what: why };
    if (bytes.len() as u64) < BLOCK {
        return Ok(Step::More);
    }
    let block = &bytes[..BLOCK as usize];
    if block.iter().all(|&b| b == 0) {
        return Ok(Step::End);
    }
    let stored = number(&block[148..156]).unwrap_or(u64::MAX);
    // Unsigned bytes, as POSIX says, or signed, as old Sun tar summed them (tarfile takes both).
    let field = |i: usize| (148..156).contains(&i);
    let sum: u64 = block.iter().enumerate().map(|(i, &b)| if field(i) { 32 } else { u64::from(b) }).sum();
    let signed: i64 =
        block.iter().enumerate().map(|(i, &b)| if field(i) { 32 } else { i64::from(b as i8) }).sum();
    if stored != sum && i64::try_from(stored).ok() != Some(signed) {
        return Err(bad(format!("header checksum {stored} where the header sums to {sum}")));
    }
    // Every numeric field a number, as tarfile checks (it ends the archive at the first
    // header that is not, silently; GNU tar and libarchive call the archive damaged).
    for (what, range) in NUMERIC_FIELDS {
        // 0xff: a negative base-256 number (an mtime before 1970), a number all the same.
        if block[range.start] != 0xff && number(&block[range.clone()]).is_none() {
            return Err(bad(format!("the header's {what} is not a number")));
        }
    }
    let mut length = number(&block[124..136]).ok_or_else(|| bad("a size that is not a number".into()))?;
    if let Some(size) = walk.pax.get("size").and_then(|s| s.parse().ok()) {
        length = size;
    }
    let data = walk.at + BLOCK;
    // Checked: a size near 2^64 (base-256, or pax) must not wrap back to this header.
    if data.checked_add(length).is_none_or(|end| end > size) {
        return Err(bad(format!("an entry of {length} bytes past the end of the file ({size})")));
    }
    // Past the end of the file the check above allowed: the next header (or the end).
    let next = data.saturating_add(length.div_ceil(BLOCK) * BLOCK);
    if matches!(block[156], b'L' | b'x' | b'K' | b'g') && length > MAX_EXTENSION {
        return Err(bad(format!("an extension header of {length} bytes (at most {MAX_EXTENSION} are read)")));
    }
    // An extension's data, with its padding to the block: tarfile reads a long name up
    // to its NUL and pax records up to the zeros across the whole padded block, past the
    // size the header gives; other readers stop at the size. Padding that is not zeros
    // would be read two ways: refused.
    let body = || -> Option<std::result::Result<&[u8], Error>> {
        let padded = bytes.get(BLOCK as usize..(BLOCK + length.div_ceil(BLOCK) * BLOCK) as usize)?;
        let (data, padding) = padded.split_at(length as usize);
        match padding.iter().all(|&b| b == 0) {
            true => Some(Ok(data)),
            false => {
                Some(Err(bad(format!("an extension header's data runs past its size ({length} bytes)"))))
            }
        }
    };
    match block[156] {
        b'L' => {
            let Some(name) = body() else { return Ok(Step::More) };
            walk.long_name = Some(text(name?));
        }
        b'x' => {
            let Some(records) = body() else { return Ok(Step::More) };
            walk.pax = pax(records?).map_err(bad)?;
        }
        b'0' | 0 | b'7' => {
            let mut name = text(&block[..100]);
            if &block[257..262] == b"ustar" && block[345] != 0 {
                name = format!("{}/{name}", text(&block[345..500]));
            }
            let name = walk.long_name.take().or_else(|| walk.pax.remove("path")).unwrap_or(name);
            walk.pax.clear();
            walk.members.push(TarMember { name, offset: data, size: length });
        }
        b'1'..=b'6' if length != 0 => {
            // Links, devices, directories, FIFOs have no data: POSIX says their size is
            // not followed by data (tarfile reads the next header right after), GNU tar
            // and libarchive may skip it. Where readers disagree, the file is damaged.
            return Err(bad(format!("a {} entry with {length} bytes of data", kind_name(block[156]))));
        }
        b'S' => return Err(bad("a GNU sparse file (not read by this reader)".into())),
        _ => {
            // Directories, links, global pax headers...: not files of a sample.
            walk.long_name = None;
            walk.pax.clear();
        }
    }
    Ok(Step::Next(next))
}

/// What a tar's type flag is, in words.
fn kind_name(flag: u8) -> &'static str {
    match flag {
        b'1' => "hard link",
        b'2' => "symbolic link",
        b'3' | b'4' => "device",
        b'5' => "directory",
        _ => "FIFO",
    }
}

/// A NUL-terminated field as text.
fn text(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// The numeric fields of a header besides the size and the checksum, by name.
const NUMERIC_FIELDS: [(&str, std::ops::Range<usize>); 6] = [
    ("mode", 100..108),
    ("uid", 108..116),
    ("gid", 116..124),
    ("mtime", 136..148),
    ("devmajor", 329..337),
    ("devminor", 337..345),
];

/// A numeric header field: octal digits up to a NUL, blanks around them (an empty field
/// is 0), or GNU's base-256 (a first byte of 0x80, or 0xff for a negative number: none
/// here, so not a number).
fn number(field: &[u8]) -> Option<u64> {
    match field[0] {
        0x80 => {
            let bytes = &field[1..];
            // Past 64 bits: not a number this reader can use.
            let (high, low) = bytes.split_at(bytes.len().saturating_sub(8));
            high.iter().all(|&b| b == 0).then(|| low.iter().fold(0u64, |n, &b| (n << 8) | u64::from(b)))
        }
        0xff => None,
        _ => {
            let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
            let digits = field[..end].trim_ascii();
            digits.iter().try_fold(0u64, |n, &b| match b {
                b'0'..=b'7' => n.checked_mul(8)?.checked_add(u64::from(b - b'0')),
                _ => None,
            })
        }
    }
}

/// pax records: "LENGTH KEY=VALUE\n" each, LENGTH counting the whole record. A record
/// whose length does not cover its own length field and a key (a length of 0 would
/// never advance: CPython's tarfile hung on it, CVE-2019-20907), or runs past the
/// records, ends the parse as tarfile's does: an error.
fn pax(records: &[u8]) -> std::result::Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    let mut rest = records;
    let mut at = 0usize;
    // As tarfile: records until the end or a NUL byte; each at least "5 x=\n".
    while rest.first().is_some_and(|&b| b != 0) {
        let space =
            rest.iter().position(|&b| b == b' ').ok_or_else(|| format!("pax record at {at}: no length"))?;
        let length = std::str::from_utf8(&rest[..space])
            .ok()
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|&length| length >= 5 && length > space + 2 && length <= rest.len())
            .ok_or_else(|| format!("pax record at {at}: a length that does not fit its record"))?;
        // Framed as tarfile checks since CVE-2024-6232: `KEY=VALUE\n`, a key not empty.
        let record = &rest[space + 1..length - 1];
        let text = String::from_utf8_lossy(record);
        match text.split_once('=') {
            Some((key, value)) if !key.is_empty() && rest[length - 1] == b'\n' => {
                out.insert(key.to_owned(), value.to_owned());
            }
            _ => return Err(format!("pax record at {at}: not KEY=VALUE and a newline")),
        }
        rest = &rest[length..];
        at += length;
    }
    Ok(out)
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
fn group(dataset: &str, shard: &str, members: &[TarMember]) -> Result<Vec<Group>> {
    let mut groups: Vec<Group> = Vec::new();
    for member in members.iter().filter(|m| !is_meta(&m.name)) {
        let Some((key, field)) = key_and_field(&member.name) else { continue };
        if groups.last().is_none_or(|g| g.key != key) {
            groups.push(Group { key: key.to_owned(), fields: Vec::new() });
        }
        let current = groups.last_mut().ok_or_else(|| Error::Config("no sample".into()))?;
        if current.fields.iter().any(|(f, _, _)| *f == field) {
            let what = format!("{}: field {field} twice in sample {key}", member.name);
            return Err(damaged(dataset, shard, member.offset.saturating_sub(BLOCK), what));
        }
        current.fields.push((field, member.offset, member.size));
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::{Files, Format};

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
        assert_eq!(number(b"\0\0\0\0\0\0\0\0"), Some(0), "an empty field is 0");
        assert_eq!(number(b"0000649\0"), None, "9 is no octal digit");
        assert_eq!(number(b"xxxxxxxx"), None);
        assert_eq!(number(b"12 34\0\0\0"), None, "digits, blanks, digits");
        assert_eq!(number(&[0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]), Some(256));
        assert_eq!(number(&[0x80, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), None, "past 64 bits");
        assert_eq!(
            pax(b"20 path=some/name.x\n11 size=42\n").unwrap().get("size").map(String::as_str),
            Some("42")
        );
        // A zero length never advanced the parse (CVE-2019-20907's hang): an error now.
        assert!(pax(b"0 path=x\n").is_err());
        assert!(pax(b"99 path=x\n").is_err(), "a length past the records");
        // Framing tarfile checks: a newline at the end, a key, an equals sign.
        assert!(pax(b"11 size=42X").is_err() && pax(b"8 =abc\n").is_err() && pax(b"8 sizeX\n").is_err());
        assert_eq!(
            pax(b"8 size=\n").unwrap().get("size").map(String::as_str),
            Some(""),
            "a value may be empty"
        );
    }

    #[test]
    fn a_size_near_two_to_the_64_is_an_error_not_a_wrap_back() {
        let mut block = [0u8; 512];
        block[..6].copy_from_slice(b"a.bin\0");
        block[124] = 0x80; // GNU base-256: 2^64 - 2
        block[128..136].copy_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]);
        block[156] = b'0';
        fix_checksum(&mut block, 0);
        let mut walk = Walk::default();
        let err = header("x.tar", &mut walk, &block, 4096).err().expect("refused");
        assert!(err.to_string().contains("past the end of the file"), "{err}");
    }

    /// A ustar header block for `name`, of `size` bytes and `kind`.
    fn tar_header(name: &str, size: usize, kind: u8) -> Vec<u8> {
        let mut block = vec![0u8; 512];
        block[..name.len()].copy_from_slice(name.as_bytes());
        block[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
        block[156] = kind;
        block[257..263].copy_from_slice(b"ustar\0");
        fix_checksum(&mut block, 0);
        block
    }

    #[tokio::test]
    async fn the_headers_a_walk_holds_are_taken_from_the_budget() {
        // A 900 KiB pax record (under the 1 MiB a header may have), then one sample.
        let value = "a".repeat(900 << 10);
        let mut record = format!(" comment={value}\n");
        record = format!("{}{record}", record.len() + (record.len() + 7).to_string().len());
        let mut tar = tar_header("pax", record.len(), b'x');
        tar.extend_from_slice(record.as_bytes());
        tar.resize(tar.len().next_multiple_of(512), 0);
        tar.extend(tar_header("0001.txt", 3, b'0'));
        tar.extend_from_slice(b"hi\n");
        tar.resize(tar.len().next_multiple_of(512) + 1024, 0);
        assert!(pax(&tar[512..512 + record.len()]).is_ok(), "the record is well formed");
        let files = Files::new([("a.tar".to_owned(), Bytes::from(tar))]);
        let open = |limit| {
            let budget = Budget::new(limit);
            let files = &files;
            async move {
                let index = SampleIndex::open_listed(
                    files,
                    "ds",
                    &files.listing(),
                    &Format::WebDataset,
                    budget.clone(),
                )
                .await;
                (index, budget)
            }
        };
        let (refused, _) = open(512 << 10).await;
        let Err(err) = refused else { panic!("a header past the budget read") };
        assert!(
            matches!(err, Error::OverBudget { .. }) && err.to_string().contains("tar headers of ds/a.tar"),
            "{err}"
        );
        let (index, budget) = open(4 << 20).await;
        assert_eq!(index.expect("read under a larger budget").len(), 1);
        assert_eq!(budget.used(), 0, "the walk gave back what it held");
    }

    /// The header block at `at` of `tar` summed again after an edit.
    fn fix_checksum(tar: &mut [u8], at: usize) {
        let block = &mut tar[at..at + 512];
        let sum: u64 = block
            .iter()
            .enumerate()
            .map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u64::from(b) })
            .sum();
        block[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    }

    /// A tar of `entries` (name, type, data), padded, with the end-of-archive blocks.
    fn tar_of(entries: &[(&str, u8, &[u8])]) -> Vec<u8> {
        let mut tar = Vec::new();
        for (name, kind, data) in entries {
            tar.extend(tar_header(name, data.len(), *kind));
            tar.extend_from_slice(data);
            tar.resize(tar.len().next_multiple_of(512), 0);
        }
        tar.resize(tar.len() + 1024, 0);
        tar
    }

    #[tokio::test]
    async fn tars_that_readers_would_read_differently_are_refused() {
        // Each found by the differential fuzz run against webdataset's tarfile.
        let good: &[(&str, u8, &[u8])] = &[("0001.txt", b'0', b"hi"), ("0001.cls", b'0', b"3")];
        let mut devmajor = tar_of(good);
        devmajor[1024 + 329..1024 + 337].copy_from_slice(b"xxxxxxxx"); // the second header
        fix_checksum(&mut devmajor, 1024);
        let mut long_name_past_size =
            tar_of(&[("././@LongLink", b'L', b"0001.seg.png\0"), ("x", b'0', b"hi")]);
        long_name_past_size[124..136].copy_from_slice(b"00000000002\0");
        fix_checksum(&mut long_name_past_size, 0);
        let mut cut = tar_of(good);
        cut.truncate(512 + 2); // the first entry's data, not its padding
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("short", tar_of(good)[..300].to_vec(), "300 bytes: too short for a tar"),
            ("empty", Vec::new(), "0 bytes: too short for a tar"),
            ("no samples", tar_of(&[("README", b'0', b"hi")]), "hold no samples"),
            (
                "link",
                tar_of(&[("0001.txt", b'1', b"sample"), ("0001.cls", b'0', b"3")]),
                "a hard link entry with 6 bytes",
            ),
            (
                "dangling",
                tar_of(&[("0001.txt", b'0', b"hi"), ("././@LongLink", b'L', b"0002.txt\0")]),
                "with no entry after it",
            ),
            ("devmajor", devmajor, "devmajor is not a number"),
            ("padding", cut, "ends inside its last entry's padding"),
            ("long name past its size", long_name_past_size, "data runs past its size (2 bytes)"),
        ];
        for (name, tar, why) in cases {
            let files = Files::new([(format!("{name}.tar"), Bytes::from(tar))]);
            let opened = SampleIndex::open_listed(
                &files,
                "ds",
                &files.listing(),
                &Format::WebDataset,
                Budget::default(),
            )
            .await;
            let err = opened.err().unwrap_or_else(|| panic!("{name}: read"));
            assert!(
                matches!(err, Error::Damaged { .. } | Error::Config(_)) && err.to_string().contains(why),
                "{name}: {err}"
            );
        }
        // An mtime before 1970 (base-256, negative) is a number all the same.
        let mut old = tar_of(good);
        old[136..148].copy_from_slice(&[0xff; 12]);
        fix_checksum(&mut old, 0);
        let files = Files::new([("old.tar".to_owned(), Bytes::from(old))]);
        let index =
            SampleIndex::open_listed(&files, "ds", &files.listing(), &Format::WebDataset, Budget::default())
                .await;
        assert_eq!(index.expect("a tar of 1969").len(), 1);
        let files = Files::new([("good.tar".to_owned(), Bytes::from(tar_of(good)))]);
        let index =
            SampleIndex::open_listed(&files, "ds", &files.listing(), &Format::WebDataset, Budget::default())
                .await;
        assert_eq!(index.expect("the good tar").len(), 1);
    }
}
