//! `shardcache cat`: a range of a shard to stdout.

use super::*;

pub async fn cat(
    server: &Server,
    dataset: &str,
    shard: &str,
    offset: u64,
    length: Option<u64>,
) -> anyhow::Result<()> {
    // A shard is binary and large (64 MiB in the seed): not for a terminal, unasked.
    anyhow::ensure!(
        length.is_some() || !std::io::stdout().is_terminal(),
        "cat would write all of {dataset}/{shard} (binary) to the terminal: give --length N, or redirect or pipe \
         the output (`| od -t u4 | head`), or use `get` to write it to a file"
    );
    let client = server.client().await?;
    let mut stream = client.stream_shard(dataset, shard, offset, length).await?;
    let mut out = tokio::io::stdout();
    while let Some(chunk) = stream.next_chunk().await? {
        out.write_all(&chunk.data).await?;
    }
    out.flush().await?;
    Ok(())
}
