//! `shardcache pin` and `unpin`: shards a spoke never evicts.

use super::*;

pub async fn pin(server: &Server, dataset: &str, shards: &[String], pinned: bool) -> anyhow::Result<()> {
    let changed = server.cache().await?.pin(dataset, shards, pinned).await?;
    println!("{} {changed} shards", if pinned { "pinned" } else { "unpinned" });
    Ok(())
}
