"""The instances job with its inputs and output on object storage, against the same job on local disk.

    .venv/bin/python bench/bench_instances_s3.py [--mb 50] [--reps 3] [--out FILE]

Shards ``--mb`` MB of Gutenberg books (../shared/data) once, adopts the bert-base-uncased vocab, uploads
both datasets to a real S3-compatible server on 127.0.0.1 (moto's server mode, as the tests use), then
runs ``python -m data_jobs.instances_job`` (default workers, local processes) in rounds: local shards and
vocab -> local output, and s3 shards and vocab -> s3 output, the order alternating per round (ABBA: this
machine is noisy). Each run is measured as a whole process tree (bench/treemeter.py: the job and its
workers); the server's CPU is counted separately (it stands for S3, which is not on the node). Prints the
per-round ratio s3/local of wall time and of the job's CPU, and checks that both write the same Parquet
files (by the manifests' SHA-256). Target (issue 23): the s3 run within 1.3x of the local one.

What it can and cannot say: moto is a Python server on the same 2 cores, so each request costs far more
than S3's and the server competes with the job for CPU; the ratio is an upper bound on what the storage
seam costs, not S3's throughput.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from bench_instances import pick_books, shard  # noqa: E402
from treemeter import run_tree  # noqa: E402

SHARED = REPO.parent / "shared" / "data"


def _server_cpu(pid: int) -> float:
    import psutil

    root = psutil.Process(pid)
    return sum(p.cpu_times().user + p.cpu_times().system for p in [root, *root.children(recursive=True)])


def _upload(local: Path, uri: str) -> None:
    from contracts.storage import location

    loc = location(uri)
    for f in sorted(local.iterdir()):
        if f.is_file() and not f.name.startswith("."):
            loc.upload(f.name, f)


def _files(where: str) -> list[tuple[str, str]]:
    from contracts.schema import Manifest

    return sorted((f.name, f.sha256) for f in Manifest.read(where).files)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50.0, help="MB of books (default 50)")
    ap.add_argument("--reps", type=int, default=3, help="rounds, each running both (default 3)")
    ap.add_argument("--out", help="also write the report to this file")
    args = ap.parse_args()
    if not (SHARED / "corpus" / "gutenberg").is_dir():
        print(f"needs {SHARED}/corpus/gutenberg (the shared data)", file=sys.stderr)
        return 2
    from data_jobs import vocab_job
    from data_jobs.config import VocabConfig
    from s3_server import S3Server

    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    work = Path(tempfile.mkdtemp(prefix="bench-inst-s3-"))
    books = pick_books(SHARED / "corpus" / "gutenberg", args.mb)
    shards = shard(books, work / "shards", num_shards=8)
    vocab = work / "vocab"
    vocab_job.run(VocabConfig(output_dir=str(vocab), vocab_file=str(SHARED / "vocab" / "bert-base-uncased-vocab.txt")))
    size = sum(b.stat().st_size for b in books) / 1e6
    server = S3Server(work).start()
    try:
        env = {**os.environ, **server.env(), "PYTHONPATH": str(REPO), "BERTFLOW_SCRATCH": str(work / "scratch")}
        os.environ.update(server.env())
        (work / "scratch").mkdir()
        bucket = server.new_bucket()
        _upload(shards, f"s3://{bucket}/shards")
        _upload(vocab, f"s3://{bucket}/vocab")
        load = os.getloadavg()
        say(f"bench_instances_s3 {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores; "
            f"{size:.1f} MB of books ({len(books)} files) in 8 shards, bert-base-uncased vocab, seq 128, "
            f"dupe 5; load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        arms = {"local": (str(shards), str(vocab), lambda r: str(work / f"out-local-{r}")),
                "s3": (f"s3://{bucket}/shards", f"s3://{bucket}/vocab", lambda r: f"s3://{bucket}/out-{r}")}
        results: dict[str, list] = {"local": [], "s3": []}
        outputs: dict[str, str] = {}
        for r in range(args.reps):
            for arm in (["local", "s3"] if r % 2 == 0 else ["s3", "local"]):
                shards_in, vocab_in, out_of = arms[arm]
                out = out_of(r)
                cmd = [sys.executable, "-m", "data_jobs.instances_job", "--shards-dir", shards_in, "--vocab-dir",
                       vocab_in, "--output-dir", out, "--max-seq-length", "128", "--dupe-factor", "5",
                       "--engine", "local"]
                cpu0 = _server_cpu(server.proc.pid)
                t = run_tree(cmd, env=env, cwd=str(REPO))
                server_cpu = _server_cpu(server.proc.pid) - cpu0
                if t.returncode != 0:
                    say(f"round {r + 1} {arm}: FAILED rc {t.returncode}: {t.stderr[-1500:]}")
                    return 1
                results[arm].append((t.wall_s, t.cpu_s, t.peak_rss_mb, server_cpu))
                outputs[arm] = out
                say(f"  round {r + 1} {arm:5s}: {t.wall_s:6.2f} s wall, job CPU {t.cpu_s:6.1f} s, peak RSS "
                    f"{t.peak_rss_mb:5.0f} MB (tree); store server CPU {server_cpu:5.1f} s; load "
                    f"{os.getloadavg()[0]:.2f}")
        same = _files(outputs["local"]) == _files(outputs["s3"])
        say(f"same Parquet files (manifest SHA-256) from local and s3 inputs/outputs: {same}")
        wall = [s[0] / loc[0] for s, loc in zip(results["s3"], results["local"])]
        cpu = [s[1] / loc[1] for s, loc in zip(results["s3"], results["local"])]
        say(f"s3/local wall per round: {', '.join(f'{x:.2f}' for x in wall)}; median {statistics.median(wall):.2f} "
            f"(target <= 1.3)")
        say(f"s3/local job CPU per round: {', '.join(f'{x:.2f}' for x in cpu)}; median {statistics.median(cpu):.2f}")
        say(f"peak RSS (tree) median: local {statistics.median(r[2] for r in results['local']):.0f} MB, "
            f"s3 {statistics.median(r[2] for r in results['s3']):.0f} MB")
        if not same:
            return 1
    finally:
        server.stop()
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
