//! What the spoke counts, served in Prometheus text format on `--metrics-listen` (by
//! `scrape.rs`) and summarised by the `Status` RPC.
//!
//! Hand-rolled rather than a metrics crate: a few counters, gauges and two histograms,
//! all relaxed atomics on the read path, rendered on scrape.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
};

use shardcache_routing::HedgeCounters;
use shardcache_serving::prom::{Histogram, escape};

use crate::observe::job_counters::{JobSnapshot, Jobs};

/// Picks one counter of a dataset's counters.
type CounterField = fn(&DatasetCounters) -> &AtomicU64;
/// The `job_id` label of the jobs `--metric-jobs` does not name.
pub const OTHER_JOBS: &str = "other";

/// Picks one value of a job row.
type JobField = fn(&JobSnapshot) -> u64;

/// Picks one of a principal's (held, share) bytes.
type PrincipalField = fn(&(u64, u64)) -> u64;

/// Per-dataset counters.
#[derive(Debug, Default)]
pub struct DatasetCounters {
    pub hit_requests: AtomicU64,
    pub miss_requests: AtomicU64,
    pub hit_bytes: AtomicU64,
    pub miss_bytes: AtomicU64,
    pub upstream_bytes: AtomicU64,
    /// What `upstream_bytes` took on the link (less where the hub compressed them).
    pub upstream_wire_bytes: AtomicU64,
    /// Bytes fetched from members of the spoke's group (not over the long link).
    pub peer_bytes: AtomicU64,
}

/// Everything the spoke counts.
#[derive(Debug, Default)]
pub struct Metrics {
    datasets: Mutex<BTreeMap<String, Arc<DatasetCounters>>>,
    pub checksum_failures: AtomicU64,
    /// Stored pages the disk could not read (I/O errors); each chunk was refetched.
    pub store_read_errors: AtomicU64,
    /// Chunks and records the store could not write (the reads were served anyway).
    pub store_write_failures: AtomicU64,
    /// Times the filesystem filled before `--capacity` and the capacity in effect was
    /// lowered.
    pub disk_full: AtomicU64,
    /// Background fetches of a whole shard started by a miss (read-ahead's big brother).
    pub whole_shard_fetches: AtomicU64,
    /// Batches of planned samples fetched ahead of their reads (`samples/follow.rs`).
    pub sample_batches: AtomicU64,
    /// Packs of kept samples written (`store/kept/`).
    pub kept_packs_written: AtomicU64,
    pub evicted_shards: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub upstream_requests: AtomicU64,
    /// Microseconds fetches waited for room under the bounds on bytes and requests in
    /// flight upstream (`fetch/upstream.rs`): a link carrying all it may.
    pub upstream_queue_micros: AtomicU64,
    /// What the link gate has measured of the long link (`fetch/link_gate.rs`): its
    /// delivery rate (bytes per second) and the bound on chunk fetches and reads in
    /// flight over it (bytes), as of the last hub answer.
    pub link_rate: AtomicU64,
    pub link_bound: AtomicU64,
    /// Revalidations the hub could not answer (the cached version was served).
    pub revalidation_failures: AtomicU64,
    /// `ReadCached` calls other members made here: for what this spoke holds of the
    /// shards they own (`suppliers::Chain::held_behind`), or to join its fetches.
    pub held_reads_asked: AtomicU64,
    /// The same-node door (`serve/local_door.rs`): calls answered with places, bytes
    /// handed out as pages of the store's files, bytes carried in its answers, and calls
    /// sent back to gRPC because something they read was not stored.
    pub door_calls: AtomicU64,
    pub door_placed_bytes: AtomicU64,
    pub door_carried_bytes: AtomicU64,
    pub door_not_stored: AtomicU64,
    /// Time to answer a read RPC (ReadRange, ReadRanges, one StreamShard chunk).
    pub read_latency: Histogram,
    /// Time of one upstream chunk fetch, hub round trip included.
    pub fetch_latency: Histogram,
    /// Per job and epoch (`jobs.rs`).
    pub jobs: Jobs,
    /// Every job's own table: its steps' data wait and its reads by phase (`job_table/`).
    pub job_tables: crate::observe::job_table::JobTables,
    /// Jobs whose rows get their own `job_id` label (`--metric-jobs`); the rest are
    /// summed under `job_id="other"`: label values are the operator's, never a client's.
    pub labelled_jobs: BTreeSet<String>,
    /// Hedged calls to the peers and hubs (`suppliers/`).
    pub hedges: Arc<HedgeCounters>,
}

