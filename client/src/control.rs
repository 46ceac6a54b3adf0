//! [`CacheClient`]: the spoke's cache-control API (prefetch, status, evict, pin, plans).

use crate::{
    ConnectOptions, Credentials, Error, Result,
    connect::{AuthChannel, connect_channel},
};
use shardcache_proto::v1::{
    EpochPlan, EvictRequest, EvictResponse, PinRequest, PlanRequest, PrefetchProgress, PrefetchRequest,
    ShardRef, StatusRequest, StatusResponse, cache_control_client::CacheControlClient,
};

/// A connection to a spoke's cache control. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CacheClient {
    control: CacheControlClient<AuthChannel>,
    endpoint: String,
}

impl CacheClient {
    pub async fn connect(endpoint: &str) -> Result<Self> {
        Self::connect_with(endpoint, &ConnectOptions::default()).await
    }

    /// Connects with `options`' certificates and token (see [`crate::Client::connect_with`]).
    pub async fn connect_with(endpoint: &str, options: &ConnectOptions) -> Result<Self> {
        let credentials = Credentials::token(options.token.as_deref())?;
        let channel = connect_channel(endpoint, options).await?;
        let control = CacheControlClient::with_interceptor(channel, credentials);
        Ok(Self { control, endpoint: endpoint.to_owned() })
    }

    fn status_error(&self, status: tonic::Status) -> Error {
        Error::Status { endpoint: self.endpoint.clone(), status }
    }

    /// Occupancy and per-dataset counters.
    pub async fn status(&self) -> Result<StatusResponse> {
        let response = self.control.clone().status(StatusRequest {}).await;
        Ok(response.map_err(|s| self.status_error(s))?.into_inner())
    }

    /// Starts fetching `shards` of `dataset` (all of them when empty) in order; the
    /// stream reports progress after each shard.
    pub async fn prefetch(
        &self,
        dataset: &str,
        shards: &[String],
        parallelism: u32,
    ) -> Result<PrefetchStream> {
        let request = PrefetchRequest {
            dataset: dataset.to_owned(),
            shards: shards
                .iter()
                .map(|s| ShardRef { dataset: dataset.to_owned(), shard: s.clone() })
                .collect(),
            parallelism,
        };
        let stream =
            self.control.clone().prefetch(request).await.map_err(|s| self.status_error(s))?.into_inner();
        Ok(PrefetchStream { stream, client: self.clone() })
    }

    /// Drops `shards` of `dataset` (all of them when empty) from the cache.
    pub async fn evict(&self, dataset: &str, shards: &[String]) -> Result<EvictResponse> {
        let request = EvictRequest { dataset: dataset.to_owned(), shards: shards.to_vec() };
        Ok(self.control.clone().evict(request).await.map_err(|s| self.status_error(s))?.into_inner())
    }

    /// Pins (or unpins) shards; returns how many changed.
    pub async fn pin(&self, dataset: &str, shards: &[String], pinned: bool) -> Result<u64> {
        let request = PinRequest { dataset: dataset.to_owned(), shards: shards.to_vec() };
        let mut control = self.control.clone();
        let response = if pinned { control.pin(request).await } else { control.unpin(request).await };
        Ok(response.map_err(|s| self.status_error(s))?.into_inner().shards)
    }

    /// Tells the spoke the order in which `job` will read shards of `dataset`: one shard
    /// list per epoch from `epoch` on (the rest of this epoch, then the next), so that it
    /// evicts what is read again furthest away. Replaces the job's previous plan (no
    /// epochs withdraws it); returns the distinct shards it names.
    pub async fn set_plan(
        &self,
        job: &str,
        epoch: u64,
        dataset: &str,
        epochs: &[Vec<String>],
    ) -> Result<u64> {
        let epochs = epochs
            .iter()
            .map(|shards| EpochPlan {
                shards: shards
                    .iter()
                    .map(|shard| ShardRef { dataset: dataset.to_owned(), shard: shard.clone() })
                    .collect(),
            })
            .collect();
        let request = PlanRequest { job: job.to_owned(), epoch, epochs };
        let response = self.control.clone().set_plan(request).await.map_err(|s| self.status_error(s))?;
        Ok(response.into_inner().shards)
    }
}

/// Progress of a prefetch.
#[derive(Debug)]
pub struct PrefetchStream {
    stream: tonic::Streaming<PrefetchProgress>,
    client: CacheClient,
}

impl PrefetchStream {
    /// The next progress report; `Ok(None)` when the prefetch is complete.
    pub async fn next(&mut self) -> Result<Option<PrefetchProgress>> {
        self.stream.message().await.map_err(|s| self.client.status_error(s))
    }

    /// Waits for the end; returns the last report.
    pub async fn finish(mut self) -> Result<PrefetchProgress> {
        let mut last = PrefetchProgress::default();
        while let Some(progress) = self.next().await? {
            last = progress;
        }
        Ok(last)
    }
}
