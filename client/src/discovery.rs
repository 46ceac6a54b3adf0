//! Who is in a group of spokes, and how the list stays current: where the list comes
//! from (its [`Origin`]) and keeping it current; the list the router uses is
//! `shardcache_routing::members`.
//!
//! A group is named by one of:
//! - `URL1,URL2,...`: a fixed list (a spoke's `--peers`, the CLI's `--endpoint`);
//! - `file:PATH`: URLs in a file (commas, spaces or lines; `#` starts a comment),
//!   re-read when it changes (checked every [`FILE_POLL`]);
//! - `dns+http://NAME:PORT` (or `dns+https://`): every address NAME resolves to, on
//!   PORT, re-resolved every [`DNS_REFRESH`]: a Kubernetes headless Service's records
//!   are its ready pods, so members join and leave as pods do.
//!
//! Any URL may carry a weight, `URL?weight=2` (default 1): its share of the shards, in
//! proportion (a member with twice the NVMe owns twice the shards). The weight is part of
//! the member's identity for ranking, so everyone must be given the same list.
//!
//! The list in use is swapped whole when the source changes; members still listed keep
//! their connection and health. A source that cannot be read (a DNS outage, a file being
//! rewritten) keeps the last list: a group never empties because its resolver blinked.

use std::{
    path::PathBuf,
    sync::{Arc, Weak},
    time::{Duration, SystemTime},
};

use shardcache_routing::{
    members::{MemberSpec, Members},
    normalize_url,
};

use shardcache_transport::liveness::LiveChannel;

use crate::ConnectOptions;

/// How often a `file:` source is checked for a change (a `stat`).
pub const FILE_POLL: Duration = Duration::from_secs(1);
/// How often members that failed are asked whether they serve again (grpc.health.v1):
/// a member that comes back is used again within this, not after its pause (up to 30 s).
pub const PROBE_PERIOD: Duration = Duration::from_millis(500);
/// Deadline of one such check: a member that is up answers in well under a millisecond
/// on a local network.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How often a `dns+` source is resolved again: Kubernetes' cluster DNS answers for
/// Services with a 5 s TTL, so a new pod is seen within about 10 s.
pub const DNS_REFRESH: Duration = Duration::from_secs(5);

/// URLs separated by commas, spaces or lines, `#` to the end of a line a comment.
pub fn parse_list(text: &str) -> Result<Vec<MemberSpec>, String> {
    entries(text).map(|(_, entry)| MemberSpec::parse(entry)).collect()
}

/// Each entry of a list with its line number (from 1).
fn entries(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(number, line)| (number + 1, line.split('#').next().unwrap_or_default()))
        .flat_map(|(number, line)| line.split([',', ' ', '\t']).map(move |entry| (number, entry)))
        .filter(|(_, entry)| !entry.is_empty())
}

/// A group file's members, the entries that parse; each one that does not is a
/// warning naming its line. A file edited by hand or by a script keeps its group when
/// one line is wrong: the members it does name are not dropped for it.
pub fn parse_file(text: &str, path: &std::path::Path) -> (Vec<MemberSpec>, Vec<String>) {
    let (mut members, mut bad) = (Vec::new(), Vec::new());
    for (number, entry) in entries(text) {
        match MemberSpec::parse(entry) {
            Ok(member) => members.push(member),
            Err(e) => bad.push(format!("{}:{number}: {e}; the line is left out", path.display())),
        }
    }
    (members, bad)
}

/// Where a group's members come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    List(Vec<MemberSpec>),
    File(PathBuf),
    Dns { scheme: String, host: String, port: u16 },
}

impl Origin {
    /// The source `spec` names (see the module's documentation).
    pub fn parse(spec: &str) -> Result<Self, String> {
        let spec = spec.trim();
        if let Some(path) = spec.strip_prefix("file:") {
            return Ok(Self::File(PathBuf::from(path)));
        }
        if let Some(rest) = spec.strip_prefix("dns+") {
            let (scheme, name) = rest
                .split_once("://")
                .filter(|(s, _)| *s == "http" || *s == "https")
                .ok_or_else(|| format!("{spec:?}: use dns+http://NAME:PORT or dns+https://NAME:PORT"))?;
            let (host, port) = name
                .trim_end_matches('/')
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
                .filter(|(h, _)| !h.is_empty())
                .ok_or_else(|| format!("{spec:?}: the name needs a port, e.g. dns+http://spokes:7070"))?;
            return Ok(Self::Dns { scheme: scheme.to_owned(), host: host.to_owned(), port });
        }
        Ok(Self::List(parse_list(spec)?))
    }

