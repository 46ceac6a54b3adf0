//! A training epoch through a spoke while its link to the hub cycles through faults
//! (the WAN emulator's [`Schedule`]): what `spoke_soak` checks in `make test` and
//! `soak-bench` measures at 1 GiB.
//!
//! The epoch reads every record of a dataset once, in a shuffled order, in `ReadRanges`
//! batches (as a trainer does); every tenth batch is read as one `StreamShard` per
//! record instead.
//! Each call is checked against the dataset's files and must finish within `hung_after`;
//! once the schedule has run its course the link heals and every record whose call
//! failed is read again: the epoch must complete.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use shardcache_client::{Client, Range};
use shardcache_wan::{Fault, Schedule, WanProxy};

use crate::next_random;

/// What the soak saw.
#[derive(Debug, Default)]
pub struct SoakReport {
    /// Read calls made (ReadRanges and StreamShard), first pass.
    pub calls: u64,
    /// Bytes returned and found equal to the files, first pass.
    pub bytes: u64,
    /// Faults set on the link.
    pub faults_injected: u64,
    /// Failed calls by status code (first pass), and the first message of each code.
    pub failures: BTreeMap<String, u64>,
    pub examples: BTreeMap<String, String>,
    /// Returned bytes that differ from the files (must be 0).
    pub wrong_bytes: u64,
    /// Calls that had not finished after `hung_after` (must be 0).
    pub hung: u64,
    /// Failures whose status is not one a caller can act on (must be 0): see [`clean`].
    pub unclean: Vec<String>,
    /// Records read again once the link healed, and those that still failed (must be 0).
    pub reread: u64,
    pub still_failing: u64,
    pub elapsed: Duration,
}

/// Statuses a failed read may have while the link misbehaves: the hub is unreachable or
/// too slow (UNAVAILABLE, DEADLINE_EXCEEDED), overloaded (RESOURCE_EXHAUSTED), or the
/// shard's version could not be held (ABORTED). Anything else (INTERNAL, UNKNOWN, a
/// transport error) is a bug.
pub fn clean(code: Option<tonic::Code>) -> bool {
    use tonic::Code;
    matches!(code, Some(Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted | Code::Aborted))
}

/// The records of a dataset: `(shard, offset, length)` of every `record` bytes.
fn records(dir: &Path, record: u64) -> Vec<(String, u64, u64)> {
    let mut shards: Vec<(String, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file() && !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().len()))
        .collect();
    shards.sort();
    shards
        .into_iter()
        .flat_map(|(name, size)| {
            (0..size.div_ceil(record)).map(move |i| (name.clone(), i * record, record.min(size - i * record)))
        })
        .collect()
}

/// What to read, and what to do to the link meanwhile.
#[derive(Debug, Clone)]
pub struct SoakPlan<'a> {
    pub dataset: &'a str,
    /// The dataset's folder (the hub's files), to check every byte against.
    pub dir: &'a Path,
    /// The faults, each for its time, once through; then the link heals.
    pub schedule: Schedule,
    /// Bytes per record, records per `ReadRanges` call.
    pub record: u64,
    pub batch: usize,
    /// A call not finished after this has hung.
    pub hung_after: Duration,
    /// Time between calls (a trainer's compute step), so the epoch meets the schedule.
    pub pace: Duration,
}

/// A record: `(shard, offset, length)`.
type Record = (String, u64, u64);

