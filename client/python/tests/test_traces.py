"""Traces from Python, in a real OpenTelemetry Collector (the one `make test` builds,
with the shipped deploy/otel/collector.yaml, keeping every trace here): a trainer process
with OTEL_EXPORTER_OTLP_ENDPOINT set exports each call as a span whose child is the
spoke's span of the request, and below it the hub's for a cold read; a forked worker
(what a DataLoader worker is) exports its own calls, not lost with the parent's
exporter thread."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO, binary

COLLECTOR = pathlib.Path(
    os.environ.get("SHARDCACHE_OTELCOL", pathlib.Path.home() / ".cache/shardcache/bin/otelcol-shardcache")
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def collector(tmp_path):
    """The collector on a free port (another one if that was taken meanwhile); yields
    (endpoint, file of the traces it keeps)."""
    if not COLLECTOR.exists():
        pytest.fail(f"{COLLECTOR} is missing: run scripts/build-otelcol.sh (make test does)")
    out = tmp_path / "traces.json"
    overrides = tmp_path / "test.yaml"
    overrides.write_text(textwrap.dedent(f"""\
        exporters:
          file:
            path: {out}
            flush_interval: 100ms
        service:
          telemetry:
            metrics:
              level: none
          pipelines:
            traces:
              exporters: [file]
        """))
    for _ in range(5):
        port = free_port()
        env = dict(os.environ, SHARDCACHE_TRACES_LISTEN=f"127.0.0.1:{port}", SHARDCACHE_TRACES_PERCENT="100",
                   SHARDCACHE_TRACES_DECISION_WAIT="1s")
        proc = subprocess.Popen(
            [str(COLLECTOR), "--config", str(REPO / "deploy/otel/collector.yaml"), "--config", str(overrides)],
            stderr=subprocess.PIPE, env=env, text=True)
        for line in proc.stderr:
            if "Everything is ready" in line:
                break
        if proc.poll() is None:
            yield f"http://127.0.0.1:{port}", out
            proc.kill()
            proc.wait()
            return
    pytest.fail("the collector did not start on any of five free ports")


def spans(path):
    """Every span the collector wrote: (service, name, trace, span, parent, attributes)."""
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            export = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        for resource in export.get("resourceSpans", []):
            service = next(a["value"]["stringValue"] for a in resource["resource"]["attributes"]
                           if a["key"] == "service.name")
            for scope in resource.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    attrs = {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}
                    out.append((service, span["name"], span["traceId"], span["spanId"],
                                span.get("parentSpanId", ""), attrs))
    return out


TRAINER = """
import os, shardcache
client = shardcache.Client(os.environ["SPOKE"])
client.read("c4", "shard-00000.bin", 0, 16384)          # the parent: cold, 16 KiB
pid = os.fork()
if pid == 0:                                              # a DataLoader worker
    client.read("c4", "shard-00001.bin", 0, 8192)        # cold, 8 KiB
    shardcache._native.flush_traces()
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_a_trainer_and_its_forked_worker_each_export_their_calls_above_the_servers(collector, dataset_dir,
                                                                                   tmp_path):
    endpoint, out = collector
    exporting = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
    hub, hub_addr = start_with([binary("hub-server"), "--root", str(dataset_dir), "--listen", "127.0.0.1:0"],
                               "hub-server listening on ", dict(exporting, OTEL_SERVICE_NAME="hub"))
    spoke, rest = start_with([binary("spoke-cache"), "--hub", f"http://{hub_addr}", "--cache-dir",
                              str(tmp_path / "cache"), "--listen", "127.0.0.1:0", "--metrics-listen",
                              "127.0.0.1:0"], "spoke-cache listening on ", dict(exporting, OTEL_SERVICE_NAME="spoke"))
    try:
        subprocess.run([sys.executable, "-c", TRAINER], check=True, timeout=120,
                       env=dict(exporting, OTEL_SERVICE_NAME="trainer", SPOKE=f"http://{rest.split()[0]}"))
        # Each read's trace: the trainer's call, the spoke's request under it (its bytes say
        # which read), the hub's request under the spoke's fetch.
        for _ in range(300):
            found = {}
            got = spans(out)
            for service, name, trace, span_id, parent, attrs in got:
                if service != "spoke" or name != "rpc" or "/Read" not in attrs.get("method", ""):
                    continue
                caller = [s for s in got if s[3] == parent]
                hub_below = any(s[0] == "hub" and s[2] == trace and s[1] == "rpc" for s in got)
                if caller and caller[0][:2] == ("trainer", "shardcache.ask") and hub_below:
                    found[str(attrs.get("bytes"))] = caller[0][5].get("member")
            if {"16384", "8192"} <= found.keys():
                break
            time.sleep(0.1)
        assert found.get("16384") == found.get("8192") == f"http://{rest.split()[0]}", (found, got)
    finally:
        for proc in (spoke, hub):
            proc.kill()
            proc.wait()


def start_with(args, prefix, env):
    """`conftest.start` with `env`, keeping its RUST_LOG."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, env=dict(env, RUST_LOG="warn"), text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith(prefix):
        proc.kill()
        pytest.fail(f"expected {prefix!r}, got {line!r}")
    return proc, line[len(prefix):]
