"""link-bench's map-style reader: shardcache.ShardDataset under
torch.utils.data.DataLoader(shuffle=True), as a new user writes it (or, `--sampler`,
with shardcache.ShardSampler, which sends the spoke its order), for `--epochs` epochs;
after each, one JSON line: the epoch, samples and bytes read, the bytes that crossed the
link toward the reader meanwhile (the WAN emulator's `to_client` counter, `--counters`:
its counters file, read once the spoke has nothing in flight and the link is still) with
the spoke's own count of what its hub connections read beside it (none straight from a
hub), seconds. Every sample is compared with the dataset's files (`--files`)."""

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
parser.add_argument("--counters", required=True, help="the WAN emulator's --counters-file")
args = parser.parse_args()

records = []
for shard in sorted(pathlib.Path(args.files).glob("*.bin")):
    data = shard.read_bytes()
    records.extend(data[i:i + 16384] for i in range(0, len(data), 16384))

client = shardcache.Client(args.endpoint)
ds = shardcache.ShardDataset(args.endpoint, args.dataset, dtype=None)
assert len(ds) == len(records), (len(ds), len(records))


def spoke_status():
    """The spoke's status; None straight from a hub."""
    try:
        return client.status()
    except shardcache.ShardcacheError as error:
        if getattr(error, "code", "") != "UNIMPLEMENTED":
            raise
        return None


# Asked once: straight from a hub, every Status call would cross the link being counted.
THROUGH_A_SPOKE = spoke_status() is not None


def settled():
    """(bytes the link delivered toward the reader, the spoke's count of what its hub
    connections read or None) once the link is still: the spoke (if any) has nothing in
    flight, and the emulator's counts did not move across a fresh write of its file (100
    ms). A condition waited for (at most 120 s), as shardcache_tests::wire waits."""
    deadline, last = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        status = client.status() if THROUGH_A_SPOKE else None
        quiet = status is None or status["fetches_in_flight"] == 0
        to_client, _, _, writes = (int(v) for v in pathlib.Path(args.counters).read_text().split())
        if quiet and last is not None and last[0] == to_client and writes > last[1]:
            return to_client, None if status is None else status["hub_bytes_received"]
        if not (quiet and last is not None and last[0] == to_client):
            last = (to_client, writes) if quiet else None
        time.sleep(0.025)
    raise SystemExit(f"the link did not settle within 120 s (last {last})")


class Indexed(torch.utils.data.Dataset):
    """The dataset with each sample's index beside it, to check it against the files."""

    def __len__(self):
        return len(ds)

    def __getitems__(self, indices):
        return list(zip(indices, ds.__getitems__(indices)))


sampler = shardcache.ShardSampler(ds, seed=0) if args.sampler else None
for epoch in range(args.epochs):
    before, started = settled(), time.monotonic()
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
    after = settled()
    received = None if after[1] is None else after[1] - before[1]
    print(json.dumps({"epoch": epoch + 1, "samples": samples, "read": samples * 16384,
                      "link": after[0] - before[0], "spoke_received": received, "seconds": seconds}), flush=True)
