//! [`CacheClient`]: the spoke's cache-control API (prefetch, status, evict, pin, plans).

use std::sync::Arc;

use futures::{StreamExt, stream::BoxStream};
use shardcache_proto::v1::{
    EpochPlan, EvictRequest, EvictResponse, JobReport, JobReportRequest, MemberStatus, PinRequest,
    PlanRequest, PlanResponse, PrefetchProgress, PrefetchRequest, SamplePlanRequest, SamplePlanResponse,
    ShardRef, StatusRequest, StatusResponse, StepReport, cache_control_client::CacheControlClient,
};

use shardcache_routing::members::{List, Members};

use crate::{ConnectOptions, Credentials, Error, Result, connect::AuthChannel, discovery};

mod group_status;

use group_status::merge_status;

/// A connection to a spoke's cache control, or to every member of a group of spokes
/// (as [`crate::Client`] names one): then each call goes to every member (a member
/// prefetches and plans only the shards it owns; the group holds one copy), and `status`
/// adds their answers up. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CacheClient {
    members: Arc<Members<CacheControlClient<AuthChannel>>>,
}

impl CacheClient {
    pub async fn connect(endpoint: &str) -> Result<Self> {
        Self::connect_with(endpoint, &ConnectOptions::default()).await
    }

    /// Connects with `options`' certificates and token (see [`crate::Client::connect_with`]).
    pub async fn connect_with(endpoint: &str, options: &ConnectOptions) -> Result<Self> {
        let credentials = Credentials::token(options.token.as_deref())?;
        let connected = discovery::connect_one_or_group(endpoint, options, move |channel| {
            CacheControlClient::with_interceptor(channel, credentials.clone())
        })
        .await?;
        Ok(Self { members: connected.members })
    }

    /// Runs `call` on every member at once; the answers in member order, or the first
    /// member's error (naming it).
    async fn on_all<T, F, Fut>(&self, call: F) -> Result<Vec<T>>
    where
        F: Fn(CacheControlClient<AuthChannel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        Self::on_list(&self.members.current(), call).await
    }

    /// [`CacheClient::on_all`] on the members of `list`.
    async fn on_list<T, F, Fut>(list: &List<CacheControlClient<AuthChannel>>, call: F) -> Result<Vec<T>>
    where
        F: Fn(CacheControlClient<AuthChannel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        Self::on_each(list, call).await.into_iter().map(|(_, answer)| answer).collect()
    }

