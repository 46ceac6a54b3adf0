//! The SDK's answers as Python values (dicts of plain types).

use pyo3::{
    prelude::*,
    types::{PyDict, PyList},
};
use shardcache_proto::v1::JobReport;

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