    /// Whether the list can change (so it must be watched).
    pub fn is_dynamic(&self) -> bool {
        !matches!(self, Self::List(_))
    }

    /// Whether this names a group rather than one server: a list of several, or a
    /// source whose members may come and go.
    pub fn is_group(&self) -> bool {
        match self {
            Self::List(list) => list.len() > 1,
            _ => true,
        }
    }

    /// The members now, in a stable order (a resolver's answer sorted).
    pub async fn resolve(&self) -> Result<Vec<MemberSpec>, String> {
        match self {
            Self::List(list) => Ok(list.clone()),
            Self::File(path) => {
                let text = tokio::fs::read_to_string(path)
                    .await
                    .map_err(|e| format!("group file {}: {e}", path.display()))?;
                let (members, bad) = parse_file(&text, path);
                for line in bad {
                    tracing::warn!(problem = line, "a line of the group file is not a member URL");
                }
                Ok(members)
            }
            Self::Dns { scheme, host, port } => {
                let addresses = tokio::net::lookup_host((host.as_str(), *port))
                    .await
                    .map_err(|e| format!("resolving {host}: {e}"))?;
                let mut urls: Vec<String> =
                    addresses.map(|a| normalize_url(&format!("{scheme}://{a}"))).collect();
                urls.sort();
                urls.dedup();
                Ok(urls.into_iter().map(|url| MemberSpec { url, weight: 1.0 }).collect())
            }
        }
    }

    /// `options` for connecting to this source's members: a `dns+https` group's members
    /// are addresses, so their certificates are checked against the name resolved (a
    /// Service's certificate names the Service), unless `options` name another.
    pub fn connect_options(&self, options: &ConnectOptions) -> ConnectOptions {
        let mut options = options.clone();
        if let Self::Dns { scheme, host, .. } = self
            && scheme == "https"
        {
            let tls = options.tls.get_or_insert_with(Default::default);
            tls.domain.get_or_insert_with(|| host.clone());
        }
        options
    }

    /// A token that changes when the source may have: a file's modification time;
    /// `None` for sources that must be asked every time.
    fn stamp(&self) -> Option<SystemTime> {
        match self {
            Self::File(path) => std::fs::metadata(path).and_then(|m| m.modified()).ok(),
            _ => None,
        }
    }
}

/// A client's members for `endpoint`, in the one way the SDK connects: one server
/// (connected now, so that a wrong URL or a server that is down fails at once), or a
/// group from its [`Origin`] (`connect`); each member made into a `T` by `conn`.
pub async fn connect_one_or_group<T: Send + Sync + 'static>(
    endpoint: &str,
    options: &ConnectOptions,
    conn: impl Fn(LiveChannel) -> T + Send + 'static,
) -> crate::Result<Connected<T>> {
    let origin = Origin::parse(endpoint).map_err(crate::Error::Config)?;
    match &origin {
        Origin::List(list) if !origin.is_group() => {
            let one = list.first().cloned().unwrap_or_else(|| MemberSpec::new(endpoint));
            let channel = crate::connect::connect_channel(&one.url, options).await?;
            let mut made = Some(conn(channel));
            let members = Members::new(std::slice::from_ref(&one), |_| made.take().ok_or(()))
                .unwrap_or_else(|()| unreachable!());
            Ok(Connected { members: Arc::new(members), name: one.url, group: false })
        }
        _ => {
            let members = connect(origin, endpoint, options, conn).await?;
            Ok(Connected { members, name: endpoint.to_owned(), group: true })
        }
    }
}

/// What [`connect_one_or_group`] connected.
#[derive(Debug)]
pub struct Connected<T> {
    pub members: Arc<Members<T>>,
    /// What the client goes by in errors: the one server's URL (normalised), or the
    /// group as it was given.
    pub name: String,
    /// Whether it is a group (whose failed members are worth probing).
    pub group: bool,
}

