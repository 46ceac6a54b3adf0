//! The mount's tree, `DATASET/SHARD`, as inodes: the root (1), a directory per dataset
//! and a file per shard, numbered as they are first seen and never reused (a kernel that
//! still holds an old number never reaches another file). Listings come from the server
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
    Shard { dataset: String, shard: String, size: u64 },
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

    /// The inode of `dataset` (and `shard`), numbered now if new; a shard's size is
    /// updated to `size`.
    pub fn number(&mut self, dataset: &str, shard: Option<(&str, u64)>) -> u64 {
        let key = (dataset.to_owned(), shard.map(|(s, _)| s.to_owned()));
        let ino = *self.numbers.entry(key).or_insert_with(|| {
            self.next += 1;
            self.next - 1
        });
        let node = match shard {
            None => Node::Dataset(dataset.to_owned()),
            Some((shard, size)) => Node::Shard { dataset: dataset.to_owned(), shard: shard.to_owned(), size },
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

    /// `dataset`'s shards as listed: `(name, size)`.
    pub fn set_shards(&mut self, dataset: &str, shards: Vec<(String, u64)>) {
        for (name, size) in &shards {
            self.number(dataset, Some((name, *size)));
        }
        let names = shards.into_iter().map(|(name, _)| name).collect();
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
        tree.set_shards("a", vec![("s0".into(), 10), ("s1".into(), 20)]);
        let s1 = tree.find("a", Some("s1")).unwrap();
        assert_ne!(a, s1);
        assert_eq!(tree.node(s1), Some(&Node::Shard { dataset: "a".into(), shard: "s1".into(), size: 20 }));
        // Listed again with a new size: same number, new size.
        tree.set_shards("a", vec![("s1".into(), 30)]);
        assert_eq!(tree.find("a", Some("s1")), Some(s1));
        assert_eq!(tree.node(s1), Some(&Node::Shard { dataset: "a".into(), shard: "s1".into(), size: 30 }));
        assert_eq!(tree.shards("a").unwrap(), ["s1"]);
        assert_eq!(tree.node(ROOT), Some(&Node::Root));
        assert!(tree.datasets().unwrap().contains(&"b".to_owned()));
    }
}
