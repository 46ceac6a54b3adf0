"""PyTorch-ready datasets over a dataset's samples, in the format it already has:
``format="records"`` (fixed-size records: the seed's 16 KiB token windows, the default),
``"megatron"`` (Megatron-LM's PREFIX.bin + PREFIX.idx: a sample per sequence), ``"mds"``
(MosaicML Streaming's index.json + shards: a dict of columns per sample),
``"webdataset"`` (tar shards: a dict of ``__key__`` and fields' bytes), ``"parquet"``
(a dict of columns per row, as pyarrow's ``to_pylist`` gives them) or ``"tokens"``
(.npy files, or raw files of ``dtype``: windows of ``seq_len + 1`` tokens every
``seq_len``, across files). The index comes from the format itself, read through the
spoke (``Client.samples``).

Both work with ``torch.utils.data.DataLoader`` when torch is installed and as plain
Python objects without it. With numpy, a record is read as values of ``dtype`` (how the
dataset stores them: the seed's tokens are ``uint32``) and handed out as a writable array
of ``tensor_dtype`` (``int64`` by default: what ``nn.Embedding`` takes; ``None`` keeps
``dtype``), so the DataLoader makes tensors of it without PyTorch's warning about
read-only arrays. ``dtype=None`` (or no numpy) hands out ``bytes``.

How :class:`StreamingShardDataset` orders and splits an epoch:

1. The *epoch order*: shards shuffled by ``(seed, epoch)`` and cut into blocks of
   ``shard_block`` shards; the records of each block shuffled together by ``(seed,
   epoch, block)``, block after block (a block shuffle, as MosaicML Streaming's
   ``py1b``). A batch mixes records of several shards, reads stay within one block of
   shards at a time (what a read-through cache and its prefetch like), and the order is
   the same in every process that has the same ``(seed, epoch)``. ``shard_block=1``
   reads shard after shard. A Parquet file's unit is its row group, not the file (a row
   group is read and decoded whole: a block of files would mix hundreds of them). The
   order is computed a position at a time, never listed (:mod:`shardcache.order`): an
   epoch of billions of samples costs each worker its blocks, not its samples.
2. *Ranks*: record ``k`` of the epoch order goes to rank ``k % world_size``.
3. *Resume*: a state records ``sample_in_epoch``, the records of the epoch order all
   ranks have consumed together (each rank's count times the world size: with rank
   ``r`` taking record ``k`` when ``k % world_size == r``, ranks that have each taken
   ``n`` have taken exactly the first ``n * world_size``). A resumed run skips that
   prefix and deals the rest to *its* ranks, so it may have another world size and
   another number of workers (as MosaicML Streaming's ``sample_in_epoch``).
4. *Workers*: the rest is cut into blocks of ``batch_size``; block ``b`` goes to
   DataLoader worker ``b % num_workers``. DataLoader takes batches from its workers in
   turn, so the batches a trainer has consumed are always a prefix of the rank's
   sequence: resuming after ``n`` batches (``consumed = n * batch_size``) neither repeats
   nor skips a record.
"""

import bisect
import itertools
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ._native import Client, ShardcacheError
from ._torch import dataset_bases, loader_batch_size, rank_and_world, worker
from . import order as order_module
from .epochs import EpochState
from .order import EpochOrder
from .plans import SAMPLE_RANGES_FORMATS, SampleWindow, follows_samples, planned_reads

# The epoch order's version in a saved state (2: computed per position, shardcache.order).
ORDER_VERSION = 2

# Samples of a worker's share a plan follows one by one; past them, block by block (a
# plan of the whole share of a huge epoch would take as long as reading its order).
PLANNED_SAMPLES = 1 << 16

try:  # numpy is optional: without it records are bytes
    import numpy as _np
except ImportError:  # pragma: no cover - exercised where numpy is absent
    _np = None


_MapBase, _IterableBase = dataset_bases()


