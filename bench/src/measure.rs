//! Measurement helpers shared by the benchmark binaries (`src/bin/*_bench.rs`) and the
//! seed demo: raw TCP references, rates, percentiles, a process's CPU time and peak RSS.

use std::{net::SocketAddr, time::Duration};

use futures::future::join_all;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// MB/s of `streams` TCP connections moving `total` bytes over loopback, in this process.
pub async fn raw_tcp(streams: usize, total: u64) -> f64 {
    raw_tcp_via(streams, total, |sink| (sink, ())).await
}

/// Like [`raw_tcp`], but the writers connect to the address `via` returns for the sink's
/// address (a WAN emulator in front of it, kept alive by the guard `G`): the raw TCP
/// reference through the same link, like iperf3 through it.
pub async fn raw_tcp_via<G>(
    streams: usize,
    total: u64,
    via: impl FnOnce(SocketAddr) -> (SocketAddr, G),
) -> f64 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, _guard) = via(listener.local_addr().unwrap());
    let per_stream = total / streams as u64;
    let sink = tokio::spawn(async move {
        let mut readers = Vec::new();
        for _ in 0..streams {
            let (mut socket, _) = listener.accept().await.unwrap();
            readers.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 20];
                while socket.read(&mut buf).await.unwrap() > 0 {}
            }));
        }
        join_all(readers).await;
    });
    let started = std::time::Instant::now();
    let writers = (0..streams).map(|_| async move {
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let buf = vec![7u8; 1 << 20];
        let mut sent = 0;
        while sent < per_stream {
            socket.write_all(&buf).await.unwrap();
            sent += buf.len() as u64;
        }
        socket.shutdown().await.unwrap();
    });
    join_all(writers).await;
    sink.await.unwrap();
    mb_per_s(per_stream * streams as u64, started.elapsed())
}

pub fn mb_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e6
}

/// p50 and p99 in microseconds.
pub fn percentiles(mut latencies: Vec<Duration>) -> (f64, f64) {
    latencies.sort();
    let at = |q: f64| {
        latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)].as_secs_f64() * 1e6
    };
    (at(0.50), at(0.99))
}

/// Peak resident set size (VmHWM) of a process, in MiB.
pub fn peak_rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmHWM:")
}

/// Resident memory of a process now (VmRSS), in MiB.
pub fn rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// A size field of `/proc/PID/status` (in kB there), in MiB; 0 when unreadable.
fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// CPU seconds (user + system) a process has used so far.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0 // USER_HZ is 100 on Linux
}

/// `shards` clients each streaming one shard of `dataset` (`shard-00000.bin`, ...) at
/// once, from the start to the end: the bytes read and the time it took.
pub async fn stream_shards(
    client: &shardcache_client::Client,
    dataset: &str,
    shards: u32,
) -> (u64, Duration) {
    let started = std::time::Instant::now();
    let reads = (0..shards).map(|i| {
        let client = client.clone();
        async move {
            let shard = shardcache_cli::dataset_gen::shard_name(i);
            let mut stream = client.stream_shard(dataset, &shard, 0, None).await.expect("a stream opens");
            let mut n = 0u64;
            while let Some(chunk) = stream.next_chunk().await.expect("every chunk arrives, verified") {
                n += chunk.data.len() as u64;
            }
            n
        }
    });
    let bytes: u64 = join_all(reads).await.into_iter().sum();
    (bytes, started.elapsed())
}
