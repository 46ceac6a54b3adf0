//! The seed experiment reproduced (`make demo`, binary `seed-demo`): a simulated
//! data-parallel trainer reading a tokenised dataset across a 60 ms link, through the
//! hub directly, through the spoke cold, through the spoke with the epoch's order
//! prefetched, and through the peer users would build instead (nginx `proxy_cache`);
//! then through a spoke with room for half the dataset, evicting least recently used or
//! by the job's access plan, over three epochs; then two trainer nodes through a spoke
//! each and through a group of three spokes; and the prefetched spoke over a 2 Gbit/s
//! link with the hub's compression off and on (`link.rs`: its bytes per epoch). Through a
//! spoke, the trainer's ranks also time their batches with the SDK's `StepTimer`, and the
//! spoke's own table of the job is printed beside the demo's (`job_table.rs`).
//! See ../shared/seed/SEED.md for the run this reproduces.

pub mod flags;
pub mod group;
pub mod job_table;
pub mod link;
pub mod nginx;
pub mod readers;
pub mod report;
pub mod small_cache;
pub mod trainer;

/// The job the setups share: the dataset, its shards' names, how it is cut, the trainer
/// and its sampler.
#[derive(Debug, Clone, Copy)]
pub struct Workload<'a> {
    pub dataset: &'a str,
    pub names: &'a std::sync::Arc<Vec<String>>,
    pub layout: trainer::Layout,
    pub shape: trainer::JobShape,
    pub block_shards: u32,
    pub sample_bytes: u64,
}

/// Sums every series of `name` (all label sets) in a Prometheus text scrape.
pub fn metric_sum(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn metric_sums_cover_every_label_set_and_only_that_name() {
        let scrape = "# HELP x\nhits_total{dataset=\"a\"} 3\nhits_total{dataset=\"b\"} 4\nhits_total_other 9\nhits_total 1\n";
        assert_eq!(super::metric_sum(scrape, "hits_total"), 8.0);
    }
}