class _Records:
    """The samples of one dataset: shard names, samples per shard, the native index
    (``Client.samples``: where each sample's bytes are, from the dataset's format) and a
    lazy client, both made again in each DataLoader worker."""

    def __init__(
        self,
        endpoint: str,
        dataset: str,
        record_size: Optional[int],
        dtype: Optional[str],
        client_args: Dict[str, Any],
        tensor_dtype: Optional[str] = "int64",
        format: str = "records",
        seq_len: Optional[int] = None,
        allow_unsafe_types: bool = False,
    ):
        self.endpoint = endpoint
        self.format = format
        self.allow_unsafe_types = allow_unsafe_types
        self.dataset = dataset
        self.client_args = client_args
        self._client: Optional[Client] = None
        self._samples: Any = None
        # Raw token files say nothing of their dtype: it is the format's option then.
        raw_dtype = dtype if format == "tokens" and dtype not in (None, "auto") else None
        self.format_args = dict(format=format, record_size=record_size, seq_len=seq_len, dtype=raw_dtype)
        try:
            samples = self.samples
        except ShardcacheError as error:
            if "has no record_size" in str(error):
                raise ValueError(error.message) from None
            raise
        # Records without a record_size take the dataset's metadata's (one round trip
        # fewer than listing first); workers then ask for that size.
        self.record_size = samples.record_size
        self.format_args["record_size"] = self.record_size
        self.shards: List[str] = list(samples.shards)
        self.counts: List[int] = list(samples.counts)
        # What the block shuffle shuffles: (shard, first sample, samples) each.
        self.units: List[Tuple[int, int, int]] = list(samples.units)
        self.starts: List[int] = []
        total = 0
        for count in self.counts:
            self.starts.append(total)
            total += count
        self.total = total
        # MDS, Parquet and WebDataset samples are dicts (of columns, of fields), made natively.
        columnar = samples.columns is not None or format == "webdataset"
        self.dtype = self._value_dtype(dtype, samples.dtype) if _np is not None and not columnar else None
        self.tensor_dtype = tensor_dtype

    def _value_dtype(self, asked: Optional[str], format_dtype: Optional[str]) -> Optional[str]:
        """How the values are stored: the format's dtype where it says (Megatron, .npy),
        else ``asked`` ("auto": the seed's uint32 records)."""
        if asked is None:
            return None
        if format_dtype is not None:
            if asked not in ("auto", format_dtype):
                raise ValueError(f"dtype={asked!r}, but the dataset's files say {format_dtype}")
            return format_dtype
        dtype = "uint32" if asked == "auto" else asked
        size = _np.dtype(dtype).itemsize
        if self.record_size and self.record_size % size:
            raise ValueError(
                f"record_size {self.record_size} is not a multiple of {dtype}'s {size} bytes: each record "
                f"would end mid-value; dtype is how the dataset stores its values (e.g. uint32 for the "
                f"seed's tokens), tensor_dtype what you get"
            )
        return dtype

    @property
    def client(self) -> Client:
        # Made on first use, so a dataset pickled into DataLoader workers connects there.
        if self._client is None:
            self._client = Client(self.endpoint, **self.client_args)
        return self._client

    @property
    def samples(self) -> Any:
        if self._samples is None:
            samples = self.client.samples(self.dataset, **self.format_args)
            if hasattr(self, "counts") and (list(samples.shards), list(samples.counts)) != (self.shards, self.counts):
                raise RuntimeError(
                    f"dataset {self.dataset!r} changed after this dataset object was made (its shards or "
                    f"their samples differ in this worker): make the dataset object again"
                )
            self._samples = samples
        return self._samples

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        state["_samples"] = None
        state.pop("_tag", None)
        return state

    def locate(self, index: int) -> Tuple[int, int]:
        """(shard number, sample number inside it) of a global sample index."""
        if not 0 <= index < self.total:
            raise IndexError(f"record {index} is outside 0..{self.total}")
        shard = bisect.bisect_right(self.starts, index) - 1
        return shard, index - self.starts[shard]

    def load(self, items: List[Tuple[int, int]]) -> List[Any]:
        """``items`` ((shard, sample) each), read in batched calls and decoded."""
        if self.format == "webdataset":
            return self.samples.read_fields(items)
        if self.format in ("mds", "parquet"):
            return self.samples.read_decoded(items, allow_unsafe_types=self.allow_unsafe_types)
        if self.dtype is not None and _np.dtype(self.tensor_dtype or self.dtype) == _np.dtype(self.dtype):
            # Handed out as stored: arrays over writable buffers the SDK filled, no copy.
            return [_np.frombuffer(data, dtype=self.dtype) for data in self.samples.read_writable(items)]
        return [self.decode(data) for data in self.samples.read(items)]

    def decode(self, data: bytes) -> Any:
        if self.dtype is None:
            return data
        values = _np.frombuffer(data, dtype=self.dtype)
        # Values of another dtype: converted (a copy). Of the stored dtype, `load` reads
        # them into writable buffers instead (frombuffer's array over bytes is read-only,
        # and torch warns of it).
        return values.astype(self.tensor_dtype or self.dtype)


