"""The fuzz harness's oracle against the formats' reference readers: damaged inputs the
SDK read whole (saved by ``fuzz-bench --accepted DIR``) read again, through a real hub
and the Python SDK as a trainer reads them, and by each format's reference reader
(numpy, megatron-core's ``IndexedDataset``, MosaicML Streaming, webdataset, pyarrow).

Each input ends in one of:

- ``same``: both read it, the same samples (values, dtypes, keys, fields);
- ``differ``: both read it, other samples: a failure (silently wrong samples);
- ``reference refused``: we read samples the reference reader refuses to give: listed
  with the reference's reason, to judge (a reference may refuse what the format allows);
- ``both refused``: refused here by the SDK too (the harness reads at most 512 samples
  of an input and does not make Python values; this reads them all, as Python's);
- ``ours refused``: refused by the SDK here, read by the reference;
- ``not compared``: Megatron GPT packing (its reference needs a whole GPTDataset
  configuration: compared on valid files in client/python/tests/test_formats.py).

The reference readers run in a child process, one a target, so a crash or a hang of a
reference (C code reading a damaged file) is counted against that input, not this run.

    target/release/fuzz-bench --inputs 100000 --accepted /tmp/accepted --keep 300
    ~/.cache/shardcache/venv/bin/python tests/fuzz/differential.py /tmp/accepted target/release/hub-server
"""

import collections
import decimal
import json
import math
import os
import pathlib
import pickle
import shutil
import subprocess
import sys
import tempfile
import warnings

SEQ_LEN = 16  # the harness's token windows (tests/fuzz/src/lib.rs: targets)

# target -> the SDK's Client.samples options (as the harness reads it).
OPTIONS = {
    "npy": dict(format="tokens", seq_len=SEQ_LEN),
    "raw-tokens": dict(format="tokens", seq_len=SEQ_LEN, dtype="uint16"),
    "megatron": dict(format="megatron"),
    "mds": dict(format="mds"),
    "mds-zstd": dict(format="mds"),
    "mds-gz": dict(format="mds"),
    "mds-snappy": dict(format="mds"),
    "webdataset": dict(format="webdataset"),
    "webdataset-gnu": dict(format="webdataset"),
    "parquet": dict(format="parquet"),
}
NOT_COMPARED = {"megatron-gpt"}
CASE_TIMEOUT_S = 60


def target_of(case: str) -> str:
    return case.rsplit("-", 1)[0]


# ---- the reference readers (run in the child) ----

def windows(tokens):
    import numpy as np
    if len(tokens) < SEQ_LEN + 1:
        return []
    count = (len(tokens) - (SEQ_LEN + 1)) // SEQ_LEN + 1
    # Copies: a view would outlive the memmap it looks into when pickled to the parent.
    return [np.array(tokens[g * SEQ_LEN: g * SEQ_LEN + SEQ_LEN + 1]) for g in range(count)]


def reference(target: str, folder: pathlib.Path):
    """The samples the reference reader gives for the dataset in ``folder``."""
    import numpy as np
    names = sorted(p.name for p in folder.iterdir())
    if target == "npy":
        arrays = [np.load(folder / n, allow_pickle=False) for n in names if n.endswith(".npy")]
        if any(a.ndim != 1 for a in arrays) or len({a.dtype for a in arrays}) > 1:
            raise ValueError("not one-dimensional token arrays of one dtype")
        return windows(np.concatenate(arrays))
    if target == "raw-tokens":
        return windows(np.concatenate([np.memmap(folder / n, dtype=np.uint16, mode="r") for n in names]))
    if target == "megatron":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.datasets.indexed_dataset import IndexedDataset
        out = []
        for n in names:
            if n.endswith(".idx"):
                ds = IndexedDataset(str(folder / n[:-4]))
                out += [np.array(ds[k]) for k in range(len(ds))]  # copies, as above
        return out
    if target.startswith("mds"):
        return mds_reference(folder)
    if target.startswith("webdataset"):
        import webdataset as wds
        urls = [str(folder / n) for n in names if n.endswith(".tar")]
        return [{k: v for k, v in s.items() if k == "__key__" or not k.startswith("__")}
                for s in wds.WebDataset(urls, shardshuffle=False)]
    if target == "parquet":
        import pyarrow.parquet as pq
        rows = []
        for n in names:
            rows += pq.read_table(folder / n).to_pylist()
        return rows
    raise ValueError(f"no reference for {target}")