/// Reads the epoch of `plan.dataset` through `client` while `plan.schedule` runs on
/// `proxy`, then heals the link and rereads what failed.
pub async fn soak(client: &Client, proxy: &WanProxy, plan: SoakPlan<'_>) -> SoakReport {
    let SoakPlan { dataset, dir, schedule, record, batch, hung_after, pace } = plan;
    let started = Instant::now();
    let files: BTreeMap<String, Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    let mut order = records(dir, record);
    let mut seed = 0x5eed_u64;
    for i in (1..order.len()).rev() {
        order.swap(i, (next_random(&mut seed) % (i as u64 + 1)) as usize);
    }
    let faults_set = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let schedule_task = run_schedule(proxy, schedule, faults_set.clone());
    let mut report = SoakReport::default();
    let mut failed: Vec<Record> = Vec::new();
    for (call, batch) in order.chunks(batch).enumerate() {
        tokio::time::sleep(pace).await;
        report.calls += 1;
        let ranges: Vec<Range> =
            batch.iter().map(|(shard, offset, len)| Range::new(dataset, shard, *offset, *len)).collect();
        let result = tokio::time::timeout(hung_after, read(client, dataset, call, &ranges)).await;
        if std::env::var_os("SOAK_TRACE").is_some() {
            let what = match &result {
                Err(_) => "hung".to_owned(),
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(_)) => "ok".to_owned(),
            };
            eprintln!(
                "{:>6} ms  fault {}  call {call}: {what}",
                started.elapsed().as_millis(),
                *proxy.fault_sender().borrow()
            );
        }
        if !report.tally(result, &ranges, &files) {
            failed.extend(ranges.iter().map(|r| (r.shard.clone(), r.offset, r.length)));
        }
    }
    // The link heals: every record that failed is read again, and must arrive.
    schedule_task.abort();
    proxy.set_fault(Fault::None);
    report.faults_injected = faults_set.load(std::sync::atomic::Ordering::Relaxed);
    for (shard, offset, len) in failed {
        report.reread += 1;
        let ok = reread(client, &Range::new(dataset, &shard, offset, len), &files[&shard], hung_after).await;
        match ok {
            Some(true) => {}
            Some(false) => report.wrong_bytes += len,
            None => report.still_failing += 1,
        }
    }
    report.elapsed = started.elapsed();
    report
}

/// Sets `schedule`'s faults on `proxy` one after another (counting them in `set`), then
/// heals the link.
fn run_schedule(
    proxy: &WanProxy,
    schedule: Schedule,
    set: Arc<std::sync::atomic::AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    let fault_tx = proxy.fault_sender();
    tokio::spawn(async move {
        for (fault, time) in schedule {
            fault_tx.send_replace(fault);
            set.fetch_add(u64::from(fault != Fault::None), std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(time).await;
        }
        fault_tx.send_replace(Fault::None);
    })
}

/// Call `call` of the epoch: `ranges` in one `ReadRanges`, or (every tenth call) one
/// `StreamShard` each.
async fn read(
    client: &Client,
    dataset: &str,
    call: usize,
    ranges: &[Range],
) -> shardcache_client::Result<Vec<Vec<u8>>> {
    if call % 10 != 9 {
        return client.read_ranges(ranges).await.map(|v| v.into_iter().map(|c| c.data.to_vec()).collect());
    }
    let mut data = Vec::with_capacity(ranges.len());
    for r in ranges {
        let stream = client.stream_shard(dataset, &r.shard, r.offset, Some(r.length)).await?;
        data.push(stream.read_to_end().await?);
    }
    Ok(data)
}

/// `range` read again once the link healed (a few tries: the first calls after healing
/// may still find a dead connection): whether its bytes equal `file`'s, `None` when it
/// still failed.
async fn reread(client: &Client, range: &Range, file: &[u8], hung_after: Duration) -> Option<bool> {
    for _ in 0..5 {
        if let Ok(Ok(got)) = tokio::time::timeout(hung_after, client.read_range(range)).await {
            return Some(got.data == file[range.offset as usize..(range.offset + range.length) as usize]);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

impl SoakReport {
    /// Counts one call's `result` for `ranges` (`Err`: it hung) against `files`;
    /// whether it succeeded.
    fn tally(
        &mut self,
        result: Result<shardcache_client::Result<Vec<Vec<u8>>>, tokio::time::error::Elapsed>,
        ranges: &[Range],
        files: &BTreeMap<String, Vec<u8>>,
    ) -> bool {
        match result {
            Err(_) => {
                self.hung += 1;
                false
            }
            Ok(Err(e)) => {
                let code = e.code();
                let name = code.map_or_else(|| "(no status)".into(), |c| format!("{c:?}"));
                self.examples.entry(name.clone()).or_insert_with(|| e.to_string());
                *self.failures.entry(name).or_default() += 1;
                if !clean(code) {
                    self.unclean.push(e.to_string());
                }
                false
            }
            Ok(Ok(data)) => {
                for (r, got) in ranges.iter().zip(data) {
                    let want = &files[&r.shard][r.offset as usize..(r.offset + r.length) as usize];
                    if got != want {
                        self.wrong_bytes += got.len() as u64;
                    } else {
                        self.bytes += got.len() as u64;
                    }
                }
                true
            }
        }
    }
}
