//! [`StepTimer`]: how long a training loop waits on data, measured where it waits, and
//! sent to the spoke for the job's own table (`shardcache report JOB`).
//!
//! The loop says when it asks for its next batch ([`StepTimer::waiting`]) and when it
//! has it ([`StepTimer::arrived`]); the time between is the batch's data wait, the time
//! from having it to asking for the next is the step's work (the GPU's, in a trainer).
//! Batches are sent a second's worth at a time ([`SEND_EVERY`]) by a task of their own,
//! never on the loop's path: a spoke that is slow to answer or gone costs the loop
//! nothing (reports past [`QUEUED_REPORTS`] waiting to be sent are dropped).

use std::time::{Duration, Instant};

use shardcache_proto::v1::StepReport;
use tokio::sync::mpsc;

use crate::CacheClient;

/// How often a timer sends what it measured.
pub const SEND_EVERY: Duration = Duration::from_secs(1);
/// Reports waiting to be sent before more are dropped.
pub const QUEUED_REPORTS: usize = 16;

/// Times one rank's batches of a job (see the module).
#[derive(Debug)]
pub struct StepTimer {
    report: StepReport,
    /// When the loop asked for the batch it waits for.
    asked: Option<Instant>,
    /// The batch the loop has: when it came, its wait and samples (its work runs until
    /// the next ask).
    arrived: Option<(Instant, u32, u32)>,
    sent: Instant,
    to_send: mpsc::Sender<StepReport>,
}

/// Milliseconds since the Unix epoch, now.
fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn micros(d: Duration) -> u32 {
    d.as_micros().min(u128::from(u32::MAX)) as u32
}

impl StepTimer {
    /// A timer of rank `rank` of `ranks` of `job` (its reads' `job=`), reporting to
    /// `control`'s spoke (every member of a group). Call within a tokio runtime: the
    /// sending runs on it.
    pub fn new(control: CacheClient, job: &str, rank: u32, ranks: u32) -> Self {
        let (to_send, mut queue) = mpsc::channel::<StepReport>(QUEUED_REPORTS);
        tokio::spawn(async move {
            while let Some(report) = queue.recv().await {
                if let Err(e) = control.report_steps(report).await {
                    tracing::debug!(error = %e, "a step report was not taken");
                }
            }
        });
        let report = StepReport { job: job.to_owned(), rank, ranks, ..Default::default() };
        Self { report, asked: None, arrived: None, sent: Instant::now(), to_send }
    }

    /// Epoch `epoch` begins (its first batch is batch 0): what was measured of the last
    /// is sent.
    pub fn start_epoch(&mut self, epoch: u64) {
        self.close_batch(Instant::now());
        self.send();
        self.report.epoch = epoch;
        self.report.first_batch = 0;
    }

    /// The loop asks for its next batch.
    pub fn waiting(&mut self) {
        let now = Instant::now();
        self.close_batch(now);
        self.asked = Some(now);
        if self.sent.elapsed() >= SEND_EVERY {
            self.send();
        }
    }

    /// The loop has its batch, of `samples` samples.
    pub fn arrived(&mut self, samples: u32) {
        let now = Instant::now();
        if self.report.wait_us.is_empty() && self.arrived.is_none() {
            // The report's first batch: when the loop asked for it, by the wall clock.
            let asked = self.asked.map_or(Duration::ZERO, |asked| now - asked);
            self.report.started_ms = now_ms().saturating_sub(asked.as_millis() as u64);
        }
        let wait = self.asked.take().map_or(0, |asked| micros(now - asked));
        self.arrived = Some((now, wait, samples));
    }

    /// Sends what was measured now (the batch the loop holds stays open).
    pub fn flush(&mut self) {
        self.send();
    }

    /// The batch the loop held is done: its work ran until `now`.
    fn close_batch(&mut self, now: Instant) {
        if let Some((at, wait, samples)) = self.arrived.take() {
            self.report.wait_us.push(wait);
            self.report.busy_us.push(micros(now - at));
            self.report.samples.push(samples);
        }
    }

    fn send(&mut self) {
        self.sent = Instant::now();
        if self.report.wait_us.is_empty() {
            return;
        }
        let next = StepReport {
            first_batch: self.report.first_batch + self.report.wait_us.len() as u64,
            wait_us: Vec::new(),
            busy_us: Vec::new(),
            samples: Vec::new(),
            started_ms: 0,
            ..self.report.clone()
        };
        let report = std::mem::replace(&mut self.report, next);
        if self.to_send.try_send(report).is_err() {
            tracing::debug!("step reports are not being taken as fast as made; one dropped");
        }
    }
}

impl Drop for StepTimer {
    /// The last batch ends with the loop: it is sent.
    fn drop(&mut self) {
        self.close_batch(Instant::now());
        self.send();
    }
}

/// An iterator of batches timed by a [`StepTimer`]: each `next` is the loop asking for a
/// batch, its return the batch arriving. `samples` counts a batch's samples.
#[derive(Debug)]
pub struct Timed<I, F> {
    inner: I,
    timer: StepTimer,
    samples: F,
}

impl<I, F> Timed<I, F> {
    pub fn new(inner: I, timer: StepTimer, samples: F) -> Self {
        Self { inner, timer, samples }
    }

    pub fn timer(&mut self) -> &mut StepTimer {
        &mut self.timer
    }
}

impl<I: Iterator, F: Fn(&I::Item) -> u32> Iterator for Timed<I, F> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        self.timer.waiting();
        let item = self.inner.next()?;
        self.timer.arrived((self.samples)(&item));
        Some(item)
    }
}
