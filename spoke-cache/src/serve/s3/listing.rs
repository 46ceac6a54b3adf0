//! S3 listings (`ListObjectsV2`, `ListObjects`) over the hub's shard listing, which
//! pages by name (a page starts after a name) and knows neither prefixes nor folders.
//!
//! A listing walks the hub's pages from the first name that can match (just before the
//! prefix, or after the client's token), keeps the names under the prefix, and folds
//! those with the delimiter after the prefix into common prefixes, S3's folders. Once a
//! folder is listed its remaining names are jumped over (the hub is asked for the names
//! after the folder's last possible one), so a folder of a million shards costs one
//! entry, not a thousand pages.
//!
//! The continuation token is the last entry returned (a key, or a common prefix), hex
//! encoded: the next page starts strictly after it (and after everything under it, for
//! a common prefix), so a listing always moves on, and a forged token at worst starts a
//! listing somewhere else. One request walks at most [`MAX_HUB_PAGES`] of the hub's
//! pages; past that it answers what it found so far, truncated, and the client goes on.

use std::future::Future;

use s3s::{S3Error, S3ErrorCode, S3Result};
use shardcache_proto::names::ShardName;

/// The most keys one page of an S3 listing holds (S3's own bound; `max-keys` above it
/// is taken as this).
pub const MAX_KEYS: usize = 1000;
/// The hub's pages one listing request may walk (each a round trip to the hub when it
/// is cold) before it answers truncated.
pub const MAX_HUB_PAGES: usize = 16;
/// Names per hub page.
pub const HUB_PAGE: u32 = 1000;

/// The greatest character: `FOLDER + MAX_CHAR` sorts after every name in the folder.
const MAX_CHAR: char = '\u{10FFFF}';

/// What a listing asks.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub prefix: String,
    pub delimiter: Option<String>,
    /// Start strictly after this (a token's entry, `start-after`, a v1 `marker`).
    pub after: Option<String>,
    pub max_keys: usize,
}

/// One shard as a hub page lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub size: u64,
    pub version: String,
    /// Its Last-Modified, ms since the Unix epoch (0: unknown).
    pub modified_ms: u64,
}

/// An S3 listing page.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Page {
    pub objects: Vec<Listed>,
    pub prefixes: Vec<String>,
    /// More follow: the client asks again after [`Page::last`].
    pub truncated: bool,
    /// The last entry returned (a key or a common prefix), or the last name walked when
    /// the walk stopped at [`MAX_HUB_PAGES`] before finding any.
    pub last: Option<String>,
}