class ShardDataset(_MapBase):
    """Map-style dataset of a dataset's samples, in shard-name order: fixed-size records
    by default, or the samples of any format the module names (``format=``).

    ``ds[i]`` reads sample ``i`` (one request); ``ds.get_batch(indices)`` reads many in
    one round trip, and so does a ``DataLoader``'s batch (its fetcher calls
    ``__getitems__``). Split it across ranks and shuffle it with
    :class:`shardcache.ShardSampler` (a drop-in for ``RandomSampler`` and
    ``DistributedSampler`` that tells the spoke the order it reads, so that a spoke
    smaller than the dataset fetches the next samples ahead and keeps what is read
    again), or with any sampler.

    Reads say they are for job ``job`` (default: ``"DATASET"``; a ShardSampler names its
    own) and the epoch :meth:`set_epoch` chose, so a spoke reports them per job and epoch.
    """

    def __init__(
        self,
        endpoint: str,
        dataset: str,
        record_size: Optional[int] = None,
        dtype: Optional[str] = "auto",
        tensor_dtype: Optional[str] = "int64",
        format: str = "records",
        seq_len: Optional[int] = None,
        allow_unsafe_types: bool = False,
        job: Optional[str] = None,
        **client_args: Any,
    ):
        self._records = _Records(
            endpoint, dataset, record_size, dtype, client_args, tensor_dtype, format=format, seq_len=seq_len,
            allow_unsafe_types=allow_unsafe_types,
        )
        self.job = job or dataset
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch reads say they are for (a ShardSampler sets it with its own)."""
        self.epoch = epoch

    def _tagged(self) -> "_Records":
        records = self._records
        if getattr(records, "_tag", None) != (self.job, self.epoch):
            records.client.set_job(self.job, self.epoch)
            records._tag = (self.job, self.epoch)
        return records

    def __len__(self) -> int:
        return self._records.total

    def __getitem__(self, index: int) -> Any:
        records = self._tagged()
        if index < 0:
            index += records.total
        return records.load([records.locate(index)])[0]

    def get_batch(self, indices: List[int]) -> List[Any]:
        records = self._tagged()
        return records.load([records.locate(i) for i in indices])

    def __getitems__(self, indices: List[int]) -> List[Any]:
        """A batch in one round trip: what ``torch.utils.data.DataLoader`` asks a map-style
        dataset for when it has this method (PyTorch 2.0 and later), in place of one
        ``ds[i]`` (one request, one round trip to a far spoke) per sample."""
        return self.get_batch(indices)


class StreamingShardDataset(EpochState, _IterableBase):
    """Iterable dataset: each record of an epoch exactly once across ranks and workers,
    in a deterministic shuffled order; see the module docs for how it is split.

    ``batch_size`` must be the DataLoader's, for exact resumption (a DataLoader with
    another is refused when iteration starts). Epochs advance by themselves each time
    the dataset is iterated again; :meth:`set_epoch` chooses one.

    Reads say they are for job ``job`` (default: ``"DATASET:SEED"``) and the current
    epoch, so a spoke reports reads, hits and hub bytes per job and epoch
    (``Client.status()["jobs"]``, ``shardcache status``).

    ``plan=True`` sends the spoke this worker's access plan when iteration starts: its
    shards for the rest of this epoch and the next, in the order of their first reads,
    and which are read together (a block), as ``JOB/rankR/workerW``. The spoke then
    prefetches the shards read next and, when it is smaller than the dataset, evicts
    what is read again furthest away. Where a block does not fit the spoke's cache (a
    uniform shuffle: ``shard_block`` = the number of shards), the spoke says so and the
    worker sends its next samples as it reads (``shardcache.plans``): the spoke fetches
    them ahead in batches and keeps for the next epoch what it can, never whole shards. A server that takes no plans (a hub, an older
    spoke) is told nothing more, and a plan the spoke refuses is a warning, never a
    failed epoch. ``prefetch=True`` (used when no plan was taken) asks the spoke to
    fetch this worker's shards in epoch order instead.
    """

    def __init__(
        self,
        endpoint: str,
        dataset: str,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        record_size: Optional[int] = None,
        dtype: Optional[str] = "auto",
        prefetch: bool = True,
        read_batch: int = 32,
        plan: bool = True,
        job: Optional[str] = None,
        shard_block: int = 4,
        tensor_dtype: Optional[str] = "int64",
        format: str = "records",
        seq_len: Optional[int] = None,
        allow_unsafe_types: bool = False,
        **client_args: Any,
    ):
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if shard_block <= 0:
            raise ValueError("shard_block must be positive")
        self.shard_block = shard_block
        self.plan = plan
        self.job = job
        self._records = _Records(
            endpoint, dataset, record_size, dtype, client_args, tensor_dtype, format=format, seq_len=seq_len,
            allow_unsafe_types=allow_unsafe_types,
        )
        default_rank, default_world = rank_and_world()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside 0..{self.world_size}")
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.prefetch = prefetch
        self.read_batch = read_batch
        # Records of the epoch order consumed before this layout of ranks (a resumed
        # state's sample_in_epoch), this rank's since, and the epoch (``epochs.py``).
        self._init_epochs()

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch (its order); starts it from the beginning. Optional where
        the dataset object itself is iterated (``num_workers=0``, ``persistent_workers``):
        each iteration after the first runs the next epoch."""
        self._choose(epoch)

    def state_dict(self, consumed: Optional[int] = None) -> Dict[str, int]:
        """Where the job is: ``consumed`` records this rank has taken since the epoch
        started, or since :meth:`load_state_dict` when it was resumed (the trainer's
        count: batches done x batch_size; every rank has taken as many, as in
        data-parallel training). ``sample_in_epoch`` is what every rank has taken, in
        all; a state resumes under any world size and number of workers."""
        consumed, place = self._place(consumed, self.world_size)
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "sample_in_epoch": place,
            "consumed": consumed,
            "world_size": self.world_size,
            "order": ORDER_VERSION,
        }

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Resumes where ``state`` was saved, whatever world size saved it; the next
        iteration skips the records all ranks had consumed and deals the rest to this
        run's ranks and workers."""
        self.seed = state["seed"]
        self.epoch = state["epoch"]
        if "order" not in state and state.get("sample_in_epoch", state.get("consumed", 0)):
            # Saved before the order was computed: blocks of more than LISTED_BLOCK samples
            # were shuffled another way then, so the rest of that epoch would not be its rest.
            big = [b.size for b in self._order().blocks if b.size > order_module.LISTED_BLOCK]
            if big:
                warnings.warn(
                    f"shardcache: this state was saved by a version that shuffled blocks of more than "
                    f"{order_module.LISTED_BLOCK} samples another way ({len(big)} such blocks here): the rest "
                    f"of epoch {self.epoch} may repeat or skip samples of them; later epochs are exact",
                    stacklevel=2,
                )
        if "sample_in_epoch" in state:
            base = state["sample_in_epoch"]
        else:  # a state saved before sample_in_epoch: each rank's count
            base = state["consumed"] * state.get("world_size", self.world_size)
        self._choose(self.epoch, base)

    def __len__(self) -> int:
        """Records this rank reads in an epoch (from the start)."""
        total = self._records.total
        return total // self.world_size + (1 if self.rank < total % self.world_size else 0)

    def _job(self) -> str:
        return self.job or f"{self._records.dataset}:{self.seed}"

    def _order(self, epoch: Optional[int] = None) -> EpochOrder:
        epoch = self.epoch if epoch is None else epoch
        return EpochOrder(self._records.units, self.seed, epoch, self.shuffle, self.shard_block)

    def _positions(self, order: EpochOrder, worker_id: int, num_workers: int, fresh: bool = False) -> Iterator[int]:
        """This worker's positions of ``order``: from where this run stands, or from the
        start of the epoch (``fresh``: the next epoch's)."""
        base, consumed = (0, 0) if fresh else (self.base, self.consumed)
        return order.positions(base, self.rank, self.world_size, consumed, self.batch_size, worker_id, num_workers)

    def _plan(self, order: EpochOrder, positions: Iterator[int]) -> Tuple[List[str], List[int]]:
        """The plan of reading ``positions``: shards in the order of their first read, and
        for each the index of the last shard first read before its own last read."""
        shards, until = order.plan(positions, PLANNED_SAMPLES)
        names = self._records.shards
        return [names[s] for s in shards], until

    def _send_plan(self, now_order: EpochOrder, worker_id: int, num_workers: int) -> Optional[Dict[str, Any]]:
        """Sends this worker's plan for the rest of this epoch (``now_order``) and the
        next; returns the spoke's answer (``shards``, ``samples``), or None when it took
        none."""
        then_order = self._order(self.epoch + 1)
        now, now_until = self._plan(now_order, self._positions(now_order, worker_id, num_workers))
        then, then_until = self._plan(then_order, self._positions(then_order, worker_id, num_workers, fresh=True))
        records = self._records
        try:
            job = f"{self._job()}/rank{self.rank}/worker{worker_id}"
            return records.client.plan(job, self.epoch, records.dataset, [now, then], [now_until, then_until])
        except ShardcacheError as error:
            # A plan is a hint: without it the spoke evicts least recently used. A server
            # that takes no plans says UNIMPLEMENTED; anything else is worth a warning.
            if getattr(error, "code", "") != "UNIMPLEMENTED":
                warnings.warn(f"shardcache: the spoke did not take the access plan: {error}", stacklevel=2)
            return None

    def _sample_window(self, order: EpochOrder, worker_id: int, num_workers: int) -> Optional[SampleWindow]:
        """This worker's reads sent to a spoke that follows the plan sample by sample:
        positions across epochs, each sample's next use the start of the next epoch's block
        that reads it (``shardcache.plans``)."""
        records = self._records
        if records.format not in SAMPLE_RANGES_FORMATS:
            return None
        then_order = self._order(self.epoch + 1)
        size = len(order)
        now_base, then_base = self.epoch * size, (self.epoch + 1) * size

        def next_use(sample: Tuple[int, int]) -> int:
            # +1: position 0 means "none" on the wire, and a next use is never that.
            return then_base + then_order.block_start_of(*sample) + 1

        positions = self._positions(order, worker_id, num_workers)
        planned = planned_reads(positions, now_base, lambda p: order[p], next_use)
        job = f"{self._job()}/rank{self.rank}/worker{worker_id}"
        return SampleWindow(records, job, size, planned)
    def epoch_order(self) -> List[Tuple[int, int]]:
        """(shard number, record number) of every record, in this epoch's order, as a
        list (to look at; iterating the dataset never lists the order: see
        :mod:`shardcache.order`)."""
        return list(self._order())

    def iter_indices(self, worker_id: int = 0, num_workers: int = 1) -> Iterator[Tuple[int, int]]:
        """The records worker ``worker_id`` of ``num_workers`` reads, in order, computed
        one at a time."""
        order = self._order()
        return order.items(self._positions(order, worker_id, num_workers))

    def indices(self, worker_id: int = 0, num_workers: int = 1) -> List[Tuple[int, int]]:
        """:meth:`iter_indices` as a list."""
        return list(self.iter_indices(worker_id, num_workers))

    def __iter__(self) -> Iterator[Any]:
        loader_batch = loader_batch_size()
        if loader_batch is not None and loader_batch != self.batch_size:
            raise ValueError(
                f"the DataLoader's batch_size={loader_batch} is not the dataset's batch_size="
                f"{self.batch_size}: give both the same (workers hand out whole blocks of the "
                f"dataset's batch_size, which exact resumption counts on)"
            )
        self._begin_iteration()
        worker_id, num_workers = worker()
        records = self._records
        records.client.set_job(self._job(), self.epoch)
        order = self._order()
        if next(self._positions(order, worker_id, num_workers), None) is None:
            return  # nothing left for this worker this epoch
        answer = self._send_plan(order, worker_id, num_workers) if self.plan else None
        if self.prefetch and answer is None:
            shards, _ = self._plan(order, self._positions(order, worker_id, num_workers))
            records.client.prefetch(records.dataset, shards, wait=False)
        # A block larger than the spoke's cache: the spoke follows this worker's samples.
        window = self._sample_window(order, worker_id, num_workers) if follows_samples(answer) else None
        items = order.items(self._positions(order, worker_id, num_workers))
        while True:
            batch = list(itertools.islice(items, self.read_batch))
            if not batch:
                return
            if window is not None:
                window.read(len(batch))
            yield from records.load(batch)
