"""MosaicML Streaming beside shardcache on the same work (issue 16): a cache limit of
half the dataset, three epochs, the same samples, the same 60 ms link.

- MosaicML Streaming: the samples written in its MDS format, served by an S3-compatible
  server (moto) behind the WAN emulator; ``StreamingDataset`` with ``cache_limit`` at
  half the dataset and its ``py1br`` shuffle over blocks of about 4 shards (``py1b`` is gone from 0.13).
- shardcache: the same samples as fixed-size records; the hub next to them, the spoke
  (``--capacity`` half the dataset) across the same emulator; ``StreamingShardDataset``
  with blocks of 4 shards (its access plan sent to the spoke).

Both read through a ``torch.utils.data.DataLoader`` with the same workers and batch
size, as fast as they can. Per epoch: samples/s, bytes the emulator delivered across
the link (its ``--counters-file``), and reads from cache (the spoke's own per-job row;
for MosaicML, which does not count them, 1 - link bytes / dataset bytes).

Run by scripts/peer-bench.sh (which installs MosaicML Streaming into a cached venv).
"""

import argparse
import json
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

RECORD = 16 * 1024


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


def upload(endpoint: str, local: pathlib.Path, bucket: str, prefix: str):
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local)}")


def epochs(loader_for_epoch, count, link, row_for_epoch, dataset_bytes, name):
    import torch  # noqa: F401  (the loader's)

    rows = []
    for epoch in range(count):
        loader = loader_for_epoch(epoch)
        before = link.delivered()
        started = time.perf_counter()
        samples = 0
        for batch in loader:
            samples += len(batch)
        elapsed = time.perf_counter() - started
        moved = link.delivered() - before
        row = {
            "setup": name,
            "epoch": epoch + 1,
            "samples": samples,
            "samples_per_s": samples / elapsed,
            "link_bytes_per_dataset": moved / dataset_bytes,
            "from_cache_pct": row_for_epoch(epoch, moved, samples),
        }
        print(
            f"{name} epoch {epoch + 1}: {samples} samples, {row['samples_per_s']:.0f} samples/s, "
            f"{row['link_bytes_per_dataset']:.2f} x dataset over the link, {row['from_cache_pct']:.1f}% from cache",
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
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("target/peer-bench.json"))
    args = p.parse_args()

    import torch
    import shardcache
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

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
        # MosaicML: MDS shards of about the same size, on moto, behind the emulator.
        mds = work / "mds"
        write_mds(records, mds, (args.shard_size_mib << 20) + 64 * 1024)
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
        upload(f"http://127.0.0.1:{moto_port}", mds, "peer", "mds")
        s3_link = Link(args.bin_dir, f"127.0.0.1:{moto_port}", args.rtt, work, "s3")
        procs.append(s3_link.proc)
        os.environ["S3_ENDPOINT_URL"] = f"http://{s3_link.addr}"

        clean_stale_shared_memory()
        local = work / "mosaic-cache"

        def mosaic_loader(epoch):
            global _mosaic
            if epoch == 0:
                _mosaic = StreamingDataset(
                    remote="s3://peer/mds", local=str(local), shuffle=True, shuffle_algo="py1br",
                    shuffle_block_size=4 * samples_per_shard, shuffle_seed=0, cache_limit=capacity,
                    batch_size=args.batch_size,
                )
            return torch.utils.data.DataLoader(
                _mosaic, batch_size=args.batch_size, num_workers=args.workers,
                collate_fn=lambda b: b, persistent_workers=False,
            )

        mosaic_rows = epochs(
            mosaic_loader, args.epochs, s3_link,
            lambda epoch, moved, samples: max(0.0, 100.0 * (1 - moved / dataset_bytes)),
            dataset_bytes, "MosaicML Streaming 0.13.0",
        )

        # shardcache: hub next to the records, spoke across the same kind of link.
        quiet = dict(os.environ, RUST_LOG="warn")
        hub, hub_addr = start([str(args.bin_dir / "hub-server"), "--root", str(records), "--listen", "127.0.0.1:0"],
                              "hub-server listening on ", env=quiet)
        procs.append(hub)
        hub_link = Link(args.bin_dir, hub_addr, args.rtt, work, "hub")
        procs.append(hub_link.proc)
        spoke, rest = start(
            [str(args.bin_dir / "spoke-cache"), "--hub", f"http://{hub_link.addr}", "--cache-dir", str(work / "spoke"),
             "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--capacity", f"{capacity}B"],
            "spoke-cache listening on ",
            env=quiet,
        )
        procs.append(spoke)
        endpoint = f"http://{rest.split()[0]}"
        ours = shardcache.StreamingShardDataset(
            endpoint, "c4", batch_size=args.batch_size, seed=0, rank=0, world_size=1, shard_block=4,
            job="peer-bench", dtype=None,
        )

        def ours_loader(epoch):
            ours.set_epoch(epoch)
            return torch.utils.data.DataLoader(ours, batch_size=args.batch_size, num_workers=args.workers,
                                               collate_fn=lambda b: b)

        client = shardcache.Client(endpoint)

        def ours_hits(epoch, moved, samples):
            row = [j for j in client.status()["jobs"] if j["job"] == "peer-bench" and j["epoch"] == epoch]
            assert row and row[0]["reads"] == samples, (row, samples)
            return 100.0 * row[0]["hit_reads"] / row[0]["reads"]

        ours_rows = epochs(ours_loader, args.epochs, hub_link, ours_hits, dataset_bytes, "shardcache spoke")

        for rows in (mosaic_rows, ours_rows):
            assert all(r["samples"] == args.shards * samples_per_shard for r in rows), rows
        print()
        print(f"{args.shards} shards x {args.shard_size_mib} MiB of 16 KiB samples, cache limit {capacity >> 20} MiB, "
              f"link RTT {args.rtt}, DataLoader {args.workers} workers x batch {args.batch_size}")
        print("| epoch | MosaicML samples/s | shardcache samples/s | MosaicML link bytes / dataset | "
              "shardcache link bytes / dataset | MosaicML from cache (derived) | shardcache from cache |")
        print("|---|---|---|---|---|---|---|")
        for m, o in zip(mosaic_rows, ours_rows):
            print(f"| {m['epoch']} | {m['samples_per_s']:.0f} | {o['samples_per_s']:.0f} | "
                  f"{m['link_bytes_per_dataset']:.2f} | {o['link_bytes_per_dataset']:.2f} | "
                  f"{m['from_cache_pct']:.1f}% | {o['from_cache_pct']:.1f}% |")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"mosaic": mosaic_rows, "shardcache": ours_rows}, indent=2))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
