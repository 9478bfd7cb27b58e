"""Is a learning-curve point decided by the models or by the fine-tuning grid? One GLUE task at one
training-set size, fine-tuned from a pretrained model and from a random init of its shape (the recipe's
two BERT-tiny rows), over a wider grid than the recipe's: more epochs (each epoch is scored on the held-out
training split, so ``--epochs 10`` also offers epochs 1 to 9) and more learning rates.

The recipe chooses lr and epoch on 10 % of the training set, held out; this script does the same, then
prints for each row the selection score of every (lr, epoch), the choice, whether the choice lies on an
edge of the grid (the highest lr or the last epoch: the grid may be cutting the row short), the dev score
at the choice, and the pretrained-minus-random difference with its Welch 95 % interval
(``evaluation/stats.py``, as the recipe's report). The recipe's own grid (its ``comparison.glue``, read from
``--recipe``, with the learning curve's overrides) runs beside it on the same examples and seeds: its cells
are the recipe's curve cells, so its figures reproduce the recipe's.

    .venv/bin/python bench/curve_grid.py --model-path runs/cpu-tiny/export/<name> \\
        --size 2000 --epochs 10 --lrs 1e-3 3e-4 1e-4 --out bench/results/X.txt
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluation.stats import verdict, welch  # noqa: E402


def _row(res: dict, task: str, lrs: list[float]) -> dict:
    """One row of one grid from the GLUE stage's results: its choice (the stage's own), the dev scores at it,
    the selection score of every (lr, epoch), and whether the choice lies on an edge of the grid."""
    t = res["tasks"][task]
    metric = t["metric"]
    runs = [r for r in res["runs"] if r["task"] == task]
    cells: dict[tuple[float, float], list[float]] = {}
    for r in runs:
        cells.setdefault((r["lr"], r["epoch"]), []).append(r["selection"]["metrics"][metric] * 100)
    lr, epoch = t["best_lr"], t["best_epoch"]
    return {"metric": metric, "lr": lr, "epoch": epoch, "mean": t["mean"] * 100, "std": t["std"] * 100,
            "n": len(t["seeds"]), "selection": t["selection"]["mean"] * 100,
            "table": {k: statistics.mean(v) for k, v in cells.items()},
            "edge": [w for w, hit in (("highest lr", lr == max(lrs)), ("last epoch", epoch == max(e for _, e in cells)))
                     if hit]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", required=True, help="the pretrained row's Hugging Face directory")
    p.add_argument("--recipe", default="recipes/cpu-tiny.yaml", help="the recipe whose GLUE budget and grid to use")
    p.add_argument("--task", default="SST-2")
    p.add_argument("--size", type=int, default=2000, help="training examples (after the held-out split)")
    p.add_argument("--epochs", type=float, default=10.0, help="the wide grid's epochs (every epoch is scored)")
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-4, 1e-4], help="the wide grid's lrs")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--work", default="runs/curve-grid", help="where the GLUE cells live (a rerun reuses them)")
    p.add_argument("--no-ray", action="store_true", help="run the cells in this process (default: Ray, 1 CPU each)")
    p.add_argument("--out", help="also write the report here")
    a = p.parse_args(argv)

    from evaluation.config import GlueConfig
    from evaluation.runner import run_staged
    from flows.recipe_config import load_recipe

    glue = load_recipe(a.recipe).comparison.glue.model_dump(mode="json")
    # the learning curve's overrides of the grid (evaluation/compare.py learning_curve)
    glue.update({"tasks": [a.task], "seeds": a.seeds, "task_seeds": {}, "task_epochs": {},
                 "max_train_examples": a.size, "write_test_predictions": False, "save_models": "none",
                 **({"use_ray": False} if a.no_ray else {})})
    t0 = time.time()
    grids = {"recipe": (glue["learning_rates"], glue["epochs"]), "wide": (a.lrs, a.epochs)}
    rows: dict[str, dict[str, dict]] = {g: {} for g in grids}
    for grid, (lrs, epochs) in grids.items():
        for name, random_init in (("pretrained", False), ("random init", True)):
            out = Path(a.work) / f"{a.task}-n{a.size}-e{epochs:g}-{'random' if random_init else 'pretrained'}"
            cfg = GlueConfig.model_validate({**glue, "model_path": a.model_path, "random_init": random_init,
                                             "output_dir": str(out), "learning_rates": lrs, "epochs": epochs})
            rows[grid][name] = _row(run_staged("glue", cfg), a.task, lrs)

    lines = [f"{a.task}, {a.size} training examples, seeds {a.seeds}, {a.recipe}'s GLUE budget otherwise (batch "
             f"{glue['batch_size']}, {glue['precision']}, select_on {glue['select_on']}); dev reported once at the "
             f"choice (bench/curve_grid.py)",
             f"model: {a.model_path}", f"wall: {time.time() - t0:.0f} s (a rerun reuses finished cells)", ""]
    for grid, (lrs, epochs) in grids.items():
        lines.append(f"{grid} grid: lrs {lrs}, {epochs:g} epochs (linear decay over them), every epoch scored")
        for name, c in rows[grid].items():
            edge = f"  (on the grid's edge: {', '.join(c['edge'])})" if c["edge"] else ""
            lines.append(f"  {name:12s} dev {c['metric']} {c['mean']:.1f} ± {c['std']:.1f} (n={c['n']})  "
                         f"chosen lr {c['lr']:g}, epoch {c['epoch']:g}, selection {c['selection']:.1f}{edge}")
        ci = welch(rows[grid]["pretrained"], rows[grid]["random init"])
        lines.append(f"  pretrained minus random init: {ci['diff']:+.1f} [{ci['low']:+.1f}, {ci['high']:+.1f}] "
                     f"(Welch 95 %, df {ci['df']:.1f}): {verdict(ci)}" if ci and ci["low"] is not None
                     else "  pretrained minus random init: no interval")
        for name, c in rows[grid].items():
            eps = sorted({e for _, e in c["table"]})
            lines.append(f"    {name} selection score (mean over seeds, %), lr by epoch:")
            lines.append("      lr \\ epoch " + " ".join(f"{e:>5g}" for e in eps))
            for lr in sorted(lrs, reverse=True):
                lines.append(f"      {lr:<10g} " + " ".join(f"{c['table'][(lr, e)]:5.1f}" for e in eps))
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n" + json.dumps(
            {g: {k: {f: v for f, v in c.items() if f != "table"} for k, c in r.items()} for g, r in rows.items()},
            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
