//! Which job and epoch a read is for: request headers the SDK's datasets send and a
//! spoke counts reads under (its per-job hit ratios), and the job names `SetPlan` takes.

/// Request header on a read of a dataset format's index (headers, offset tables, an
/// `.idx`): a spoke neither reads ahead nor fetches the rest of the shard for it, so
/// opening a dataset does not start fetching every shard in the background.
pub const INDEX_READ_HEADER: &str = "shardcache-index-read";

/// Request header naming the job a read is for.
pub const JOB_HEADER: &str = "shardcache-job";
/// Request header with the job's epoch (a decimal number); 0 when absent.
pub const EPOCH_HEADER: &str = "shardcache-epoch";
/// Longest job name.
pub const MAX_JOB_NAME: usize = 256;

/// Checks a job name: 1 to [`MAX_JOB_NAME`] printable ASCII characters (a header value
/// and a metrics label both carry it).
pub fn check_job_name(job: &str) -> Result<(), String> {
    if job.is_empty() || job.len() > MAX_JOB_NAME || !job.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(format!("job {job:?} must be 1 to {MAX_JOB_NAME} printable ASCII characters"));
    }
    Ok(())
}

/// Buckets of a `JobPhase`'s read latency histogram: four a doubling of microseconds,
/// from 1 µs to past 10 minutes (the spoke fills them, the SDK's report reads them).
pub const LATENCY_BUCKETS: usize = 4 * 40;

/// The latency bucket of `elapsed`: the first whose bound, 2^((i+1)/4) µs, is above it.
pub fn latency_bucket(elapsed: std::time::Duration) -> usize {
    let us = elapsed.as_micros().max(1) as f64;
    ((us.log2() * 4.0).floor() as usize).min(LATENCY_BUCKETS - 1)
}

/// The upper bound of latency bucket `i`, in milliseconds.
pub fn latency_bound_ms(i: usize) -> f64 {
    2f64.powf((i + 1) as f64 / 4.0) / 1e3
}

/// A job's table (`JobReport`): a phase's reads, added from another count of them (a
/// group member's, or the reads before the job's first step).
impl crate::v1::JobPhase {
    /// Adds `other`'s reads, their bytes and latency histogram to this phase's (not its
    /// steps: every member folds the same steps).
    pub fn add_reads(&mut self, other: &crate::v1::JobPhase) {
        self.reads += other.reads;
        self.store_reads += other.store_reads;
        self.bytes += other.bytes;
        self.member_bytes += other.member_bytes;
        self.hub_bytes += other.hub_bytes;
        self.link_bytes += other.link_bytes;
        if self.latency.len() < other.latency.len() {
            self.latency.resize(other.latency.len(), 0);
        }
        for (a, b) in self.latency.iter_mut().zip(&other.latency) {
            *a += b;
        }
    }
}
