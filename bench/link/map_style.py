"""link-bench's map-style reader: shardcache.ShardDataset under
torch.utils.data.DataLoader(shuffle=True), as a new user writes it (or, `--sampler`,
with shardcache.ShardSampler, which sends the spoke its order), for `--epochs` epochs;
after each, one JSON line: the epoch, samples and bytes read, the bytes the spoke's
fetches took on the link meanwhile (its status; straight from a hub, which has none,
every byte read), seconds. Every sample is compared with the dataset's files
(`--files`)."""

import argparse
import json
import pathlib
import time

import torch

import shardcache

parser = argparse.ArgumentParser()
parser.add_argument("--endpoint", required=True)
parser.add_argument("--dataset", required=True)
parser.add_argument("--files", required=True)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--sampler", action="store_true", help="shardcache.ShardSampler instead of shuffle=True")
args = parser.parse_args()

records = []
for shard in sorted(pathlib.Path(args.files).glob("*.bin")):
    data = shard.read_bytes()
    records.extend(data[i:i + 16384] for i in range(0, len(data), 16384))

client = shardcache.Client(args.endpoint)
ds = shardcache.ShardDataset(args.endpoint, args.dataset, dtype=None)
assert len(ds) == len(records), (len(ds), len(records))


def on_the_link():
    """What the spoke's fetches took on the link so far; None straight from a hub."""
    try:
        return client.status()["datasets"].get(args.dataset, {}).get("upstream_wire_bytes", 0)
    except shardcache.ShardcacheError as error:
        if getattr(error, "code", "") != "UNIMPLEMENTED":
            raise
        return None


class Indexed(torch.utils.data.Dataset):
    """The dataset with each sample's index beside it, to check it against the files."""

    def __len__(self):
        return len(ds)

    def __getitems__(self, indices):
        return list(zip(indices, ds.__getitems__(indices)))


sampler = shardcache.ShardSampler(ds, seed=0) if args.sampler else None
for epoch in range(args.epochs):
    before, started = on_the_link(), time.monotonic()
    if sampler is not None:
        sampler.set_epoch(epoch)
        shuffling = {"sampler": sampler}
    else:
        shuffling = {"shuffle": True, "generator": torch.Generator().manual_seed(epoch)}
    loader = torch.utils.data.DataLoader(
        Indexed(), batch_size=args.batch_size, num_workers=args.workers, collate_fn=list,
        persistent_workers=False, **shuffling,
    )
    samples = 0
    for batch in loader:
        for index, sample in batch:
            assert sample == records[index], f"sample {index} differs from the files"
            samples += 1
    seconds = time.monotonic() - started
    after = on_the_link()
    link = samples * 16384 if after is None else after - before
    print(json.dumps({"epoch": epoch + 1, "samples": samples, "read": samples * 16384,
                      "link": link, "seconds": seconds}), flush=True)
