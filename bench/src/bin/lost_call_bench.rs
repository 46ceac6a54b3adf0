//! `lost-call-bench`: calls that outlive their connection (`shardcache_transport::liveness`).
//! Prints markdown tables (recorded in BENCHMARKS.md, "Calls that outlived their
//! connection").
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/lost-call-bench
//! ```
//!
//! A server in this process accepts, peeks one byte and closes, as a TLS hub does to a
//! plaintext client (the kernel resets the connection). Against it, each run is a fresh
//! process (the race shows in a fresh process's first call) making one `ListDatasets`:
//! - through a plain tonic channel with the SDK's connector (what the SDK made before the
//!   check), through the SDK's `LiveChannel`, and through the `shardcache` CLI: how many
//!   runs never ended (killed at `--deadline`), how many were failed by the check;
//! - through a plain channel, and when the call has not ended after 1 s, a second call on
//!   the same channel: how long after it the first ends (where the lost call waits).
//!
//! Then what the check costs a call that is answered: sequential `ListDatasets` to a hub
//! in this process through the SDK's channel and through a plain one (the ceiling).

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use clap::Parser;
use shardcache_client::{Client, connect::connect_channel};
use shardcache_tests::{TestHub, binary, make_dataset, process::output_within};
use shardcache_transport::{http2::Http2Settings, liveness::ORPHANED};
use tonic::transport::Endpoint;

#[derive(Parser)]
struct Args {
    /// Runs (fresh processes) per client.
    #[arg(long, default_value_t = 400)]
    runs: usize,
    /// A run not ended by then is killed and counted as never ending.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    deadline: Duration,
    /// Sequential calls per channel for the cost of the check.
    #[arg(long, default_value_t = 5000)]
    calls: usize,
    /// In a child process: one run of CLIENT (`plain`, `live`, `plain-then-second`)
    /// against ENDPOINT, printing its outcome on one line (or `serve-resets -`: the
    /// resetting server).
    #[arg(long, num_args = 2, value_names = ["CLIENT", "ENDPOINT"])]
    child: Option<Vec<String>>,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    match args.child.as_deref() {
        Some([serve, _]) if serve == "serve-resets" => return serve_resets().await,
        Some([client, endpoint]) => return println!("{}", one_run(client, endpoint).await),
        _ => {}
    }
    let (endpoint, mut server) = resetting_server();
    println!(
        "| client | runs | never ended (killed at {:?}) | failed by the check | failed at once |",
        args.deadline
    );
    println!("|---|---|---|---|---|");
    let me = std::env::current_exe().unwrap();
    for (label, client) in [("plain tonic channel (before)", "plain"), ("SDK's LiveChannel", "live")] {
        let runs = (0..args.runs).map(|_| {
            let mut command = Command::new(&me);
            command.args(["--child", client, &endpoint]);
            run(command, args.deadline)
        });
        tally(label, runs.collect());
    }
    let cli = (0..args.runs).map(|_| {
        let mut command = Command::new(binary("shardcache"));
        command.args(["--endpoint", &endpoint, "ls"]);
        run(command, args.deadline)
    });
    tally("`shardcache ls` (CLI)", cli.collect());

    println!();
    println!(
        "| plain channel, a second call after 1 s | runs | first call lost | first ended after the second started |"
    );
    println!("|---|---|---|---|");
    let runs: Vec<_> = (0..args.runs)
        .map(|_| {
            let mut command = Command::new(&me);
            command.args(["--child", "plain-then-second", &endpoint]);
            run(command, args.deadline)
        })
        .collect();
    let released: Vec<&str> = runs.iter().filter_map(|r| r.strip_prefix("lost, released after ")).collect();
    assert!(!runs.iter().any(|r| r == "never ended"), "a second call did not release a lost one");
    println!("| | {} | {} | {} |", runs.len(), released.len(), released.join(", "));
    let _ = server.kill();

    println!();
    check_cost(args.calls).await;
}