/// Occupancy the cache reports at scrape time.
#[derive(Debug, Default, Clone)]
pub struct Occupancy {
    pub capacity_bytes: u64,
    pub configured_capacity_bytes: u64,
    pub used_bytes: u64,
    pub disk_bytes: u64,
    /// Per dataset: (cached shards, cached bytes, pinned shards).
    pub datasets: BTreeMap<String, (u64, u64, u64)>,
    /// Per principal holding bytes: (bytes held, its share of the capacity now). Its
    /// names are the operator's (token-file lines, certificate names), so few.
    pub principals: BTreeMap<String, (u64, u64)>,
    /// Of what speculation brought lately, the share reads used; bytes it holds unread.
    pub speculation_useful_share: f64,
    pub speculation_unread_bytes: u64,
    /// Bytes of samples kept for later epochs, and of samples fetched ahead of reads.
    pub kept_sample_bytes: u64,
    pub staged_sample_bytes: u64,
    /// The token file no longer loads, so requests with tokens are refused (an alarm).
    pub token_file_broken: bool,
    /// Members of the spoke's group as it sees them now (itself included); 0 alone.
    pub group_members: u64,
    /// Times a member refused this spoke's credentials (a counter).
    pub peer_refusals: u64,
    /// Chunks from members that failed verification (a counter).
    pub peer_bad_chunks: u64,
    /// Members that refused this spoke's credentials within the last minute.
    pub members_refusing: u64,
    /// Chunk fetches asked of the hubs as they are, and for zstd (counters).
    pub hub_fetches: (u64, u64),
    /// Every byte the connections to the hubs read (a counter: `Hubs::bytes_received`).
    pub hub_bytes_received: u64,
    /// Fetches running now (a gauge: `Cache::fetches_running`).
    pub fetches_running: u64,
}

impl Metrics {
    /// Counters whose metrics label the jobs `jobs` by name (`--metric-jobs`).
    pub fn labelling(jobs: BTreeSet<String>) -> Self {
        Self { labelled_jobs: jobs, ..Self::default() }
    }

    /// These metrics with the jobs' tables kept in `dir` (`job_table/`).
    pub fn with_job_tables(self, dir: &std::path::Path) -> Self {
        Self { job_tables: crate::observe::job_table::JobTables::open(dir), ..self }
    }

    pub fn dataset(&self, dataset: &str) -> Arc<DatasetCounters> {
        let mut map = self.datasets.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(dataset.to_owned()).or_default().clone()
    }

