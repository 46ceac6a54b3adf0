//! Fuzzing of the formats' readers on stable Rust: valid datasets written by each
//! format's reference writer (`tests/fuzz/seeds/`, made by `tests/fuzz/make_seeds.py`)
//! mutated (bits flipped, bytes and length or count fields set to extremes, files cut
//! short or extended, sections swapped, numbers in text rewritten) and read whole, index
//! and samples, through [`SampleIndex::open_listed`] over the files in memory
//! ([`Files`]): the readers' own code, no server. Each input runs under a memory budget
//! and a time limit; a failure is a panic, a hang, memory past the budget, or an
//! accepted file whose samples break what the format guarantees.
//!
//! Inputs are numbered: input `i` of a target is the same mutation on every machine
//! (`Mutator` is seeded by `i`), so a failure is reproduced by its number
//! (`fuzz-bench --target T --from I --inputs 1`).
//!
//! The mutations are in [`mutate`].
//!
//! The memory check needs the binary's allocator: a binary that runs the harness sets
//! `#[global_allocator] static ALLOC: Counting = shardcache_fuzz::counting();`.

pub mod mutate;

use std::{
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
pub use mutate::{Mutator, fix_tar_checksums};
use shardcache_client::Error;
use shardcache_formats::{Budget, Files, Format, SampleIndex};

/// The budget every input is read under.
pub const BUDGET: u64 = 64 << 20;
/// Memory an input may hold past what was held before it: the budget, plus what reading
/// files of a few KiB may take outside it (the files, their index, tokio). An allocation
/// past it aborts the run (a completed run had none).
pub const SOFT_CAP: u64 = BUDGET + (32 << 20);
/// The longest an input may run (a valid seed takes well under a millisecond).
pub const TIME_LIMIT: Duration = Duration::from_secs(20);

/// Which input runs now, and when it started (ms since the watchdog started; 0: none).
static INPUT: AtomicU64 = AtomicU64::new(u64::MAX);
static STARTED_MS: AtomicU64 = AtomicU64::new(0);
static PANICKED: AtomicBool = AtomicBool::new(false);
static UPSTREAM: AtomicBool = AtomicBool::new(false);
/// The target's name, for the watchdog's message.
static TARGET_NAME: Mutex<&'static str> = Mutex::new("");

/// The allocator a binary running the harness must use: it counts the bytes held, and
/// refuses an allocation past the limit each input sets ([`SOFT_CAP`] past what was held
/// before it), which aborts the process ("memory allocation of N bytes failed") after
/// the harness has said which input runs.
pub type Counting = cap::Cap<std::alloc::System>;

/// The allocator for `#[global_allocator]`: no limit until an input sets one.
pub const fn counting() -> Counting {
    cap::Cap::new(std::alloc::System, usize::MAX)
}

/// One format's seeds and how they are read.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: &'static str,
    /// The folder of `tests/fuzz/seeds/` with the dataset.
    pub seeds: &'static str,
    pub format: Format,
    /// Whether a file can be damaged at all (raw tokens: any bytes are tokens).
    pub structured: bool,
}

/// Every format, each compression, the GPT packing.
pub fn targets() -> Vec<Target> {
    let t = |name, seeds, format| Target { name, seeds, format, structured: name != "raw-tokens" };
    vec![
        t("npy", "tokens", Format::Tokens { seq_len: 16, dtype: None }),
        t("raw-tokens", "raw", Format::Tokens { seq_len: 16, dtype: Some("uint16".into()) }),
        t("megatron", "megatron", Format::Megatron),
        t("megatron-gpt", "megatron", Format::MegatronGpt { seq_len: 8, seed: 1234, num_samples: Some(40) }),
        t("mds", "mds", Format::Mds),
        t("mds-zstd", "mds-zstd", Format::Mds),
        t("mds-gz", "mds-gz", Format::Mds),
        t("mds-snappy", "mds-snappy", Format::Mds),
        t("webdataset", "wds", Format::WebDataset),
        t("webdataset-gnu", "wds-gnu", Format::WebDataset),
        t("parquet", "parquet", Format::Parquet),
    ]
}

