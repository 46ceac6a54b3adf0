"""Type stubs of the Rust extension module (see src/lib.rs)."""

from typing import Dict, Iterator, List, Optional, Tuple, Union

def flush_traces() -> None:
    """Sends the spans this process holds to the OpenTelemetry collector now (with
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` set; the package calls it at exit)."""

class ShardcacheError(Exception):
    """A failed call. ``code`` is the gRPC code name (``"NOT_FOUND"``, ``"UNAVAILABLE"``,
    ``"PERMISSION_DENIED"``, ...), ``message`` the server's words."""

    code: str
    message: str

class Client:
    """A connection to a hub or spoke; ``https://`` endpoints use TLS. Safe to share
    between threads and to use after ``fork`` (connections are made again in the child).
    Every call releases the GIL while it waits."""

    def __init__(
        self,
        endpoint: Optional[str] = None,
        token: Optional[str] = None,
        ca: Optional[str] = None,
        cert: Optional[str] = None,
        key: Optional[str] = None,
        tls_domain: Optional[str] = None,
        token_file: Optional[str] = None,
    ) -> None:
        """Each argument left out falls back to the CLI's environment variable
        (``SHARDCACHE_ENDPOINT``, ``SHARDCACHE_TOKEN_FILE``, ``SHARDCACHE_CA``,
        ``SHARDCACHE_CERT``, ``SHARDCACHE_KEY``, ``SHARDCACHE_TLS_DOMAIN``).
        ``token_file`` is read as the CLI reads it; ``token`` is the secret itself."""
    @property
    def endpoint(self) -> str: ...
    def set_job(self, job: Optional[str], epoch: int = 0) -> None:
        """Reads from now on say they are for ``job``'s ``epoch``; ``None`` stops."""
    def ls(self, dataset: Optional[str] = None) -> List[Dict[str, Union[str, int]]]:
        """Datasets (``name``, ``shard_count``, ``total_bytes``, ``record_size``), or the
        shards of ``dataset`` (``shard``, ``size``, ``version``, ``message_size``, ...)."""
    def stat(self, dataset: str, shard: str) -> Dict[str, Union[str, int]]: ...
    def read(self, dataset: str, shard: str, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset``, checksum-verified."""
    def stream(
        self, dataset: str, shard: str, offset: int = 0, length: Optional[int] = None
    ) -> "ShardReader":
        """``[offset, offset + length)`` (to the end when ``length`` is None) as verified
        chunks: constant memory for a range of any size (``read`` is bounded by the
        server's ``--max-read``)."""
    def samples(
        self,
        dataset: str,
        format: str = "records",
        record_size: Optional[int] = None,
        seq_len: Optional[int] = None,
        dtype: Optional[str] = None,
        seed: Optional[int] = None,
        num_samples: Optional[int] = None,
        memory_budget: Optional[int] = None,
    ) -> "Samples":
        """``dataset`` as samples of any size, indexed from its format: ``"records"``
        (fixed ``record_size``, by default the dataset metadata's), ``"megatron"`` (PREFIX.bin + PREFIX.idx, a sample per
        sequence), ``"megatron-gpt"`` (one such dataset packed as Megatron's GPTDataset
        packs it: ``seq_len``, ``seed`` = its random_seed, 1234 by default, ``num_samples``), ``"mds"`` (index.json + shards, decoded with ``Samples.decode``),
        ``"webdataset"`` (tar shards, ``Samples.read_fields``), ``"parquet"`` (a sample per row, ``Samples.read_decoded``) or ``"tokens"`` (.npy files, or raw files of ``dtype``: windows of
        ``seq_len + 1`` tokens every ``seq_len``). ``memory_budget``: bytes the reader may
        hold for what it decodes (``SHARDCACHE_MEMORY_BUDGET``, else what the process may
        use: an eighth of its address-space limit, half its cgroup's or the machine's
        memory shared with a DataLoader's workers, 4 GiB at most; logged to the
        ``shardcache`` logger, and ``Samples.memory_budget``); a damaged
        file raises ``ShardcacheError`` with ``code`` ``"INVALID_ARGUMENT"`` naming the
        file and byte, one past the budget ``"RESOURCE_EXHAUSTED"``."""
    def read_many(self, ranges: List[Tuple[str, str, int, int]]) -> List[bytes]:
        """A batch of ``(dataset, shard, offset, length)`` in one round trip, in order."""
    def prefetch(
        self,
        dataset: str,
        shards: Optional[List[str]] = None,
        parallelism: int = 0,
        wait: bool = True,
    ) -> Optional[Dict[str, int]]:
        """Has a spoke fetch ``shards`` (all when None) in this order; with ``wait``, the
        final progress, else ``None`` at once."""
    def set_plan(
        self,
        job: str,
        epoch: int,
        dataset: str,
        epochs: List[List[str]],
        until: Optional[List[List[int]]] = None,
    ) -> int:
        """Tells a spoke the shard order of ``job`` (one list per epoch from ``epoch``
        on, and for each shard the last shard first read before its own last read), so it
        evicts what is read again furthest away; returns the distinct shards."""
    def plan(
        self,
        job: str,
        epoch: int,
        dataset: str,
        epochs: List[List[str]],
        until: Optional[List[List[int]]] = None,
    ) -> Dict[str, Union[int, bool]]:
        """``set_plan``, answering ``shards`` and ``samples`` (True: the spoke follows the
        plan sample by sample; send its samples with ``plan_samples``)."""
    def plan_samples(
        self,
        job: str,
        dataset: str,
        epoch_samples: int,
        reads: List[Tuple[int, str, int, int, Optional[int]]],
    ) -> Dict[str, int]:
        """Sends ``job``'s next reads sample by sample: ``(position, shard, offset, length,
        next_use)`` each; answers ``planned`` and ``window_bytes``."""
    def status(self) -> Dict[str, object]: ...
    def report_steps(
        self,
        job: str,
        rank: int,
        ranks: int,
        epoch: int,
        first_batch: int,
        wait_us: List[int],
        busy_us: List[int],
        samples: List[int],
        started_ms: int = 0,
    ) -> None:
        """Sends one rank's step timings of ``job`` (what ``shardcache.StepTimer`` measured)."""
    def report(self, job: str, principal: str = "") -> Dict[str, object]:
        """``job``'s own table: ``phases`` (samples/s, data wait, GPU utilisation, read
        latency, where reads came from, the slowest rank), ``timeline``, ``markdown``."""
    def _bench_read_many(self, ranges: List[Tuple[str, str, int, int]], rounds: int) -> float: ...

class ShardReader(Iterator[bytes]):
    """What ``Client.stream`` returns: an iterator of verified ``bytes`` chunks."""

    def __iter__(self) -> "ShardReader": ...
    def __next__(self) -> bytes: ...

class Samples:
    """What ``Client.samples`` returns: samples per shard, and their bytes on request."""

    @property
    def shards(self) -> List[str]: ...
    @property
    def counts(self) -> List[int]: ...
    @property
    def memory_budget(self) -> int:
        """The bytes this reader may hold for what it decodes (``Client.samples``'
        ``memory_budget``, ``SHARDCACHE_MEMORY_BUDGET``, or what the process may use)."""
    @property
    def units(self) -> List[Tuple[int, int, int]]:
        """What a block shuffle shuffles, ``(shard, first sample, samples)`` each: every
        shard whole, a Parquet file's row groups (each read and decoded whole)."""
    @property
    def record_size(self) -> Optional[int]:
        """The size of a record (format "records"), else None."""
    @property
    def dtype(self) -> Optional[str]:
        """The values' numpy dtype, where the format says (tokens, Megatron)."""
    @property
    def columns(self) -> Optional[List[Tuple[str, str]]]:
        """``(name, encoding)`` of each column (MDS; Parquet: its type), else None."""
    def decode(self, data: bytes, allow_unsafe_types: bool = False) -> Dict[str, object]:
        """An MDS sample's bytes as a dict of its columns (pickled ones only when allowed)."""
    def read_decoded(
        self, samples: List[Tuple[int, int]], allow_unsafe_types: bool = False
    ) -> List[Dict[str, object]]:
        """``read`` then ``decode`` (MDS), without handing the bytes to Python first; Parquet's
        rows as pyarrow's ``to_pylist`` gives them."""
    def read_fields(self, samples: List[Tuple[int, int]]) -> List[Dict[str, object]]:
        """WebDataset samples: dicts of ``__key__`` and each field's bytes."""
    def pieces(self, samples: List[Tuple[int, int]]) -> List[List[Tuple[int, int, int]]]:
        """Each sample's ranges ``(shard, offset, length)``, as a read asks for them."""
    def __len__(self) -> int: ...
    def read(self, samples: List[Tuple[int, int]]) -> List[bytes]:
        """The bytes of ``(shard number, sample number)`` pairs, in order, batched."""
    def read_writable(self, samples: List[Tuple[int, int]]) -> List[bytearray]:
        """As ``read``, each in a ``bytearray``: numpy arrays over them are writable."""

class Permutation:
    """A keyed bijection of ``range(n)``, computed per position, with its inverse."""
    def __init__(self, n: int, key: str) -> None: ...
    def __len__(self) -> int: ...
    def __getitem__(self, position: int) -> int: ...
    def position_of(self, value: int) -> int: ...
    def take(self, start: int, count: int) -> List[int]: ...

class SamplerOrder:
    """A map-style sampler's order over ranks, as ``DistributedSampler`` deals it."""
    def __init__(self, n: int, seed: int, shuffle: bool, num_replicas: int, drop_last: bool) -> None: ...
    @property
    def places(self) -> int: ...
    @property
    def per_rank(self) -> int: ...
    def rank_places(self, rank: int, base: int, start: int, count: int) -> List[int]: ...
    def rank_samples(self, epoch: int, rank: int, base: int, start: int, count: int) -> List[int]: ...
    def place_of(self, epoch: int, sample: int) -> Optional[int]: ...
