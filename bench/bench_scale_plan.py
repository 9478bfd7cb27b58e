"""Measure what a full-size run plan needs, here, and print the plan (docs/scaling.md quotes it).

    .venv/bin/python bench/bench_scale_plan.py [--mb 3] [--dupe 5] [--nodes 1 2 4 8 16 32]

Measured in this run, on a few MB of the shared Gutenberg books + the Wikipedia sample:
  - shard job: raw MB -> documents bytes (Parquet zstd)
  - instances job with 1 Ray worker (one core): instances/s and bytes/instance, for seq 128 and 512
    (Ray start-up excluded), and instances per MB of raw text
Taken from elsewhere (printed with their source):
  - sentence-splitting speed per core (bench/bench_data_prep.py's shard section)
  - BERT-large training throughput per GPU: this project's H200 run (bench/results_gpu_h200_run1.json,
    DeepSpeed ZeRO-1 bf16, seq 128) and NVIDIA's published DGX A100 figures (DeepLearningExamples)
The plan scales these to BooksCorpus + English Wikipedia (~3.3 B words, ~16 GB of raw text).
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

from contracts.common import build_config  # noqa: E402
from data_jobs import instances_job, shard_job, vocab_job  # noqa: E402
from data_jobs.config import InstancesConfig, ShardConfig, VocabConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BERTFLOW_SHARED_DATA", REPO.parent / "shared" / "data"))
RAW_GB = 16.0  # BooksCorpus (~800 M words) + English Wikipedia (~2,500 M words) as plain text
# bench/bench_data_prep.py, 2026-12-01: whole shard job, 1 worker, raw MB per CPU-second of the process tree
SYNTOK_MB_S_PER_CORE = 0.68
BLINGFIRE_MB_S_PER_CORE = 1.93
# NVIDIA DeepLearningExamples BERT (DGX A100 80GB, AMP): sequences/s per GPU, multi-node strong scaling
A100_SEQ_S = {128: 5541 / 8, 512: 2109 / 8}
NVIDIA_SCALING = {1: 1.0, 2: 0.96, 4: 0.965, 8: 0.94, 16: 0.89, 32: 0.89}  # speed-up / nodes, seq 128
RECIPE = {128: (7038, 65536), 512: (1563, 32768)}  # (steps, global batch): NVIDIA's LAMB phases 1 and 2


def measure(mb: float, dupe: int, tmp: Path) -> dict:
    books = sorted((DATA / "corpus" / "gutenberg").glob("*.txt"), key=lambda p: p.stat().st_size)
    picked, total = [], 0
    for b in books:  # smallest books first, until `mb` (with the Wikipedia sample: both genres)
        if total >= mb * 1e6:
            break
        picked.append(str(b))
        total += b.stat().st_size
    wiki = sorted(str(p) for p in (DATA / "corpus" / "wikipedia_mlperf").glob("wiki_0*"))
    raw = total + sum(Path(p).stat().st_size for p in wiki)
    shard_job.run(build_config(ShardConfig, dict(inputs=picked + wiki, output_dir=str(tmp / "docs"), num_shards=8,
                                                 num_workers=2, sentence_splitter="blingfire")))
    docs_bytes = sum(p.stat().st_size for p in (tmp / "docs").glob("shard-*.parquet"))
    vocab_job.run(build_config(VocabConfig, dict(vocab_file=str(DATA / "vocab" / "bert-base-uncased-vocab.txt"),
                                                 output_dir=str(tmp / "vocab"))))
    out = {"raw_mb": raw / 1e6, "docs_bytes_per_raw_byte": docs_bytes / raw}
    for seq, pred in ((128, 20), (512, 80)):
        cfg = build_config(InstancesConfig, dict(shards_dir=str(tmp / "docs"), vocab_dir=str(tmp / "vocab"),
                                                 output_dir=str(tmp / f"inst{seq}"), max_seq_length=seq,
                                                 max_predictions_per_seq=pred, dupe_factor=dupe, num_workers=1))
        t0 = time.perf_counter()
        m = instances_job.run(cfg)
        dt = time.perf_counter() - t0
        n = m.totals["instances"]
        size = sum(f.bytes for f in m.files)
        out[seq] = {"instances": n, "seconds": dt, "instances_per_s_core": n / dt, "bytes_per_instance": size / n,
                    "instances_per_raw_mb": n / (raw / 1e6)}
    return out


def plan(meas: dict, dupe: int, nodes: list[int]) -> list[str]:
    h200 = json.loads((REPO / "bench" / "results_gpu_h200_run1.json").read_text())
    h200_128 = next(r["seq_per_s"] for r in h200 if r["variant"] == "deepspeed_zero1_bf16")
    # No seq-512 H200 measurement: scale by NVIDIA's own 512/128 ratio on A100 (attention cost grows).
    h200 = {128: h200_128, 512: h200_128 * A100_SEQ_S[512] / A100_SEQ_S[128]}
    raw_mb = RAW_GB * 1e3
    lines = [f"measured on {meas['raw_mb']:.1f} MB of raw text (dupe_factor {dupe}):",
             f"  documents (Parquet zstd): {meas['docs_bytes_per_raw_byte']:.2f} bytes per raw byte"]
    for seq in (128, 512):
        m = meas[seq]
        lines.append(f"  seq {seq}: {m['instances']:,} instances in {m['seconds']:.1f} s on 1 core = "
                     f"{m['instances_per_s_core']:,.0f} instances/s/core, {m['bytes_per_instance']:.0f} bytes/instance, "
                     f"{m['instances_per_raw_mb']:,.0f} instances per raw MB")
    lines.append(f"full corpus ({RAW_GB:.0f} GB raw):")
    lines.append(f"  shard job: {raw_mb / SYNTOK_MB_S_PER_CORE / 3600:,.0f} core-hours with syntok, "
                 f"{raw_mb / BLINGFIRE_MB_S_PER_CORE / 3600:,.0f} with blingfire; documents "
                 f"{RAW_GB * meas['docs_bytes_per_raw_byte']:.1f} GB")
    for seq in (128, 512):
        m = meas[seq]
        n = m["instances_per_raw_mb"] * raw_mb
        lines.append(f"  seq {seq}: {n / 1e6:,.0f} M instances, {n * m['bytes_per_instance'] / 1e9:,.0f} GB, "
                     f"{n / m['instances_per_s_core'] / 3600:,.0f} core-hours")
    lines.append("training time, NVIDIA recipe (phase 1: 7,038 steps x 65,536 at seq 128; phase 2: 1,563 x 32,768 at 512):")
    lines.append("  nodes x 8 GPUs | H200 (this project's seq/s) phase 1 + 2 | A100 80GB (NVIDIA's seq/s) phase 1 + 2")
    for n in nodes:
        eff = NVIDIA_SCALING.get(n, 0.89)
        cols = []
        for rate in (h200, A100_SEQ_S):
            hours = [RECIPE[s][0] * RECIPE[s][1] / (rate[s] * 8 * n * eff) / 3600 for s in (128, 512)]
            cols.append(f"{hours[0]:6.1f} h + {hours[1]:5.1f} h = {sum(hours):6.1f} h")
        lines.append(f"  {n:>5} | {cols[0]} | {cols[1]}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=3.0, help="MB of books (plus the 3 MB Wikipedia sample)")
    ap.add_argument("--dupe", type=int, default=5, help="dupe_factor (NVIDIA's recipe uses 5, Google's 10)")
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="scaleplan"))
    try:
        meas = measure(args.mb, args.dupe, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n".join(plan(meas, args.dupe, args.nodes)))


if __name__ == "__main__":
    main()
