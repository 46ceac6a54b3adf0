//! The header a read carries when a client of a group of spokes sends it to a member
//! other than the first it asked (a hedge, or a failover): the members already asked.
//! The spoke that receives it does not ask those members for the chunks it lacks (it
//! goes on to the next peer or the hub), so a member that hangs costs the read one hedge
//! delay, not one at the client and another at the spoke.

/// Request header: the URLs of the members already asked for this read, comma-separated,
/// as the client's group names them.
pub const AVOID_HEADER: &str = "shardcache-avoid";

/// Most URLs an avoid header is read for (a group's members; more are ignored).
pub const MAX_AVOIDED: usize = 16;

/// The member URLs of an avoid header's value.
pub fn parse_avoided(value: &str) -> Vec<String> {
    value.split(',').map(str::trim).filter(|u| !u.is_empty()).take(MAX_AVOIDED).map(str::to_owned).collect()
}

/// Request header of a `ReadCached` a member sends the owner of a shard when a client's
/// hedge (or failover) reached it with the owner in `AVOID_HEADER`: the owner answers
/// from its store, or with the bytes of a fetch of that range it is running, waiting
/// for them, and says "not here" only when it neither holds nor fetches them. So a hedge
/// costs the long link nothing when the owner is merely slow.
pub const JOIN_HEADER: &str = "shardcache-join-fetch";

/// Response header of a read a member answered with bytes the owner gave it (a join,
/// above): the owner answered that read, the member only relayed it. A client that
/// hedged to the member does not count the race as lost by the owner, so a healthy
/// owner slowed by a cold fetch is not demoted for the hedges that joined it.
pub const RELAYED_HEADER: &str = "shardcache-relayed";
