//! How the simulated trainer reads a batch: one `ReadRanges` call through the SDK (hub or
//! spoke), or one HTTP range request per sample (the nginx peer).

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering::Relaxed},
};

use bytes::Bytes;
use futures::{FutureExt, future::try_join_all};
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{Client as HttpClient, connect::HttpConnector},
    rt::TokioExecutor,
};
use shardcache_client::{Client, Range};

use super::trainer::{ReadBatch, Sample};

/// `ReadRanges` of the batch's samples through the SDK (CRC32C-verified).
pub fn grpc(client: Client, dataset: &str, shard_names: Arc<Vec<String>>, sample_bytes: u64) -> ReadBatch {
    let dataset = dataset.to_owned();
    Arc::new(move |batch: Vec<Sample>| {
        let (client, dataset, names) = (client.clone(), dataset.clone(), shard_names.clone());
        async move {
            let ranges: Vec<Range> = batch
                .iter()
                .map(|s| Range::new(&dataset, &names[s.shard as usize], s.offset, sample_bytes))
                .collect();
            let got = client.read_ranges(&ranges).await?;
            Ok(got.iter().map(|v| v.data.len() as u64).sum())
        }
        .boxed()
    })
}

/// Counts of nginx's `X-Cache-Status` answers.
#[derive(Debug, Default)]
pub struct HttpCacheCounts {
    pub hits: AtomicU64,
    pub reads: AtomicU64,
}

/// One `GET` with `Range: bytes=a-b` per sample, all of a batch at once, over pooled
/// HTTP/1.1 keep-alive connections (what a trainer reading from an HTTP cache does).
/// Every answer must be `206` with exactly the sample's bytes.
pub fn http(
    base: &str,
    dataset: &str,
    shard_names: Arc<Vec<String>>,
    sample_bytes: u64,
    counts: Arc<HttpCacheCounts>,
) -> ReadBatch {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient<HttpConnector, Empty<Bytes>> =
        HttpClient::builder(TokioExecutor::new()).pool_max_idle_per_host(4096).build(connector);
    let prefix = format!("{}/{dataset}/", base.trim_end_matches('/'));
    Arc::new(move |batch: Vec<Sample>| {
        let (client, prefix, names, counts) =
            (client.clone(), prefix.clone(), shard_names.clone(), counts.clone());
        async move {
            let gets = batch.iter().map(|s| {
                let request = http::Request::get(format!("{prefix}{}", names[s.shard as usize]))
                    .header(
                        http::header::RANGE,
                        format!("bytes={}-{}", s.offset, s.offset + sample_bytes - 1),
                    )
                    .body(Empty::new());
                let (client, counts) = (client.clone(), counts.clone());
                async move {
                    let response = client.request(request?).await?;
                    let hit = response.headers().get("x-cache-status").is_some_and(|v| v == "HIT");
                    let status = response.status();
                    let body = response.into_body().collect().await?.to_bytes();
                    anyhow::ensure!(
                        status == http::StatusCode::PARTIAL_CONTENT && body.len() as u64 == sample_bytes,
                        "nginx answered {status} with {} bytes for a {sample_bytes}-byte range",
                        body.len()
                    );
                    counts.reads.fetch_add(1, Relaxed);
                    counts.hits.fetch_add(u64::from(hit), Relaxed);
                    Ok::<u64, anyhow::Error>(body.len() as u64)
                }
            });
            Ok(try_join_all(gets).await?.into_iter().sum())
        }
        .boxed()
    })
}

/// Counters of cache hits and reads, taken at phase boundaries.
pub type Counter = Arc<dyn Fn() -> futures::future::BoxFuture<'static, (u64, u64)> + Send + Sync>;

/// A spoke's hits and reads, from its metrics at `metrics_addr`.
pub fn spoke_counter(metrics_addr: &str) -> Counter {
    let metrics = metrics_addr.to_owned();
    Arc::new(move || {
        let metrics = metrics.clone();
        async move {
            let text = shardcache_tests::scrape_metrics(metrics.as_str()).await.unwrap_or_default();
            let hits = super::metric_sum(&text, "shardcache_spoke_hit_requests_total");
            let misses = super::metric_sum(&text, "shardcache_spoke_miss_requests_total");
            (hits as u64, (hits + misses) as u64)
        }
        .boxed()
    })
}
