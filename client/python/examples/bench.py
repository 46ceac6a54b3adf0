"""Samples/s from Python vs the Rust SDK on the same warm spoke (issue target: >= 80%).

    python examples/bench.py --endpoint http://127.0.0.1:7071 --dataset c4-synthetic

Reads batches of 24 random 16 KiB records with read_many, through Python (bytes objects
handed to Python, as a DataLoader gets them) and with the same batches in a loop inside
the extension (the Rust SDK with no Python per batch), alternating in short rounds so
that the machine's noise (a shared VM) falls on both alike. Prints a markdown table.
"""

import argparse
import random
import time

import shardcache


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", default="http://127.0.0.1:7071")
    parser.add_argument("--dataset", default="c4-synthetic")
    parser.add_argument("--batches", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=24)
    args = parser.parse_args()

    client = shardcache.Client(args.endpoint)
    shards = client.ls(args.dataset)
    record = int(shards[0]["record_size"]) or 16384
    rng = random.Random(0)
    batch = []
    for _ in range(args.batch_size):
        s = rng.choice(shards)
        batch.append((args.dataset, s["shard"], rng.randrange(int(s["size"]) // record) * record, record))
    client.prefetch(args.dataset)  # warm
    for _ in range(50):
        client.read_many(batch)

    per_round = max(1, args.batches // args.rounds)
    python_secs = rust_secs = 0.0
    for _ in range(args.rounds):
        started = time.perf_counter()
        for _ in range(per_round):
            client.read_many(batch)
        python_secs += time.perf_counter() - started
        rust_secs += client._bench_read_many(batch, per_round)
    args.batches = per_round * args.rounds

    samples = args.batches * args.batch_size
    py_rate, rust_rate = samples / python_secs, samples / rust_secs
    print("| reader | samples/s | MB/s | Python / Rust |")
    print("|---|---|---|---|")
    print(f"| Rust SDK (read_many loop in the extension) | {rust_rate:.0f} | {rust_rate * record / 1e6:.0f} | |")
    print(f"| Python `Client.read_many` | {py_rate:.0f} | {py_rate * record / 1e6:.0f} | {py_rate / rust_rate:.0%} |")


if __name__ == "__main__":
    main()
