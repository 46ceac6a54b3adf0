//! A group's list as the router uses it: each member's URL and weight ([`MemberSpec`]),
//! its health and what talks to it ([`Slot`]), and the list in use, swapped whole when
//! its origin changes ([`Members`]). Where the list comes from (a fixed list, a file,
//! DNS) and keeping it current is the SDK's discovery (`shardcache_client::discovery`).

use std::sync::{Arc, RwLock};

use crate::{Health, normalize_url};

/// One member as a source names it.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberSpec {
    /// Its URL, without the weight, normalised (`routing::normalize_url`): members are
    /// ranked and compared by it.
    pub url: String,
    pub weight: f64,
}

impl MemberSpec {
    /// The member at `url` with weight 1.
    pub fn new(url: &str) -> Self {
        Self { url: normalize_url(url), weight: 1.0 }
    }

    /// `URL` or `URL?weight=W` (W a positive number).
    pub fn parse(entry: &str) -> Result<Self, String> {
        let (url, weight) = match entry.split_once('?') {
            None => (entry, 1.0),
            Some((url, query)) => {
                let weight = query
                    .strip_prefix("weight=")
                    .and_then(|w| w.parse::<f64>().ok())
                    .filter(|w| w.is_finite() && *w > 0.0)
                    .ok_or_else(|| {
                        format!("member {entry:?}: the only option is ?weight=N, N a positive number")
                    })?;
                (url, weight)
            }
        };
        Ok(Self { url: normalize_url(url), weight })
    }
}

/// One member in use: its URL and weight, whether it is answering, and what talks to it.
#[derive(Debug)]
pub struct Slot<T> {
    pub url: String,
    pub weight: f64,
    pub health: Health,
    pub conn: T,
}

/// The members in use, swapped whole when the source changes.
pub type List<T> = Arc<Vec<Arc<Slot<T>>>>;

/// A group's current members.
#[derive(Debug)]
pub struct Members<T> {
    list: RwLock<List<T>>,
}

impl<T> Members<T> {
    /// Members `specs`, each connected with `make`.
    pub fn new<E>(specs: &[MemberSpec], make: impl FnMut(&str) -> Result<T, E>) -> Result<Self, E> {
        let members = Self { list: RwLock::new(Arc::new(Vec::new())) };
        members.replace(specs, make)?;
        Ok(members)
    }

    /// Whether `url` is a member now.
    pub fn has(&self, url: &str) -> bool {
        self.current().iter().any(|slot| slot.url == url)
    }

    /// The list in use: one call works on one list, whatever changes meanwhile.
    pub fn current(&self) -> List<T> {
        self.list.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Makes `specs` the list; members already in it keep their connection and health,
    /// new ones are connected with `make`. Whether anything changed.
    pub fn replace<E>(
        &self,
        specs: &[MemberSpec],
        mut make: impl FnMut(&str) -> Result<T, E>,
    ) -> Result<bool, E> {
        let old = self.current();
        let same = |slot: &Slot<T>, spec: &MemberSpec| slot.url == spec.url && slot.weight == spec.weight;
        if old.len() == specs.len() && old.iter().zip(specs).all(|(slot, spec)| same(slot, spec)) {
            return Ok(false);
        }
        let mut list = Vec::with_capacity(specs.len());
        for spec in specs {
            match old.iter().find(|slot| same(slot, spec)) {
                Some(slot) => list.push(slot.clone()),
                None => list.push(Arc::new(Slot {
                    url: spec.url.clone(),
                    weight: spec.weight,
                    health: Health::default(),
                    conn: make(&spec.url)?,
                })),
            }
        }
        *self.list.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(list);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(urls: &str) -> Vec<MemberSpec> {
        urls.split([',', ' ']).filter(|u| !u.is_empty()).map(MemberSpec::new).collect()
    }

    #[test]
    fn a_new_list_keeps_the_members_it_still_has() {
        let specs = listed("http://a:1 http://b:2");
        let mut made = 0;
        let members = Members::new(&specs, |url| {
            made += 1;
            Ok::<_, String>(url.to_owned())
        })
        .unwrap();
        let before = members.current();
        before[1].health.failed();
        let changed =
            members.replace(&listed("http://b:2 http://c:3"), |url| Ok::<_, String>(format!("new {url}")));
        assert_eq!(changed, Ok(true));
        let after = members.current();
        assert!(Arc::ptr_eq(&before[1], &after[0]), "b kept its connection and health");
        assert!(!after[0].health.is_live());
        assert_eq!(after[1].conn, "new http://c:3");
        assert_eq!(made, 2);
        assert_eq!(members.replace(&listed("http://b:2,http://c:3"), |_| Err("unused")), Ok(false));
    }
}
