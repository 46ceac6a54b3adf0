//! A real OpenTelemetry Collector as a child process (`otelcol-shardcache`, built from
//! the collector's modules by `scripts/build-otelcol.sh`, which `make test` runs), with
//! the shipped `deploy/otel/collector.yaml` (its tail sampling included) and a file
//! exporter whose OTLP JSON lines a test reads back as [`ExportedSpan`]s.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    process::workspace_dir,
    watchdog::{Watched, watch},
};

/// How long the collector may take to say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// One span as the collector exported it.
#[derive(Debug, Clone)]
pub struct ExportedSpan {
    /// `service.name` of the process that sent it.
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a trace's root.
    pub parent: String,
    pub attributes: HashMap<String, String>,
    pub start_ns: u64,
    pub end_ns: u64,
}

impl ExportedSpan {
    /// An attribute's value, as text (`""` when the span has none of that name).
    pub fn attribute(&self, key: &str) -> &str {
        self.attributes.get(key).map_or("", String::as_str)
    }
}

/// The collector, listening for OTLP/gRPC at [`Collector::endpoint`]; killed when dropped.
#[derive(Debug)]
pub struct Collector {
    child: Child,
    /// `http://127.0.0.1:PORT`, for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: String,
    file: PathBuf,
    _dir: tempfile::TempDir,
    _watched: Watched,
}

impl Collector {
    /// The collector's binary: `$SHARDCACHE_OTELCOL`, else where `make test` builds it.
    pub fn binary() -> PathBuf {
        let path = std::env::var_os("SHARDCACHE_OTELCOL").map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/shardcache/bin/otelcol-shardcache")
        });
        assert!(
            path.exists(),
            "{} is missing: run scripts/build-otelcol.sh (`make test` does)",
            path.display()
        );
        path
    }

    /// Starts the collector with `deploy/otel/collector.yaml`, keeping the traces it
    /// decides to keep (after `decision_wait`; none of the unmarked ones) in a file.
    pub fn start(decision_wait: &str) -> Self {
        Self::start_with_sampling(decision_wait, Some("0"))
    }

    /// [`Collector::start`], keeping `percent` of the unmarked traces (`None`: the
    /// shipped file's default). The collector takes a port, not a listener: it is given
    /// a free one, and another if that one was taken meanwhile.
    pub fn start_with_sampling(decision_wait: &str, percent: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("traces.json");
        let overrides = dir.path().join("test.yaml");
        std::fs::write(
            &overrides,
            format!(
                "exporters:\n  file:\n    path: {}\n    flush_interval: 100ms\n\
                 service:\n  telemetry:\n    metrics:\n      level: none\n  \
                 pipelines:\n    traces:\n      exporters: [file]\n",
                file.display()
            ),
        )
        .unwrap();
        let shipped = workspace_dir().join("deploy/otel/collector.yaml");
        for _ in 0..5 {
            let addr = crate::free_loopback_addr();
            let mut command = Command::new(Self::binary());
            command.arg("--config").arg(&shipped).arg("--config").arg(&overrides);
            if let Some(percent) = percent {
                command.env("SHARDCACHE_TRACES_PERCENT", percent);
            }
            let mut child = command
                .env("SHARDCACHE_TRACES_LISTEN", &addr)
                .env("SHARDCACHE_TRACES_DECISION_WAIT", decision_wait)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            if wait_until_ready(&mut child) {
                return Self {
                    child,
                    endpoint: format!("http://{addr}"),
                    file,
                    _dir: dir,
                    _watched: watch(),
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("the collector did not start on any of five free ports");
    }

    /// Every span the collector has written so far.
    pub fn spans(&self) -> Vec<ExportedSpan> {
        let Ok(text) = std::fs::read_to_string(&self.file) else { return Vec::new() };
        // The file may end mid-line while the exporter writes: whole lines only.
        text.lines().filter_map(|line| serde_json::from_str(line).ok()).flat_map(|v| spans_of(&v)).collect()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the collector's log until it says it is ready (`true`) or ends (`false`: the
/// port was taken, or it failed), then drains the rest on a thread of its own.
fn wait_until_ready(child: &mut Child) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut log = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("Everything is ready") {
                let _ = tx.send(Ok(()));
            }
            if log.len() < 64 << 10 {
                log.push_str(&line);
                log.push('\n');
            }
        }
        let _ = tx.send(Err(log));
    });
    let deadline = Instant::now() + READY_WITHIN;
    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(Ok(())) => true,
        Ok(Err(log)) => {
            eprintln!("the collector stopped before it was ready:\n{log}");
            false
        }
        Err(_) => panic!("the collector was not ready within {READY_WITHIN:?}"),
    }
}

/// The spans of one OTLP JSON export (`{"resourceSpans": [...]}`).
fn spans_of(export: &serde_json::Value) -> Vec<ExportedSpan> {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    let mut out = Vec::new();
    for resource in export["resourceSpans"].as_array().into_iter().flatten() {
        let service =
            attributes(&resource["resource"]["attributes"]).remove("service.name").unwrap_or_default();
        for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
            for span in scope["spans"].as_array().into_iter().flatten() {
                let nanos = |key: &str| span[key].as_str().and_then(|n| n.parse().ok()).unwrap_or(0);
                out.push(ExportedSpan {
                    service: service.clone(),
                    name: text(&span["name"]),
                    trace_id: text(&span["traceId"]),
                    span_id: text(&span["spanId"]),
                    parent: text(&span["parentSpanId"]),
                    attributes: attributes(&span["attributes"]),
                    start_ns: nanos("startTimeUnixNano"),
                    end_ns: nanos("endTimeUnixNano"),
                });
            }
        }
    }
    out
}

/// OTLP JSON attributes (`[{"key": k, "value": {"stringValue": v}}]`) as text.
fn attributes(list: &serde_json::Value) -> HashMap<String, String> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let value = a["value"]
                .as_object()
                .and_then(|v| v.values().next())
                .map_or_else(String::new, |v| v.as_str().map_or_else(|| v.to_string(), str::to_owned));
            (a["key"].as_str().unwrap_or_default().to_owned(), value)
        })
        .collect()
}
