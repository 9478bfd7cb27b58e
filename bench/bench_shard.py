"""Shard job throughput on Gutenberg books: 1 and 2 Ray workers against the bare single-process reader
(read + sentence-split, no Ray, no Parquet) measured in the same run.

    .venv/bin/python bench/bench_shard.py [--books 6] [--splitter syntok]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_jobs.config import ShardConfig  # noqa: E402
from data_jobs.ray_util import ensure_ray  # noqa: E402
from data_jobs.readers import ReadStats, read_documents  # noqa: E402
from data_jobs.shard_job import run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared-data", default=str(Path(__file__).resolve().parents[2] / "shared/data"))
    ap.add_argument("--books", type=int, default=6)
    ap.add_argument("--splitter", default="syntok")
    args = ap.parse_args()
    books = sorted((Path(args.shared_data) / "corpus/gutenberg").glob("*.txt"))[: args.books]
    mb = sum(b.stat().st_size for b in books) / 1e6
    tmp = Path(tempfile.mkdtemp(prefix="bench_shard."))
    base = dict(inputs=[str(b) for b in books], input_format="books", num_shards=8, sentence_splitter=args.splitter)
    try:
        t0 = time.perf_counter()
        n = sum(1 for _ in read_documents(ShardConfig(output_dir=str(tmp / "x"), **base), ReadStats()))
        bare = time.perf_counter() - t0
        print(f"{len(books)} books, {mb:.1f} MB, splitter {args.splitter}; bare reader: {bare:.1f} s ({mb / bare:.2f} MB/s, {n} docs)")
        ensure_ray(None, 2)  # cluster start-up is not part of the job's time
        for workers in (1, 2):
            t0 = time.perf_counter()
            m = run(ShardConfig(output_dir=str(tmp / f"w{workers}"), num_workers=workers, **base))
            secs = time.perf_counter() - t0
            print(f"shard job, {workers} worker(s): {secs:.1f} s, {mb / secs:.2f} MB/s, "
                  f"{secs / bare:.2f}x the bare reader, {m.totals['sentences']} sentences")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
