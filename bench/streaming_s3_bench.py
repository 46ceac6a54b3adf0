"""MosaicML Streaming reading its ``remote`` through the spoke's S3 door over the emulated
60 ms link, beside the same loader reading versitygw through an identical emulator with no
cache (issue 60). Prints markdown tables; link bytes are the emulators' counters.

    cargo build --release --workspace --bins
    go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
    ~/.cache/shardcache/venv/bin/python bench/streaming_s3_bench.py

Rows:
- versitygw's own speed on loopback (no emulator), measured first: above the link's rate;
- epoch 1 of a job through the spoke (cold) and through versitygw, each over a 60 ms link
  capped at --rate: samples/s and link bytes per dataset byte;
- a second job with a fresh ``local`` directory (Streaming keeps its own copy, so the first
  job's second epoch would prove nothing) through the now warm spoke: 0 bytes over the link;
- two nodes, each with its own spoke, the two a group: each node's job reads the whole
  dataset through its own spoke's door; the link carries the dataset once, not twice.

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
remote, local = sys.argv[1], sys.argv[2]
started = time.time()
dataset = StreamingDataset(remote=remote, local=local, shuffle=False, batch_size=16)
ids = []
for s in dataset:
    i = int(s["id"])
    assert s["data"] == random.Random(i).randbytes(SAMPLE_BYTES - i % 97), i
    ids.append(i)
elapsed = time.time() - started
print(json.dumps({"samples": len(ids), "ids_ok": sorted(ids) == list(range(len(ids))), "seconds": elapsed}))
""".replace("SAMPLE_BYTES", str(SAMPLE_BYTES))


def job(endpoint, remote, local, key=("anykey", "anysecret")):
    env = dict(os.environ, S3_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=key[0], AWS_SECRET_ACCESS_KEY=key[1],
               AWS_DEFAULT_REGION="us-east-1")
    out = subprocess.run([sys.executable, "-c", JOB, remote, local], env=env, check=True, capture_output=True,
                         text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["samples"] == SAMPLES and result["ids_ok"], result
    return result["seconds"]


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
        seconds = job(f"http://127.0.0.1:{port}", "s3://mds/train", str(work / "local-gw-loop"), gw_key)
        print(f"versitygw on loopback, no emulator: {SAMPLES / seconds:.0f} samples/s, "
              f"{dataset_bytes / seconds / 1e6:.0f} MB/s (the link: {args.rate}, {args.rtt})\n")

        hub_link = Link(binary("wan-proxy"), hub_addr.split()[0], args.rtt, args.rate, work)
        gw_link = Link(binary("wan-proxy"), f"127.0.0.1:{port}", args.rtt, args.rate, work)
        procs += [hub_link.proc, gw_link.proc]
        a_port, b_port = free_port(), free_port()
        members = f"http://127.0.0.1:{a_port},http://127.0.0.1:{b_port}"
        spokes = []
        for name, p in [("a", a_port), ("b", b_port)]:
            proc, rest = start([binary("spoke-cache"), "--hub", f"http://{hub_link.addr}", "--cache-dir",
                                str(work / f"cache-{name}"), "--listen", f"127.0.0.1:{p}", "--metrics-listen",
                                "127.0.0.1:0", "--s3-listen", "127.0.0.1:0", "--peers", members, "--peer-self",
                                f"http://127.0.0.1:{p}"], "spoke-cache listening on ")
            procs.append(proc)
            spokes.append("http://" + rest.split(" s3 on ")[1].strip())

        print("| job | through | samples/s | link bytes / dataset bytes |")
        print("|---|---|---|---|")
        rows = []
        for label, endpoint, link, local, key in [
            ("epoch 1, cold", spokes[0], hub_link, "local-1", ("anykey", "anysecret")),
            ("epoch 1, no cache", f"http://{gw_link.addr}", gw_link, "local-gw", gw_key),
            ("a second job, fresh local", spokes[0], hub_link, "local-2", ("anykey", "anysecret")),
            ("another node's job (group member b)", spokes[1], hub_link, "local-3", ("anykey", "anysecret")),
        ]:
            before = link.to_client()
            seconds = job(endpoint, "s3://mds/train", str(work / local), key)
            carried = link.to_client() - before
            through = "versitygw over the link" if link is gw_link else "spoke's S3 door " + ("a" if endpoint == spokes[0] else "b")
            rows.append((label, SAMPLES / seconds, carried / dataset_bytes))
            print(f"| {label} | {through} | {SAMPLES / seconds:.0f} | {carried / dataset_bytes:.3f} |")
        cold, none, second, other = rows
        assert cold[2] >= 0.99, "the cold job brought the dataset over the link"
        print(f"\nEpoch 1 through the spoke / with no cache: {cold[1] / none[1]:.2f}x samples/s. "
              f"Both nodes' jobs together brought {cold[2] + other[2]:.3f} datasets over the link.")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
