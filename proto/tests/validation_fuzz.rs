//! Property tests (a short fuzz run on every `make test`) of the checks that stand
//! between a request and the filesystem or the cache: names and ranges. Inputs are
//! built from the pieces attacks are made of (`..`, `/`, `\`, NUL, control characters,
//! dots, long runs, any Unicode), so the interesting cases come up in every run.
//! `PROPTEST_CASES=100000 cargo test -p shardcache-proto --test validation_fuzz` fuzzes longer.
#![allow(clippy::unwrap_used)]

use std::path::{Component, Path};

use proptest::prelude::*;
use shardcache_proto::{
    names::{DatasetName, MAX_COMPONENT_LEN, MAX_DATASET_LEN, MAX_SHARD_LEN, ShardName},
    range::{MAX_RANGES_PER_CALL, check_count, check_total, check_within},
};

fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("..".to_owned()),
        Just(".".to_owned()),
        Just("/".to_owned()),
        Just("\\".to_owned()),
        Just("\0".to_owned()),
        Just("\n".to_owned()),
        Just(".hidden".to_owned()),
        Just("~".to_owned()),
        "[a-z0-9_-]{1,8}",
        any::<char>().prop_map(String::from),
        (1usize..300).prop_map(|n| "x".repeat(n)),
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop::collection::vec(piece(), 0..12).prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// An accepted shard name joined to a root never leaves it and never names a
    /// hidden file; a refused one has a reason a person can read.
    #[test]
    fn accepted_shard_names_stay_inside_their_dataset(name in name()) {
        match ShardName::new(&name) {
            Ok(shard) => {
                prop_assert!(shard.as_str().len() <= MAX_SHARD_LEN);
                let root = Path::new("/srv/data/ds");
                let joined = shard.components().fold(root.to_path_buf(), |p, c| p.join(c));
                prop_assert!(joined.starts_with(root));
                for component in Path::new(shard.as_str()).components() {
                    let Component::Normal(part) = component else {
                        return Err(TestCaseError::fail(format!("{component:?} in {name:?}")));
                    };
                    let part = part.to_str().unwrap();
                    prop_assert!(!part.starts_with('.') && part.len() <= MAX_COMPONENT_LEN);
                    prop_assert!(!part.contains(['\0', '\\']) && !part.chars().any(char::is_control));
                }
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// An accepted dataset name is exactly one ordinary path component.
    #[test]
    fn accepted_dataset_names_are_one_component(name in name()) {
        if let Ok(dataset) = DatasetName::new(&name) {
            prop_assert!(dataset.as_str().len() <= MAX_DATASET_LEN);
            let components: Vec<_> = Path::new(dataset.as_str()).components().collect();
            prop_assert_eq!(components.len(), 1);
            prop_assert!(matches!(components[0], Component::Normal(_)));
        }
    }

    /// A range is accepted exactly when it lies inside the shard, with no overflow.
    #[test]
    fn ranges_are_accepted_exactly_when_inside(offset in any::<u64>(), length in any::<u64>(), size in any::<u64>()) {
        let inside = offset.checked_add(length).is_some_and(|end| end <= size);
        prop_assert_eq!(check_within(offset, length, size).is_ok(), inside);
    }

    /// Small values near the edges, where off-by-one errors live.
    #[test]
    fn ranges_at_the_edges(offset in 0u64..70, length in 0u64..70, size in 0u64..70) {
        prop_assert_eq!(check_within(offset, length, size).is_ok(), offset + length <= size);
    }

    #[test]
    fn totals_and_counts_respect_their_limits(total in any::<u64>(), limit in any::<u64>(), count in 0usize..10_000) {
        prop_assert_eq!(check_total(total, limit).is_ok(), total <= limit);
        prop_assert_eq!(check_count(count).is_ok(), count <= MAX_RANGES_PER_CALL);
    }
}
