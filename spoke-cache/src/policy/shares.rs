//! Each tenant's share of the cache (`--tenant-shares alice=3,bob=1`): a principal's share
//! is its weight over the weights of the principals holding bytes now, times the
//! capacity, so a share no one uses is lent out to those who read. Eviction takes from
//! principals holding more than their share first (`evict.rs`: the order), so one principal's scan
//! or random reads cannot push another's working set below its share; an admission is
//! weighed against what its own eviction would take (`policy::admit`).
//!
//! A cached shard is held by the principal whose read first stored a chunk of it (a
//! plan's fetches by the plan's, a prefetch's by the caller's); others reading it read it
//! for free. Principals not named weigh [`DEFAULT_WEIGHT`] (`*=W` changes it).

use std::collections::{BTreeMap, HashMap, HashSet};

/// The weight of a principal `--tenant-shares` does not name: all equal by default.
pub const DEFAULT_WEIGHT: f64 = 1.0;

/// Tenants' weights (see the module's documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct Shares {
    weights: BTreeMap<String, f64>,
    default: f64,
}

impl Default for Shares {
    fn default() -> Self {
        Self { weights: BTreeMap::new(), default: DEFAULT_WEIGHT }
    }
}

impl Shares {
    /// `NAME=WEIGHT,...` (`*=WEIGHT` for the principals not named); empty: all equal.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut shares = Self::default();
        for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, weight) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?} is not NAME=WEIGHT (e.g. alice=3,bob=1,*=1)"))?;
            let weight: f64 =
                weight.trim().parse().ok().filter(|w: &f64| w.is_finite() && *w > 0.0).ok_or_else(|| {
                    format!("the weight of {name:?} must be a number above 0, not {weight:?}")
                })?;
            match name.trim() {
                "*" => shares.default = weight,
                "" => return Err(format!("{item:?} names no principal")),
                name => {
                    shares.weights.insert(name.to_owned(), weight);
                }
            }
        }
        Ok(shares)
    }

    pub fn weight(&self, principal: &str) -> f64 {
        self.weights.get(principal).copied().unwrap_or(self.default)
    }

    /// Each principal of `held` (bytes held per principal) with its share of `capacity`
    /// among those holding bytes.
    pub fn of(&self, held: &HashMap<String, u64>, capacity: u64) -> HashMap<String, u64> {
        let holding: Vec<(&String, f64)> =
            held.iter().filter(|(_, bytes)| **bytes > 0).map(|(p, _)| (p, self.weight(p))).collect();
        let total: f64 = holding.iter().map(|(_, w)| w).sum();
        holding
            .into_iter()
            .map(|(principal, weight)| (principal.clone(), (capacity as f64 * weight / total) as u64))
            .collect()
    }

    /// The principals of `held` that hold more than their share of `capacity`.
    pub fn over(&self, held: &HashMap<String, u64>, capacity: u64) -> HashSet<String> {
        let shares = self.of(held, capacity);
        held.iter()
            .filter(|(principal, bytes)| shares.get(*principal).is_some_and(|share| **bytes > *share))
            .map(|(principal, _)| principal.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(items: &[(&str, u64)]) -> HashMap<String, u64> {
        items.iter().map(|(p, b)| ((*p).to_owned(), *b)).collect()
    }

    #[test]
    fn shares_are_weighted_among_those_holding_bytes() {
        let shares = Shares::parse("alice=3, bob=1").unwrap();
        assert_eq!(shares.weight("carol"), DEFAULT_WEIGHT);
        let now = held(&[("alice", 50), ("bob", 50), ("carol", 0)]);
        let of = shares.of(&now, 100);
        assert_eq!((of["alice"], of["bob"]), (75, 25), "carol holds nothing: her share is lent out");
        assert_eq!(shares.over(&now, 100), HashSet::from(["bob".to_owned()]));
        assert!(shares.over(&held(&[("alice", 100)]), 100).is_empty(), "alone, all of it");
        let equal = Shares::parse("").unwrap();
        assert_eq!(equal.over(&held(&[("a", 60), ("b", 40)]), 100), HashSet::from(["a".to_owned()]));
        assert_eq!(Shares::parse("*=2,a=1").unwrap().of(&held(&[("a", 1), ("b", 1)]), 90)["b"], 60);
    }

    #[test]
    fn bad_specs_say_what_to_write() {
        assert!(Shares::parse("alice").unwrap_err().contains("NAME=WEIGHT"));
        assert!(Shares::parse("alice=0").unwrap_err().contains("above 0"));
        assert!(Shares::parse("alice=x").unwrap_err().contains("above 0"));
        assert!(Shares::parse("=2").unwrap_err().contains("names no principal"));
    }
}
