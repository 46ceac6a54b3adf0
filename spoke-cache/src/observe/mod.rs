//! What the spoke counts and reports: counters and histograms in Prometheus text
//! (`metrics.rs`), counters per job and epoch (`jobs.rs`) and every job's own table of
//! data wait and phases (`job_table/`).
//!
//! Owns: counting; decides nothing. May import only `error`: every other part reports
//! here.

pub mod job_counters;
pub mod job_table;
pub mod metrics;
