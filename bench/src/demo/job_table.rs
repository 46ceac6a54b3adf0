//! The table the spoke keeps for the demo's job (issue 49), beside the demo's own: each
//! rank of the simulated trainer times its batches with the Rust SDK's `StepTimer` (the
//! loop asks for its batch at the step's start and has it when its loader hands it
//! over), the spoke folds them into phases, and after the setup's epochs the demo asks
//! for the job's table (`CacheClient::job_report`) and prints, phase by phase, the GPU
//! utilisation it computed itself (the ground truth: it sleeps the compute) beside the
//! one the spoke reports.

use shardcache_client::{CacheClient, StepTimer, report};

use super::report::PhaseRow;

/// A setup's job on a spoke, and its ranks' timers.
#[derive(Debug)]
pub struct JobTiming {
    pub control: CacheClient,
    pub job: String,
    pub timers: Vec<StepTimer>,
}

impl JobTiming {
    /// Timers for `ranks` ranks of `job` reporting to `control`'s spoke.
    pub fn new(control: CacheClient, job: &str, ranks: usize) -> Self {
        let timers =
            (0..ranks).map(|r| StepTimer::new(control.clone(), job, r as u32, ranks as u32)).collect();
        Self { control, job: job.to_owned(), timers }
    }

    /// Sends what the timers hold and waits (bounded) for the spoke to have folded
    /// `steps` steps; returns the job's table.
    pub async fn table(mut self, steps: u64) -> anyhow::Result<shardcache_proto::v1::JobReport> {
        for timer in &mut self.timers {
            timer.flush();
        }
        drop(self.timers); // the batches they held are sent
        let mut last = None;
        for _ in 0..600 {
            let table = self.control.job_report(&self.job, "").await?;
            if table.phases.iter().map(|p| p.steps).sum::<u64>() >= steps {
                return Ok(table);
            }
            last = Some(table);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        anyhow::bail!("the spoke's table of {} never had {steps} steps: {last:?}", self.job)
    }
}

/// The demo's phase name for the spoke's (`epoch 2` is the demo's warm epoch).
fn demo_phase(name: &str) -> String {
    match name {
        "epoch 2" => "epoch 2 (warm)".to_owned(),
        other => other.to_owned(),
    }
}

/// One phase: the demo's GPU utilisation and samples/s beside the spoke's.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Compared {
    pub setup: String,
    pub phase: String,
    pub demo_gpu_util_pct: f64,
    pub spoke_gpu_util_pct: f64,
    pub demo_samples_per_s: f64,
    pub spoke_samples_per_s: f64,
    pub spoke_from_store_pct: f64,
    pub spoke_read_p99_ms: f64,
    pub spoke_slowest_rank: Option<u32>,
}

/// The spoke's rows of `table` matched to the demo's `rows` of `setup`.
pub fn compare(setup: &str, rows: &[PhaseRow], table: &shardcache_proto::v1::JobReport) -> Vec<Compared> {
    table
        .phases
        .iter()
        .filter(|p| p.steps > 0)
        .filter_map(|phase| {
            let spoke = report::row(phase);
            let demo = rows.iter().find(|r| r.setup == setup && r.phase == demo_phase(&phase.name))?;
            Some(Compared {
                setup: setup.to_owned(),
                phase: demo.phase.clone(),
                demo_gpu_util_pct: demo.gpu_util_pct,
                spoke_gpu_util_pct: spoke.gpu_util_pct,
                demo_samples_per_s: demo.samples_per_s,
                spoke_samples_per_s: spoke.samples_per_s,
                spoke_from_store_pct: spoke.from_store_pct,
                spoke_read_p99_ms: spoke.read_p99_ms,
                spoke_slowest_rank: spoke.slowest_rank.map(|(rank, _)| rank),
            })
        })
        .collect()
}

/// Per epoch (the small-cache setups' rows, `(epoch from 1, GPU util %, samples/s)`),
/// the spoke's rows of `table` summed over each epoch's phases, beside the demo's.
pub fn compare_epochs(
    setup: &str,
    rows: &[(u64, f64, f64)],
    table: &shardcache_proto::v1::JobReport,
) -> Vec<Compared> {
    let mut out = Vec::new();
    for &(epoch, demo_gpu, demo_rate) in rows {
        let mut whole = shardcache_proto::v1::JobPhase::default();
        for phase in table.phases.iter().filter(|p| p.epoch + 1 == epoch && p.steps > 0) {
            whole.steps += phase.steps;
            whole.wall_us += phase.wall_us;
            whole.wait_us += phase.wait_us;
            whole.samples += phase.samples;
            whole.add_reads(phase);
        }
        if whole.steps == 0 {
            continue;
        }
        let spoke = report::row(&whole);
        out.push(Compared {
            setup: setup.to_owned(),
            phase: format!("epoch {epoch}"),
            demo_gpu_util_pct: demo_gpu,
            spoke_gpu_util_pct: spoke.gpu_util_pct,
            demo_samples_per_s: demo_rate,
            spoke_samples_per_s: spoke.samples_per_s,
            spoke_from_store_pct: spoke.from_store_pct,
            spoke_read_p99_ms: spoke.read_p99_ms,
            spoke_slowest_rank: None,
        });
    }
    out
}

/// The comparison as markdown.
pub fn markdown(compared: &[Compared]) -> String {
    let mut out = String::from(
        "| setup | phase | GPU util (demo) | GPU util (spoke's table) | difference | samples/s (demo / spoke) | \
         reads from store (spoke) | read p99 (spoke) | slowest rank |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in compared {
        out += &format!(
            "| {} | {} | {:.1}% | {:.1}% | {:+.1} | {:.0} / {:.0} | {:.1}% | {:.2} ms | {} |\n",
            c.setup,
            c.phase,
            c.demo_gpu_util_pct,
            c.spoke_gpu_util_pct,
            c.spoke_gpu_util_pct - c.demo_gpu_util_pct,
            c.demo_samples_per_s,
            c.spoke_samples_per_s,
            c.spoke_from_store_pct,
            c.spoke_read_p99_ms,
            c.spoke_slowest_rank.map_or("-".to_owned(), |r| r.to_string())
        );
    }
    out
}