/// `tests/fuzz/seeds` of the checkout under test: cargo sets `CARGO_MANIFEST_DIR` when it
/// runs a test or `cargo run`, and that is the checkout's own; otherwise the compile-time
/// value, where the binary was built, which a target directory reused by a clone
/// elsewhere keeps (cargo does not rebuild a moved checkout: pass the folder then).
pub fn seeds_dir() -> std::path::PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR");
    std::path::PathBuf::from(dir.unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())).join("seeds")
}

/// The seed files of `target` under `root` ([`seeds_dir`]), by name.
pub fn seeds(root: &Path, target: &Target) -> std::io::Result<Vec<(String, Bytes)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(root.join(target.seeds))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        files.push((name, Bytes::from(std::fs::read(entry.path())?)));
    }
    files.sort();
    Ok(files)
}

/// What an input did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Read whole: this many samples.
    Read(u64),
    /// Refused with a clear error (its gRPC code class).
    Refused(&'static str),
}

/// A failure: which input, and what went wrong.
#[derive(Debug, Clone)]
pub struct Failure {
    pub target: &'static str,
    pub input: u64,
    pub what: String,
}

/// Counts of a run.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub inputs: u64,
    pub read: u64,
    pub refused: u64,
    /// The most one input held past what was held before it, seen after its index was
    /// read and after each batch of samples (its values in hand).
    pub peak: u64,
    pub failures: Vec<Failure>,
    /// Inputs on which the parquet crate panicked (caught and refused by the reader).
    pub upstream: Vec<u64>,
    /// Inputs read whole (what a differential run compares with the reference readers).
    pub accepted: Vec<u64>,
    /// The longest one input took, and which.
    pub slowest: (Duration, u64),
    pub elapsed: Duration,
}

/// `target`'s seeds read as they are: what the format's reference writer wrote must be
/// read whole (else the harness would fuzz a reader that refuses everything).
pub fn read_seeds(target: &Target, seeds: &[(String, Bytes)]) -> Result<Outcome, String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(read(target, seeds, &|| {}))
}

/// How long reading `files` as `target`'s format takes: the median of `times` reads
/// (one read of a few KiB is noise beside the scheduler). With the seeds: what a valid
/// file of about an input's size costs, beside which the slowest input is put.
pub fn read_time(target: &Target, files: &[(String, Bytes)], times: usize) -> Duration {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let mut took: Vec<Duration> = (0..times.max(1))
        .map(|_| {
            let began = Instant::now();
            let _ = runtime.block_on(read(target, files, &|| {}));
            began.elapsed()
        })
        .collect();
    took.sort();
    took[took.len() / 2]
}

/// Inputs `from..from + inputs` of `target` (number `n` of [`targets`]).
pub fn run(
    alloc: &Counting,
    n: usize,
    target: &Target,
    seeds: &[(String, Bytes)],
    from: u64,
    inputs: u64,
) -> Tally {
    watchdog();
    *TARGET_NAME.lock().unwrap_or_else(|p| p.into_inner()) = target.name;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    eprintln!(
        "fuzz: {} inputs {from}..{} (an abort names the input, or is within them)",
        target.name,
        from + inputs
    );
    let mut tally = Tally::default();
    let started = Instant::now();
    for input in from..from + inputs {
        let files = Mutator::new(n as u64, input).mutate(seeds);
        let baseline = alloc.allocated();
        let _ = alloc.set_limit(baseline.saturating_add(SOFT_CAP as usize));
        INPUT.store(input, Ordering::Relaxed);
        STARTED_MS.store(now_ms(), Ordering::Relaxed);
        PANICKED.store(false, Ordering::Relaxed);
        UPSTREAM.store(false, Ordering::Relaxed);
        let seen = AtomicU64::new(0);
        let checkpoint = || {
            let held = alloc.allocated().saturating_sub(baseline) as u64;
            seen.fetch_max(held, Ordering::Relaxed);
        };
        let began = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(read(target, &files, &checkpoint))
        }));
        tally.slowest = tally.slowest.max((began.elapsed(), input));
        STARTED_MS.store(0, Ordering::Relaxed);
        tally.peak = tally.peak.max(seen.load(Ordering::Relaxed));
        let _ = alloc.set_limit(usize::MAX);
        tally.inputs += 1;
        if UPSTREAM.load(Ordering::Relaxed) {
            tally.upstream.push(input);
        }
        let fail = |what: String| Failure { target: target.name, input, what };
        match outcome {
            Err(_) => tally.failures.push(fail("a panic".into())),
            Ok(_) if PANICKED.load(Ordering::Relaxed) => {
                tally.failures.push(fail("a panic in a task".into()))
            }
            Ok(Err(what)) => tally.failures.push(fail(what)),
            Ok(Ok(Outcome::Read(_))) => {
                tally.read += 1;
                tally.accepted.push(input);
            }
            Ok(Ok(Outcome::Refused(_))) => tally.refused += 1,
        }
    }
    INPUT.store(u64::MAX, Ordering::Relaxed);
    tally.elapsed = started.elapsed();
    tally
}

