//! `shardcache evict`: shards out of a spoke's cache.

use super::*;

pub async fn evict(server: &Server, dataset: &str, shards: &[String]) -> anyhow::Result<()> {
    let evicted = server.cache().await?.evict(dataset, shards).await?;
    println!("evicted {} shards, {} bytes", evicted.shards, evicted.bytes);
    Ok(())
}
