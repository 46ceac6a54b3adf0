//! `shardcache ls`: datasets, or a dataset's shards.

use super::*;

pub async fn ls(server: &Server, dataset: Option<&str>) -> anyhow::Result<()> {
    let client = server.client().await?;
    let mut out = std::io::stdout().lock();
    match dataset {
        // Asked before the header is printed: a failure prints no half table.
        None => {
            let datasets = client.list_datasets_marked().await?;
            warn_if_stale(datasets.stale);
            writeln!(out, "{:<32} {:>8} {:>16} {:>12}", "DATASET", "SHARDS", "BYTES", "RECORD")?;
            for d in datasets.items {
                let record =
                    if d.record_size == 0 { "-".into() } else { ByteSize(d.record_size.into()).to_string() };
                let bytes = ByteSize(d.total_bytes).human();
                writeln!(out, "{:<32} {:>8} {:>16} {:>12}", d.name, d.shard_count, bytes, record)?;
            }
        }
        Some(dataset) => {
            let shards = client.list_shards_marked(dataset).await?;
            warn_if_stale(shards.stale);
            writeln!(out, "{:<40} {:>14}  VERSION", "SHARD", "BYTES")?;
            for s in shards.items {
                writeln!(out, "{:<40} {:>14}  {}", s.shard, ByteSize(s.size).human(), s.version)?;
            }
        }
    }
    Ok(())
}
