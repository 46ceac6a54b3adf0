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
    let schedule_task = {
        let (fault_tx, counter) = (proxy.fault_sender(), faults_set.clone());
        tokio::spawn(async move {
            for (fault, time) in schedule {
                fault_tx.send_replace(fault);
                counter.fetch_add(u64::from(fault != Fault::None), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(time).await;
            }
            fault_tx.send_replace(Fault::None);
        })
    };
    let mut report = SoakReport::default();
    let mut failed: Vec<(String, u64, u64)> = Vec::new();
    for (call, batch) in order.chunks(batch).enumerate() {
        tokio::time::sleep(pace).await;
        report.calls += 1;
        let ranges: Vec<Range> =
            batch.iter().map(|(shard, offset, len)| Range::new(dataset, shard, *offset, *len)).collect();
        let read = async {
            if call % 10 == 9 {
                // Every tenth call streams its records, one StreamShard each.
                let mut data = Vec::with_capacity(ranges.len());
                for r in &ranges {
                    let stream = client.stream_shard(dataset, &r.shard, r.offset, Some(r.length)).await?;
                    data.push(stream.read_to_end().await?);
                }
                Ok(data)
            } else {
                client.read_ranges(&ranges).await.map(|v| v.into_iter().map(|c| c.data.to_vec()).collect())
            }
        };
        let result = tokio::time::timeout(hung_after, read).await;
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
        match result {
            Err(_) => {
                report.hung += 1;
                failed.extend(ranges.iter().map(|r| (r.shard.clone(), r.offset, r.length)));
            }
            Ok(Err(e)) => {
                let code = e.code();
                let name = code.map_or_else(|| "(no status)".into(), |c| format!("{c:?}"));
                report.examples.entry(name.clone()).or_insert_with(|| e.to_string());
                *report.failures.entry(name).or_default() += 1;
                if !clean(code) {
                    report.unclean.push(e.to_string());
                }
                failed.extend(ranges.iter().map(|r| (r.shard.clone(), r.offset, r.length)));
            }
            Ok(Ok(data)) => {
                for (r, got) in ranges.iter().zip(data) {
                    let want = &files[&r.shard][r.offset as usize..(r.offset + r.length) as usize];
                    if got != want {
                        report.wrong_bytes += got.len() as u64;
                    } else {
                        report.bytes += got.len() as u64;
                    }
                }
            }
        }
    }
    // The link heals: every record that failed is read again, and must arrive.
    schedule_task.abort();
    proxy.set_fault(Fault::None);
    report.faults_injected = faults_set.load(std::sync::atomic::Ordering::Relaxed);
    for (shard, offset, len) in failed {
        report.reread += 1;
        let range = Range::new(dataset, &shard, offset, len);
        let mut ok = false;
        // A few tries: the first calls after healing may still find a dead connection.
        for _ in 0..5 {
            if let Ok(Ok(got)) = tokio::time::timeout(hung_after, client.read_range(&range)).await {
                let want = &files[&shard][offset as usize..(offset + len) as usize];
                if got.data != want {
                    report.wrong_bytes += len;
                }
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        report.still_failing += u64::from(!ok);
    }
    report.elapsed = started.elapsed();
    report
}