    pub fn datasets(&self) -> BTreeMap<String, Arc<DatasetCounters>> {
        self.datasets.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self, occupancy: &Occupancy) -> String {
        let mut out = String::new();
        self.render_datasets(&mut out);
        self.render_jobs(&mut out);
        self.render_globals(&mut out);
        render_occupancy(&mut out, occupancy);
        let queued = self.upstream_queue_micros.load(Relaxed) as f64 / 1e6;
        let name = "shardcache_spoke_upstream_queue_seconds_total";
        let _ = writeln!(
            out,
            "# HELP {name} Seconds fetches waited for room under the bounds on bytes and requests in flight to the hub and peers (summed over fetches: per second, how many waited at once)\n# TYPE {name} counter\n{name} {queued}"
        );
        for (name, help, value) in [
            (
                "shardcache_spoke_link_delivery_rate_bytes",
                "The long link's delivery rate as the spoke measures it (the highest over 2 s, bytes per second)",
                &self.link_rate,
            ),
            (
                "shardcache_spoke_link_in_flight_bound_bytes",
                "Bytes the spoke's chunk fetches and reads may have in flight over the long link (twice the measured bandwidth-delay product plus two chunks, at most --upstream-bytes-in-flight)",
                &self.link_bound,
            ),
        ] {
            let _ =
                writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}", value.load(Relaxed));
        }
        self.read_latency.render(&mut out, "shardcache_spoke_read_seconds", "Time to answer a read");
        self.fetch_latency.render(
            &mut out,
            "shardcache_spoke_fetch_seconds",
            "Time of one chunk fetch from the hub",
        );
        out
    }

    /// Per-dataset counters, labelled `dataset`.
    fn render_datasets(&self, out: &mut String) {
        let counters: [(&str, &str, CounterField); 7] = [
            ("shardcache_spoke_hit_requests_total", "Read requests served wholly from the cache", |d| {
                &d.hit_requests
            }),
            ("shardcache_spoke_miss_requests_total", "Read requests that needed the hub", |d| {
                &d.miss_requests
            }),
            ("shardcache_spoke_hit_bytes_total", "Bytes served from the cache", |d| &d.hit_bytes),
            ("shardcache_spoke_miss_bytes_total", "Bytes served by requests that needed the hub", |d| {
                &d.miss_bytes
            }),
            ("shardcache_spoke_upstream_bytes_total", "Bytes fetched from the hub", |d| &d.upstream_bytes),
            (
                "shardcache_spoke_upstream_wire_bytes_total",
                "What the bytes fetched from the hub took on the link (less where it compressed them)",
                |d| &d.upstream_wire_bytes,
            ),
            ("shardcache_spoke_peer_bytes_total", "Bytes fetched from members of the spoke's group", |d| {
                &d.peer_bytes
            }),
        ];
        let datasets = self.datasets();
        for (name, help, field) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (dataset, c) in &datasets {
                let _ = writeln!(out, "{name}{{dataset=\"{}\"}} {}", escape(dataset), field(c).load(Relaxed));
            }
        }
    }

    /// The counters of the whole spoke.
    fn render_globals(&self, out: &mut String) {
        let globals = [
            (
                "shardcache_spoke_checksum_failures_total",
                "Stored pages that failed their CRC32C and were refetched",
                &self.checksum_failures,
            ),
            (
                "shardcache_spoke_store_read_errors_total",
                "Stored pages the disk could not read (I/O errors, not damage); each chunk was forgotten and refetched",
                &self.store_read_errors,
            ),
            (
                "shardcache_spoke_store_write_failures_total",
                "Chunks and shard records the store could not write; their reads were served without storing",
                &self.store_write_failures,
            ),
            (
                "shardcache_spoke_disk_full_total",
                "Times the cache's filesystem filled before --capacity and the capacity in effect was lowered",
                &self.disk_full,
            ),
            (
                "shardcache_spoke_whole_shard_fetches_total",
                "Background fetches of the rest of a shard started by a miss (--fetch-whole-shard)",
                &self.whole_shard_fetches,
            ),
            (
                "shardcache_spoke_sample_batches_total",
                "Batches of planned samples fetched ahead of their reads (plans followed sample by sample)",
                &self.sample_batches,
            ),
            (
                "shardcache_spoke_kept_packs_written_total",
                "Packs (files) of samples kept for later epochs written",
                &self.kept_packs_written,
            ),
            ("shardcache_spoke_evicted_shards_total", "Shards evicted", &self.evicted_shards),
            (
                "shardcache_spoke_evicted_bytes_total",
                "Bytes evicted (shards and packs of kept samples)",
                &self.evicted_bytes,
            ),
            (
                "shardcache_spoke_upstream_requests_total",
                "Chunk fetches sent to the hub",
                &self.upstream_requests,
            ),
            (
                "shardcache_spoke_revalidation_failures_total",
                "Revalidations the hub could not answer; the cached version was served",
                &self.revalidation_failures,
            ),
            (
                "shardcache_spoke_held_reads_asked_total",
                "ReadCached calls of the group's members here (what this spoke holds, or a fetch to join)",
                &self.held_reads_asked,
            ),
            (
                "shardcache_spoke_hedges_total",
                "Chunk requests also sent to the next peer or hub because one had not answered within its hedge delay",
                &self.hedges.sent,
            ),
            (
                "shardcache_spoke_hedges_won_total",
                "Hedged requests whose answer came first",
                &self.hedges.won,
            ),
            (
                "shardcache_spoke_demotions_total",
                "Peers or hubs skipped for a while because their hedges kept losing",
                &self.hedges.demotions,
            ),
        ];
        counters(out, &globals);
        self.render_door(out);
    }

    /// The same-node door's counters (`serve/local_door.rs`).
    fn render_door(&self, out: &mut String) {
        let door = [
            (
                "shardcache_spoke_local_door_calls_total",
                "Calls of the same-node door answered (reads of readers on the spoke's node)",
                &self.door_calls,
            ),
            (
                "shardcache_spoke_local_door_placed_bytes_total",
                "Bytes the same-node door's readers read from the store's files themselves",
                &self.door_placed_bytes,
            ),
            (
                "shardcache_spoke_local_door_carried_bytes_total",
                "Bytes the same-node door carried in its answers (parts it could not place in a file)",
                &self.door_carried_bytes,
            ),
            (
                "shardcache_spoke_local_door_not_stored_total",
                "Calls of the same-node door sent back to gRPC: something they read was not stored",
                &self.door_not_stored,
            ),
        ];
        counters(out, &door);
    }
}

/// Writes `counters` (name, help, value) as Prometheus counters.
fn counters(out: &mut String, counters: &[(&str, &str, &AtomicU64)]) {
    for (name, help, value) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", value.load(Relaxed));
    }
}

