//! A group's statuses added up into one (`CacheClient::status` of a group).

use std::collections::BTreeMap;

use shardcache_proto::v1::{DatasetStatus, JobStatus, PrincipalStatus, StatusResponse};

/// A group's statuses as one: occupancy, counters and job rows added up; plans and hubs
/// listed once each.
pub(super) fn merge_status(answers: Vec<StatusResponse>) -> StatusResponse {
    let mut merged = StatusResponse::default();
    let mut datasets: BTreeMap<String, DatasetStatus> = BTreeMap::new();
    let mut jobs: BTreeMap<(String, String, u64), JobStatus> = BTreeMap::new();
    let mut principals: BTreeMap<String, PrincipalStatus> = BTreeMap::new();
    merged.server_view = !answers.is_empty() && answers.iter().all(|a| a.server_view);
    merged.principal = answers.first().map(|a| a.principal.clone()).unwrap_or_default();
    let count = answers.len().max(1) as f64;
    for answer in answers {
        merged.capacity_bytes += answer.capacity_bytes;
        merged.used_bytes += answer.used_bytes;
        merged.evicted_shards += answer.evicted_shards;
        merged.evicted_bytes += answer.evicted_bytes;
        merged.checksum_failures += answer.checksum_failures;
        for hub in answer.hubs {
            if !merged.hubs.contains(&hub) {
                merged.hubs.push(hub);
            }
        }
        for d in answer.datasets {
            let sum = datasets
                .entry(d.dataset.clone())
                .or_insert_with(|| DatasetStatus { dataset: d.dataset.clone(), ..Default::default() });
            sum.cached_shards += d.cached_shards;
            sum.cached_bytes += d.cached_bytes;
            sum.pinned_shards += d.pinned_shards;
            sum.hit_requests += d.hit_requests;
            sum.miss_requests += d.miss_requests;
            sum.hit_bytes += d.hit_bytes;
            sum.miss_bytes += d.miss_bytes;
            sum.upstream_bytes += d.upstream_bytes;
            sum.upstream_wire_bytes += d.upstream_wire_bytes;
            sum.peer_bytes += d.peer_bytes;
        }
        for j in answer.jobs {
            let sum =
                jobs.entry((j.principal.clone(), j.job.clone(), j.epoch)).or_insert_with(|| JobStatus {
                    principal: j.principal.clone(),
                    job: j.job.clone(),
                    epoch: j.epoch,
                    ..Default::default()
                });
            sum.reads += j.reads;
            sum.hit_reads += j.hit_reads;
            sum.bytes += j.bytes;
            sum.hit_bytes += j.hit_bytes;
            sum.hub_bytes += j.hub_bytes;
            sum.link_bytes += j.link_bytes;
            sum.planned_reads += j.planned_reads;
        }
        for p in answer.principals {
            let sum = principals
                .entry(p.principal.clone())
                .or_insert_with(|| PrincipalStatus { principal: p.principal.clone(), ..Default::default() });
            sum.held_bytes += p.held_bytes;
            sum.share_bytes += p.share_bytes;
        }
        merged.plans.extend(answer.plans);
        // Each member's view of the group, as it sees it.
        merged.members.extend(answer.members);
        if merged.hub_trouble.is_empty() && !answer.hub_trouble.is_empty() {
            merged.hub_trouble = answer.hub_trouble;
            merged.hub_trouble_age_s = answer.hub_trouble_age_s;
        }
        merged.peer_refusals += answer.peer_refusals;
        merged.speculation_unread_bytes += answer.speculation_unread_bytes;
        merged.kept_sample_bytes += answer.kept_sample_bytes;
        merged.kept_sample_packs += answer.kept_sample_packs;
        merged.staged_sample_bytes += answer.staged_sample_bytes;
        merged.sample_window_bytes += answer.sample_window_bytes;
        merged.hub_fetches_plain += answer.hub_fetches_plain;
        merged.hub_fetches_zstd += answer.hub_fetches_zstd;
        merged.store_own_bytes += answer.store_own_bytes;
        merged.fetches_in_flight += answer.fetches_in_flight;
        merged.hub_bytes_received += answer.hub_bytes_received;
        // The members' mean: each speculates for its own readers.
        merged.speculation_useful_share += answer.speculation_useful_share / count;
    }
    merged.datasets = datasets.into_values().collect();
    merged.jobs = jobs.into_values().collect();
    merged.principals = principals.into_values().collect();
    merged
}
