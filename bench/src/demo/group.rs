//! The demo's group setups: two trainer nodes (the 16 ranks' batches alternate between
//! them) across the 60 ms link, either with a spoke each (today: each fetches the whole
//! dataset) or through a group of three spokes (`--peers`: each shard fetched once, by
//! its owner), and the group again with one member killed halfway through epoch 1 and
//! restarted on its cache before epoch 2 (its reads fail over to the next member). Two
//! epochs; per epoch the bytes that crossed the link (the emulator's count, read once no
//! live spoke has a fetch in flight and the link is still), the epoch's wall time and GPU
//! utilisation. An epoch with a failed read fails the demo. The ranks time their batches
//! (`StepTimer`, reporting to every spoke of the setup), and the job's table gathered from
//! the spokes is printed beside each setup's rows (`job_table`).

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use futures::FutureExt;
use shardcache_client::{CacheClient, Client};
use shardcache_tests::{ProxyProcess, SpokeProcess, free_loopback_addr, wire};

use super::{
    Workload,
    job_table::{self, Compared, JobTiming},
    readers,
    report::phase_row,
    trainer::{ReadBatch, epoch_order, run_epoch_timed},
};

/// The job the group setups' ranks report their steps as.
const JOB: &str = "demo-group";

/// One epoch of one group setup.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupRow {
    pub setup: String,
    pub epoch: u64,
    /// Bytes that crossed the link (the emulator's count), per byte of the dataset.
    pub link_bytes_per_dataset: f64,
    /// The share of the dataset's shards the killed member owned (what its death may
    /// cost again over the link: rendezvous hashing gives a member about a third of a
    /// few shards, not exactly); 0 where no member is killed.
    pub killed_share: f64,
    pub wall_s: f64,
    pub gpu_util_pct: f64,
    pub samples_per_s: f64,
}

/// What the setups share: the hub across the link (the WAN emulator, which counts what
/// crosses it), where the spokes keep their caches, and the job.
#[derive(Debug)]
pub struct Groups<'a> {
    pub link: &'a ProxyProcess,
    pub work: &'a std::path::Path,
    pub job: Workload<'a>,
}

/// How a setup's spokes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spokes {
    /// A spoke per node.
    Each,
    /// One group of three.
    Group,
    /// One group of three; one member killed halfway through epoch 1, restarted after.
    GroupLosingOne,
}

/// The spokes of a setup, and how to start each again.
struct Started {
    spokes: Vec<Option<SpokeProcess>>,
    addrs: Vec<String>,
    dirs: Vec<PathBuf>,
    args: Vec<Vec<String>>,
}

