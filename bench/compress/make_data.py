"""Real data for compress-bench (issue 28): English text found on this machine, tokenised
by a byte-level BPE trained on it with Hugging Face's `tokenizers`, written as the seed's
records (windows of 4096 tokens, uint32: 16 KiB each) and as uint16 (8 KiB each); plus
random bytes (incompressible). Nothing is downloaded.

Text, in this order until --text-mib (MiB counted in characters): Debian's package documentation (/usr/share/doc:
READMEs, changelogs, copyright files, gzip or not), the man pages (/usr/share/man, troff
source), Python's standard library sources (docstrings and comments; site-packages
excluded).

    python bench/compress/make_data.py OUT_DIR [--text-mib 160] [--vocab 50000]

Writes OUT_DIR/text-u32/, OUT_DIR/text-u16/, OUT_DIR/random/ (shards of 4 MiB) and prints
what it read.
"""

import argparse
import gzip
import os
import pathlib
import sys
import sysconfig

import numpy as np


def texts(budget):
    """(path, text) from the sources, up to `budget` bytes of text in all."""
    sources = [pathlib.Path("/usr/share/doc"), pathlib.Path("/usr/share/man"), pathlib.Path(sysconfig.get_paths()["stdlib"])]
    total = 0
    for root in sources:
        for path in sorted(root.rglob("*")):
            if total >= budget:
                return
            if not path.is_file() or path.is_symlink() or "site-packages" in path.parts:
                continue
            if root.name == "doc" or root.name == "man":
                if path.suffix not in ("", ".gz", ".txt", ".md", ".rst", ".html") and not path.name.startswith("README"):
                    if not path.suffix[1:].isdigit():  # man pages: name.1, name.8.gz...
                        continue
            elif path.suffix != ".py":
                continue
            try:
                raw = path.read_bytes()
                if path.suffix == ".gz":
                    raw = gzip.decompress(raw)
                text = raw.decode("utf-8")
            except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
                continue
            total += len(text)
            yield text


def shards(tokens, dtype, out, shard_bytes):
    out.mkdir(parents=True)
    data = tokens.astype(dtype).tobytes()
    # Whole records of 4096 tokens only, as the seed's files hold.
    record = 4096 * np.dtype(dtype).itemsize
    data = data[: len(data) // record * record]
    per_shard = shard_bytes // record * record
    for i in range(0, len(data), per_shard):
        (out / f"shard-{i // per_shard:05d}.bin").write_bytes(data[i : i + per_shard])
    return len(data)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out", type=pathlib.Path)
    p.add_argument("--text-mib", type=int, default=160)
    p.add_argument("--vocab", type=int, default=50_000)
    args = p.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    corpus = list(texts(args.text_mib << 20))
    text_bytes = sum(len(t.encode()) for t in corpus)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    ids = np.concatenate([np.asarray(e.ids, dtype=np.uint32) for e in tokenizer.encode_batch(corpus)])
    assert ids.max() < 65536, "uint16 needs a vocabulary under 65536"
    u32 = shards(ids, np.uint32, args.out / "text-u32", 4 << 20)
    u16 = shards(ids, np.uint16, args.out / "text-u16", 4 << 20)
    rng = np.random.default_rng(28)
    (args.out / "random").mkdir(parents=True)
    for i in range(max(1, u32 // (4 << 20))):
        (args.out / "random" / f"shard-{i:05d}.bin").write_bytes(rng.bytes(4 << 20))
    print(f"{len(corpus)} documents, {text_bytes / 2**20:.1f} MiB of text -> {len(ids)} tokens "
          f"(vocabulary {tokenizer.get_vocab_size()}, {text_bytes / len(ids):.2f} bytes of text a token); "
          f"uint32 {u32 / 2**20:.1f} MiB, uint16 {u16 / 2**20:.1f} MiB", file=sys.stderr)


if __name__ == "__main__":
    main()
