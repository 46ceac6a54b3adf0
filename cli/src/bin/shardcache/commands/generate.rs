//! `shardcache generate`: a synthetic dataset on disk.

use super::*;

pub fn generate(spec: &GenSpec) -> anyhow::Result<()> {
    let started = Instant::now();
    let report = generate_dataset(spec)?;
    println!(
        "generated {}: {} shards x {} = {} bytes, {} records of {} ({} tokens each, {:?}), seed {}, in {:.2} s",
        report.dataset_dir.display(),
        spec.shards,
        ByteSize(spec.shard_size),
        report.bytes,
        report.records,
        ByteSize(spec.record_size),
        spec.record_size / 4,
        spec.tokens,
        spec.seed,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
