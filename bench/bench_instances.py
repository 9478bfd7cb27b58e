"""Instances job throughput and memory on Gutenberg books, against bare `tokenizers` in the same run.

    .venv/bin/python bench/bench_instances.py [--mb 5] [--seq 128] [--dupe 5] [--skip-4x]

Prints: instances/s with 1 and 2 Ray workers; end-to-end job time / the time bare `tokenizers` takes
to encode the same sentences (all cores, Rust threads; target <= 1.5); the workers' peak RSS for 1x and
4x the input (target: flat, since a worker holds one shard). Ray start-up is excluded (a fixed cost).
The comparison with Google's create_pretraining_data.py, run side by side, is bench/bench_data_prep.py.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_jobs import shard_job, vocab_job  # noqa: E402
from data_jobs.config import InstancesConfig, ShardConfig, VocabConfig  # noqa: E402
from data_jobs.instances_job import run  # noqa: E402
from data_jobs.tokenization import wordpiece_tokenizer  # noqa: E402


def pick_books(gutenberg: Path, mb: float, skip: int = 0) -> list[Path]:
    """Whole books, mid-sized first, until `mb` megabytes (a book is one document)."""
    books = sorted(gutenberg.glob("*.txt"), key=lambda p: (abs(p.stat().st_size - 900_000), p.name))[skip:]
    out, total = [], 0
    for b in books:
        if total >= mb * 1e6:
            break
        out.append(b)
        total += b.stat().st_size
    return out


def shard(books: list[Path], out: Path, num_shards: int) -> Path:
    shard_job.run(ShardConfig(inputs=[str(b) for b in books], input_format="books", output_dir=str(out),
                              num_shards=num_shards, num_workers=2))
    return out


def bare_tokenize_seconds(shards: Path, vocab: Path) -> tuple[float, int, int]:
    import pyarrow.parquet as pq

    sents = []
    for f in sorted(shards.glob("shard-*.parquet")):
        sents += pq.read_table(f, columns=["sentences"]).column(0).combine_chunks().flatten().to_pylist()
    tok = wordpiece_tokenizer(vocab, lowercase=True)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: CPU seconds, robust on a busy machine
    c0 = time.process_time()
    tok.encode_batch_fast(sents, add_special_tokens=False)
    cpu = time.process_time() - c0
    os.environ["TOKENIZERS_PARALLELISM"] = "true"  # every core: the wall-clock baseline
    t0 = time.perf_counter()
    encs = tok.encode_batch_fast(sents, add_special_tokens=False)
    dt = time.perf_counter() - t0
    return dt, cpu, len(sents), sum(len(e.ids) for e in encs)


def job(shards: Path, vocab_dir: Path, out: Path, workers: int, args) -> tuple[float, int, float]:
    cfg = InstancesConfig(shards_dir=str(shards), vocab_dir=str(vocab_dir), output_dir=str(out),
                          max_seq_length=args.seq, dupe_factor=args.dupe, num_workers=workers)
    t0 = time.perf_counter()
    m = run(cfg)
    dt = time.perf_counter() - t0
    workers = [json.loads(p.read_text())["worker"] for p in out.glob("part-*.done.json")]
    return dt, m.totals["instances"], max(w["peak_rss_mb"] for w in workers), sum(w["cpu_s"] for w in workers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared-data", default=str(Path(__file__).resolve().parents[2] / "shared/data"))
    ap.add_argument("--mb", type=float, default=5.0)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dupe", type=int, default=5)
    ap.add_argument("--num-shards", type=int, default=8)
    ap.add_argument("--skip-4x", action="store_true")
    args = ap.parse_args()
    data = Path(args.shared_data)
    vocab = data / "vocab/bert-base-uncased-vocab.txt"
    tmp = Path(tempfile.mkdtemp(prefix="bench_instances."))
    os.environ.pop("RAYON_NUM_THREADS", None)  # the bare baseline gets every core
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        import ray

        from data_jobs.ray_util import ensure_ray

        vocab_job.run(VocabConfig(output_dir=str(tmp / "vocab"), vocab_file=str(vocab)))
        books = pick_books(data / "corpus/gutenberg", args.mb)
        mb = sum(b.stat().st_size for b in books) / 1e6
        ensure_ray(None, 2)
        shards = shard(books, tmp / "shards", args.num_shards)
        ray.shutdown()  # fresh workers below, so their peak memory belongs to this job
        bare, bare_cpu, n_sent, n_tok = bare_tokenize_seconds(shards, vocab)
        print(f"input: {len(books)} books, {mb:.1f} MB, {n_sent:,} sentences, {n_tok:,} tokens; "
              f"seq {args.seq}, dupe {args.dupe}, {args.num_shards} shards")
        print(f"bare tokenizers encode_batch_fast: {bare:.2f} s wall on all cores ({n_tok / bare / 1e6:.2f} M tokens/s), "
              f"{bare_cpu:.2f} CPU s on one thread")
        ensure_ray(None, 2)
        res = {}
        for workers in (1, 2):
            dt, n, peak, cpu = job(shards, tmp / "vocab", tmp / f"out{workers}", workers, args)
            res[workers] = (dt, n, peak)
            print(f"{workers} worker(s): {dt:.2f} s, {n:,} instances, {n / dt:,.0f} instances/s, "
                  f"end-to-end / bare tokenize = {dt / bare:.2f} wall (target <= 1.5), "
                  f"shard tasks' CPU / bare CPU = {cpu / bare_cpu:.2f}, worker peak RSS {peak:.0f} MB")
        same = all((tmp / "out1" / p.name).read_bytes() == p.read_bytes() for p in (tmp / "out2").glob("part-*.parquet"))
        print(f"1 vs 2 workers byte-identical: {same}")
        if not args.skip_4x:
            ray.shutdown()
            books4 = pick_books(data / "corpus/gutenberg", 4 * args.mb)
            mb4 = sum(b.stat().st_size for b in books4) / 1e6
            ensure_ray(None, 2)
            shards4 = shard(books4, tmp / "shards4", 4 * args.num_shards)
            ray.shutdown()
            ensure_ray(None, 2)
            dt, n, peak, _ = job(shards4, tmp / "vocab", tmp / "out4x", 2, args)
            print(f"4x input ({mb4:.1f} MB, {4 * args.num_shards} shards), 2 workers: {dt:.2f} s, {n:,} instances, "
                  f"worker peak RSS {peak:.0f} MB vs {res[2][2]:.0f} MB at 1x (ratio {peak / res[2][2]:.2f})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