/// The hub's parsers of what clients and dataset folders give it: dataset and shard
/// names (a page token is a shard name), job names, a dataset's metadata file. Inputs
/// `from..from + inputs`, mutated from a few valid ones; a failure is a panic, or a name
/// accepted that could leave its dataset.
pub fn run_hub(from: u64, inputs: u64) -> Tally {
    use shardcache_proto::names::{DatasetName, ShardName};
    watchdog();
    *TARGET_NAME.lock().unwrap_or_else(|p| p.into_inner()) = "hub-names";
    let seeds: Vec<(String, Bytes)> = [
        "imagenet",
        "train/shard-00001.tar",
        "a/b/c/part-0.parquet",
        "job-7/rank0/worker3",
        "{\"record_size\": 16384}",
        "{\"record_size\": 4096, \"note\": [1, 2, {\"x\": null}]}",
        "über/データ.npy",
    ]
    .iter()
    .map(|s| (String::new(), Bytes::from_static(s.as_bytes())))
    .collect();
    let mut tally = Tally::default();
    let started = Instant::now();
    for input in from..from + inputs {
        let mut mutator = Mutator::new(u64::MAX, input);
        let pick = mutator.below(seeds.len() as u64) as usize;
        let raw = mutator.mutate(&seeds[pick..pick + 1]).remove(0).1;
        let text = String::from_utf8_lossy(&raw);
        INPUT.store(input, Ordering::Relaxed);
        STARTED_MS.store(now_ms(), Ordering::Relaxed);
        let checked = std::panic::catch_unwind(|| {
            let escapes = |name: &str| {
                name.starts_with('/')
                    || name.split('/').any(|c| c == ".." || c == "." || c.is_empty())
                    || name.contains('\0')
            };
            let shard = ShardName::new(&text).map(|n| n.as_str().to_owned());
            let dataset = DatasetName::new(&text).map(|n| n.as_str().to_owned());
            let _ = shardcache_proto::job_headers::check_job_name(&text);
            let _ = hub_server::source::parse_record_size(&raw);
            match (shard, dataset) {
                (Ok(name), _) | (_, Ok(name)) if escapes(&name) => Err(format!("{name:?} accepted")),
                (Ok(_), _) | (_, Ok(_)) => Ok(true),
                _ => Ok(false),
            }
        });
        STARTED_MS.store(0, Ordering::Relaxed);
        tally.inputs += 1;
        let fail = |what: String| Failure { target: "hub-names", input, what };
        match checked {
            Err(_) => tally.failures.push(fail("a panic".into())),
            Ok(Err(what)) => tally.failures.push(fail(what)),
            Ok(Ok(true)) => tally.read += 1,
            Ok(Ok(false)) => tally.refused += 1,
        }
    }
    tally.elapsed = started.elapsed();
    tally
}

/// Samples read of an index at most (spread over it): a damaged count the budget
/// allows may claim millions, and reading each is time, not coverage.
const READ_AT_MOST: u64 = 512;

