//! The mount's tree, `DATASET/SHARD`, as inodes: the root (1), a directory per dataset
//! and a file per shard *version*, numbered as they are first seen and never reused (a
//! kernel that still holds an old number never reaches another file). A shard that
//! changes gets a new inode for its new version: the kernel caches pages per inode, so
//! pages of two versions never share a cache, and a file opened at the old version
//! keeps reading the old inode whatever other processes open. Listings come from the server
//! (`ListDatasets`, `ListShards`) and are kept for [`LISTING_TTL`]: `ls` in a loop or a
//! data loader's `os.listdir` per epoch asks the server once per TTL, not per call.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

/// How long a listing (and the sizes and versions in it) is used before it is asked
/// again. Short: a shard replaced on the hub shows its new size within this.
pub const LISTING_TTL: Duration = Duration::from_secs(2);

/// The root directory's inode (FUSE's).
pub const ROOT: u64 = 1;

/// What an inode is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Root,
    Dataset(String),
    /// A shard at one version (`None` until a listing or an open says which).
    Shard {
        dataset: String,
        shard: String,
        size: u64,
        version: Option<String>,
    },
}

/// Inodes and cached listings.
#[derive(Debug, Default)]
pub struct Tree {
    nodes: HashMap<u64, Node>,
    numbers: HashMap<(String, Option<String>), u64>,
    next: u64,
    /// Dataset names, when listed.
    datasets: Option<(Instant, Vec<String>)>,
    /// Per dataset: its shards' names, when listed.
    shards: HashMap<String, (Instant, Vec<String>)>,
}

impl Tree {
    pub fn new() -> Self {
        Self { next: ROOT + 1, ..Self::default() }
    }

    pub fn node(&self, ino: u64) -> Option<&Node> {
        if ino == ROOT {
            return Some(&Node::Root);
        }
        self.nodes.get(&ino)
    }

    /// The inode of `dataset` (and `shard` at `size` and `version`), numbered now if
    /// new. A shard seen at another version than its inode's gets a new inode (the old
    /// one stays, for the files open on it); one whose inode has no version yet takes
    /// this one.
    pub fn number(&mut self, dataset: &str, shard: Option<(&str, u64, Option<&str>)>) -> u64 {
        let key = (dataset.to_owned(), shard.map(|(s, ..)| s.to_owned()));
        let current = self.numbers.get(&key).copied();
        let changed = match (current.and_then(|ino| self.nodes.get(&ino)), shard) {
            (Some(Node::Shard { version: Some(was), .. }), Some((_, _, Some(now)))) => was != now,
            _ => false,
        };
        let ino = match current {
            Some(ino) if !changed => ino,
            _ => {
                self.next += 1;
                self.numbers.insert(key, self.next - 1);
                self.next - 1
            }
        };
        let node = match shard {
            None => Node::Dataset(dataset.to_owned()),
            Some((shard, size, version)) => {
                let known = match self.nodes.get(&ino) {
                    Some(Node::Shard { version, .. }) => version.clone(),
                    _ => None,
                };
                Node::Shard {
                    dataset: dataset.to_owned(),
                    shard: shard.to_owned(),
                    size,
                    version: version.map(str::to_owned).or(known),
                }
            }
        };
        self.nodes.insert(ino, node);
        ino
    }

    /// The dataset names, when listed within [`LISTING_TTL`].
    pub fn datasets(&self) -> Option<&[String]> {
        self.datasets.as_ref().filter(|(at, _)| at.elapsed() < LISTING_TTL).map(|(_, names)| names.as_slice())
    }

    pub fn set_datasets(&mut self, names: Vec<String>) {
        for name in &names {
            self.number(name, None);
        }
        self.datasets = Some((Instant::now(), names));
    }

    /// `dataset`'s shard names, when listed within [`LISTING_TTL`].
    pub fn shards(&self, dataset: &str) -> Option<&[String]> {
        self.shards
            .get(dataset)
            .filter(|(at, _)| at.elapsed() < LISTING_TTL)
            .map(|(_, names)| names.as_slice())
    }

    /// `dataset`'s shards as listed: `(name, size, version)`.
    pub fn set_shards(&mut self, dataset: &str, shards: Vec<(String, u64, String)>) {
        for (name, size, version) in &shards {
            self.number(dataset, Some((name, *size, Some(version))));
        }
        let names = shards.into_iter().map(|(name, ..)| name).collect();
        self.shards.insert(dataset.to_owned(), (Instant::now(), names));
    }

    /// The inode of an already numbered `dataset` (and `shard`).
    pub fn find(&self, dataset: &str, shard: Option<&str>) -> Option<u64> {
        self.numbers.get(&(dataset.to_owned(), shard.map(str::to_owned))).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_stable_and_never_reused() {
        let mut tree = Tree::new();
        tree.set_datasets(vec!["a".into(), "b".into()]);
        let a = tree.find("a", None).unwrap();
        tree.set_shards("a", vec![("s0".into(), 10, "v1".into()), ("s1".into(), 20, "v1".into())]);
        let s1 = tree.find("a", Some("s1")).unwrap();
        assert_ne!(a, s1);
        let shard = |size, version: &str| Node::Shard {
            dataset: "a".into(),
            shard: "s1".into(),
            size,
            version: Some(version.into()),
        };
        assert_eq!(tree.node(s1), Some(&shard(20, "v1")));
        // Listed again at the same version: the same number.
        tree.set_shards("a", vec![("s1".into(), 20, "v1".into())]);
        assert_eq!(tree.find("a", Some("s1")), Some(s1));
        // At a new version: a new number for the name; the old inode stays, as it was,
        // for the files open on it.
        tree.set_shards("a", vec![("s1".into(), 30, "v2".into())]);
        let s1_v2 = tree.find("a", Some("s1")).unwrap();
        assert_ne!(s1_v2, s1);
        assert_eq!(tree.node(s1_v2), Some(&shard(30, "v2")));
        assert_eq!(tree.node(s1), Some(&shard(20, "v1")));
        assert_eq!(tree.shards("a").unwrap(), ["s1"]);
        assert_eq!(tree.node(ROOT), Some(&Node::Root));
        assert!(tree.datasets().unwrap().contains(&"b".to_owned()));
    }
}