/// A group's members from `source` (named `what` in log lines), each connected lazily with
/// `options` (TLS and token as for any server) and made into a `T` by `conn`, kept
/// current while the source is dynamic.
pub async fn connect<T: Send + Sync + 'static>(
    source: Origin,
    what: &str,
    options: &ConnectOptions,
    conn: impl Fn(LiveChannel) -> T + Send + 'static,
) -> crate::Result<Arc<Members<T>>> {
    let specs = source.resolve().await.map_err(crate::Error::Config)?;
    let options = source.connect_options(options);
    let make = move |url: &str| -> Result<T, String> {
        let channel = crate::connect::connect_channel_lazy(url, &options).map_err(|e| e.to_string())?;
        Ok(conn(channel))
    };
    let members = Arc::new(Members::new(&specs, &make).map_err(crate::Error::Config)?);
    watch(&members, source, what.to_owned(), make, false, None);
    Ok(members)
}

/// Keeps `members` up to date with a dynamic `source` until they are dropped: new
/// members are connected with `make`; `what` names the group in log lines. The first
/// reading is at once when `now`, else after the first period (the caller has just
/// read it). A member `me` (a spoke watching its own group) is kept in the list when
/// the source leaves it out: a spoke that joins is listed by its peers' resolvers before
/// its own (a DNS answer cached a little longer), and ranking without itself while they
/// rank with it would have each ask the other for what neither fetches.
pub fn watch<T: Send + Sync + 'static>(
    members: &Arc<Members<T>>,
    source: Origin,
    what: String,
    make: impl Fn(&str) -> Result<T, String> + Send + 'static,
    now: bool,
    me: Option<String>,
) {
    if !source.is_dynamic() {
        return;
    }
    let members: Weak<Members<T>> = Arc::downgrade(members);
    let every = if matches!(source, Origin::File(_)) { FILE_POLL } else { DNS_REFRESH };
    tokio::spawn(async move {
        let mut seen = if now { None } else { source.stamp() };
        let mut first = now;
        loop {
            if !std::mem::take(&mut first) {
                tokio::time::sleep(every).await;
            }
            let Some(members) = members.upgrade() else { return };
            let stamp = source.stamp();
            if stamp.is_some() && stamp == seen {
                continue;
            }
            match source.resolve().await {
                Ok(specs) if specs.is_empty() => {
                    tracing::warn!(
                        group = what,
                        "the group's source lists no members; keeping the last list"
                    );
                }
                Ok(mut specs) => {
                    seen = stamp;
                    if let Some(me) = me.as_deref() {
                        with_member(&mut specs, me);
                    }
                    // A member that cannot be connected is left out (a warning names it),
                    // not the whole new list.
                    specs.retain(|spec| {
                        members.has(&spec.url)
                            || make(&spec.url)
                                .map_err(|e| {
                                    tracing::warn!(
                                        group = what,
                                        member = spec.url,
                                        error = e,
                                        "a member cannot be used; left out"
                                    )
                                })
                                .is_ok()
                    });
                    match members.replace(&specs, &make) {
                        Ok(true) => tracing::info!(
                            group = what,
                            members = ?specs.iter().map(|s| s.url.as_str()).collect::<Vec<_>>(),
                            "group membership changed"
                        ),
                        Ok(false) => {}
                        Err(e) => tracing::warn!(group = what, error = e, "a new member cannot be used"),
                    }
                }
                Err(e) => tracing::warn!(
                    group = what,
                    error = e,
                    "cannot read the group's members; keeping the last list"
                ),
            }
        }
    });
}

/// Adds `me` to `specs` when they do not name it (see [`watch`]).
pub fn with_member(specs: &mut Vec<MemberSpec>, me: &str) {
    if !specs.iter().any(|s| s.url == me) {
        specs.push(MemberSpec::new(me));
    }
}

/// Asks the members of `members` that failed, every [`PROBE_PERIOD`], whether they serve
/// (`probe`: a gRPC health check), until `members` are dropped; one that says so is used
/// again at once.
pub fn probe_failed<T: Send + Sync + 'static>(
    members: &Arc<Members<T>>,
    probe: impl Fn(&T) -> futures::future::BoxFuture<'static, bool> + Send + 'static,
) {
    let members: Weak<Members<T>> = Arc::downgrade(members);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(PROBE_PERIOD).await;
            let Some(members) = members.upgrade() else { return };
            let failed: Vec<_> =
                members.current().iter().filter(|m| m.health.has_failed()).cloned().collect();
            drop(members);
            let checks = failed.into_iter().map(|member| {
                let check = tokio::time::timeout(PROBE_TIMEOUT, probe(&member.conn));
                async move {
                    if check.await.unwrap_or(false) && member.health.serving_again() {
                        tracing::info!(member = member.url, "member serves again");
                    }
                }
            });
            futures::future::join_all(checks).await;
        }
    });
}

