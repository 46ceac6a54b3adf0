//! Whom to ask, and when to ask the next one: the one routing type of the project, used
//! by the SDK's groups of spokes, a spoke's peers and a spoke's hubs alike.
//!
//! A [`Router`] holds a group's list ([`members`]: where it comes from, a list, a file or
//! DNS, is the SDK's `discovery`) and answers three questions:
//! - *who owns a shard*: weighted rendezvous hashing over the members' normalised URLs
//!   (`rank.rs`), the owner first;
//! - *who is worth asking now*: each member's [`Health`] (`health.rs`): paused with one
//!   [`Backoff`] after failing as an unwell member would, and demoted when its hedges
//!   keep losing;
//! - *what a failure means*: one table of gRPC statuses, "unwell, ask the next" or "the
//!   answer" (`verdict.rs`).
//!
//! Calls go through [`hedged`] (`hedge.rs`): to the first member of the route, to the next
//! on failure, and to the next as well when the first has not answered within its hedge
//! delay (learned from its recent answer times).

mod health;
mod hedge;
pub mod members;
mod rank;
mod verdict;

use std::sync::Arc;

pub use health::{Backoff, DEMOTE_AFTER, FIRST_BACKOFF, Health, HedgePolicy, MAX_BACKOFF};
pub use hedge::{Candidate, HedgeCounters, hedged, hedged_relayed};
pub use rank::{normalize_url, rendezvous};
pub use verdict::{Judged, Verdict, of_code};

use crate::members::{List, Members, Slot};

/// Members, ranked per shard, asked with hedging (see the module's documentation).
#[derive(Debug)]
pub struct Router<T> {
    members: Arc<Members<T>>,
    policy: HedgePolicy,
    counters: Arc<HedgeCounters>,
}

impl<T> Router<T> {
    /// Routes over `members`, hedging by `policy`; what hedging does is counted in
    /// `counters`.
    pub fn new(members: Arc<Members<T>>, policy: HedgePolicy, counters: Arc<HedgeCounters>) -> Self {
        Self { members, policy, counters }
    }

    pub fn members(&self) -> &Arc<Members<T>> {
        &self.members
    }

    pub fn counters(&self) -> &Arc<HedgeCounters> {
        &self.counters
    }

    /// The members now in the order they own `dataset/shard` (the owner first), or in
    /// list order for a call about no one shard (`None`).
    pub fn ranked(&self, shard: Option<(&str, &str)>) -> Vec<Arc<Slot<T>>> {
        ranked(&self.members.current(), shard)
    }

    /// Whom to ask for `shard`, in order: the members worth asking now first (owners
    /// first), then the others (when every member is paused they are tried anyway),
    /// leaving out the members named in `avoid`.
    pub fn route(&self, shard: Option<(&str, &str)>, avoid: &[String]) -> Vec<Arc<Slot<T>>> {
        let mut order = self.ranked(shard);
        order.retain(|m| !avoid.contains(&m.url));
        // A member on probation after a demotion is tried by one call at a time, and only
        // by a call that asks it first (its own shards): a probe spent elsewhere would
        // prove nothing.
        let probe_owner = order.first().is_some_and(|m| m.health.try_probe());
        let (live, paused): (Vec<_>, Vec<_>) =
            order.into_iter().enumerate().partition(|(i, m)| m.health.is_live() || (*i == 0 && probe_owner));
        live.into_iter().chain(paused).map(|(_, m)| m).collect()
    }

    /// Asks the members of `route` with [`hedged`] calls; `call(i, member)` asks
    /// `route[i]` (the members before it in the route were asked first). `Err(None)`:
    /// the route was empty.
    pub async fn call<R, E, F, Fut>(&self, route: &[Arc<Slot<T>>], call: F) -> Result<R, Option<E>>
    where
        E: Judged,
        F: FnMut(usize, &Arc<Slot<T>>) -> Fut,
        Fut: std::future::Future<Output = Result<R, E>>,
    {
        self.call_relayed(route, call, |_| false).await
    }

    /// [`Router::call`], where an answer for which `relayed` is true was relayed from
    /// the member asked first ([`hedged_relayed`]).
    pub async fn call_relayed<R, E, F, Fut>(
        &self,
        route: &[Arc<Slot<T>>],
        mut call: F,
        relayed: impl Fn(&R) -> bool,
    ) -> Result<R, Option<E>>
    where
        E: Judged,
        F: FnMut(usize, &Arc<Slot<T>>) -> Fut,
        Fut: std::future::Future<Output = Result<R, E>>,
    {
        let candidates: Vec<Candidate> = route.iter().map(|m| Candidate::new(&m.health, &m.url)).collect();
        hedged_relayed(&candidates, &self.policy, &self.counters, |i| call(i, &route[i]), relayed).await
    }
}

/// `list` in the order its members own `dataset/shard` (rendezvous, weighted): the owner
/// first; in list order for `None`.
pub fn ranked<T>(list: &List<T>, shard: Option<(&str, &str)>) -> Vec<Arc<Slot<T>>> {
    let Some((dataset, shard)) = shard else { return list.to_vec() };
    let names: Vec<(&str, f64)> = list.iter().map(|m| (m.url.as_str(), m.weight)).collect();
    rendezvous(&names, dataset, shard).into_iter().map(|i| list[i].clone()).collect()
}