impl Groups<'_> {
    /// The spokes: a spoke per node (two), or one group of three every node reads
    /// through; with the endpoint each node uses.
    fn start(&self, grouped: bool) -> anyhow::Result<(Vec<String>, Started)> {
        let members = if grouped { 3 } else { 2 };
        let addrs: Vec<String> = (0..members).map(|_| free_loopback_addr()).collect();
        let urls: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
        let peers = urls.join(",");
        let mut started = Started { spokes: Vec::new(), addrs, dirs: Vec::new(), args: Vec::new() };
        for (i, url) in urls.iter().enumerate() {
            started.dirs.push(tempfile::tempdir_in(self.work)?.keep());
            let args = if grouped {
                vec!["--peers".to_owned(), peers.clone(), "--peer-self".to_owned(), url.clone()]
            } else {
                Vec::new()
            };
            started.args.push(args);
            started.spokes.push(Some(started.member(&self.link.endpoint, i)));
        }
        let endpoints = if grouped { vec![peers.clone(), peers] } else { urls };
        Ok((endpoints, started))
    }

    /// The ranks' batches, alternating between the two nodes' clients, tagged with the
    /// job and `epoch`.
    fn read(clients: &[Client], job: &Workload<'_>, epoch: u64) -> anyhow::Result<ReadBatch> {
        let nodes = clients
            .iter()
            .map(|client| {
                let client = client.for_job(JOB, epoch)?;
                Ok(readers::grpc(client, job.dataset, job.names.clone(), job.sample_bytes))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let turn = Arc::new(AtomicUsize::new(0));
        Ok(Arc::new(move |batch| {
            let node = &nodes[turn.fetch_add(1, Relaxed) % nodes.len()];
            node(batch)
        }))
    }

    /// Runs two epochs; returns each epoch's row, and the spokes' table of the job beside.
    pub async fn run(&self, setup: &str, spokes: Spokes) -> anyhow::Result<(Vec<GroupRow>, Vec<Compared>)> {
        let (endpoints, started) = self.start(spokes != Spokes::Each)?;
        let every_spoke = started.addrs.iter().map(|a| format!("http://{a}")).collect::<Vec<_>>().join(",");
        let started = Arc::new(Mutex::new(started));
        let mut clients = Vec::new();
        for endpoint in &endpoints {
            clients.push(Client::connect(endpoint).await?);
        }
        // Each rank reports its steps to every spoke of the setup; the table is theirs
        // gathered (`CacheClient::job_report` merges the members').
        let mut timing = JobTiming::new(CacheClient::connect(&every_spoke).await?, JOB, self.job.shape.ranks);
        let mut timers = std::mem::take(&mut timing.timers);
        let mut all_steps = 0;
        let dataset_bytes =
            u64::from(self.job.layout.shards) * self.job.layout.samples_per_shard * self.job.sample_bytes;
        let global = self.job.shape.ranks * self.job.shape.batch_per_rank;
        let mut rows = Vec::new();
        let killed_share = if spokes == Spokes::GroupLosingOne {
            let member = format!("http://{}", started.lock().unwrap_or_else(|p| p.into_inner()).addrs[1]);
            self.share_of(&clients[0], &member)
        } else {
            0.0
        };
        let mut sent_before = self.settled_link(&started).await?;
        for epoch in 0..2 {
            let order = epoch_order(self.job.layout, self.job.block_shards, 21 + epoch);
            // Member 1 is killed (no graceful end) halfway through epoch 1.
            let halfway = self.job.shape.steps_over(&order) / 2;
            let losing = spokes == Spokes::GroupLosingOne && epoch == 0;
            let on_step = |step: usize| {
                if losing && step == halfway {
                    let mut started = started.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(spoke) = started.spokes[1].take() {
                        spoke.kill();
                        println!("   (member 1 killed after step {step})");
                    }
                }
                async {}.boxed()
            };
            let read = Self::read(&clients, &self.job, epoch)?;
            timers.iter_mut().for_each(|t| t.start_epoch(epoch));
            let started_at = Instant::now();
            let run =
                run_epoch_timed(&order, self.job.shape, read, Duration::ZERO, on_step, &mut timers).await?;
            all_steps += run.steps.len();
            let wall = started_at.elapsed().as_secs_f64();
            let sent = self.settled_link(&started).await?;
            let row = phase_row(setup, "", &run.steps, &[], global, None);
            rows.push(GroupRow {
                setup: setup.to_owned(),
                epoch: epoch + 1,
                link_bytes_per_dataset: (sent - sent_before) as f64 / dataset_bytes as f64,
                killed_share,
                wall_s: wall,
                gpu_util_pct: row.gpu_util_pct,
                samples_per_s: row.samples_per_s,
            });
            sent_before = sent;
            if losing {
                // Back on its address and cache, before the next epoch; the nodes see it
                // serving again by their health checks (every 500 ms).
                let (restarted, others) = {
                    let mut started = started.lock().unwrap_or_else(|p| p.into_inner());
                    let member = started.member(&self.link.endpoint, 1);
                    started.spokes[1] = Some(member);
                    let others: Vec<String> =
                        started.spokes.iter().flatten().map(|s| s.endpoint.clone()).collect();
                    (format!("http://{}", started.addrs[1]), others)
                };
                seen_serving(&clients, &restarted).await?;
                members_see_serving(&others, &restarted).await?;
            }
        }
        timing.timers = timers;
        let table = timing.table(all_steps as u64).await?;
        let demo: Vec<_> = rows.iter().map(|r| (r.epoch, r.gpu_util_pct, r.samples_per_s)).collect();
        Ok((rows, job_table::compare_epochs(setup, &demo, &table)))
    }

    /// The share of the dataset's shards `member` owns, as `client` routes them.
    fn share_of(&self, client: &Client, member: &str) -> f64 {
        let owned = self.job.names.iter().filter(|n| client.owners(self.job.dataset, n)[0] == member).count();
        owned as f64 / self.job.names.len().max(1) as f64
    }

    /// The bytes the link delivered so far, once it is still and no live spoke of the
    /// setup has a fetch in flight (whole-shard fetches may run after the last read).
    async fn settled_link(&self, started: &Mutex<Started>) -> anyhow::Result<u64> {
        let live: Vec<String> = {
            let started = started.lock().unwrap_or_else(|p| p.into_inner());
            started.spokes.iter().flatten().map(|s| s.endpoint.clone()).collect()
        };
        let mut controls = Vec::new();
        for endpoint in &live {
            controls.push(CacheClient::connect(endpoint).await?);
        }
        let controls = &controls;
        let count = wire::settled(self.link, move || async move {
            for control in controls {
                if control.status().await.map_or(true, |s| s.fetches_in_flight > 0) {
                    return false;
                }
            }
            true
        })
        .await;
        Ok(count.to_client)
    }
}

impl Started {
    /// Starts member `i` (again) on its address and cache.
    fn member(&self, hub: &str, i: usize) -> SpokeProcess {
        let args: Vec<&str> = self.args[i].iter().map(String::as_str).collect();
        SpokeProcess::start_at(hub, &self.dirs[i], &self.addrs[i], &args)
    }
}

/// The group table.
pub fn markdown(rows: &[GroupRow]) -> String {
    let mut out = String::from(
        "| setup | epoch | link bytes / dataset | epoch wall time | GPU util | samples/s |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out += &format!(
            "| {} | {} | {:.2} | {:.1} s | {:.1}% | {:.0} |\n",
            r.setup, r.epoch, r.link_bytes_per_dataset, r.wall_s, r.gpu_util_pct, r.samples_per_s
        );
    }
    out
}

