//! `shardcache warm`: shards fetched into a spoke ahead of a job, with progress.

use super::*;

pub async fn warm(server: &Server, dataset: &str, shards: &[String], parallelism: u32) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut stream = server.cache().await?.prefetch(dataset, shards, parallelism).await?;
    let mut bar: Option<ProgressBar> = None;
    let mut last = Default::default();
    while let Some(progress) = stream.next().await? {
        let bar = bar.get_or_insert_with(|| progress_bar(progress.bytes_total));
        bar.set_position(progress.bytes_done);
        last = progress;
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let last: shardcache_proto::v1::PrefetchProgress = last;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "warmed {dataset}: {} shards, {} bytes cached, {} fetched from the hub in {secs:.2} s ({:.1} MB/s)",
        last.shards_done,
        last.bytes_done,
        last.bytes_fetched,
        last.bytes_fetched as f64 / secs.max(1e-9) / 1e6
    );
    // A group's members that answered warmed their shards; the others are named, and
    // the command fails: what was asked is not all cached.
    let silent = stream.not_answering();
    for (member, why) in silent {
        eprintln!("member {member} did not warm its shards: {why}");
    }
    anyhow::ensure!(
        silent.is_empty(),
        "{} member(s) of the group did not answer; warm again once they serve (reads fetch their shards meanwhile)",
        silent.len()
    );
    Ok(())
}
