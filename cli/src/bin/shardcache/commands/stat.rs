//! `shardcache stat`: one shard's size and version.

use super::*;

pub async fn stat(server: &Server, dataset: &str, shard: &str) -> anyhow::Result<()> {
    let info = server.client().await?.stat(dataset, shard).await?;
    println!("dataset:     {}", info.dataset);
    println!("shard:       {}", info.shard);
    println!("size:        {} bytes", info.size);
    println!("version:     {}", info.version);
    println!("message size: {}", ByteSize(info.message_size.into()));
    let record =
        if info.record_size == 0 { "unknown".into() } else { ByteSize(info.record_size.into()).to_string() };
    println!("record size: {record}");
    Ok(())
}
