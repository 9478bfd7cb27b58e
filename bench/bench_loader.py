"""Loader memory, time to first batch and collation rate at 1x / 4x / 8x of an instances dataset built
from the shared Gutenberg books, read per rank from local disk (in place) and from object storage (a real
S3-compatible server on 127.0.0.1, moto's server mode, through the loader's bounded node-local cache),
measured in the same run, interleaved, in fresh processes.

    .venv/bin/python bench/bench_loader.py [--mb 3] [--dupe 2] [--repeats 3] [--world 8] [--batch 64]
                                           [--storages local,s3]

Datasets: one shard/vocab job on ``--mb`` MB of books, then the instances job at dupe factors
d, 4d, 8d (each dupe round has its own seed-derived masks), so the sizes are 1x / 4x / 8x; each is
also uploaded to a bucket of the test server. Each measurement is one fresh Python process acting as
rank 0 of ``--world`` ranks: peak RSS (VmHWM) and anonymous RSS after the dataset is open and
``--batches`` micro batches were collated, time from the start of ``InstanceDataset(...)`` to the first
batch (for s3: including fetching the files it needs into an empty cache), and collation rate (seq/s).
Then a loader-share measurement: a small BERT training step on CPU fed by the loader with and without
the prefetch thread.
Targets: peak RSS of a rank grows < 10 % from 1x to 8x; from s3 >= 15,000 seq/s a rank at seq 128,
with peak RSS as bounded as from local disk.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROBE = r"""
import json, sys, time, resource
t_import = time.perf_counter()
import numpy as np, torch
torch.set_num_threads(1)
from bert_core.loader import BatchLoader, InstanceDataset

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
data, storage, world, batch, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
base_rss = status("VmRSS:")
t0 = time.perf_counter()
ds = InstanceDataset(data)
loader = BatchLoader(ds, batch, rank=0, world_size=world, seed=0)
next(loader)
first = time.perf_counter() - t0
t1 = time.perf_counter()
seqs = sum(next(loader)["input_ids"].shape[0] for _ in range(n))
rate = seqs / (time.perf_counter() - t1)
print(json.dumps({"rows": len(ds), "first_s": first, "rate": rate, "base_mb": base_rss,
                  "peak_mb": status("VmHWM:"), "anon_mb": status("RssAnon:"), "file_mb": status("RssFile:")}))
"""

SHARE = r"""
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[4]))
from bert_core.config import preset
from bert_core.loader import BatchLoader, InstanceDataset
from bert_core.engine import forward_loss
from bert_core.model import BertForPreTraining
ds = InstanceDataset(sys.argv[1])
torch.manual_seed(0)
model = BertForPreTraining(preset(sys.argv[2], vocab_size=ds.vocab_size))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
out = {}
for prefetch in (0, 2, 0, 2):
    loader = BatchLoader(ds, int(sys.argv[3]), seed=1, prefetch=prefetch)
    wait = total = 0.0
    for step in range(int(sys.argv[5]) + 2):
        t0 = time.perf_counter()
        batch = next(loader)
        t1 = time.perf_counter()
        opt.zero_grad()
        forward_loss(model, batch).loss.backward()
        opt.step()
        if step >= 2:  # the first steps warm up threads and the plan
            wait += t1 - t0
            total += time.perf_counter() - t0
    loader.close()
    out.setdefault(prefetch, []).append(wait / total)