/// Reads `files` as `target`'s format: the index, then samples in batches, decoded where
/// the format has columns. `Err`: a failure of the reader (not of the file).
async fn read(
    target: &Target,
    files: &[(String, Bytes)],
    checkpoint: &(dyn Fn() + Sync),
) -> Result<Outcome, String> {
    let files = Files::new(files.iter().cloned());
    let listed = files.listing();
    let index =
        match SampleIndex::open_listed(&files, "fuzz", &listed, &target.format, Budget::new(BUDGET)).await {
            Ok(index) => index,
            Err(e) => return refused(e),
        };
    checkpoint();
    let mut samples: Vec<(usize, u64)> = Vec::new();
    let total = index.len();
    let step = total.div_ceil(READ_AT_MOST).max(1);
    let mut seen = 0u64;
    for (shard, count) in index.counts().into_iter().enumerate() {
        let mut k = (step - seen % step) % step;
        while k < count {
            samples.push((shard, k));
            k += step;
        }
        seen += count;
    }
    for batch in samples.chunks(64) {
        let result = match &target.format {
            Format::Mds | Format::Parquet => index.read_decoded(&files, batch).await.map(|rows| {
                // Every row has every column.
                let columns = index.columns().map_or(0, <[_]>::len);
                rows.iter().all(|r| r.len() == columns)
            }),
            Format::WebDataset => index.read_pieces(&files, batch).await.map(|pieces| {
                batch
                    .iter()
                    .zip(&pieces)
                    .all(|(&(s, k), p)| index.fields(s, k).is_some_and(|(_, f)| f.len() == p.len()))
            }),
            format => index.read(&files, batch).await.map(|data| {
                // Windows (and GPT samples) of seq_len + 1 values; sequences of whole values.
                let item = index.dtype().and_then(shardcache_formats::tokens::item_size).unwrap_or(1);
                match format {
                    Format::Tokens { seq_len, .. } | Format::MegatronGpt { seq_len, .. } => {
                        data.iter().all(|d| d.len() as u64 == (seq_len + 1) * item)
                    }
                    _ => data.iter().all(|d| (d.len() as u64).is_multiple_of(item)),
                }
            }),
        };
        checkpoint();
        match result {
            Ok(true) => {}
            Ok(false) => return Err(format!("samples of {batch:?} not of the shape the format guarantees")),
            Err(e) => return refused(e),
        }
    }
    Ok(Outcome::Read(total))
}

/// A reader's error: a refusal when it is one a person can act on, a failure otherwise
/// (a read past a file's end, which [`Files`] answers as a server's OUT_OF_RANGE, means a
/// reader believed an offset it had not checked).
fn refused(e: Error) -> Result<Outcome, String> {
    match &e {
        Error::Damaged { file, .. } if !file.is_empty() => Ok(Outcome::Refused("INVALID_ARGUMENT")),
        Error::OverBudget { .. } => Ok(Outcome::Refused("RESOURCE_EXHAUSTED")),
        // Not a refusal: a sample the index has that the reader cannot find (the harness
        // asks only for samples below each shard's count).
        Error::Config(message) if message.starts_with("no sample ") => {
            Err(format!("an index that lost a sample: {e}"))
        }
        Error::Config(message) if !message.contains("a bug") => Ok(Outcome::Refused("INVALID_ARGUMENT")),
        _ => Err(format!("an error that is not a refusal: {e}")),
    }
}

fn now_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Starts (once) the thread that aborts the process when an input runs past
/// [`TIME_LIMIT`], naming it, and the panic hook that marks a panic in any thread.
fn watchdog() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        now_ms();
        let previous = Arc::new(Mutex::new(Some(std::panic::take_hook())));
        std::panic::set_hook(Box::new(move |info| {
            // Inside an input a panic is counted (and quiet: a million inputs); outside,
            // a test's own assertion, printed as usual.
            let inside = STARTED_MS.load(Ordering::Relaxed) != 0;
            if !inside {
                if let Some(hook) = previous.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    hook(info);
                }
                return;
            }
            // The parquet crate's own panics are caught where it is called (parquet.rs)
            // and refused as damaged row groups: counted apart, an upstream bug.
            let upstream = info.location().is_some_and(|l| l.file().contains("/parquet-"));
            match upstream {
                true => UPSTREAM.store(true, Ordering::Relaxed),
                false => PANICKED.store(true, Ordering::Relaxed),
            }
            if std::env::var_os("FUZZ_VERBOSE").is_some() {
                // Not the default hook: its backtrace takes more memory than an input may.
                eprintln!("fuzz: {info}");
            }
        }));
        std::thread::spawn(|| {
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let started = STARTED_MS.load(Ordering::Relaxed);
                if started != 0 && now_ms().saturating_sub(started) > TIME_LIMIT.as_millis() as u64 {
                    let target = *TARGET_NAME.lock().unwrap_or_else(|p| p.into_inner());
                    let input = INPUT.load(Ordering::Relaxed);
                    eprintln!("fuzz: {target} input {input} ran past {TIME_LIMIT:?} (a hang); aborting");
                    std::process::abort();
                }
            }
        });
    });
}
