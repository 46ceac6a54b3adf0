//! The `shardcache.v1.CacheControl` service: prefetch with progress, status, evict, pin,
//! and jobs' access plans.

use std::sync::{Arc, atomic::Ordering::Relaxed};

use futures::stream::{self, StreamExt};
use shardcache_proto::{
    names::{DatasetName, ShardName},
    v1::{
        Chunk, DatasetStatus, EvictRequest, EvictResponse, JobReport, JobReportRequest, MemberStatus,
        PinRequest, PinResponse, PlanRequest, PlanResponse, PrefetchProgress, PrefetchRequest,
        ReadRangeRequest, SamplePlanRequest, SamplePlanResponse, StatusRequest, StatusResponse, StepReport,
        StepReportResponse, cache_control_server::CacheControl,
    },
};
use shardcache_serving::auth::Grant;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

mod plan_requests;
mod statuses;

use plan_requests::{plan_positions, planned_samples};
use statuses::{job_statuses, plan_statuses, principal_statuses};

use crate::{
    Result,
    cache::Cache,
    plans::samples::job_of,
    plans::shards::{MAX_PLAN_POSITIONS, PlanRefused},
    policy::window,
    store::entry::Entry,
};

/// Shards a prefetch fetches at once when the request does not say. Each shard fetch
/// itself keeps `shard_fetch_parallelism` chunks in flight.
pub const DEFAULT_PREFETCH_PARALLELISM: usize = 4;

/// Shard versions a prefetch asks the hub for at once before fetching: 64 shards per
/// 60 ms round trip (the demo's 75-shard plan resolves in two round trips, not five).
const STAT_PARALLELISM: usize = 64;

/// Largest `ReadCached`: a member asks for one cache chunk at a time (4 MiB by default;
/// `--chunk-size` allows up to 64 MiB), and the SDK accepts 80 MiB responses.
const MAX_CACHED_READ: u64 = 64 << 20;

/// `CacheControl` over the cache.
#[derive(Debug)]
pub struct Control {
    cache: Arc<Cache>,
    /// `--max-read`: a `ReadCached` is a read like the others.
    max_read: u64,
}

impl Control {
    pub fn new(cache: Arc<Cache>, max_read: u64) -> Self {
        Self { cache, max_read }
    }

    /// The shards a request names: the listed ones, or every shard of `dataset` from the hub.
    async fn plan(
        &self,
        dataset: &str,
        shards: Vec<(String, String)>,
    ) -> Result<Vec<(DatasetName, ShardName)>> {
        let shards = if shards.is_empty() {
            DatasetName::new(dataset)?;
            let listed = self.cache.hubs().list(|hub| async move { hub.list_shards(dataset).await }).await?;
            listed.into_iter().map(|s| (dataset.to_owned(), s.shard)).collect()
        } else {
            shards
        };
        shards.into_iter().map(|(d, s)| Ok((DatasetName::new(&d)?, ShardName::new(&s)?))).collect()
    }

    /// Cached entries named by an evict or pin request (no hub involved).
    fn cached(&self, dataset: &str, shards: &[String]) -> Result<Vec<Arc<Entry>>> {
        DatasetName::new(dataset)?;
        if shards.is_empty() {
            return Ok(self.cache.entries().into_iter().filter(|e| e.dataset == dataset).collect());
        }
        let mut entries = Vec::new();
        for shard in shards {
            ShardName::new(shard)?;
            entries.extend(self.cache.cached_entry(dataset, shard));
        }
        Ok(entries)
    }
}

#[tonic::async_trait]
impl CacheControl for Control {
    type PrefetchStream = ReceiverStream<Result<PrefetchProgress, Status>>;

