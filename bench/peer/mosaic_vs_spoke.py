"""MosaicML Streaming and WebDataset beside shardcache on the same work (issues 16 and
27): a cache limit of half the dataset, three epochs, the same samples, the same 60 ms
link, each peer on its own files and shardcache on the same files:

- MosaicML Streaming: the samples written in its MDS format by its ``MDSWriter``, served
  by an S3-compatible server (moto) behind the WAN emulator; ``StreamingDataset`` with
  ``cache_limit`` at half the dataset and its ``py1br`` shuffle over blocks of about 4
  shards (``py1b`` is gone from 0.13).
- WebDataset: the samples written as tar shards by its ``TarWriter`` (a ``bin`` field
  each), served over HTTP behind the emulator, read by its own ``WebDataset`` loader
  (curl) with its ``cache_dir`` and ``cache_size`` at half the dataset, shards shuffled
  and a shuffle buffer of 4 shards' samples.
- shardcache: the hub next to the same files (the records, the MDS directory, the tar
  shards), the spoke (``--capacity`` half the dataset) across the same emulator;
  ``StreamingShardDataset`` with blocks of 4 shards (its access plan sent to the spoke),
  ``format="records"``, ``"mds"`` and ``"webdataset"``.

All read through a ``torch.utils.data.DataLoader`` with the same workers and batch size,
as fast as they can, or, with ``--step-ms``, under a simulated GPU step per batch (GPU
utilisation = compute / elapsed). Per epoch: samples/s, bytes the emulator delivered
across the link (its ``--counters-file``), and reads from cache (the spoke's own
per-job row; for the peers, which do not count them, 1 - link bytes / dataset bytes).

Run by scripts/peer-bench.sh.
"""

import argparse
import functools
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

RECORD = 16 * 1024
# The DataLoader's batch size (set from --batch-size).
BATCH = [64]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, prefix, env=None):
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline().strip()
    if not line.startswith(prefix):
        proc.kill()
        raise SystemExit(f"{args[0]}: expected {prefix!r}, got {line!r}")
    return proc, line[len(prefix):]


class Link:
    """A wan-proxy to `upstream`, and what it delivered."""

    def __init__(self, bin_dir, upstream, rtt, work, name):
        self.counters = work / f"{name}.counters"
        self.proc, addr = start(
            [str(bin_dir / "wan-proxy"), "--upstream", upstream, "--rtt", rtt, "--counters-file", str(self.counters)],
            "wan-proxy listening on ",
        )
        self.addr = addr

    def delivered(self) -> int:
        time.sleep(0.25)  # the file is rewritten every 100 ms
        return int(self.counters.read_text().split()[0])


def write_mds(records_dir: pathlib.Path, out: pathlib.Path, shard_bytes: int):
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"tokens": "bytes"}, size_limit=shard_bytes) as writer:
        for shard in sorted((records_dir / "c4").glob("*.bin")):
            data = shard.read_bytes()
            for i in range(0, len(data), RECORD):
                writer.write({"tokens": data[i : i + RECORD]})


def write_wds(records_dir: pathlib.Path, out: pathlib.Path, shard_bytes: int):
    """The same samples as WebDataset tar shards of about ``shard_bytes``."""
    import webdataset as wds

    out.mkdir(parents=True)
    with wds.ShardWriter(str(out / "shard-%05d.tar"), maxsize=shard_bytes, verbose=0) as sink:
        n = 0
        for shard in sorted((records_dir / "c4").glob("*.bin")):
            data = shard.read_bytes()
            for i in range(0, len(data), RECORD):
                sink.write({"__key__": f"{n:08d}", "bin": data[i : i + RECORD]})
                n += 1


HTTP_SERVER = """
import functools, http.server, sys
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args): pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=sys.argv[1]))
print("http listening on 127.0.0.1:%d" % server.server_address[1], flush=True)
server.serve_forever()
"""


def upload(endpoint: str, local: pathlib.Path, bucket: str, prefix: str):
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local)}")