/// Chunk fetches asked of the hubs as they are and for zstd (`--hub-compression`), what
/// the hub connections read in all, and the fetches running.
fn render_hub_fetches(out: &mut String, occupancy: &Occupancy) {
    let (plain, zstd) = occupancy.hub_fetches;
    let name = "shardcache_spoke_hub_fetches_total";
    let _ = writeln!(
        out,
        "# HELP {name} Chunk fetches asked of the hubs, by encoding asked for (--hub-compression; under auto, \
         what it measured to deliver faster)\n# TYPE {name} counter\n{name}{{encoding=\"plain\"}} {}\n\
         {name}{{encoding=\"zstd\"}} {}",
        plain, zstd
    );
    let name = "shardcache_spoke_hub_received_bytes_total";
    let _ = writeln!(
        out,
        "# HELP {name} Bytes the connections to the hubs read: every answer whatever became of it, listings, \
         stats and framing included (what the long link carried toward the spoke)\n# TYPE {name} counter\n\
         {name} {}",
        occupancy.hub_bytes_received
    );
    let name = "shardcache_spoke_fetches_in_flight";
    let _ = writeln!(
        out,
        "# HELP {name} Fetches running: calls to the suppliers, chunk fetches until stored, planned shard \
         fetches\n# TYPE {name} gauge\n{name} {}",
        occupancy.fetches_running
    );
}