/// Waits (30 s at most) for the members at `members` to see each other serving,
/// `restarted` again by their probes of failed members (every 500 ms): until then one of
/// them that a node's hedge asks for a shard `restarted` owns takes it for down and
/// fetches it over the link (`Chain::join_owner`).
async fn members_see_serving(members: &[String], restarted: &str) -> anyhow::Result<()> {
    let mut controls = Vec::new();
    for member in members {
        controls.push(CacheClient::connect(member).await?);
    }
    let mut states = Vec::new();
    for _ in 0..300 {
        states.clear();
        for control in &controls {
            let status = control.status().await?;
            states.extend(status.members.into_iter().map(|m| (m.seen_by, m.url, m.state)));
        }
        if states.iter().all(|(.., state)| state == "serving" || state == "self") {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!(
        "the members did not see each other serving within 30 s ({restarted} restarted): {states:?}"
    )
}

/// Waits (30 s at most) for every node's client to see `restarted` serving again by its
/// health checks. (Only it is waited for: a member still up that lost three hedge races in
/// a row on a busy machine stays on probation until a read finds it answering first, and
/// no read is made here.)
async fn seen_serving(clients: &[Client], restarted: &str) -> anyhow::Result<()> {
    let back = || clients.iter().all(|c| !c.failing_members().iter().any(|m| m == restarted));
    for _ in 0..300 {
        if back() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!(
        "the nodes did not see the restarted member {restarted} serving within 30 s: failing {:?}",
        clients.iter().map(Client::failing_members).collect::<Vec<_>>()
    )
}