def mds_reference(folder: pathlib.Path):
    """MosaicML Streaming's reader: its own decompression (``streaming.base.compression``)
    into the raw shards its ``LocalDataset`` reads, then every sample."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from streaming import LocalDataset
        from streaming.base.compression import decompress
    with tempfile.TemporaryDirectory() as tmp:
        index = json.loads((folder / "index.json").read_text())
        for shard in index["shards"]:
            raw = shard["raw_data"]["basename"]
            zipped = shard.get("zip_data")
            if zipped:
                data = decompress(shard["compression"], (folder / zipped["basename"]).read_bytes())
                pathlib.Path(tmp, raw).write_bytes(data)
            else:
                shutil.copy(folder / raw, pathlib.Path(tmp, raw))
        shutil.copy(folder / "index.json", pathlib.Path(tmp, "index.json"))
        ds = LocalDataset(local=tmp)
        return [ds[i] for i in range(len(ds))]


def child(target: str, root: str, cases, out: str) -> None:
    """Reads each case with the reference; appends (case, result) pickles to ``out``."""
    import signal

    def hung(*_):
        raise TimeoutError(f"the reference ran past {CASE_TIMEOUT_S} s")

    signal.signal(signal.SIGALRM, hung)
    with open(out, "ab") as sink:
        for case in cases:
            signal.alarm(CASE_TIMEOUT_S)
            try:
                result = ("read", reference(target, pathlib.Path(root) / case))
            except Exception as error:  # a refusal, whatever its class
                result = ("refused", f"{type(error).__name__}: {error}"[:300])
            signal.alarm(0)
            pickle.dump((case, result), sink)
            sink.flush()


def references(target: str, root: str, cases):
    """{case: ("read", samples) | ("refused", why)} from child processes; a case a child
    died or hung on is ("refused", "the reference crashed/hung") and the rest go on."""
    results = {}
    todo = list(cases)
    while todo:
        with tempfile.NamedTemporaryFile(suffix=".pickle", delete=False) as f:
            out = f.name
        proc = subprocess.Popen([sys.executable, __file__, "--child", target, root, out, *todo])
        try:
            proc.wait(timeout=CASE_TIMEOUT_S * (len(todo) + 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with open(out, "rb") as f:
            while True:
                try:
                    case, result = pickle.load(f)
                except EOFError:
                    break
                results[case] = result
        os.unlink(out)
        done = [c for c in todo if c in results]
        rest = todo[len(done):]
        if rest:  # the child stopped on rest[0]
            results[rest[0]] = ("refused", f"the reference process ended (exit {proc.returncode}) on it")
            rest = rest[1:]
        todo = rest
    return results


# ---- ours, through a hub ----

def ours(client, case: str):
    options = OPTIONS[target_of(case)]
    samples = client.samples(case, **options)
    items = [(s, k) for s, count in enumerate(samples.counts) for k in range(count)]
    out = []
    for i in range(0, len(items), 64):
        batch = items[i:i + 64]
        if options["format"] == "webdataset":
            out += samples.read_fields(batch)
        elif options["format"] in ("mds", "parquet"):
            out += samples.read_decoded(batch)
        else:
            import numpy as np
            out += [np.frombuffer(data, dtype=samples.dtype) for data in samples.read(batch)]
    return out


def same(a, b) -> bool:
    """The same samples: arrays of one dtype, shape and values; dicts of the same keys;
    scalars of the same value (the SDK hands out Python numbers where MosaicML hands out
    numpy scalars: 0.5 and np.float16(0.5) are the same sample)."""
    import numpy as np
    number = (int, float, np.integer, np.floating)
    if isinstance(a, number) and isinstance(b, number) and not isinstance(a, bool) and not isinstance(b, bool):
        if isinstance(a, (float, np.floating)) or isinstance(b, (float, np.floating)):
            return float(a) == float(b) or (math.isnan(float(a)) and math.isnan(float(b)))
        return int(a) == int(b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, decimal.Decimal) and isinstance(b, decimal.Decimal) and a.is_nan() and b.is_nan():
        return True
    return type(a) is type(b) and a == b


def compare(root: str, hub: str):
    """{target: Counter of outcomes}, and the notable cases (differ, reference refused)."""
    import shardcache
    client = shardcache.Client(hub)
    cases = sorted(p.name for p in pathlib.Path(root).iterdir() if p.is_dir())
    by_target = collections.defaultdict(list)
    for case in cases:
        by_target[target_of(case)].append(case)
    tally, notes = {}, []
    for target, mine in sorted(by_target.items()):
        counts = tally.setdefault(target, collections.Counter())
        if target in NOT_COMPARED:
            counts["not compared"] += len(mine)
            continue
        theirs = references(target, root, mine)
        for case in mine:
            try:
                got = ("read", ours(client, case))
            except shardcache.ShardcacheError as error:
                got = ("refused", f"{error.code}: {error.message}"[:300])
            want = theirs[case]
            if got[0] == "refused" and want[0] == "refused":
                counts["both refused"] += 1
            elif got[0] == "refused":
                counts["ours refused"] += 1
                notes.append((case, "ours refused", got[1]))
            elif want[0] == "refused":
                counts["reference refused"] += 1
                notes.append((case, "reference refused", want[1]))
            elif same(got[1], want[1]):
                counts["same"] += 1
            else:
                counts["differ"] += 1
                first = next((i for i, (x, y) in enumerate(zip(got[1], want[1])) if not same(x, y)), None)
                where = f"{len(got[1])} samples vs {len(want[1])}" if first is None else f"sample {first}"
                notes.append((case, "differ", where))
    return tally, notes


def main() -> None:
    if sys.argv[1] == "--child":
        target, root, out, *cases = sys.argv[2:]
        child(target, root, cases, out)
        return
    root, hub_bin = sys.argv[1], sys.argv[2]
    proc = subprocess.Popen([hub_bin, "--root", root, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, RUST_LOG="warn"))
    line = proc.stdout.readline().strip()
    try:
        tally, notes = compare(root, "http://" + line.removeprefix("hub-server listening on "))
    finally:
        proc.kill()
        proc.wait()
    outcomes = ["same", "differ", "reference refused", "both refused", "ours refused", "not compared"]
    print("| target | inputs | " + " | ".join(outcomes) + " |")
    print("|---" * (len(outcomes) + 2) + "|")
    for target, counts in tally.items():
        print(f"| {target} | {sum(counts.values())} | " + " | ".join(str(counts[o]) for o in outcomes) + " |")
    for case, outcome, why in notes:
        print(f"{outcome}: {case}: {why}")
    if any(counts["differ"] for counts in tally.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