    /// Runs `call` on every member of `list` at once; each member's URL and answer.
    async fn on_each<T, F, Fut>(
        list: &List<CacheControlClient<AuthChannel>>,
        call: F,
    ) -> Vec<(String, Result<T>)>
    where
        F: Fn(CacheControlClient<AuthChannel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let calls = list.iter().map(|member| {
            let call = call(member.conn.clone());
            async move {
                let answer = call
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|status| Error::Status { endpoint: member.url.clone(), status });
                (member.url.clone(), answer)
            }
        });
        futures::future::join_all(calls).await
    }

    /// Occupancy and per-dataset counters (a group's added up, its per-job rows too). A
    /// member that does not answer does not fail a group's status: it is listed in
    /// `members` as "not answering: WHY" (seen by "this client"); only a group none of
    /// whose members answers is an error.
    pub async fn status(&self) -> Result<StatusResponse> {
        let list = self.members.current();
        let each =
            Self::on_each(&list, |mut control| async move { control.status(StatusRequest {}).await }).await;
        let (answers, silent) = answered(each)?;
        let mut merged = merge_status(answers.into_iter().map(|(_, answer)| answer).collect());
        for (url, e) in silent {
            let state = format!("not answering: {e}");
            merged.members.push(MemberStatus { url, state, seen_by: "this client".into() });
        }
        Ok(merged)
    }

    /// Starts fetching `shards` of `dataset` (all of them when empty) in order; the
    /// stream reports progress after each shard (a group's, added up). In a group, a
    /// member that does not answer (at the start or later) is left out and named by
    /// [`PrefetchStream::not_answering`] while the others go on; only a group none of
    /// whose members answers is an error.
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
        let list = self.members.current();
        let each = Self::on_each(&list, |mut control| {
            let request = request.clone();
            async move { control.prefetch(request).await }
        })
        .await;
        let (started, silent) = answered(each)?;
        let not_answering = silent.into_iter().map(|(url, e)| (url, e.to_string())).collect();
        let started_urls: Vec<String> = started.iter().map(|(url, _)| url.clone()).collect();
        let streams = started.into_iter().enumerate().map(|(i, (endpoint, stream))| {
            futures::stream::unfold(Some((stream, endpoint)), move |state| async move {
                let (mut stream, endpoint) = state?;
                match stream.message().await {
                    Ok(Some(progress)) => Some(((i, Ok(progress)), Some((stream, endpoint)))),
                    Ok(None) => None,
                    // A member's stream ends with its failure.
                    Err(status) => Some(((i, Err(Error::Status { endpoint, status })), None)),
                }
            })
            .boxed()
        });
        Ok(PrefetchStream {
            streams: futures::stream::select_all(streams),
            latest: vec![PrefetchProgress::default(); started_urls.len()],
            started: started_urls,
            failed: 0,
            not_answering,
        })
    }

    /// Drops `shards` of `dataset` (all of them when empty) from the cache.
    pub async fn evict(&self, dataset: &str, shards: &[String]) -> Result<EvictResponse> {
        let request = EvictRequest { dataset: dataset.to_owned(), shards: shards.to_vec() };
        let answers = self
            .on_all(|mut control| {
                let request = request.clone();
                async move { control.evict(request).await }
            })
            .await?;
        Ok(EvictResponse {
            shards: answers.iter().map(|a| a.shards).sum(),
            bytes: answers.iter().map(|a| a.bytes).sum(),
        })
    }

    /// Pins (or unpins) shards; returns how many changed.
    pub async fn pin(&self, dataset: &str, shards: &[String], pinned: bool) -> Result<u64> {
        let request = PinRequest { dataset: dataset.to_owned(), shards: shards.to_vec() };
        let answers = self
            .on_all(|mut control| {
                let request = request.clone();
                async move { if pinned { control.pin(request).await } else { control.unpin(request).await } }
            })
            .await?;
        Ok(answers.iter().map(|a| a.shards).sum())
    }

    /// Tells the spoke the order in which `job` will read shards of `dataset`: one
    /// [`PlannedEpoch`] per epoch from `epoch` on (the rest of this epoch, then the next),
    /// so that it evicts what is read again furthest away and prefetches what is read
    /// next. Replaces the job's previous plan (no epochs withdraws it); returns the
    /// distinct shards it names. A job with several readers (DataLoader workers) sends
    /// one plan per reader, as `JOB/READER`. A group's members each take the plan.
    pub async fn set_plan(
        &self,
        job: &str,
        epoch: u64,
        dataset: &str,
        epochs: &[PlannedEpoch],
    ) -> Result<u64> {
        Ok(self.plan(job, epoch, dataset, epochs).await?.shards)
    }

    /// [`CacheClient::set_plan`], with the whole answer: the shards the plan names, and
    /// whether a spoke follows it sample by sample (`samples`: its blocks do not fit the
    /// cache; send its samples with [`CacheClient::plan_samples`]). A group's answers
    /// as one: the most shards, and samples if any member follows samples.
    pub async fn plan(
        &self,
        job: &str,
        epoch: u64,
        dataset: &str,
        epochs: &[PlannedEpoch],
    ) -> Result<PlanResponse> {
        // Each shard once in a table, each position its index there: a plan of a million
        // positions is four megabytes on the wire and in the spoke's hands, not a
        // million pairs of names.
        let mut table = ShardTable::new(dataset);
        let epochs: Vec<EpochPlan> = epochs
            .iter()
            .map(|planned| EpochPlan {
                shard_index: planned.shards.iter().map(|shard| table.index(shard)).collect(),
                until: planned.until.clone(),
                ..Default::default()
            })
            .collect();
        let table = table.shards;
        let request = PlanRequest { job: job.to_owned(), epoch, epochs, shard_table: table };
        let answers = self
            .on_all(|mut control| {
                let request = request.clone();
                async move { control.set_plan(request).await }
            })
            .await?;
        Ok(PlanResponse {
            shards: answers.iter().map(|a| a.shards).max().unwrap_or(0),
            samples: answers.iter().any(|a| a.samples),
        })
    }

    /// Sends `job`'s next reads of `dataset`, sample by sample (a rolling window ahead of
    /// its reads: see `PlanSamples` in the proto), `epoch_samples` samples an epoch. The
    /// spoke fetches the nearest ahead in batches, holds them until read and keeps those
    /// read again. A group's members each take them (each follows the samples of the
    /// shards it owns); the answer is the largest window a member fetches.
    pub async fn plan_samples(
        &self,
        job: &str,
        dataset: &str,
        epoch_samples: u64,
        reads: &[PlannedSample],
    ) -> Result<SamplePlanResponse> {
        let mut table = ShardTable::new(dataset);
        let mut request = SamplePlanRequest { job: job.to_owned(), epoch_samples, ..Default::default() };
        for read in reads {
            request.position.push(read.position);
            request.shard.push(table.index(&read.shard));
            request.offset.push(read.offset);
            request.length.push(read.length);
            request.next_use.push(read.next_use.unwrap_or(0));
        }
        request.shard_table = table.shards;
        let answers = self
            .on_all(|mut control| {
                let request = request.clone();
                async move { control.plan_samples(request).await }
            })
            .await?;
        Ok(SamplePlanResponse {
            planned: answers.iter().map(|a| a.planned).max().unwrap_or(0),
            window_bytes: answers.iter().map(|a| a.window_bytes).max().unwrap_or(0),
        })
    }
}

