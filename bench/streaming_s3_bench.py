"""MosaicML Streaming reading its ``remote`` through the spoke's S3 door over the emulated
60 ms link, beside the same loader reading versitygw through an identical emulator with no
cache (issue 60). Prints markdown tables; link bytes are the emulators' counters.

    cargo build --release --workspace --bins
    go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
    ~/.cache/shardcache/venv/bin/python bench/streaming_s3_bench.py

Rows:
- versitygw's own speed on loopback (no emulator), measured first: above the link's rate;
- epoch 1 of a job through a lone spoke (cold) and through versitygw, each over a 60 ms link
  capped at --rate: samples/s and link bytes per dataset byte;
- a second job with a fresh ``local`` directory (Streaming keeps its own copy, so the first
  job's second epoch would prove nothing) through the now warm spoke: 0 bytes over the link;
- two nodes, each with its own spoke, the two a group (two more spokes, cold): each node's
  job reads the whole dataset through its own spoke's door, one after the other; the link
  carries the dataset once, not twice. On this one machine, the group's second member
  works on the same cores as node A's loader, which two nodes would not.

Per row, where its time goes: the first sample's time, the loader's file downloads (each
a HeadObject and a GetObject: how many, their mean and their sum; Streaming downloads one
file at a time, a little ahead of the samples), and the CPU seconds of the loader and of
the servers on its path (spokes, hub and its emulator; or versitygw and its emulator).

Each job runs in its own process, as on its own node. The bench checks what it claims:
every sample equals the one written, and the cold rows brought at least the dataset over
the link.
"""

import argparse
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = 4000
SAMPLE_BYTES = 16 << 10


def data(i):
    """Sample ``i``'s bytes: random, so that the hub's link compression cannot shrink them."""
    import random

    return random.Random(i).randbytes(SAMPLE_BYTES - i % 97)


def sample(i):
    return {"id": i, "data": data(i)}


def start(args, prefix, env=None):
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env={**os.environ, "RUST_LOG": "warn", **(env or {})})
    line = proc.stdout.readline().strip()
    if not line.startswith(prefix):
        proc.kill()
        sys.exit(f"expected {prefix!r}, got {line!r}")
    return proc, line[len(prefix):]


def cpu_seconds(pid):
    """User and system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Link:
    """A wan-proxy toward ``upstream``, its counters read from its file."""

    def __init__(self, binary, upstream, rtt, rate, work):
        self.counters = pathlib.Path(work) / f"counters-{upstream.replace(':', '-')}"
        self.proc, addr = start([binary, "--listen", "127.0.0.1:0", "--upstream", upstream, "--rtt", rtt,
                                 "--rate", rate, "--counters-file", str(self.counters)],
                                "wan-proxy listening on ")
        self.addr = addr.split()[0]

    def to_client(self):
        """Bytes delivered toward the reader, once the link has been still for 100 ms."""
        last = None
        for _ in range(200):
            try:
                fields = self.counters.read_text().split()
            except FileNotFoundError:
                fields = []
            if len(fields) == 4:
                now = (int(fields[0]), int(fields[3]))
                if last and last[0] == now[0] and last[1] != now[1]:
                    return now[0]
                last = now
            time.sleep(0.06)
        sys.exit("the link did not settle")


JOB = r"""
import json, os, random, sys, time
from streaming import StreamingDataset
from streaming.base.storage import download
remote, local = sys.argv[1], sys.argv[2]
# Every file download (boto3's download_file: HeadObject, then GetObject) timed, to see
# where an epoch's time goes.
downloads = []
timed = download.S3Downloader._download_file_impl
def timing(self, remote, local, timeout):
    began = time.time()
    timed(self, remote, local, timeout)
    downloads.append((began - started, time.time() - began))
download.S3Downloader._download_file_impl = timing
started = time.time()
dataset = StreamingDataset(remote=remote, local=local, shuffle=False, batch_size=16)
ids = []
for s in dataset:
    if not ids:
        first = time.time() - started
    i = int(s["id"])
    assert s["data"] == random.Random(i).randbytes(SAMPLE_BYTES - i % 97), i
    ids.append(i)
elapsed = time.time() - started
cpu = time.process_time()
print(json.dumps({"samples": len(ids), "ids_ok": sorted(ids) == list(range(len(ids))), "seconds": elapsed,
                  "first": first, "downloads": downloads, "cpu": cpu}))
