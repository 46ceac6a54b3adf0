//! `wan-proxy`: the WAN emulator as a process (see the library, `shardcache_wan`).
//!
//! ```sh
//! wan-proxy --listen 127.0.0.1:7170 --upstream 127.0.0.1:7070 --rtt 60ms --rate 2Gbit
//! ```
//!
//! Prints `wan-proxy listening on ADDR` once it accepts connections.

use std::net::SocketAddr;

use clap::Parser;
use shardcache_wan::{self as wan, LinkConfig};

/// A TCP proxy that delays each direction by half the RTT, optionally at a capped rate.
#[derive(Debug, Parser)]
#[command(name = "wan-proxy", version, about)]
struct Args {
    /// Address to accept connections on (port 0 picks one; it is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Address to relay each connection to: IP:PORT, or HOST:PORT looked up per connection.
    #[arg(long)]
    upstream: String,
    /// Round-trip time to add (each direction gets half), e.g. 60ms.
    #[arg(long, default_value = "60ms", value_parser = humantime::parse_duration)]
    rtt: std::time::Duration,
    /// Bottleneck rate per direction, shared by all connections, e.g. 10Gbit, 500Mbit.
    #[arg(long, value_parser = wan::parse_rate)]
    rate: Option<u64>,
    /// Random extra delay per piece, up to +-this (never reorders bytes), e.g. 2ms.
    #[arg(long, default_value = "0ms", value_parser = humantime::parse_duration)]
    jitter: std::time::Duration,
    /// Faults to cycle through, each for its time: FAULT:DURATION,... with FAULT one of
    /// none, stall, down, stall-after=BYTES, hold-requests, hold-answers, throttle=RATE, corrupt-every=BYTES
    /// (e.g. none:10s,stall:3s,down:1s,throttle=20Mbit:5s). Each change is printed.
    #[arg(long, value_parser = wan::parse_schedule)]
    faults: Option<wan::Schedule>,
    /// Every 100 ms, replace this file's contents with `TO_CLIENT TO_UPSTREAM CONNECTIONS
    /// WRITES`: the bytes delivered each way, the connections accepted, and how many times
    /// the file was written (for benchmarks that count what crossed the link: two reads
    /// with the same counts and different WRITES saw the link still for 100 ms at least).
    #[arg(long)]
    counters_file: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let config = LinkConfig { rtt: args.rtt, rate_bps: args.rate, jitter: args.jitter };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("wan-proxy listening on {}", listener.local_addr()?);
    // `fault` lives as long as the proxy: with no sender left, the delay lines would
    // take the link for gone.
    let (fault, faults) = tokio::sync::watch::channel(wan::Fault::None);
    let schedule = args.faults.unwrap_or_default();
    // Written, not printed: whoever started the proxy may have stopped reading its output
    // (a benchmark reads the listening line only), and the schedule must run on.
    tokio::spawn(wan::run_schedule(fault.clone(), schedule, |fault| {
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), "wan-proxy fault: {fault}");
    }));
    let counters = std::sync::Arc::new(wan::LinkCounters::default());
    if let Some(path) = args.counters_file {
        let counters = counters.clone();
        tokio::spawn(async move {
            let partial = path.with_extension("partial");
            for writes in 1u64.. {
                // Written aside and renamed: a reader never sees half a line.
                let line = format!("{} {writes}\n", counters.line().trim_end());
                if std::fs::write(&partial, line).is_ok() {
                    let _ = std::fs::rename(&partial, &path);
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        });
    }
    tokio::select! {
        () = wan::run(listener, args.upstream, config, counters, faults) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    drop(fault);
    Ok(())
}