impl CacheClient {
    /// Sends one rank's step timings (`crate::steps::StepTimer` does, a second's worth at
    /// a time) to every member: each keeps the job's phases, beside the reads it answered.
    /// An error only when no member took it.
    pub async fn report_steps(&self, report: StepReport) -> Result<()> {
        let list = self.members.current();
        let each = Self::on_each(&list, |mut control| {
            let report = report.clone();
            async move { control.report_steps(report).await }
        })
        .await;
        answered(each).map(|_| ())
    }

    /// Job `job`'s own table (`principal`'s, for an operator; empty: the caller's own),
    /// a group's members' tables merged (`crate::report::merge`).
    pub async fn job_report(&self, job: &str, principal: &str) -> Result<JobReport> {
        let list = self.members.current();
        let request = JobReportRequest { job: job.to_owned(), principal: principal.to_owned() };
        let each = Self::on_each(&list, |mut control| {
            let request = request.clone();
            async move { control.job_report(request).await }
        })
        .await;
        let (answers, _) = answered(each)?;
        Ok(crate::report::merge(answers).unwrap_or_default())
    }
}

/// The shards a plan names, each once, in the order first named: positions name them by
/// their index here.
struct ShardTable<'a> {
    dataset: &'a str,
    shards: Vec<ShardRef>,
    index: std::collections::HashMap<&'a str, u32>,
}

impl<'a> ShardTable<'a> {
    fn new(dataset: &'a str) -> Self {
        Self { dataset, shards: Vec::new(), index: std::collections::HashMap::new() }
    }

    /// The index of `shard`, added if it is new.
    fn index(&mut self, shard: &'a str) -> u32 {
        *self.index.entry(shard).or_insert_with(|| {
            self.shards.push(ShardRef { dataset: self.dataset.to_owned(), shard: shard.to_owned() });
            self.shards.len() as u32 - 1
        })
    }
}

/// One read of a plan followed sample by sample ([`CacheClient::plan_samples`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedSample {
    /// Its place among the job's reads, counted across epochs: epoch x samples an epoch +
    /// its place in the epoch.
    pub position: u64,
    pub shard: String,
    pub offset: u64,
    pub length: u64,
    /// The position of the same sample's next read (`None`: not planned).
    pub next_use: Option<u64>,
}

/// Members' answers apart from their failures (each with its URL); every member failing
/// is the first failure, as it came (one spoke's error is the call's).
#[allow(clippy::type_complexity)]
fn answered<T>(each: Vec<(String, Result<T>)>) -> Result<(Vec<(String, T)>, Vec<(String, Error)>)> {
    let (mut answers, mut failures) = (Vec::new(), Vec::new());
    for (url, answer) in each {
        match answer {
            Ok(answer) => answers.push((url, answer)),
            Err(e) => failures.push((url, e)),
        }
    }
    if answers.is_empty() {
        return Err(failures
            .into_iter()
            .next()
            .map_or_else(|| Error::Config("no members".into()), |(_, e)| e));
    }
    Ok((answers, failures))
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

/// Progress of a prefetch (a group's members' added up).
pub struct PrefetchStream {
    streams: futures::stream::SelectAll<BoxStream<'static, (usize, Result<PrefetchProgress>)>>,
    /// Each started member's latest report.
    latest: Vec<PrefetchProgress>,
    /// The URL of each started member.
    started: Vec<String>,
    /// Started members whose stream failed.
    failed: usize,
    /// Members that did not answer or failed on the way, and why.
    not_answering: Vec<(String, String)>,
}

impl std::fmt::Debug for PrefetchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefetchStream").field("latest", &self.latest).finish_non_exhaustive()
    }
}

impl PrefetchStream {
    /// The next progress report; `Ok(None)` when the prefetch is complete.
    pub async fn next(&mut self) -> Result<Option<PrefetchProgress>> {
        let (member, report) = loop {
            let Some((member, report)) = self.streams.next().await else { return Ok(None) };
            match report {
                Ok(report) => break (member, report),
                Err(e) => {
                    self.failed += 1;
                    // One spoke's failure, or every member's, is the prefetch's.
                    if self.failed == self.started.len() {
                        return Err(e);
                    }
                    self.not_answering.push((self.started[member].clone(), e.to_string()));
                }
            }
        };
        self.latest[member] = report;
        let mut sum = PrefetchProgress::default();
        for p in &self.latest {
            sum.shards_total += p.shards_total;
            sum.shards_done += p.shards_done;
            sum.bytes_total += p.bytes_total;
            sum.bytes_done += p.bytes_done;
            sum.bytes_fetched += p.bytes_fetched;
            if !p.last_shard.is_empty() {
                sum.last_shard.clone_from(&p.last_shard);
            }
        }
        if self.latest.len() == 1 {
            sum.last_shard.clone_from(&self.latest[0].last_shard);
        }
        Ok(Some(sum))
    }

    /// The members of a group that did not answer, or failed on the way, and why: the
    /// shards they own were not fetched (their next reads fetch them, through the member
    /// that owns them then).
    pub fn not_answering(&self) -> &[(String, String)] {
        &self.not_answering
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