/// A continuation token for a listing that goes on after `entry`.
pub fn token(entry: &str) -> String {
    entry.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The entry a continuation token goes on after.
pub fn entry_of(token: &str) -> S3Result<String> {
    let bad = || {
        S3Error::with_message(S3ErrorCode::InvalidArgument, "The continuation token provided is incorrect")
    };
    if !token.len().is_multiple_of(2) || token.len() > 4 * shardcache_proto::names::MAX_SHARD_LEN {
        return Err(bad());
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|at| token.get(at..at + 2).and_then(|pair| u8::from_str_radix(pair, 16).ok()))
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(bad)?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// Where the hub's listing starts for `query`: a valid shard name before every name the
/// listing can return (the hub lists the names after it), or `None` for the start.
fn hub_start(query: &Query) -> Option<String> {
    let from_prefix = below(&query.prefix);
    let from_after = query.after.as_deref().and_then(|after| match &query.delimiter {
        Some(d) if after.ends_with(d.as_str()) => past_folder(after),
        _ => ShardName::new(after).ok().map(|_| after.to_owned()).or_else(|| below(after)),
    });
    from_prefix.max(from_after)
}

/// The longest valid shard name that is a proper prefix of `name` (and so sorts before
/// it and everything that starts with it).
fn below(name: &str) -> Option<String> {
    let mut end = name.len();
    while end > 0 {
        end -= 1;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        if ShardName::new(&name[..end]).is_ok() {
            return Some(name[..end].to_owned());
        }
    }
    None
}

/// A name after every name under `folder` (a common prefix), before every later one.
fn past_folder(folder: &str) -> Option<String> {
    let past = format!("{folder}{MAX_CHAR}");
    ShardName::new(&past).ok().map(|_| past).or_else(|| below(folder))
}

/// Walks the hub's listing (`page(after)`: the names after `after`, in order, and
/// whether more follow) for `query`.
pub async fn walk<F, Fut>(query: &Query, mut page: F) -> S3Result<Page>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = S3Result<(Vec<Listed>, bool)>>,
{
    let mut out = Page::default();
    if query.max_keys == 0 {
        return Ok(out);
    }
    let delimiter = query.delimiter.as_deref().filter(|d| !d.is_empty());
    // The folder last returned (or the token's): its other names are skipped.
    let mut folder = query.after.clone().filter(|after| delimiter.is_some_and(|d| after.ends_with(d)));
    let mut hub_after = hub_start(query);
    // The last name walked, returned or not.
    let mut seen: Option<String> = None;
    for _ in 0..MAX_HUB_PAGES {
        let (names, more) = page(hub_after.clone()).await?;
        for listed in names {
            seen = Some(listed.key.clone());
            let key = listed.key.as_str();
            if query.after.as_deref().is_some_and(|after| key <= after)
                || folder.as_deref().is_some_and(|folder| key.starts_with(folder))
            {
                continue;
            }
            if !key.starts_with(&query.prefix) {
                if key > query.prefix.as_str() {
                    // Past every name under the prefix: the listing is whole.
                    return Ok(out);
                }
                continue;
            }
            if out.objects.len() + out.prefixes.len() == query.max_keys {
                // One more entry exists: this page is full, and more follow.
                out.truncated = true;
                return Ok(out);
            }
            let rest = &key[query.prefix.len()..];
            match delimiter.and_then(|d| rest.find(d).map(|at| query.prefix.len() + at + d.len())) {
                Some(end) => {
                    let cut = key[..end].to_owned();
                    out.prefixes.push(cut.clone());
                    out.last = Some(cut.clone());
                    folder = Some(cut);
                }
                None => {
                    out.last = Some(listed.key.clone());
                    out.objects.push(listed);
                }
            }
        }
        if !more {
            return Ok(out);
        }
        // The next page starts after the last name walked, or past the folder it is in.
        hub_after = match (&folder, &seen) {
            (Some(folder), Some(seen)) if seen.starts_with(folder.as_str()) => past_folder(folder),
            _ => seen.clone().or(hub_after),
        };
    }
    // Walked as far as one request may: what was found, and the client asks on after
    // it (or after the last name walked, when none was found yet).
    if out.last.is_none() {
        out.last = seen;
    }
    out.truncated = out.last.is_some();
    Ok(out)
}

/// S3's `encoding-type=url`: keys percent-encoded in the answer (botocore asks for it
/// and decodes them), all but unreserved characters and `/`.
pub fn url_encoded(text: &str) -> String {
    const KEEP: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~').remove(b'/');
    percent_encoding::utf8_percent_encode(text, KEEP).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hub listing of `names` (sorted), in pages of `size`, counting its calls.
    fn hub(names: &[&str], size: usize) -> (Vec<Listed>, usize) {
        let mut all: Vec<Listed> = names
            .iter()
            .map(|n| Listed { key: (*n).to_owned(), size: 1, version: "v".into(), modified_ms: 0 })
            .collect();
        all.sort_by(|a, b| a.key.cmp(&b.key));
        (all, size)
    }

    async fn list(all: &(Vec<Listed>, usize), query: &Query, calls: &mut usize) -> Page {
        walk(query, |after: Option<String>| {
            *calls += 1;
            let start = after.map_or(0, |a| all.0.partition_point(|l| l.key.as_str() <= a.as_str()));
            let end = (start + all.1).min(all.0.len());
            let page = (all.0[start..end].to_vec(), end < all.0.len());
            async move { Ok(page) }
        })
        .await
        .unwrap()
    }

    /// Every entry of a listing, page by page as a client asks, and the pages.
    async fn list_all(all: &(Vec<Listed>, usize), mut query: Query) -> (Vec<String>, usize) {
        let (mut entries, mut pages, mut calls) = (Vec::new(), 0, 0);
        loop {
            let page = list(all, &query, &mut calls).await;
            pages += 1;
            assert!(pages < 1000, "a listing that does not end");
            entries.extend(page.objects.iter().map(|o| o.key.clone()));
            entries.extend(page.prefixes.iter().cloned());
            if !page.truncated {
                return (entries, pages);
            }
            query.after = Some(entry_of(&token(page.last.as_deref().unwrap())).unwrap());
        }
    }

    #[tokio::test]
    async fn listings_page_fold_folders_and_end() {
        let mut names: Vec<String> = (0..2500).map(|i| format!("train/shard-{i:05}.tar")).collect();
        names.extend(["a.txt", "b/x", "b/y/z", "train-meta", "val/1", "val/2", "zz"].map(String::from));
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let all = hub(&names, 100);
        let query = |prefix: &str, delimiter: Option<&str>, max_keys| Query {
            prefix: prefix.into(),
            delimiter: delimiter.map(String::from),
            after: None,
            max_keys,
        };
        // Flat, paginated over 1,000 keys: every key once, in order.
        let (entries, pages) = list_all(&all, query("", None, 1000)).await;
        assert_eq!(entries.len(), names.len());
        assert!(entries.windows(2).all(|w| w[0] < w[1]));
        assert!(pages >= 3, "{pages}");
        // Folders: the train folder is one entry, walked once.
        let mut calls = 0;
        let page = list(&all, &query("", Some("/"), 1000), &mut calls).await;
        assert_eq!(page.prefixes, ["b/", "train/", "val/"]);
        let keys: Vec<&str> = page.objects.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["a.txt", "train-meta", "zz"]);
        assert!(!page.truncated);
        assert!(calls <= 3, "the folder's 25 pages were jumped over: {calls} hub calls");
        // A prefix, inside a folder.
        let (entries, _) = list_all(&all, query("b/", Some("/"), 1000)).await;
        assert_eq!(entries, ["b/x", "b/y/"]);
        let (entries, _) = list_all(&all, query("train/shard-0249", None, 1000)).await;
        assert_eq!(entries.len(), 10);
        // Folders across pages of one entry each.
        let (entries, pages) = list_all(&all, query("", Some("/"), 1)).await;
        assert_eq!(entries, ["a.txt", "b/", "train-meta", "train/", "val/", "zz"]);
        assert_eq!(pages, 6);
        // Nothing under a prefix; no keys asked.
        assert_eq!(list_all(&all, query("nothing/", None, 1000)).await.0.len(), 0);
        assert_eq!(list(&all, &query("", None, 0), &mut calls).await, Page::default());
    }

    #[tokio::test]
    async fn a_forged_token_lists_from_somewhere_else_or_is_refused_never_loops() {
        let names: Vec<String> = (0..300).map(|i| format!("k{i:04}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let all = hub(&names, 50);
        for forged in ["k0150", "a/../b", "\u{0}", "zzzz", "", "k0150/"] {
            let query = Query {
                prefix: String::new(),
                delimiter: Some("/".into()),
                after: Some(forged.into()),
                max_keys: 7,
            };
            let (entries, _) = list_all(&all, query).await;
            assert!(entries.iter().all(|e| e.as_str() > forged), "{forged}: {entries:?}");
        }
        assert!(entry_of("zz").is_err());
        assert!(entry_of("abc").is_err());
        assert!(entry_of("ff").is_err(), "not UTF-8");
        assert_eq!(entry_of(&token("train/ä")).unwrap(), "train/ä");
    }

    #[test]
    fn keys_are_url_encoded_as_botocore_decodes_them() {
        assert_eq!(url_encoded("train/a b+c%.tar"), "train/a%20b%2Bc%25.tar");
        assert_eq!(url_encoded("ä"), "%C3%A4");
    }
}
