"""shardcache: read dataset shards from a shardcache spoke (or hub) from Python.

    import shardcache
    client = shardcache.Client("http://127.0.0.1:7071")
    sample = client.read("c4", "shard-00000.bin", 0, 16384)   # bytes, CRC32C-verified

Datasets for training loops (PyTorch's DataLoader when torch is installed, plain
iteration without it):

- :class:`ShardDataset`, map-style: ``len(ds)``, ``ds[i]`` -> the i-th record; with
  :class:`ShardSampler` (a drop-in for ``RandomSampler`` and ``DistributedSampler``) the
  spoke is told the order it reads, fetches ahead and keeps what is read again;
- :class:`StreamingShardDataset`, iterable: deterministic shard- and sample-level
  shuffle from ``(seed, epoch)``, split across ranks and DataLoader workers without
  overlap, resumable mid-epoch, and it tells the spoke the epoch's order so prefetch
  follows it.

How long the loop waits on data, per phase and rank, in the spoke's own table of the
job: ``for batch in shardcache.timed(loader, client, job="train"): ...``, then
``client.report("train")`` (or ``shardcache report train``).

Traces: with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set (an OpenTelemetry collector's OTLP/gRPC
address), every call is exported as a span, the parent of the spoke's and the hub's
spans of it, from DataLoader workers too (README, "Traces").

Errors are :class:`ShardcacheError` with ``.code`` (the gRPC code, e.g. ``"NOT_FOUND"``)
and ``.message``.
"""

import atexit

from ._native import Client, ShardcacheError, flush_traces
from .datasets import ShardDataset, StreamingShardDataset
from .sampler import ShardSampler
from .steps import StepTimer, timed

__all__ = [
    "Client", "ShardcacheError", "ShardDataset", "ShardSampler", "StepTimer", "StreamingShardDataset", "timed",
]

# What the process's calls left in the trace exporter's batch goes out before it ends.
atexit.register(flush_traces)
