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

    /// Tells the spoke the order in which `job` will read shards of `dataset`: one
    /// [`PlannedEpoch`] per epoch from `epoch` on (the rest of this epoch, then the next),
    /// so that it evicts what is read again furthest away and prefetches what is read
    /// next. Replaces the job's previous plan (no epochs withdraws it); returns the
    /// distinct shards it names. A job with several readers (DataLoader workers) sends
    /// one plan per reader, as `JOB/READER`.
    pub async fn set_plan(
        &self,
        job: &str,
        epoch: u64,
        dataset: &str,
        epochs: &[PlannedEpoch],
    ) -> Result<u64> {
        let epochs = epochs
            .iter()
            .map(|planned| EpochPlan {
                shards: planned
                    .shards
                    .iter()
                    .map(|shard| ShardRef { dataset: dataset.to_owned(), shard: shard.clone() })
                    .collect(),
                until: planned.until.clone(),
            })
            .collect();
        let request = PlanRequest { job: job.to_owned(), epoch, epochs };
        let response = self.control.clone().set_plan(request).await.map_err(|s| self.status_error(s))?;
        Ok(response.into_inner().shards)
    }
}

/// One epoch of an access plan: shards in the order of their first read, and for each
/// the last shard first read before its own last read (see `EpochPlan` in the proto).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlannedEpoch {
    pub shards: Vec<String>,
    pub until: Vec<u32>,
}

impl PlannedEpoch {
    /// Shards read one after another, each to its end before the next.
    pub fn in_order(shards: Vec<String>) -> Self {
        Self { shards, until: Vec::new() }
    }

    /// The plan of an epoch that reads the shards `reads` names, in that order (one
    /// item per read, repeats included).
    pub fn from_reads<'a>(reads: impl IntoIterator<Item = &'a str>) -> Self {
        let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        let (mut shards, mut until) = (Vec::<String>::new(), Vec::<u32>::new());
        for shard in reads {
            let latest = shards.len().saturating_sub(1) as u32;
            match index.get(shard) {
                Some(&at) => until[at] = latest,
                None => {
                    index.insert(shard, shards.len());
                    until.push(shards.len() as u32);
                    shards.push(shard.to_owned());
                }
            }
        }
        let overlaps = until.iter().enumerate().any(|(i, &u)| u as usize != i);
        Self { shards, until: if overlaps { until } else { Vec::new() } }
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

#[cfg(test)]
mod tests {
    use super::PlannedEpoch;

    #[test]
    fn a_plan_from_reads_says_which_shards_are_read_together() {
        let plan = PlannedEpoch::from_reads(["a", "a", "b", "a", "c", "b", "c", "d"]);
        assert_eq!(plan.shards, ["a", "b", "c", "d"]);
        // a's last read comes after b's first; b's after c's first; d alone.
        assert_eq!(plan.until, [1, 2, 2, 3]);
        assert_eq!(
            PlannedEpoch::from_reads(["a", "a", "b", "c", "c"]),
            PlannedEpoch::in_order(vec!["a".into(), "b".into(), "c".into()])
        );
    }
}
