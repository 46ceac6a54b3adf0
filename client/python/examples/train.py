"""A training loop reading from a spoke with StreamingShardDataset.

    python examples/train.py --endpoint http://127.0.0.1:7071 --dataset c4 --epochs 2

With torch installed it uses a DataLoader with workers; without, it iterates the
dataset directly. Either way each epoch reads every record once (across ranks when
RANK/WORLD_SIZE are set), in a shuffled order the spoke prefetches ahead of, and it
checkpoints its position so a restart resumes mid-epoch.
"""

import argparse
import json
import pathlib
import time

import shardcache


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", default="http://127.0.0.1:7071")
    parser.add_argument("--dataset", default="c4-synthetic")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=24)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint", default="train-state.json")
    args = parser.parse_args()

    ds = shardcache.StreamingShardDataset(args.endpoint, args.dataset, batch_size=args.batch_size, seed=42)
    checkpoint = pathlib.Path(args.checkpoint)
    start_epoch = 0
    if checkpoint.exists():
        state = json.loads(checkpoint.read_text())
        ds.load_state_dict(state)
        start_epoch = state["epoch"]
        done = state.get("sample_in_epoch", state["consumed"])
        print(f"resuming epoch {start_epoch} after {done} samples (all ranks)")

    try:
        import torch

        def batches():
            return torch.utils.data.DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers)
    except ImportError:

        def batches():
            batch = []
            for sample in ds:
                batch.append(sample)
                if len(batch) == args.batch_size:
                    yield batch
                    batch = []
            if batch:
                yield batch

    for epoch in range(start_epoch, args.epochs):
        if epoch != start_epoch:
            ds.set_epoch(epoch)
        consumed = ds.state_dict()["consumed"]
        started = time.monotonic()
        samples = 0
        for batch in batches():
            n = len(batch)
            samples += n
            consumed += n
            # ... forward/backward on `batch` (int64 token windows) ...
            checkpoint.write_text(json.dumps(ds.state_dict(consumed=consumed)))
        secs = time.monotonic() - started
        print(f"epoch {epoch}: {samples} samples in {secs:.2f} s ({samples / max(secs, 1e-9):.0f} samples/s)")
        ds.set_epoch(epoch + 1)
        checkpoint.write_text(json.dumps(ds.state_dict()))


if __name__ == "__main__":
    main()