/// A member's health client (grpc.health.v1; servers answer it without a token).
pub type HealthClient = tonic_health::pb::health_client::HealthClient<LiveChannel>;

/// Whether `health`'s server says the read service (`shardcache.v1.ShardReader`, which
/// hubs and spokes both serve) is SERVING.
pub fn serving(health: &HealthClient) -> futures::future::BoxFuture<'static, bool> {
    let mut health = health.clone();
    Box::pin(async move {
        let service = shardcache_proto::v1::shard_reader_server::SERVICE_NAME.into();
        let request = tonic_health::pb::HealthCheckRequest { service };
        health.check(request).await.is_ok_and(|r| {
            r.into_inner().status() == tonic_health::pb::health_check_response::ServingStatus::Serving
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_and_weights_parse_with_messages_that_say_what_to_write() {
        let list = Origin::parse("http://a:1, http://b:2?weight=2.5,,").unwrap();
        assert_eq!(
            list,
            Origin::List(vec![
                MemberSpec { url: "http://a:1".into(), weight: 1.0 },
                MemberSpec { url: "http://b:2".into(), weight: 2.5 },
            ])
        );
        assert!(!list.is_dynamic() && list.is_group());
        assert!(!Origin::parse("http://a:1").unwrap().is_group());
        assert_eq!(Origin::parse("file:/etc/spokes").unwrap(), Origin::File("/etc/spokes".into()));
        assert_eq!(
            Origin::parse("dns+https://spokes.ml.svc:7070").unwrap(),
            Origin::Dns { scheme: "https".into(), host: "spokes.ml.svc".into(), port: 7070 }
        );
        assert!(Origin::parse("dns+http://spokes").unwrap_err().contains("needs a port"));
        let dns = Origin::parse("dns+https://spokes.ml.svc:7070").unwrap();
        let tls = dns.connect_options(&ConnectOptions::default()).tls.unwrap();
        assert_eq!(tls.domain.as_deref(), Some("spokes.ml.svc"), "members' certificates name the Service");
        assert!(Origin::parse("dns+ftp://spokes:1").unwrap_err().contains("dns+http://"));
        assert!(Origin::parse("http://a:1?weight=0").unwrap_err().contains("positive"));
        assert!(Origin::parse("http://a:1?w=2").unwrap_err().contains("?weight=N"));
        let file = parse_list("# the group\nhttp://a:1 # first\n\nhttp://b:2,http://c:3\n").unwrap();
        assert_eq!(
            file.iter().map(|m| m.url.as_str()).collect::<Vec<_>>(),
            ["http://a:1", "http://b:2", "http://c:3"]
        );
    }

    #[tokio::test]
    async fn a_group_file_with_a_bad_line_keeps_its_good_members_and_follows_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spokes");
        // A weight that does not parse, and a URL no channel can be made for.
        std::fs::write(&path, "http://a:1\nhttp://b:2?weight=0\nnot-a-url\nhttp://c:3\n").unwrap();
        let (members, bad) = parse_file(&std::fs::read_to_string(&path).unwrap(), &path);
        assert_eq!(members.len(), 3, "{members:?}");
        assert!(bad.len() == 1 && bad[0].contains("spokes:2") && bad[0].contains("?weight=N"), "{bad:?}");
        let make = |url: &str| {
            if url.contains("://") { Ok(url.to_owned()) } else { Err(format!("{url}: no scheme")) }
        };
        let group = Arc::new(Members::new(&[MemberSpec::new("http://old:1")], make).unwrap());
        watch(&group, Origin::File(path.clone()), "test".into(), make, true, None);
        let urls =
            |group: &Members<String>| group.current().iter().map(|s| s.url.clone()).collect::<Vec<_>>();
        let mut seen = Vec::new();
        for _ in 0..100 {
            seen = urls(&group);
            if seen != ["http://old:1"] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(seen, ["http://a:1", "http://c:3"], "the good members, not the old list");
        // And the next change is still followed.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        std::fs::write(&path, "http://c:3\nhttp://d:4\n").unwrap();
        for _ in 0..300 {
            seen = urls(&group);
            if seen == ["http://c:3", "http://d:4"] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(seen, ["http://c:3", "http://d:4"]);
    }
}