print(json.dumps({k: min(v) for k, v in out.items()}))
"""


def build_datasets(shared: Path, tmp: Path, mb: float, dupe: int) -> dict[int, Path]:
    import ray

    from data_jobs import shard_job, vocab_job
    from data_jobs.config import InstancesConfig, ShardConfig, VocabConfig
    from data_jobs.instances_job import run as instances
    from data_jobs.ray_util import ensure_ray

    sys.path.insert(0, str(REPO / "bench"))
    from bench_instances import pick_books

    ensure_ray(None, 2)
    try:
        vocab_job.run(VocabConfig(output_dir=str(tmp / "vocab"), vocab_file=str(shared / "vocab/bert-base-uncased-vocab.txt")))
        books = pick_books(shared / "corpus/gutenberg", mb)
        shard_job.run(ShardConfig(inputs=[str(b) for b in books], input_format="books", output_dir=str(tmp / "shards"),
                                  num_shards=4, num_workers=2))
        out = {}
        for scale in (1, 4, 8):
            out[scale] = tmp / f"instances{scale}x"
            instances(InstancesConfig(shards_dir=str(tmp / "shards"), vocab_dir=str(tmp / "vocab"),
                                      output_dir=str(out[scale]), max_seq_length=128, dupe_factor=dupe * scale,
                                      num_workers=2, seed=12345))
        return out
    finally:
        ray.shutdown()


def probe(data: str, storage: str, args, env: dict, cache: Path) -> dict:
    cmd = [sys.executable, "-c", PROBE, data, storage, str(args.world), str(args.batch), str(args.batches)]
    shutil.rmtree(cache, ignore_errors=True)  # s3: every probe starts from an empty node-local cache
    proc = subprocess.run(cmd, env={**env, "BERTFLOW_LOADER_CACHE": str(cache)}, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared-data", default=str(REPO.parent / "shared/data"))
    ap.add_argument("--mb", type=float, default=3.0, help="megabytes of books for the 1x dataset")
    ap.add_argument("--dupe", type=int, default=2, help="dupe factor of the 1x dataset (4x, 8x: 4 and 8 times it)")
    ap.add_argument("--world", type=int, default=8, help="ranks the probe's rank 0 shares the data with")
    ap.add_argument("--batch", type=int, default=64, help="micro batch per rank")
    ap.add_argument("--batches", type=int, default=200, help="micro batches collated per probe")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--share-model", default="mini", help="model preset of the loader-share step")
    ap.add_argument("--storages", default="local,s3", help="comma-separated: local (in place), s3 (test server)")
    args = ap.parse_args()
    storages = args.storages.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="bench_loader."))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    try:
        t = time.perf_counter()
        data = build_datasets(Path(args.shared_data), tmp, args.mb, args.dupe)
        print(f"datasets built from {args.mb} MB of books in {time.perf_counter() - t:.0f} s "
              f"(instances job, dupe {args.dupe} / {4 * args.dupe} / {8 * args.dupe})")
        where = {(scale, "local"): str(d) for scale, d in data.items()}
        if "s3" in storages:
            sys.path.insert(0, str(REPO / "tests"))
            from s3_server import S3Server

            from contracts.storage import location

            server = S3Server(tmp).start()
            env.update(server.env())
            os.environ.update(server.env())
            bucket = server.new_bucket()
            for scale, d in data.items():
                where[(scale, "s3")] = f"s3://{bucket}/instances{scale}x"
                remote = location(where[(scale, "s3")])
                for f in sorted(d.iterdir()):
                    remote.upload(f.name, f)
        for scale, d in data.items():
            print(f"{scale}x: {sum(f.stat().st_size for f in d.glob('*.parquet')) / 1e6:.1f} MB Parquet")
        res: dict = {}
        for _ in range(args.repeats):  # interleaved: every repeat runs every (scale, storage)
            for scale, d in data.items():
                for storage in storages:
                    res.setdefault((scale, storage), []).append(probe(where[(scale, storage)], storage, args, env, tmp / "cache"))
        med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in res.items()}
        print(f"\nrank 0 of {args.world}, micro batch {args.batch}, medians of {args.repeats} interleaved runs")
        print(f"{'scale':>5} {'storage':>7} {'rows':>9} {'peak RSS MB':>11} {'anon MB':>8} {'file MB':>8} "
              f"{'1st batch s':>11} {'seq/s':>10}")
        for (scale, storage), m in med.items():
            print(f"{scale:>4}x {storage:>7} {m['rows']:>9,.0f} {m['peak_mb']:>11.0f} {m['anon_mb']:>8.0f} "
                  f"{m['file_mb']:>8.0f} {m['first_s']:>11.3f} {m['rate']:>10,.0f}")
        for storage in storages:
            p1, p8 = med[(1, storage)]["peak_mb"], med[(8, storage)]["peak_mb"]
            f1, f8 = med[(1, storage)]["first_s"], med[(8, storage)]["first_s"]
            print(f"{storage}: peak RSS 8x/1x = {p8 / p1:.3f} (target < 1.10); "
                  f"time to first batch 8x/1x = {f8 / f1:.2f}")
        for scale in data:
            for storage in storages[1:]:
                r = [a["rate"] / b["rate"] for a, b in zip(res[(scale, storages[0])], res[(scale, storage)])]
                print(f"{scale}x collation rate {storages[0]}/{storage}: median ratio {statistics.median(r):.2f}")
        cmd = [sys.executable, "-c", SHARE, str(data[1]), args.share_model, str(args.batch), "1", "8"]
        proc = subprocess.run(cmd, env={**env, "BERTFLOW_LOADER_CACHE": str(tmp / "cache")}, capture_output=True,
                              text=True, timeout=900)
        if proc.returncode:
            raise SystemExit(proc.stderr[-2000:])
        share = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"\nloader share of a {args.share_model} training step (batch {args.batch}, seq <= 128, 1 thread): "
              f"{100 * share['0']:.2f} % without prefetch, {100 * share['2']:.2f} % with prefetch 2 (time in next())")
    finally:
        if "server" in locals():
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
