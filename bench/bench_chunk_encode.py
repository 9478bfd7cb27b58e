"""Tokenizing through the chunk cache (data_jobs/chunk_encode.py) against the tokenizer's own
``encode_batch_fast`` on the same sentences, one thread, interleaved repetitions (medians).

    .venv/bin/python bench/bench_chunk_encode.py [--mb 5] [--reps 3]

Input: Gutenberg books from ../shared/data (mid-sized first, ~--mb MB), sentence-split once by our shard
job. Measured in this process with time.process_time (one thread: TOKENIZERS_PARALLELISM=false):
  bare      tokenizer.encode_batch_fast(sentences) and the ids taken out of the Encodings
  cold      ChunkEncoder(tokenizer).encode_flat(sentences): every distinct chunk encoded, then look-ups
  warm      the same ChunkEncoder again: every chunk already cached (a worker's second shard of a corpus)
Every repetition checks the ids are identical.
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # before tokenizers is imported: one thread
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import numpy as np  # noqa: E402

from bench_data_prep import shard_documents  # noqa: E402
from bench_instances import pick_books  # noqa: E402
from data_jobs.chunk_encode import ChunkEncoder  # noqa: E402
from data_jobs.tokenization import wordpiece_tokenizer  # noqa: E402


def cpu(fn):
    c = time.process_time()
    r = fn()
    return time.process_time() - c, r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared-data", default=str(REPO.parent / "shared/data"))
    ap.add_argument("--mb", type=float, default=5.0, help="megabytes of books (whole books, mid-sized first)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    data = Path(args.shared_data)
    if not (data / "corpus/gutenberg").is_dir():
        sys.exit(f"bench_chunk_encode: needs the Gutenberg books in {data / 'corpus/gutenberg'}")
    with tempfile.TemporaryDirectory(prefix="bench_chunk_encode.") as tmp:
        docs = shard_documents(pick_books(data / "corpus/gutenberg", args.mb), Path(tmp) / "split")
    sents = [s for d in docs for s in d]
    chunks = " ".join(sents).split(" ")
    print(f"bench_chunk_encode: {len(docs)} books, {len(sents):,} sentences, {sum(map(len, sents)) / 1e6:.1f} MB, "
          f"{len(chunks):,} space-separated chunks, {len(set(chunks)):,} distinct; one thread; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    tok = wordpiece_tokenizer(data / "vocab/bert-base-uncased-vocab.txt", lowercase=True)

    def bare():
        encs = tok.encode_batch_fast(sents, add_special_tokens=False)
        ids = [e.ids for e in encs]
        return np.fromiter(itertools.chain.from_iterable(ids), np.int32), [len(i) for i in ids]

    got: dict[str, list[float]] = {"bare": [], "cold": [], "warm": []}
    for rep in range(args.reps):
        order = ["bare", "cache"] if rep % 2 == 0 else ["cache", "bare"]
        for name in order:
            if name == "bare":
                t, want = cpu(bare)
                got["bare"].append(t)
            else:
                enc = ChunkEncoder(tok)
                t_cold, cold = cpu(lambda: enc.encode_flat(sents))
                t_warm, warm = cpu(lambda: enc.encode_flat(sents))
                got["cold"].append(t_cold)
                got["warm"].append(t_warm)
        for ids, lens in (cold, warm):
            if not (np.array_equal(ids, want[0]) and lens.tolist() == want[1]):
                sys.exit("bench_chunk_encode: the chunk cache's ids differ from the tokenizer's")
        print(f"  rep {rep + 1}: bare {got['bare'][-1]:.2f} CPU-s, cache cold {got['cold'][-1]:.2f}, "
              f"warm {got['warm'][-1]:.2f} (ids identical)", flush=True)
    m = {k: statistics.median(v) for k, v in got.items()}
    print(f"Medians: bare {m['bare']:.2f} CPU-s, cold {m['cold']:.2f}, warm {m['warm']:.2f}; "
          f"bare / cold {m['bare'] / m['cold']:.2f}x, bare / warm {m['bare'] / m['warm']:.2f}x")


if __name__ == "__main__":
    main()