/// What the plans followed sample by sample hold (gauges).
fn render_samples(out: &mut String, occupancy: &Occupancy) {
    let gauges = [
        (
            "shardcache_spoke_kept_sample_bytes",
            "Bytes of samples kept for later epochs (plans followed sample by sample; in used_bytes)",
            occupancy.kept_sample_bytes,
        ),
        (
            "shardcache_spoke_staged_sample_bytes",
            "Bytes of planned samples fetched ahead of their reads and held until read",
            occupancy.staged_sample_bytes,
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
    }
}

/// What the cache holds now, and its settings (gauges).
fn render_occupancy(out: &mut String, occupancy: &Occupancy) {
    let gauges = [
        (
            "shardcache_spoke_capacity_bytes",
            "Cache capacity in effect: --capacity, or less once the cache's filesystem filled first",
            occupancy.capacity_bytes,
        ),
        ("shardcache_spoke_configured_capacity_bytes", "--capacity", occupancy.configured_capacity_bytes),
        ("shardcache_spoke_used_bytes", "Bytes of cached chunks and kept samples", occupancy.used_bytes),
        ("shardcache_spoke_disk_bytes", "Bytes of live RocksDB files", occupancy.disk_bytes),
        (
            "shardcache_spoke_group_members",
            "Members of the spoke's group it knows of now, itself included (0: no group)",
            occupancy.group_members,
        ),
        (
            "shardcache_spoke_group_members_refusing",
            "Members of the group that refused this spoke's credentials within the last minute (the group then holds more than one copy)",
            occupancy.members_refusing,
        ),
        (
            "shardcache_spoke_token_file_broken",
            "1 while --token-file cannot be read or parsed: requests with tokens are refused",
            u64::from(occupancy.token_file_broken),
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
    }
    render_samples(out, occupancy);
    let name = "shardcache_spoke_peer_refusals_total";
    let _ = writeln!(
        out,
        "# HELP {name} Times a member of the group refused this spoke's credentials (UNAUTHENTICATED, \
         PERMISSION_DENIED): the chunk came from the hub instead\n# TYPE {name} counter\n{name} {}",
        occupancy.peer_refusals
    );
    let name = "shardcache_spoke_peer_bad_chunks_total";
    let _ = writeln!(
        out,
        "# HELP {name} Chunks from members of the group that failed verification (checksum, protocol, \
         range or version): the member was skipped for a while and the chunk came from the hub\n\
         # TYPE {name} counter\n{name} {}",
        occupancy.peer_bad_chunks
    );
    render_hub_fetches(out, occupancy);
    let name = "shardcache_spoke_cached_bytes";
    let _ = writeln!(out, "# HELP {name} Cached bytes per dataset\n# TYPE {name} gauge");
    for (dataset, (_, bytes, _)) in &occupancy.datasets {
        let _ = writeln!(out, "{name}{{dataset=\"{}\"}} {bytes}", escape(dataset));
    }
    let per_principal: [(&str, &str, PrincipalField); 2] = [
        ("shardcache_spoke_principal_held_bytes", "Bytes of the shards each principal's reads stored", |p| {
            p.0
        }),
        (
            "shardcache_spoke_principal_share_bytes",
            "Each principal's share of the capacity now (--tenant-shares; an unused share is lent out)",
            |p| p.1,
        ),
    ];
    for (name, help, field) in per_principal {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (principal, values) in &occupancy.principals {
            let _ = writeln!(out, "{name}{{principal=\"{}\"}} {}", escape(principal), field(values));
        }
    }
    let name = "shardcache_spoke_speculation_useful_ratio";
    let _ = writeln!(
        out,
        "# HELP {name} Of the bytes read-ahead and whole-shard fetches brought lately, the share reads used before \
         eviction (below 0.5 they back off)\n# TYPE {name} gauge\n{name} {}",
        occupancy.speculation_useful_share
    );
    let name = "shardcache_spoke_speculation_unread_bytes";
    let _ = writeln!(
        out,
        "# HELP {name} Bytes read-ahead and whole-shard fetches stored that no read has used yet\n\
         # TYPE {name} gauge\n{name} {}",
        occupancy.speculation_unread_bytes
    );
}

impl Metrics {
    /// Per (job, epoch) counters, labelled `job_id` (Prometheus keeps `job` for the scrape
    /// job) and `epoch`, for the jobs `--metric-jobs` names; every other job's rows
    /// (folded ones included) are summed under `job_id="other"` with no epoch, and
    /// untagged reads are `job_id=""`. A client chooses its job's name, so a name becomes
    /// a label value only when the operator has listed it: a series per client-chosen
    /// name would let any reader grow the scrape without bound.
    fn render_jobs(&self, out: &mut String) {
        let mut rows: BTreeMap<(String, String), JobSnapshot> = BTreeMap::new();
        for (key, row) in self.jobs.snapshot() {
            let label = match key.job.as_str() {
                "" => (String::new(), key.epoch.to_string()),
                job if self.labelled_jobs.contains(job) => (job.to_owned(), key.epoch.to_string()),
                _ => (OTHER_JOBS.to_owned(), String::new()),
            };
            rows.entry(label).or_default().add(row);
        }
        let series: [(&str, &str, JobField); 6] = [
            ("shardcache_spoke_job_reads_total", "Reads per job and epoch", |r| r.reads),
            (
                "shardcache_spoke_job_hit_reads_total",
                "Reads served wholly from the cache per job and epoch",
                |r| r.hit_reads,
            ),
            ("shardcache_spoke_job_bytes_total", "Bytes read per job and epoch", |r| r.bytes),
            ("shardcache_spoke_job_hit_bytes_total", "Bytes read from the cache per job and epoch", |r| {
                r.hit_bytes
            }),
            (
                "shardcache_spoke_job_hub_bytes_total",
                "Bytes fetched from the hub for a job's reads and plan, per epoch",
                |r| r.hub_bytes,
            ),
            (
                "shardcache_spoke_job_link_bytes_total",
                "What a job's hub bytes took on the long link, per epoch (over its bytes read: its amplification)",
                |r| r.link_bytes,
            ),
        ];
        for (name, help, field) in series {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for ((job, epoch), row) in &rows {
                let _ =
                    writeln!(out, "{name}{{job_id=\"{}\",epoch=\"{epoch}\"}} {}", escape(job), field(row));
            }
        }
        self.render_step_times(out);
    }

    /// Per job and epoch, its steps' time and the part its loop waited for data (the
    /// SDK's `StepTimer`, `job_table/`): the data-wait share the alerts watch. Labelled
    /// as the other job series.
    fn render_step_times(&self, out: &mut String) {
        let mut times: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        for (_, job, epoch, wall, wait) in self.job_tables.step_times() {
            let label = match job.as_str() {
                job if self.labelled_jobs.contains(job) => (job.to_owned(), epoch.to_string()),
                _ => (OTHER_JOBS.to_owned(), String::new()),
            };
            let sums = times.entry(label).or_default();
            sums.0 += wall;
            sums.1 += wait;
        }
        let wall = "Time of a job's steps as its ranks' loops timed them";
        let wait = "Of a job's steps' time, what its loop waited for data (its slowest rank's wait per step)";
        for (name, help, waited) in [
            ("shardcache_spoke_job_step_seconds_total", wall, false),
            ("shardcache_spoke_job_data_wait_seconds_total", wait, true),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for ((job, epoch), &(wall_us, wait_us)) in &times {
                let seconds = if waited { wait_us } else { wall_us } as f64 / 1e6;
                let _ = writeln!(out, "{name}{{job_id=\"{}\",epoch=\"{epoch}\"}} {seconds}", escape(job));
            }
        }
    }
}
