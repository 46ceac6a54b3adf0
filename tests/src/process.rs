//! The workspace's binaries as child processes (hub, spoke, WAN emulator, mount), each
//! started on a free loopback port it reports, and killed when dropped.

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use crate::watchdog::{Watched, watch};

/// Path of a binary of this workspace, built by `cargo build --bins` (`make test` does).
pub fn binary(name: &str) -> PathBuf {
    // Tests live in target/<profile>/deps/, benchmark binaries in target/<profile>/.
    let exe = std::env::current_exe().unwrap();
    let mut dir = exe.parent().unwrap();
    if dir.ends_with("deps") {
        dir = dir.parent().unwrap();
    }
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (`make test` does)",
        path.display()
    );
    path
}

/// The workspace's root in the checkout under test, for the files tests read (README,
/// deploy/). cargo sets `CARGO_MANIFEST_DIR` when it runs a test, and that is the
/// checkout's own; the compile-time value is where the binary was built, which a target
/// directory reused by a clone elsewhere keeps (cargo does not rebuild a moved checkout).
pub fn workspace_dir() -> PathBuf {
    let tests = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from);
    tests.parent().unwrap().to_path_buf()
}

/// How long a one-shot CLI command may run in a test ([`Cli::from`]): minutes beyond
/// the slowest (a `get` of a test dataset over the emulated link takes seconds).
pub const CLI_DEADLINE: Duration = Duration::from_secs(300);

/// `command` run with no stdin to its end (`Ok`, as `Command::output`), or killed once
/// `deadline` has passed (`Err`, with what it printed until then).
pub fn output_within(command: &mut Command, deadline: Duration) -> Result<Output, Output> {
    use std::io::Read;
    let mut child =
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // Drained while it runs: a child blocked on a full pipe would never end.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let until = std::time::Instant::now() + deadline;
    let (status, ended) = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break (status, true);
        }
        if std::time::Instant::now() > until {
            let _ = child.kill();
            break (child.wait().unwrap(), false);
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let out = Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() };
    if ended { Ok(out) } else { Err(out) }
}

/// One run of the `shardcache` CLI to its end: whether it succeeded and what it printed.
/// The tests' one way to run the CLI (a command that stays up, `mount`, is
/// [`MountProcess`]).
#[derive(Debug)]
pub struct Cli {
    pub ok: bool,
    pub stdout: Vec<u8>,
    /// What it told the person (progress, reports, errors), as text.
    pub stderr: String,
}

impl Cli {
    /// `shardcache ARGS`, run to its end.
    pub fn run(args: &[&str]) -> Self {
        Self::from(Command::new(binary("shardcache")).args(args))
    }

    /// `shardcache --endpoint ENDPOINT ARGS`, run to its end.
    pub fn at(endpoint: &str, args: &[&str]) -> Self {
        Self::from(Command::new(binary("shardcache")).arg("--endpoint").arg(endpoint).args(args))
    }

