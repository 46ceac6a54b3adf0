//! The SDK's answers as Python values (dicts of plain types).

use pyo3::{
    prelude::*,
    types::{PyDict, PyList},
};
use shardcache_proto::v1::{JobReport, StatusResponse};

/// A job's table (`Client.report`) as Python values.
pub(crate) fn job_report_dict<'py>(py: Python<'py>, table: &JobReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("principal", &table.principal)?;
    d.set_item("job", &table.job)?;
    d.set_item("ranks", table.ranks)?;
    d.set_item("members", &table.members)?;
    let phases = PyList::empty(py);
    for phase in &table.phases {
        let r = shardcache_client::report::row(phase);
        let item = PyDict::new(py);
        item.set_item("epoch", r.epoch)?;
        item.set_item("phase", r.phase)?;
        item.set_item("steps", r.steps)?;
        item.set_item("samples", phase.samples)?;
        item.set_item("samples_per_s", r.samples_per_s)?;
        item.set_item("data_wait_pct", r.data_wait_pct)?;
        item.set_item("gpu_util_pct", r.gpu_util_pct)?;
        item.set_item("read_p50_ms", r.read_p50_ms)?;
        item.set_item("read_p99_ms", r.read_p99_ms)?;
        item.set_item("reads", r.reads)?;
        item.set_item("from_store_pct", r.from_store_pct)?;
        item.set_item("from_members_pct", r.from_members_pct)?;
        item.set_item("from_hub_pct", r.from_hub_pct)?;
        item.set_item("link_per_read", r.link_per_read)?;
        item.set_item("slowest_rank", r.slowest_rank.map(|(rank, _)| rank))?;
        item.set_item("slowest_rank_wait_pct", r.slowest_rank.map(|(_, pct)| pct))?;
        item.set_item(
            "rank_wait_s",
            phase.rank_wait_us.iter().map(|&us| us as f64 / 1e6).collect::<Vec<_>>(),
        )?;
        phases.append(item)?;
    }
    d.set_item("phases", phases)?;
    let timeline = PyList::empty(py);
    for p in &table.timeline {
        let item = PyDict::new(py);
        item.set_item("at_ms", p.at_ms)?;
        item.set_item("width_ms", p.width_ms)?;
        item.set_item("steps", p.steps)?;
        item.set_item("wall_s", p.wall_us as f64 / 1e6)?;
        item.set_item("wait_s", p.wait_us as f64 / 1e6)?;
        item.set_item("samples", p.samples)?;
        timeline.append(item)?;
    }
    d.set_item("timeline", timeline)?;
    d.set_item("markdown", shardcache_client::report::markdown(table))?;
    Ok(d)
}

pub(crate) fn shard_dict<'py>(
    py: Python<'py>,
    s: &shardcache_proto::v1::ShardInfo,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("dataset", &s.dataset)?;
    d.set_item("shard", &s.shard)?;
    d.set_item("size", s.size)?;
    d.set_item("version", &s.version)?;
    d.set_item("message_size", s.message_size)?;
    d.set_item("record_size", s.record_size)?;
    Ok(d)
}

/// A spoke's status (`Client.status`) as Python values.
pub(crate) fn status_dict(py: Python<'_>, status: StatusResponse) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("capacity_bytes", status.capacity_bytes)?;
    d.set_item("used_bytes", status.used_bytes)?;
    d.set_item("hubs", status.hubs)?;
    // Capacity, used and hubs are filled only for a caller that may control the cache.
    d.set_item("server_view", status.server_view)?;
    d.set_item("principal", status.principal)?;
    let datasets = PyDict::new(py);
    for s in status.datasets {
        let item = PyDict::new(py);
        item.set_item("cached_shards", s.cached_shards)?;
        item.set_item("cached_bytes", s.cached_bytes)?;
        item.set_item("hit_requests", s.hit_requests)?;
        item.set_item("miss_requests", s.miss_requests)?;
        item.set_item("upstream_bytes", s.upstream_bytes)?;
        item.set_item("upstream_wire_bytes", s.upstream_wire_bytes)?;
        item.set_item("hit_bytes", s.hit_bytes)?;
        item.set_item("miss_bytes", s.miss_bytes)?;
        item.set_item("peer_bytes", s.peer_bytes)?;
        datasets.set_item(s.dataset, item)?;
    }
    d.set_item("datasets", datasets)?;
    let jobs = PyList::empty(py);
    for j in status.jobs {
        let item = PyDict::new(py);
        item.set_item("principal", j.principal)?;
        item.set_item("job", j.job)?;
        item.set_item("epoch", j.epoch)?;
        item.set_item("reads", j.reads)?;
        item.set_item("hit_reads", j.hit_reads)?;
        item.set_item("bytes", j.bytes)?;
        item.set_item("hit_bytes", j.hit_bytes)?;
        item.set_item("hub_bytes", j.hub_bytes)?;
        item.set_item("link_bytes", j.link_bytes)?;
        item.set_item("planned_reads", j.planned_reads)?;
        jobs.append(item)?;
    }
    d.set_item("jobs", jobs)?;
    let principals = PyList::empty(py);
    for p in status.principals {
        let item = PyDict::new(py);
        item.set_item("principal", p.principal)?;
        item.set_item("held_bytes", p.held_bytes)?;
        item.set_item("share_bytes", p.share_bytes)?;
        principals.append(item)?;
    }
    d.set_item("principals", principals)?;
    d.set_item("speculation_useful_share", status.speculation_useful_share)?;
    d.set_item("speculation_unread_bytes", status.speculation_unread_bytes)?;
    // Plans followed sample by sample: what the spoke keeps for later epochs, and holds
    // fetched ahead of reads.
    d.set_item("kept_sample_bytes", status.kept_sample_bytes)?;
    d.set_item("kept_sample_packs", status.kept_sample_packs)?;
    d.set_item("staged_sample_bytes", status.staged_sample_bytes)?;
    d.set_item("sample_window_bytes", status.sample_window_bytes)?;
    // Chunk fetches asked of the hubs as they are and for zstd (--hub-compression).
    d.set_item("hub_fetches_plain", status.hub_fetches_plain)?;
    d.set_item("hub_fetches_zstd", status.hub_fetches_zstd)?;
    // RocksDB's own files: the margin beside capacity_bytes.
    d.set_item("store_own_bytes", status.store_own_bytes)?;
    // Fetches running now (0: nothing more is on its way over the link), and every
    // byte the spoke's hub connections read: what a benchmark settles on.
    d.set_item("fetches_in_flight", status.fetches_in_flight)?;
    d.set_item("hub_bytes_received", status.hub_bytes_received)?;
    let plans = PyList::empty(py);
    for p in status.plans {
        let item = PyDict::new(py);
        item.set_item("principal", p.principal)?;
        item.set_item("job", p.job)?;
        item.set_item("cursor", p.cursor)?;
        item.set_item("positions", p.positions)?;
        item.set_item("lag", p.lag)?;
        item.set_item("samples", p.samples)?;
        plans.append(item)?;
    }
    d.set_item("plans", plans)?;
    let members = PyList::empty(py);
    for m in status.members {
        let item = PyDict::new(py);
        item.set_item("url", m.url)?;
        item.set_item("state", m.state)?;
        item.set_item("seen_by", m.seen_by)?;
        members.append(item)?;
    }
    d.set_item("members", members)?;
    d.set_item("peer_refusals", status.peer_refusals)?;
    Ok(d)
}
