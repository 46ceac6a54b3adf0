//! `shardcache status`: what a spoke holds, fetched and serves, per dataset, principal, job and group member.

use super::*;

pub async fn status(server: &Server) -> anyhow::Result<()> {
    let status = server.cache().await?.status().await?;
    if status.server_view {
        let percent = status.used_bytes as f64 * 100.0 / status.capacity_bytes.max(1) as f64;
        println!(
            "cache: {} of {} used ({percent:.1}%; RocksDB's own files {} beside it), {} shards evicted ({}), \
             {} checksum failures, hubs {}",
            ByteSize(status.used_bytes).human(),
            ByteSize(status.capacity_bytes).human(),
            ByteSize(status.store_own_bytes).human(),
            status.evicted_shards,
            ByteSize(status.evicted_bytes).human(),
            status.checksum_failures,
            status.hubs.join(",")
        );
        if !status.hub_trouble.is_empty() {
            println!("{}", hubs_unreachable(status.hub_trouble_age_s, &status.hub_trouble));
        }
        println!(
            "speculation: {:.0}% of what read-ahead and whole-shard fetches brought lately was read, {} unread",
            status.speculation_useful_share * 100.0,
            ByteSize(status.speculation_unread_bytes).human()
        );
        println!(
            "hub fetches: {} as they are, {} asked for zstd (--hub-compression); {} received from the hubs in \
             all (framing, listings and stats included), {} fetches running",
            status.hub_fetches_plain,
            status.hub_fetches_zstd,
            ByteSize(status.hub_bytes_received).human(),
            status.fetches_in_flight
        );
        if status.kept_sample_bytes > 0 || status.staged_sample_bytes > 0 {
            println!(
                "samples: {} kept for later epochs in {} packs, {} fetched ahead of reads (window {})",
                ByteSize(status.kept_sample_bytes).human(),
                status.kept_sample_packs,
                ByteSize(status.staged_sample_bytes).human(),
                ByteSize(status.sample_window_bytes).human()
            );
        }
    } else {
        println!(
            "cache: as {:?}: your datasets, jobs and plans (capacity, hubs and global counters need a token with \
             `control`)",
            status.principal
        );
    }
    print_datasets(&status);
    print_principals(&status);
    print_jobs(&status);
    print_group(&status);
    if !status.plans.is_empty() {
        println!();
        println!("{:<32} {:>10} {:>10} {:>6} {:>8}", "PLAN", "CURSOR", "POSITIONS", "LAG", "FOLLOWED");
        for p in &status.plans {
            let job = owned_by(&p.principal, &p.job, &status.principal);
            let followed = if p.samples { "samples" } else { "shards" };
            println!("{job:<32} {:>10} {:>10} {:>6} {followed:>8}", p.cursor, p.positions, p.lag);
        }
    }
    Ok(())
}

/// A row per dataset: what is cached, hits and misses, bytes fetched and on the link.
fn print_datasets(status: &shardcache_proto::v1::StatusResponse) {
    println!(
        "{:<24} {:>7} {:>14} {:>6} {:>10} {:>10} {:>8} {:>14} {:>14} {:>10}",
        "DATASET",
        "SHARDS",
        "CACHED",
        "PINNED",
        "HITS",
        "MISSES",
        "HIT%",
        "UPSTREAM",
        "ON THE LINK",
        "LINK/READ"
    );
    for d in &status.datasets {
        let total = d.hit_requests + d.miss_requests;
        let hit = if total == 0 {
            "-".to_owned()
        } else {
            format!("{:.1}", d.hit_requests as f64 * 100.0 / total as f64)
        };
        println!(
            "{:<24} {:>7} {:>14} {:>6} {:>10} {:>10} {:>8} {:>14} {:>14} {:>10}",
            d.dataset,
            d.cached_shards,
            ByteSize(d.cached_bytes).human(),
            d.pinned_shards,
            d.hit_requests,
            d.miss_requests,
            hit,
            ByteSize(d.upstream_bytes).human(),
            // What the upstream bytes took on the link (the hub compresses what pays); "-"
            // from a spoke too old to count it.
            match (d.upstream_wire_bytes, d.upstream_bytes) {
                (0, fetched) if fetched > 0 => "-".to_owned(),
                (wire, _) => ByteSize(wire).human(),
            },
            // Bytes over the long link per byte read: 1 is what reading with no cache
            // would cost, less is what the cache saves.
            per_byte(d.upstream_wire_bytes, d.hit_bytes + d.miss_bytes),
        );
    }
}

/// What each principal holds against its share of the capacity.
fn print_principals(status: &shardcache_proto::v1::StatusResponse) {
    if !status.principals.is_empty() {
        println!();
        println!("{:<32} {:>14} {:>14}", "PRINCIPAL", "HELD", "SHARE");
        for p in &status.principals {
            let name = if p.principal.is_empty() { "(open)" } else { p.principal.as_str() };
            let (held, share) = (ByteSize(p.held_bytes).human(), ByteSize(p.share_bytes).human());
            println!("{name:<32} {held:>14} {share:>14}");
        }
    }
}

/// Per job and epoch (reads say which with the SDK's job headers; "" for those that do
/// not, and for Prefetch calls).
fn print_jobs(status: &shardcache_proto::v1::StatusResponse) {
    if !status.jobs.is_empty() {
        println!();
        println!(
            "{:<32} {:>6} {:>10} {:>8} {:>14} {:>14} {:>10}",
            "JOB", "EPOCH", "READS", "HIT%", "BYTES", "HUB BYTES", "LINK/READ"
        );
        for j in &status.jobs {
            let hit = if j.reads == 0 {
                "-".to_owned()
            } else {
                format!("{:.1}", j.hit_reads as f64 * 100.0 / j.reads as f64)
            };
            let job = if j.job.is_empty() { "(untagged)" } else { j.job.as_str() };
            let job = owned_by(&j.principal, job, &status.principal);
            let (bytes, hub_bytes) = (ByteSize(j.bytes).human(), ByteSize(j.hub_bytes).human());
            let link = per_byte(j.link_bytes, j.bytes);
            println!(
                "{job:<32} {:>6} {:>10} {hit:>8} {bytes:>14} {hub_bytes:>14} {link:>10}",
                j.epoch, j.reads
            );
        }
    }
}

/// `over` per byte of `per`, two decimals ("-" for nothing read).
fn per_byte(over: u64, per: u64) -> String {
    if per == 0 { "-".to_owned() } else { format!("{:.2}", over as f64 / per as f64) }
}

/// Each member's view of the group: a member refusing another's credentials means the
/// group fetches more than one copy over the long link.
fn print_group(status: &shardcache_proto::v1::StatusResponse) {
    if status.members.is_empty() {
        return;
    }
    println!();
    println!("{:<32} {:<24} SEEN BY", "MEMBER", "STATE");
    for m in &status.members {
        println!("{:<32} {:<24} {}", m.url, m.state, m.seen_by);
    }
    if status.peer_refusals > 0 {
        println!(
            "members refused each other's credentials {} times: the group is not sharing one copy (see the \
             spokes' logs for the fix)",
            status.peer_refusals
        );
    }
}