    /// Runs `command` (a `shardcache` command line with its environment) to its end, with
    /// no stdin. One that has not ended after [`CLI_DEADLINE`] is killed and fails the
    /// test with its command line and what it printed: a hung CLI names itself instead of
    /// holding the test binary (and CI) until it is killed.
    pub fn from(command: &mut Command) -> Self {
        match output_within(command, CLI_DEADLINE) {
            Ok(out) => Self {
                ok: out.status.success(),
                stdout: out.stdout,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            },
            Err(out) => {
                // The program and its arguments (not the environment, which may hold a token).
                let args: Vec<_> = command.get_args().collect();
                panic!(
                    "{:?} {args:?} had not ended after {CLI_DEADLINE:?}; it printed: {}",
                    command.get_program(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }

    /// What it printed on stdout, once it succeeded (the test fails with its stderr if not).
    pub fn ok_bytes(self) -> Vec<u8> {
        assert!(self.ok, "shardcache failed: {}", self.stderr);
        self.stdout
    }

    /// [`Cli::ok_bytes`] as text.
    pub fn ok_text(self) -> String {
        String::from_utf8(self.ok_bytes()).unwrap()
    }

    /// Its stdout as text, whether or not it succeeded.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Starts `command` and waits for the line on its stdout that starts with `prefix` (a
/// server's "listening on" report); returns the child and the rest of that line. The
/// child logs warnings and up (to the caller's stderr unless the command says where),
/// or what `SHARDCACHE_CHILD_LOG` asks for (e.g. `spoke_cache=debug`, to see what a
/// bench's spokes decide); a command that sets `RUST_LOG` itself keeps it.
fn spawn_and_wait_for(mut command: Command, prefix: &str) -> (Child, String) {
    if !command.get_envs().any(|(key, _)| key == "RUST_LOG") {
        command.env("RUST_LOG", std::env::var("SHARDCACHE_CHILD_LOG").unwrap_or_else(|_| "warn".into()));
    }
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let rest = line
        .trim()
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("expected {prefix:?} on stdout, got {line:?}"))
        .to_owned();
    (child, rest)
}

/// A `shardcache mount` child process (the read-only FUSE mount); unmounted and killed
/// when dropped.
#[derive(Debug)]
pub struct MountProcess {
    pub child: Child,
    pub mountpoint: PathBuf,
    _watched: Watched,
}

impl MountProcess {
    /// Mounts `endpoint` on `mountpoint` with `extra_args`, its log (warnings and up) to
    /// `log`; returns once it is mounted.
    pub fn start(endpoint: &str, mountpoint: &Path, extra_args: &[&str], log: &Path) -> Self {
        let mut command = Command::new(binary("shardcache"));
        command.args(["mount", endpoint, mountpoint.to_str().unwrap()]).args(extra_args);
        Self::spawn(command, mountpoint, log)
    }

    /// [`MountProcess::start`] with the mount's log at `level` (`RUST_LOG`), to see what
    /// it says at `info` (which read-ahead it got).
    pub fn start_logged_with(
        endpoint: &str,
        mountpoint: &Path,
        extra_args: &[&str],
        log: &Path,
        level: &str,
    ) -> Self {
        let mut command = Command::new(binary("shardcache"));
        command
            .args(["mount", endpoint, mountpoint.to_str().unwrap()])
            .args(extra_args)
            .env("RUST_LOG", level);
        Self::spawn(command, mountpoint, log)
    }

    /// [`MountProcess::start`] as `shardcache mount MOUNTPOINT` with the endpoint in
    /// `SHARDCACHE_ENDPOINT`, as every other command takes it.
    pub fn start_from_env(endpoint: &str, mountpoint: &Path, log: &Path) -> Self {
        let mut command = Command::new(binary("shardcache"));
        command.args(["mount", mountpoint.to_str().unwrap()]).env("SHARDCACHE_ENDPOINT", endpoint);
        Self::spawn(command, mountpoint, log)
    }

    /// Runs `command` (a mount of `mountpoint`), its log to `log`, until it is mounted.
    fn spawn(mut command: Command, mountpoint: &Path, log: &Path) -> Self {
        command.stderr(std::fs::File::create(log).unwrap());
        let (child, _) = spawn_and_wait_for(command, "shardcache mounted ");
        Self { child, mountpoint: mountpoint.to_owned(), _watched: watch() }
    }

    /// Whether `path` is a mount point now (in /proc/self/mounts).
    pub fn is_mounted(path: &Path) -> bool {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        mounts.lines().any(|line| line.split(' ').nth(1) == path.to_str())
    }

    /// Why FUSE cannot be mounted here, if it cannot: the mount tests skip, saying so.
    pub fn unavailable() -> Option<String> {
        if !Path::new("/dev/fuse").exists() {
            return Some("/dev/fuse is missing (no FUSE in this kernel or container)".into());
        }
        let found = Command::new("fusermount3").arg("-V").output().is_ok_and(|o| o.status.success());
        (!found).then(|| "fusermount3 is not installed (apt-get install fuse3; make test does)".into())
    }
}

impl Drop for MountProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if Self::is_mounted(&self.mountpoint) {
            let _ = Command::new("fusermount3").arg("-uz").arg(&self.mountpoint).status();
        }
    }
}

/// A `hub-server` child process on `127.0.0.1:0`; killed when dropped.
#[derive(Debug)]
pub struct HubProcess {
    pub child: Child,
    pub endpoint: String,
    /// Where it serves metrics, when started with `--metrics-listen`.
    pub metrics_addr: Option<String>,
    _watched: Watched,
}

impl HubProcess {
    pub fn start(root: &Path, extra_args: &[&str]) -> Self {
        Self::start_logged(root, extra_args, Stdio::inherit(), "warn")
    }

    /// Starts with its log (at `level`) going to `stderr`, e.g. a file a test reads.
    pub fn start_logged(root: &Path, extra_args: &[&str], stderr: impl Into<Stdio>, level: &str) -> Self {
        Self::start_with_env(root, extra_args, &[("RUST_LOG", level)], stderr)
    }

    /// Starts with `env` added to its environment (e.g. where to export traces).
    pub fn start_with_env(
        root: &Path,
        extra_args: &[&str],
        env: &[(&str, &str)],
        stderr: impl Into<Stdio>,
    ) -> Self {
        let mut command = Command::new(binary("hub-server"));
        command.args(["--root", root.to_str().unwrap(), "--listen", "127.0.0.1:0"]).args(extra_args);
        command.envs(env.iter().copied()).stderr(stderr);
        let (child, rest) = spawn_and_wait_for(command, "hub-server listening on ");
        let scheme = if extra_args.contains(&"--tls-cert") { "https" } else { "http" };
        let mut words = rest.split_whitespace();
        let addr = words.next().unwrap_or_default().to_owned();
        let metrics_addr = words.last().filter(|_| rest.contains(" metrics on ")).map(str::to_owned);
        Self { endpoint: format!("{scheme}://{addr}"), child, metrics_addr, _watched: watch() }
    }

    /// Bytes it has served (`shardcache_hub_bytes_served_total`); it must have been
    /// started with `--metrics-listen`.
    pub async fn bytes_served(&self) -> u64 {
        self.counter("shardcache_hub_bytes_served_total").await
    }

    /// What its data messages took as sent (`shardcache_hub_bytes_sent_total`: less than
    /// served where compressed); it must have been started with `--metrics-listen`.
    pub async fn bytes_sent(&self) -> u64 {
        self.counter("shardcache_hub_bytes_sent_total").await
    }

    /// The value of the unlabelled counter `name` on its metrics page.
    async fn counter(&self, name: &str) -> u64 {
        let addr = self.metrics_addr.as_deref().expect("the hub was started with --metrics-listen");
        let page = crate::scrape_metrics(addr).await.unwrap();
        page.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} on the hub's metrics page")) as u64
    }
}

impl Drop for HubProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `wan-proxy` child process on `127.0.0.1:0` in front of `upstream`; killed when
/// dropped. `link_args` are its link flags, e.g. `["--rtt", "60ms", "--rate", "2Gbit"]`.
/// It counts what crosses it (`--counters-file`): [`crate::wire`] reads the counts.
#[derive(Debug)]
pub struct ProxyProcess {
    pub child: Child,
    pub addr: SocketAddr,
    pub endpoint: String,
    /// Its `--counters-file`.
    pub counters_file: PathBuf,
    _counters_dir: tempfile::TempDir,
    _watched: Watched,
}

impl ProxyProcess {
    pub fn start(upstream: SocketAddr, link_args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let counters_file = dir.path().join("counters");
        let mut command = Command::new(binary("wan-proxy"));
        command.args(["--listen", "127.0.0.1:0", "--upstream", &upstream.to_string()]).args(link_args);
        command.arg("--counters-file").arg(&counters_file);
        let (child, addr) = spawn_and_wait_for(command, "wan-proxy listening on ");
        Self {
            endpoint: format!("http://{addr}"),
            addr: addr.parse().unwrap(),
            child,
            counters_file,
            _counters_dir: dir,
            _watched: watch(),
        }
    }
}

/// The counts of its `--counters-file` (zeros before its first write, 100 ms after start).
impl crate::wire::LinkMeter for ProxyProcess {
    fn read(&self) -> (crate::wire::LinkCount, u64) {
        match std::fs::read_to_string(&self.counters_file) {
            Ok(line) => crate::wire::LinkCount::parse_line(&line)
                .unwrap_or_else(|| panic!("{}: not a counters line: {line:?}", self.counters_file.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Default::default(),
            Err(e) => panic!("{}: {e}", self.counters_file.display()),
        }
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `spoke-cache` child process on `127.0.0.1:0`; killed when dropped.
#[derive(Debug)]
pub struct SpokeProcess {
    pub child: Child,
    pub endpoint: String,
    pub metrics_addr: String,
    /// The S3 door's address, when started with `--s3-listen`.
    pub s3_addr: Option<String>,
    _watched: Watched,
}

impl SpokeProcess {
    pub fn start(hub: &str, cache_dir: &Path, extra_args: &[&str]) -> Self {
        Self::start_at(hub, cache_dir, "127.0.0.1:0", extra_args)
    }

    /// Starts listening on `listen` (a group's members must know each other's
    /// addresses before they start).
    pub fn start_at(hub: &str, cache_dir: &Path, listen: &str, extra_args: &[&str]) -> Self {
        Self::spawn(Self::command(hub, cache_dir, listen, extra_args))
    }

    /// [`SpokeProcess::start`] with `key=value` in its environment.
    pub fn start_with_env(hub: &str, cache_dir: &Path, (key, value): (&str, &str)) -> Self {
        let mut command = Self::command(hub, cache_dir, "127.0.0.1:0", &[]);
        command.env(key, value);
        Self::spawn(command)
    }

    /// [`SpokeProcess::start_at`] with `env` added to its environment.
    pub fn start_at_with_env(
        hub: &str,
        cache_dir: &Path,
        listen: &str,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let mut command = Self::command(hub, cache_dir, listen, extra_args);
        command.envs(env.iter().copied());
        Self::spawn(command)
    }

    fn command(hub: &str, cache_dir: &Path, listen: &str, extra_args: &[&str]) -> Command {
        let mut command = Command::new(binary("spoke-cache"));
        command
            .args(["--hub", hub, "--cache-dir", cache_dir.to_str().unwrap()])
            .args(["--listen", listen, "--metrics-listen", "127.0.0.1:0"])
            .args(extra_args);
        command
    }

    /// Runs `command` (a spoke) until it says where it listens.
    fn spawn(command: Command) -> Self {
        let (child, rest) = spawn_and_wait_for(command, "spoke-cache listening on ");
        let (addr, metrics) = rest.split_once(" metrics on ").unwrap();
        let (metrics, s3) = metrics.split_once(" s3 on ").map_or((metrics, None), |(m, s3)| (m, Some(s3)));
        Self {
            endpoint: format!("http://{addr}"),
            metrics_addr: metrics.to_owned(),
            s3_addr: s3.map(str::to_owned),
            child,
            _watched: watch(),
        }
    }

    /// `kill -9`: no shutdown, no flush.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SpokeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
