"""Measure what a full-size run plan needs, here, and print the plan (docs/scaling.md quotes it).

    .venv/bin/python bench/bench_scale_plan.py [--mb 3] [--dupe 5] [--nodes 1 2 4 8 16 32]

Measured in this run, on a few MB of the shared Gutenberg books + the Wikipedia sample, each job run
through the CLI on one worker (local engine) with its whole process tree metered (bench/treemeter.py),
so the rates are per CPU-second: what a core delivers, whatever else the machine was doing:
  - shard job with syntok and with blingfire: raw MB per CPU-second; documents bytes per raw byte
  - instances job, seq 128 and 512, on one small file and on all: instances per CPU-second as the slope
    between the two (the fixed start-up drops out), bytes per instance, instances per MB of raw text
Taken from elsewhere (printed with their source):
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from contracts.schema import Manifest  # noqa: E402
from treemeter import run_tree  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BERTFLOW_SHARED_DATA", REPO.parent / "shared" / "data"))
RAW_GB = 16.0  # BooksCorpus (~800 M words) + English Wikipedia (~2,500 M words) as plain text
BIN = Path(sys.executable).parent
SPLITTERS = ("syntok", "blingfire")
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
    out = {"raw_mb": raw / 1e6}
    for splitter in SPLITTERS:  # the whole shard job on one worker, per CPU-second of its process tree
        docs = tmp / f"docs-{splitter}"
        r = cli(["data", "shard", "--input", *picked, *wiki, "--output-dir", str(docs), "--num-shards", "8",
                 "--num-workers", "1", "--engine", "local", "--splitter", splitter])
        out[splitter] = {"cpu_s": r.cpu_s, "mb_per_cpu_s": raw / 1e6 / r.cpu_s}
    tiny = tmp / "docs-tiny"  # one small file: what a run costs before its input size matters
    cli(["data", "shard", "--input", wiki[0], "--output-dir", str(tiny), "--num-shards", "1", "--num-workers", "1",
         "--engine", "local", "--splitter", "blingfire"])
    docs_bytes = sum(p.stat().st_size for p in docs.glob("shard-*.parquet"))
    out["docs_bytes_per_raw_byte"] = docs_bytes / raw
    cli(["data", "vocab", "--vocab-file", str(DATA / "vocab" / "bert-base-uncased-vocab.txt"),
         "--output-dir", str(tmp / "vocab")])
    for seq, pred in ((128, 20), (512, 80)):
        runs = {}
        for size, src in (("tiny", tiny), ("all", docs)):  # two input sizes: the slope is the rate without start-up
            inst = tmp / f"inst{seq}-{size}"
            r = cli(["data", "instances", "--shards-dir", str(src), "--vocab-dir", str(tmp / "vocab"),
                     "--output-dir", str(inst), "--max-seq-length", str(seq), "--max-predictions-per-seq",
                     str(pred), "--dupe-factor", str(dupe), "--num-workers", "1", "--engine", "local"])
            m = Manifest.read(inst)
            runs[size] = (m.totals["instances"], r.cpu_s, sum(f.bytes for f in m.files))
        (n1, c1, _), (n, c, size) = runs["tiny"], runs["all"]
        out[seq] = {"instances": n, "cpu_s": c, "instances_per_cpu_s": (n - n1) / (c - c1),
                    "startup_cpu_s": c1 - n1 * (c - c1) / (n - n1),
                    "bytes_per_instance": size / n, "instances_per_raw_mb": n / (raw / 1e6)}
    return out


def cli(args: list[str]):
    r = run_tree([str(BIN / "bertflow"), *args], env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if r.returncode != 0:
        sys.exit(f"bench_scale_plan: bertflow {args[0]} {args[1]} failed:\n{r.stderr[-2000:]}")
    return r


def plan(meas: dict, dupe: int, nodes: list[int]) -> list[str]:
    h200 = json.loads((REPO / "bench" / "results_gpu_h200_run1.json").read_text())
    h200_128 = next(r["seq_per_s"] for r in h200 if r["variant"] == "deepspeed_zero1_bf16")
    # No seq-512 H200 measurement: scale by NVIDIA's own 512/128 ratio on A100 (attention cost grows).
    h200 = {128: h200_128, 512: h200_128 * A100_SEQ_S[512] / A100_SEQ_S[128]}
    raw_mb = RAW_GB * 1e3
    lines = [f"measured on {meas['raw_mb']:.1f} MB of raw text (dupe_factor {dupe}):",
             f"  documents (Parquet zstd): {meas['docs_bytes_per_raw_byte']:.2f} bytes per raw byte"]
    for sp in SPLITTERS:
        lines.append(f"  shard job, {sp}: {meas['raw_mb']:.1f} MB in {meas[sp]['cpu_s']:.1f} CPU-s = "
                     f"{meas[sp]['mb_per_cpu_s']:.2f} MB per CPU-second")
    for seq in (128, 512):
        m = meas[seq]
        lines.append(f"  seq {seq}: {m['instances']:,} instances in {m['cpu_s']:.1f} CPU-s (1 worker): "
                     f"{m['instances_per_cpu_s']:,.0f} instances per CPU-second beyond a fixed "
                     f"{m['startup_cpu_s']:.1f} CPU-s (slope from one small file to all), {m['bytes_per_instance']:.0f} bytes/instance, "
                     f"{m['instances_per_raw_mb']:,.0f} instances per raw MB")
    lines.append(f"full corpus ({RAW_GB:.0f} GB raw):")
    shard_h = {sp: raw_mb / meas[sp]["mb_per_cpu_s"] / 3600 for sp in SPLITTERS}
    docs_gb = RAW_GB * meas["docs_bytes_per_raw_byte"]
    lines.append(f"  shard job: {shard_h['syntok']:,.1f} core-hours with syntok, "
                 f"{shard_h['blingfire']:,.1f} with blingfire; documents {docs_gb:.1f} GB")
    inst_h, inst_gb = 0.0, 0.0
    for seq in (128, 512):
        m = meas[seq]
        n = m["instances_per_raw_mb"] * raw_mb
        inst_h += n / m["instances_per_cpu_s"] / 3600
        inst_gb += n * m["bytes_per_instance"] / 1e9
        lines.append(f"  seq {seq}: {n / 1e6:,.0f} M instances, {n * m['bytes_per_instance'] / 1e9:,.0f} GB, "
                     f"{n / m['instances_per_cpu_s'] / 3600:,.1f} core-hours")
    for sp in SPLITTERS:
        lines.append(f"  data preparation with {sp}: {shard_h[sp] + inst_h:,.1f} "
                     "core-hours (shard job + instances at both lengths)")
    lines.append(f"  storage: {RAW_GB:.0f} GB raw + {docs_gb:.1f} GB documents + {inst_gb:.0f} GB instances = "
                 f"{RAW_GB + docs_gb + inst_gb:.0f} GB")
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