    async fn prefetch(
        &self,
        request: Request<PrefetchRequest>,
    ) -> Result<Response<Self::PrefetchStream>, Status> {
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        if req.shards.is_empty() {
            grant.check_control(&req.dataset)?;
        }
        for shard in &req.shards {
            grant.check_control(&shard.dataset)?;
        }
        let listed = req.shards.into_iter().map(|s| (s.dataset, s.shard)).collect();
        let mut plan = self.plan(&req.dataset, listed).await?;
        // In a group each member fetches the shards it owns: the group holds one copy,
        // and the SDK sends a group's prefetch to every member.
        plan.retain(|(d, s)| self.cache.owns(d.as_str(), s.as_str()));
        let parallelism = match req.parallelism as usize {
            0 => DEFAULT_PREFETCH_PARALLELISM,
            n => n.min(64),
        };
        // Resolve every shard first (size and version), so progress has a total. Across
        // a 60 ms link that is one round trip per STAT_PARALLELISM shards.
        let cache = self.cache.clone();
        // A prefetch is no job's reads: what it fetches counts in a row of its own.
        let row = cache.metrics().jobs.prefetched(grant.principal());
        let principal: Arc<str> = grant.principal().into();
        let entries: Vec<Arc<Entry>> = stream::iter(plan)
            .map(|(d, s)| {
                let cache = cache.clone();
                async move { cache.entry(&d, &s).await }
            })
            .buffered(STAT_PARALLELISM)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_>>()?;
        for entry in &entries {
            entry.hold_for_prefetch(true);
        }
        let mut progress = PrefetchProgress {
            shards_total: entries.len() as u64,
            bytes_total: entries.iter().map(|e| e.size).sum(),
            ..Default::default()
        };
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            let _ = tx.send(Ok(progress.clone())).await;
            // In plan order, `parallelism` shards at a time.
            let mut fetches = stream::iter(entries.iter().cloned())
                .map(|entry| {
                    let (cache, row, principal) = (cache.clone(), row.clone(), principal.clone());
                    async move { (cache.fetch_shard(&entry, &row, &principal).await, entry) }
                })
                .buffered(parallelism);
            let mut failed = false;
            while let Some((result, entry)) = fetches.next().await {
                match result {
                    Ok(fetched) => {
                        progress.shards_done += 1;
                        progress.bytes_done += entry.size;
                        progress.bytes_fetched += fetched;
                        progress.last_shard = format!("{}/{}", entry.dataset, entry.shard);
                        if tx.send(Ok(progress.clone())).await.is_err() {
                            break; // the client went away; stop fetching for it
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        failed = true;
                        break;
                    }
                }
            }
            drop(fetches);
            for entry in &entries {
                entry.hold_for_prefetch(false);
            }
            if !failed {
                // Shards it held may be evicted now.
                cache.capacity().wake_if_over();
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn status(&self, request: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let grant = Grant::of(&request)?;
        let cache = &self.cache;
        let mut datasets: std::collections::BTreeMap<String, DatasetStatus> = Default::default();
        for entry in cache.entries() {
            let status = datasets.entry(entry.dataset.clone()).or_default();
            let bytes = entry.cached_bytes();
            status.cached_shards += u64::from(bytes > 0);
            status.cached_bytes += bytes;
            status.pinned_shards += u64::from(entry.is_pinned());
        }
        for (name, counters) in cache.metrics().datasets() {
            let status = datasets.entry(name).or_default();
            status.hit_requests = counters.hit_requests.load(Relaxed);
            status.miss_requests = counters.miss_requests.load(Relaxed);
            status.hit_bytes = counters.hit_bytes.load(Relaxed);
            status.miss_bytes = counters.miss_bytes.load(Relaxed);
            status.upstream_bytes = counters.upstream_bytes.load(Relaxed);
            status.upstream_wire_bytes = counters.upstream_wire_bytes.load(Relaxed);
            status.peer_bytes = counters.peer_bytes.load(Relaxed);
        }
        // A principal sees the counters of the datasets it may read, and its own jobs and
        // plans; the server's own figures (hubs, capacity, global counters) are for one
        // that may control the cache, and everyone's jobs for the operator.
        let datasets = datasets
            .into_iter()
            .filter(|(dataset, _)| grant.allows(dataset))
            .map(|(dataset, status)| DatasetStatus { dataset, ..status })
            .collect();
        let whose = |principal: &str| grant.is_operator() || principal == grant.principal();
        let (members, peer_refusals) = match cache.chain().peers() {
            Some(peers) => {
                let me = peers.me().to_owned();
                let members = peers
                    .states()
                    .into_iter()
                    .map(|m| MemberStatus { url: m.url, state: m.state.to_owned(), seen_by: me.clone() })
                    .collect();
                (members, peers.reports().refusals())
            }
            None => (Vec::new(), 0),
        };
        let mut status = StatusResponse {
            datasets,
            principals: principal_statuses(cache).into_iter().filter(|p| whose(&p.principal)).collect(),
            jobs: job_statuses(cache).into_iter().filter(|j| whose(&j.principal)).collect(),
            plans: plan_statuses(cache).into_iter().filter(|p| whose(&p.principal)).collect(),
            principal: grant.principal().to_owned(),
            members,
            peer_refusals,
            ..Default::default()
        };
        if grant.may_control() {
            let (hub_trouble, age) = cache.hubs().trouble().unwrap_or_default();
            let (kept, packs, staged) = cache.samples_held();
            let (hub_fetches_plain, hub_fetches_zstd) = cache.hubs().fetches_asked();
            let store_own_bytes = cache.store_own_bytes().await;
            status = StatusResponse {
                capacity_bytes: cache.capacity().capacity(),
                used_bytes: cache.used_bytes(),
                evicted_shards: cache.metrics().evicted_shards.load(Relaxed),
                evicted_bytes: cache.metrics().evicted_bytes.load(Relaxed),
                checksum_failures: cache.metrics().checksum_failures.load(Relaxed),
                hubs: cache.hubs().urls(),
                hub_trouble,
                hub_trouble_age_s: age.as_secs(),
                speculation_useful_share: cache.speculation().useful_share(),
                speculation_unread_bytes: cache.speculation().unread(),
                kept_sample_bytes: kept,
                kept_sample_packs: packs,
                staged_sample_bytes: staged,
                sample_window_bytes: window::samples_bound(cache.capacity().capacity()),
                hub_fetches_plain,
                hub_fetches_zstd,
                store_own_bytes,
                fetches_in_flight: cache.fetches_running() as u64,
                hub_bytes_received: cache.hubs().bytes_received(),
                server_view: true,
                ..status
            };
        }
        Ok(Response::new(status))
    }

    async fn evict(&self, request: Request<EvictRequest>) -> Result<Response<EvictResponse>, Status> {
        Grant::of(&request)?.check_control(&request.get_ref().dataset)?;
        let req = request.into_inner();
        let (shards, bytes) = self.cache.evict(&self.cached(&req.dataset, &req.shards)?).await;
        Ok(Response::new(EvictResponse { shards, bytes }))
    }

    async fn pin(&self, request: Request<PinRequest>) -> Result<Response<PinResponse>, Status> {
        Grant::of(&request)?.check_control(&request.get_ref().dataset)?;
        let req = request.into_inner();
        // Named shards are pinned even before they are cached (pin, then prefetch);
        // a whole dataset means its cached shards.
        let entries = if req.shards.is_empty() {
            self.cached(&req.dataset, &[])?
        } else {
            let dataset = DatasetName::new(&req.dataset)?;
            let mut entries = Vec::new();
            for shard in &req.shards {
                entries.push(self.cache.entry(&dataset, &ShardName::new(shard)?).await?);
            }
            entries
        };
        set_pins(&self.cache, entries, true).await
    }

    async fn report_steps(
        &self,
        request: Request<StepReport>,
    ) -> Result<Response<StepReportResponse>, Status> {
        let grant = Grant::of(&request)?;
        let report = request.into_inner();
        let principal = grant.principal();
        let reads = self.cache.metrics().jobs.job_sum(principal, job_of(&report.job));
        self.cache
            .metrics()
            .job_tables
            .report(principal, &report, reads)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(StepReportResponse {}))
    }

    async fn job_report(&self, request: Request<JobReportRequest>) -> Result<Response<JobReport>, Status> {
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        // A job is its principal's: another's table is the operator's to see.
        let principal = if req.principal.is_empty() || req.principal == grant.principal() {
            grant.principal()
        } else if grant.is_operator() {
            req.principal.as_str()
        } else {
            return Err(Status::permission_denied(format!(
                "principal {:?} may see its own jobs' tables only, not {:?}'s",
                grant.principal(),
                req.principal
            )));
        };
        let job = job_of(&req.job);
        let reads = self.cache.metrics().jobs.job_sum(principal, job);
        let Some(report) = self.cache.metrics().job_tables.get(principal, job, reads) else {
            return Err(Status::not_found(format!(
                "this spoke has no table for job {job:?} of principal {principal:?}: its reads name the job with the \
                 SDK's `job=` and its loop reports its steps with the SDK's StepTimer"
            )));
        };
        Ok(Response::new(report))
    }

    async fn read_cached(&self, request: Request<ReadRangeRequest>) -> Result<Response<Chunk>, Status> {
        Grant::of(&request)?.check(&request.get_ref().dataset)?;
        self.cache.metrics().held_reads_asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A member hedged to asks the owner to join its fetch (`shardcache_proto::hedge`).
        let join = request.metadata().get(shardcache_proto::hedge::JOIN_HEADER).is_some();
        let req = request.into_inner();
        let (dataset, shard) = (DatasetName::new(&req.dataset)?, ShardName::new(&req.shard)?);
        shardcache_proto::range::check_total(req.length, MAX_CACHED_READ.min(self.max_read))
            .map_err(Status::from)?;
        // One joining waits for a first read's lookup of the shard running here.
        let known = if join {
            self.cache.known_entry(dataset.as_str(), shard.as_str()).await
        } else {
            self.cache.cached_entry(dataset.as_str(), shard.as_str())
        };
        let Some(entry) = known else {
            return Err(Status::failed_precondition(format!("{dataset}/{shard} is not cached here")));
        };
        if !req.expected_version.is_empty() && req.expected_version != entry.version {
            return Err(Status::aborted(format!(
                "{dataset}/{shard} is cached here at version {:?}, not {:?}",
                entry.version, req.expected_version
            )));
        }
        shardcache_proto::range::check_within(req.offset, req.length, entry.size).map_err(Status::from)?;
        let mut data = self.cache.read_cached(&entry, req.offset, req.length).await?;
        if data.is_none() && join {
            data = self.cache.join_running(&entry, req.offset, req.length).await;
        }
        let Some(data) = data else {
            return Err(Status::failed_precondition(format!(
                "{dataset}/{shard} [{}, {}) is not all cached here{}",
                req.offset,
                req.offset + req.length,
                if join { " nor being fetched" } else { "" }
            )));
        };
        Ok(Response::new(Chunk {
            offset: req.offset,
            data: data.data,
            crc32c: data.crc32c,
            version: entry.version.clone(),
            ..Default::default()
        }))
    }

    async fn set_plan(&self, request: Request<PlanRequest>) -> Result<Response<PlanResponse>, Status> {
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        shardcache_proto::job_headers::check_job_name(&req.job).map_err(Status::invalid_argument)?;
        let positions: usize = req.epochs.iter().map(|e| e.shards.len() + e.shard_index.len()).sum();
        if positions > MAX_PLAN_POSITIONS {
            return Err(Status::invalid_argument(format!(
                "a plan of {positions} reads is over the limit of {MAX_PLAN_POSITIONS}; send the current and the \
                 next epoch only"
            )));
        }
        let refused = |e: PlanRefused| Status::resource_exhausted(e.to_string());
        self.cache.plans().shards.admits(grant.principal(), &req.job, positions).map_err(refused)?;
        let (table, mut plan) = plan_positions(&req, positions)?;
        for (dataset, _) in &table {
            grant.check(dataset.as_str())?;
        }
        // Every shard the plan names must exist (its StatShard, as a prefetch's).
        let resolved = stream::iter(table)
            .map(|(dataset, shard)| {
                let cache = self.cache.clone();
                async move {
                    let entry = cache.entry(&dataset, &shard).await.map_err(|e| match e.code() {
                        tonic::Code::NotFound => Status::invalid_argument(format!(
                            "the plan names {dataset}/{shard}, which does not exist on the hub: {e}"
                        )),
                        _ => Status::from(e),
                    })?;
                    Ok::<_, Status>(((dataset.to_string(), shard.to_string()), entry.size))
                }
            })
            .buffered(STAT_PARALLELISM)
            .collect::<Vec<_>>()
            .await;
        plan.shards = resolved.into_iter().collect::<Result<_, Status>>()?;
        let room = self.cache.capacity().low_watermark();
        let (shards, samples) =
            self.cache.plans().shards.set(grant.principal(), &req.job, plan, room).map_err(refused)?;
        let shards = shards as u64;
        tracing::info!(principal = grant.principal(), job = %req.job, epoch = req.epoch, reads = positions, shards, samples, "access plan set");
        Ok(Response::new(PlanResponse { shards, samples }))
    }

    async fn plan_samples(
        &self,
        request: Request<SamplePlanRequest>,
    ) -> Result<Response<SamplePlanResponse>, Status> {
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        shardcache_proto::job_headers::check_job_name(&req.job).map_err(Status::invalid_argument)?;
        let (table, reads) = planned_samples(&req, self.max_read)?;
        for (dataset, _) in &table {
            grant.check(dataset)?;
        }
        let planned = self
            .cache
            .plans()
            .samples
            .add((grant.principal(), &req.job), req.epoch_samples, &table, &reads)
            .map_err(|e| Status::resource_exhausted(e.to_string()))?;
        let window_bytes = window::samples_bound(self.cache.capacity().capacity());
        Ok(Response::new(SamplePlanResponse { planned: planned as u64, window_bytes }))
    }

    async fn unpin(&self, request: Request<PinRequest>) -> Result<Response<PinResponse>, Status> {
        Grant::of(&request)?.check_control(&request.get_ref().dataset)?;
        set_pins(&self.cache, self.cached(&request.get_ref().dataset, &request.get_ref().shards)?, false)
            .await
    }
}

async fn set_pins(
    cache: &Cache,
    entries: Vec<Arc<Entry>>,
    pinned: bool,
) -> Result<Response<PinResponse>, Status> {
    let changed = cache.set_pinned(&entries, pinned).await?;
    Ok(Response::new(PinResponse { shards: changed }))
}