def epochs(loader_for_epoch, count, link, row_for_epoch, dataset_bytes, name, step_s):
    import torch  # noqa: F401  (the loader's)

    rows = []
    for epoch in range(count):
        # Epoch 1 counts opening the dataset (its index, over the link) in bytes and time.
        before = link.delivered()
        started = time.perf_counter()
        loader = loader_for_epoch(epoch)
        opened = time.perf_counter() - started
        samples = 0
        for batch in loader:
            samples += len(batch)
            if step_s:
                time.sleep(step_s)  # the GPU's step: the loader's workers read on meanwhile
        elapsed = time.perf_counter() - started
        steps = -(-samples // BATCH[0])
        moved = link.delivered() - before
        row = {
            "setup": name,
            "epoch": epoch + 1,
            "samples": samples,
            "samples_per_s": samples / elapsed,
            "link_bytes_per_dataset": moved / dataset_bytes,
            "from_cache_pct": row_for_epoch(epoch, moved, samples),
            "gpu_util_pct": 100.0 * steps * step_s / elapsed if step_s else None,
            "open_s": opened,
        }
        util = f", GPU {row['gpu_util_pct']:.0f}%" if step_s else ""
        print(
            f"{name} epoch {epoch + 1}: {samples} samples, {row['samples_per_s']:.0f} samples/s, "
            f"{row['link_bytes_per_dataset']:.2f} x dataset over the link, {row['from_cache_pct']:.1f}% from cache{util}, "
            f"{elapsed:.2f} s of which {opened:.2f} s making the loader",
            flush=True,
        )
        rows.append(row)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin-dir", type=pathlib.Path, required=True)
    p.add_argument("--moto-server", required=True)
    p.add_argument("--shards", type=int, default=64)
    p.add_argument("--shard-size-mib", type=int, default=4)
    p.add_argument("--rtt", default="60ms")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-ms", type=float, default=0.0, help="simulated GPU step per batch (0: as fast as they read)")
    p.add_argument("--setups", default="mosaic,records,mds,webdataset,wds",
                   help="of mosaic (Streaming on its MDS), records, mds, wds (shardcache on each), webdataset (its loader)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("target/peer-bench.json"))
    args = p.parse_args()
    BATCH[0] = args.batch_size
    setups = args.setups.split(",")

    dataset_bytes = args.shards * args.shard_size_mib << 20
    samples_per_shard = (args.shard_size_mib << 20) // RECORD
    capacity = dataset_bytes // 2
    work = pathlib.Path(tempfile.mkdtemp(prefix="peer-bench-"))
    procs = []
    try:
        records = work / "records"
        subprocess.run(
            [str(args.bin_dir / "shardcache"), "gen", "--dir", str(records), "--dataset", "c4",
             "--shards", str(args.shards), "--shard-size", f"{args.shard_size_mib}MiB", "--record-size", "16KiB"],
            check=True, stdout=subprocess.DEVNULL,
        )
        # The same samples in MDS (by MosaicML's writer) and in tar shards (by
        # webdataset's), shards of about the records' size, beside the records: the hub
        # serves all three, the peers read their own.
        write_mds(records, records / "mds", (args.shard_size_mib << 20) + 64 * 1024)
        write_wds(records, records / "wds", (args.shard_size_mib << 20) + 64 * 1024)
        sizes = {name: sum(f.stat().st_size for f in (records / name).rglob("*") if f.is_file())
                 for name in ("c4", "mds", "wds")}
        print(f"dataset bytes: records {sizes['c4']}, MDS {sizes['mds']}, tar {sizes['wds']}", flush=True)
        results = {}
        runners = {"mosaic": run_mosaic, "webdataset": run_webdataset}
        for setup in setups:
            if setup in runners:
                name, rows = runners[setup](args, work, records, procs, capacity, samples_per_shard, sizes)
            else:
                name, rows = run_shardcache(args, work, records, procs, capacity, setup, sizes)
            results[name] = rows
            assert all(r["samples"] == args.shards * samples_per_shard for r in rows), rows
        print_table(args, capacity, results)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def loader(dataset, args, **extra):
    import torch

    return torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                                       collate_fn=lambda b: b, **extra)


def run_mosaic(args, work, records, procs, capacity, samples_per_shard, sizes):
    """MosaicML Streaming reading its MDS files from S3 (moto) behind the link."""
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    moto_port = free_port()
    moto = subprocess.Popen([args.moto_server, "-p", str(moto_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(moto)
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", moto_port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    upload(f"http://127.0.0.1:{moto_port}", records / "mds", "peer", "mds")
    link = Link(args.bin_dir, f"127.0.0.1:{moto_port}", args.rtt, work, "s3")
    procs.append(link.proc)
    os.environ["S3_ENDPOINT_URL"] = f"http://{link.addr}"
    clean_stale_shared_memory()
    made = []

    def make(epoch):
        if not made:
            made.append(StreamingDataset(
                remote="s3://peer/mds", local=str(work / "mosaic-cache"), shuffle=True, shuffle_algo="py1br",
                shuffle_block_size=4 * samples_per_shard, shuffle_seed=0, cache_limit=capacity,
                batch_size=args.batch_size,
            ))
        return loader(made[0], args, persistent_workers=False)

    rows = epochs(make, args.epochs, link,
                  lambda epoch, moved, samples: max(0.0, 100.0 * (1 - moved / sizes["mds"])),
                  sizes["mds"], "MosaicML Streaming 0.13.0 (MDS on S3)", args.step_ms / 1000)
    return "MosaicML Streaming 0.13.0, its MDS on S3", rows


def run_webdataset(args, work, records, procs, capacity, samples_per_shard, sizes):
    """webdataset's own loader reading the tar shards over HTTP behind the link."""
    import webdataset as wds

    server, addr = start([sys.executable, "-c", HTTP_SERVER, str(records / "wds")], "http listening on ")
    procs.append(server)
    link = Link(args.bin_dir, addr, args.rtt, work, "http")
    procs.append(link.proc)
    shards = sorted(f.name for f in (records / "wds").glob("*.tar"))
    urls = [f"http://{link.addr}/{name}" for name in shards]
    (work / "wds-cache").mkdir()

    def make(epoch):
        dataset = wds.WebDataset(urls, shardshuffle=len(urls), cache_dir=str(work / "wds-cache"), cache_size=capacity,
                                 nodesplitter=None, seed=epoch).shuffle(4 * samples_per_shard)
        return loader(dataset, args)

    rows = epochs(make, args.epochs, link, lambda epoch, moved, samples: max(0.0, 100.0 * (1 - moved / sizes["wds"])),
                  sizes["wds"], "WebDataset 1.0.2 (tar over HTTP)", args.step_ms / 1000)
    return "WebDataset 1.0.2, its tars over HTTP", rows


def run_shardcache(args, work, records, procs, capacity, setup, sizes):
    """A fresh spoke across the link from a hub beside the files, read as `setup`."""
    import shardcache

    dataset, fmt = {"records": ("c4", "records"), "mds": ("mds", "mds"), "wds": ("wds", "webdataset")}[setup]
    quiet = dict(os.environ, RUST_LOG="warn")
    hub, hub_addr = start([str(args.bin_dir / "hub-server"), "--root", str(records), "--listen", "127.0.0.1:0"],
                          "hub-server listening on ", env=quiet)
    procs.append(hub)
    link = Link(args.bin_dir, hub_addr, args.rtt, work, f"hub-{setup}")
    procs.append(link.proc)
    spoke, rest = start(
        [str(args.bin_dir / "spoke-cache"), "--hub", f"http://{link.addr}", "--cache-dir", str(work / f"spoke-{setup}"),
         "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--capacity", f"{capacity}B"],
        "spoke-cache listening on ",
        env=quiet,
    )
    procs.append(spoke)
    endpoint = f"http://{rest.split()[0]}"
    job = f"peer-bench-{setup}"
    made = []

    def make(epoch):
        if not made:
            made.append(shardcache.StreamingShardDataset(
                endpoint, dataset, batch_size=args.batch_size, seed=0, rank=0, world_size=1, shard_block=4,
                job=job, dtype=None, format=fmt,
            ))
        made[0].set_epoch(epoch)
        return loader(made[0], args)

    client = shardcache.Client(endpoint)

    def hits(epoch, moved, samples):
        row = [j for j in client.status()["jobs"] if j["job"] == job and j["epoch"] == epoch]
        assert row and row[0]["reads"] == samples, (row, samples)
        return 100.0 * row[0]["hit_reads"] / row[0]["reads"]

    name = f"shardcache spoke, {fmt}"
    return name, epochs(make, args.epochs, link, hits, sizes[dataset], name, args.step_ms / 1000)


def print_table(args, capacity, results):
    print()
    print(f"{args.shards} shards x {args.shard_size_mib} MiB of 16 KiB samples, cache limit {capacity >> 20} MiB, "
          f"link RTT {args.rtt}, DataLoader {args.workers} workers x batch {args.batch_size}, "
          f"GPU step {args.step_ms} ms per batch")
    print("| setup | epoch | samples/s | link bytes / its dataset | from cache | GPU utilisation |")
    print("|---|---|---|---|---|---|")
    for name, rows in results.items():
        for r in rows:
            util = f"{r['gpu_util_pct']:.0f}%" if r["gpu_util_pct"] is not None else "-"
            print(f"| {name} | {r['epoch']} | {r['samples_per_s']:.0f} | {r['link_bytes_per_dataset']:.2f} | "
                  f"{r['from_cache_pct']:.1f}% | {util} |")


if __name__ == "__main__":
    main()