/// One child process's run to its end or `deadline`: how it ended, or "never ended".
fn run(mut command: Command, deadline: Duration) -> String {
    let Ok(out) = output_within(&mut command, deadline) else { return "never ended".into() };
    // A child of this bench says how its call ended on stdout, the CLI on stderr.
    let said = [String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)].concat();
    // The resetting server answers nothing: a call that succeeded did not reach it.
    assert!(!said.starts_with("ok") && !said.contains("DATASET"), "a call succeeded: {said}");
    if said.contains(ORPHANED) {
        "failed by the check".into()
    } else if said.starts_with("lost, released after ") {
        said.trim().to_owned()
    } else {
        "failed at once".into()
    }
}

fn tally(label: &str, runs: Vec<String>) {
    let count = |what: &str| runs.iter().filter(|r| r.as_str() == what).count();
    let (never, checked) = (count("never ended"), count("failed by the check"));
    println!("| {label} | {} | {never} | {checked} | {} |", runs.len(), runs.len() - never - checked);
}

/// A child's run: `plain` and `live` make one call; `plain-then-second` makes a second
/// call on the channel when the first has not ended after 1 s.
async fn one_run(client: &str, endpoint: &str) -> String {
    let second = client == "plain-then-second";
    let client = match client {
        "live" => {
            Client::from_channel(connect_channel(endpoint, &Default::default()).await.unwrap(), endpoint)
        }
        _ => Client::from_channel(plain_channel(endpoint).await, endpoint),
    };
    let first = client.list_datasets();
    tokio::pin!(first);
    let ended = match tokio::time::timeout(Duration::from_secs(1), &mut first).await {
        Err(_) if second => {
            let started = Instant::now();
            let _ = client.list_datasets().await;
            let _ = first.await;
            return format!("lost, released after {:.2} ms", started.elapsed().as_secs_f64() * 1e3);
        }
        Ok(ended) => ended,
        Err(_) => first.await,
    };
    match ended {
        Ok(_) => "ok".into(),
        Err(e) => format!("error: {e}"),
    }
}

/// A plain tonic channel with the SDK's connector and windows: the SDK's channel before
/// the check.
async fn plain_channel(endpoint: &str) -> tonic::transport::Channel {
    Http2Settings::TUNED
        .endpoint(Endpoint::from_shared(endpoint.to_owned()).unwrap())
        .connect_with_connector(Http2Settings::TUNED.connector(None))
        .await
        .unwrap()
}

/// A server that accepts, peeks one byte and closes, as a TLS hub does to a plaintext
/// client, in a process of its own (in this one, busy starting the runs, it answered
/// sooner and no run lost its call: 0 of 800); `http://ADDR`, and the process.
fn resetting_server() -> (String, std::process::Child) {
    let mut server = Command::new(std::env::current_exe().unwrap())
        .args(["--child", "serve-resets", "-"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(server.stdout.take().unwrap()), &mut line)
        .unwrap();
    (format!("http://{}", line.trim()), server)
}

/// The resetting server's loop (`--child serve-resets -`): prints its address first.
async fn serve_resets() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("{}", listener.local_addr().unwrap());
    while let Ok((socket, _)) = listener.accept().await {
        let mut first = [0u8; 1];
        let _ = socket.peek(&mut first).await;
    }
}

/// Sequential calls answered by a hub through the SDK's channel and through a plain one,
/// in alternating rounds: calls per second of each.
async fn check_cost(calls: usize) {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 1, 16 << 10);
    let hub = TestHub::start(root.path()).await;
    let live = Client::from_channel(
        connect_channel(&hub.endpoint, &Default::default()).await.unwrap(),
        &hub.endpoint,
    );
    let plain = Client::from_channel(plain_channel(&hub.endpoint).await, &hub.endpoint);
    let (mut live_s, mut plain_s) = (0.0, 0.0);
    for _ in 0..3 {
        for (client, seconds) in [(&live, &mut live_s), (&plain, &mut plain_s)] {
            let started = Instant::now();
            for _ in 0..calls / 3 {
                assert_eq!(client.list_datasets().await.unwrap().len(), 1);
            }
            *seconds += started.elapsed().as_secs_f64();
        }
    }
    let per_s = |s: f64| (calls / 3 * 3) as f64 / s;
    println!("| sequential ListDatasets to a hub in this process | calls/s |");
    println!("|---|---|");
    println!("| plain tonic channel (the ceiling) | {:.0} |", per_s(plain_s));
    println!("| SDK's LiveChannel | {:.0} ({:.3} of the ceiling) |", per_s(live_s), plain_s / live_s);
}