""".replace("SAMPLE_BYTES", str(SAMPLE_BYTES))


def job(endpoint, remote, local, key=("anykey", "anysecret")):
    env = dict(os.environ, S3_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=key[0], AWS_SECRET_ACCESS_KEY=key[1],
               AWS_DEFAULT_REGION="us-east-1")
    out = subprocess.run([sys.executable, "-c", JOB, remote, local], env=env, check=True, capture_output=True,
                         text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["samples"] == SAMPLES and result["ids_ok"], result
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=str(REPO / "target" / "release"))
    parser.add_argument("--rtt", default="60ms")
    parser.add_argument("--rate", default="1Gbit")
    args = parser.parse_args()
    binary = lambda name: str(pathlib.Path(args.bin) / name)
    gopath = subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True).stdout.strip()
    versitygw = pathlib.Path(gopath) / "bin" / "versitygw"
    if not versitygw.exists():
        sys.exit("go install github.com/versity/versitygw/cmd/versitygw@v1.8.0 first")

    from streaming import MDSWriter

    work = pathlib.Path(tempfile.mkdtemp())
    procs = []
    try:
        root = work / "root"
        with MDSWriter(out=str(root / "mds" / "train"), columns={"id": "int", "data": "bytes"},
                       size_limit=4 << 20) as writer:
            for i in range(SAMPLES):
                writer.write(sample(i))
        dataset_bytes = sum(p.stat().st_size for p in (root / "mds").rglob("*") if p.is_file())

        hub, hub_addr = start([binary("hub-server"), "--root", str(root), "--listen", "127.0.0.1:0"],
                              "hub-server listening on ")
        procs.append(hub)
        port = free_port()
        gw = subprocess.Popen([str(versitygw), "--access", "benchkey", "--secret", "benchsecret",
                               "--port", f"127.0.0.1:{port}", "posix", str(root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(gw)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        gw_key = ("benchkey", "benchsecret")

        # versitygw on loopback, first: its speed against the link's.
        seconds = job(f"http://127.0.0.1:{port}", "s3://mds/train", str(work / "local-gw-loop"), gw_key)["seconds"]
        print(f"versitygw on loopback, no emulator: {SAMPLES / seconds:.0f} samples/s, "
              f"{dataset_bytes / seconds / 1e6:.0f} MB/s (the link: {args.rate}, {args.rtt})\n")

        hub_link = Link(binary("wan-proxy"), hub_addr.split()[0], args.rtt, args.rate, work)
        gw_link = Link(binary("wan-proxy"), f"127.0.0.1:{port}", args.rtt, args.rate, work)
        procs += [hub_link.proc, gw_link.proc]
        # A lone spoke (one node: the epoch-1 target), and a group of two for the two-node rows.
        a_port, b_port = free_port(), free_port()
        members = f"http://127.0.0.1:{a_port},http://127.0.0.1:{b_port}"
        doors, spoke_procs = {}, {}
        for name, group in [("lone", []), ("a", [a_port]), ("b", [b_port])]:
            listen = f"127.0.0.1:{group[0]}" if group else "127.0.0.1:0"
            grouped = ["--peers", members, "--peer-self", f"http://{listen}"] if group else []
            proc, rest = start([binary("spoke-cache"), "--hub", f"http://{hub_link.addr}", "--cache-dir",
                                str(work / f"cache-{name}"), "--listen", listen, "--metrics-listen",
                                "127.0.0.1:0", "--s3-listen", "127.0.0.1:0", *grouped], "spoke-cache listening on ")
            procs.append(proc)
            spoke_procs[name] = proc
            doors[name] = "http://" + rest.split(" s3 on ")[1].strip()

        print("| job | through | samples/s | link bytes / dataset bytes | first sample | downloads: count, mean, sum | CPU s: loader; servers |")
        print("|---|---|---|---|---|---|---|")
        rows = {}
        spoke_key = ("anykey", "anysecret")
        for label, through, link, local in [
            ("epoch 1, cold", "lone", hub_link, "local-1"),
            ("epoch 1, no cache", "versitygw", gw_link, "local-gw"),
            ("a second job, fresh local", "lone", hub_link, "local-2"),
            ("node A's job, cold", "a", hub_link, "local-3"),
            ("node B's job", "b", hub_link, "local-4"),
        ]:
            # The servers on this row's path: a spoke or the group, the hub and its link; or
            # versitygw and its link.
            if through == "versitygw":
                endpoint, key, servers = f"http://{gw_link.addr}", gw_key, [("versitygw", gw), ("link", gw_link.proc)]
                name = "versitygw over the link"
            else:
                endpoint, key = doors[through], spoke_key
                spokes = ["lone"] if through == "lone" else ["a", "b"]
                servers = [("hub", hub), ("link", hub_link.proc), *((f"spoke {n}", spoke_procs[n]) for n in spokes)]
                name = "a lone spoke's S3 door" if through == "lone" else f"group member {through}'s S3 door"
            before, cpu_before = link.to_client(), [cpu_seconds(p.pid) for _, p in servers]
            result = job(endpoint, "s3://mds/train", str(work / local), key)
            seconds = result["seconds"]
            carried = link.to_client() - before
            servers_cpu = ", ".join(f"{n} {cpu_seconds(p.pid) - b:.2f}" for (n, p), b in zip(servers, cpu_before))
            rows[label] = (SAMPLES / seconds, carried / dataset_bytes)
            took = [d[1] for d in result["downloads"]]
            downloads = f"{len(took)}, {1000 * sum(took) / max(len(took), 1):.0f} ms, {sum(took):.2f} s"
            print(f"| {label} | {name} | {SAMPLES / seconds:.0f} | {carried / dataset_bytes:.3f} | "
                  f"{result['first'] * 1000:.0f} ms | {downloads} | {result['cpu']:.2f}; {servers_cpu} |")
        cold, none = rows["epoch 1, cold"], rows["epoch 1, no cache"]
        for label in ["epoch 1, cold", "node A's job, cold"]:
            assert rows[label][1] >= 0.99, f"{label}: the cold job brought the dataset over the link"
        node_a, node_b = rows["node A's job, cold"], rows["node B's job"]
        group = node_a[1] + node_b[1]
        print(f"\nEpoch 1 through the spoke / with no cache: {cold[0] / none[0]:.2f}x samples/s "
              f"(node A's, through the group: {node_a[0] / none[0]:.2f}x). "
              f"Both nodes' jobs together brought {group:.3f} datasets over the link.")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
