"""Gathers job results into per-task summaries (best learning rate, mean ± std over seeds), writes
``results.json`` and ``report.md``.

A run record is ``{"task", "eval", "lr", "seed", "metrics": {name: value}, ...}``; ``eval`` names the
scored split (MNLI has two: "MNLI-m" picks the learning rate, "MNLI-mm" is reported at the same one).
Standard deviations are sample standard deviations (ddof=1; 0 for a single seed).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from contracts.common import atomic_path, write_json_atomic


def _mean_std(values: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0}


def choice_score(run: Mapping, metric: str) -> float:
    """What a run contributes to the choice of lr (and epoch): its held-out training split's score where it
    has one (GlueConfig ``select_on: train_split``), else its own (dev) score."""
    held = run.get("selection")
    return held["metrics"][metric] if held else run["metrics"][metric]


def at_choice(run: Mapping, task: Mapping) -> bool:
    """Whether ``run`` is one of the seeds at the task summary's chosen lr (and epoch, where one is chosen)."""
    return run["lr"] == task["best_lr"] and run.get("epoch") == task.get("best_epoch")


def _best(grid: Mapping[Any, Mapping[str, float]]) -> Any:
    # max keeps the first of equal means; a NaN mean (a cell written before constant predictions
    # scored 0) never wins over a number
    return max(grid, key=lambda k: grid[k]["mean"] if np.isfinite(grid[k]["mean"]) else -np.inf)


def summarize(runs: Sequence[Mapping], primary: Mapping[str, str], select_on: Mapping[str, str]) -> dict:
    """Per evaluation name: metric, best lr (chosen on ``select_on[eval]``'s primary metric, mean over
    seeds; ties go to the earlier lr of the grid) and every metric's mean ± std at that lr.

    Runs scored at several epochs (``"epoch"``) are chosen over (lr, epoch), ties to the earlier; runs that
    carry a held-out training split's score (``"selection"``) are chosen by it (``choice_score``), and the
    summary says so under ``"selection"``: dev is then reported at a choice it took no part in.
    ``primary``: eval name -> metric name; ``select_on``: eval name -> eval name that picks its lr.
    """
    by_eval: dict[str, dict[tuple, list[Mapping]]] = {}
    for r in runs:
        by_eval.setdefault(r["eval"], {}).setdefault((r["lr"], r.get("epoch")), []).append(r)
    out: dict[str, Any] = {}
    for name, by_key in by_eval.items():
        chooser = select_on.get(name, name)
        metric = primary[chooser]
        grid = {key: _mean_std([choice_score(r, metric) for r in rs]) for key, rs in by_eval[chooser].items()}
        best_lr, best_epoch = best = _best(grid)
        best_runs = by_key[best]
        metric_names = sorted(best_runs[0]["metrics"])
        per_lr = {}  # each lr at its own best epoch (by the same choice)
        for lr in dict.fromkeys(k[0] for k in by_key):
            key = _best({k: v for k, v in grid.items() if k[0] == lr and k in by_key})
            per_lr[f"{lr:g}"] = _mean_std([r["metrics"][primary[name]] for r in by_key[key]])
        out[name] = {
            "metric": primary[name],
            "best_lr": best_lr,
            **({"best_epoch": best_epoch} if best_epoch is not None else {}),
            **_mean_std([r["metrics"][primary[name]] for r in best_runs]),
            "seeds": [r["seed"] for r in best_runs],
            "metrics": {m: _mean_std([r["metrics"][m] for r in best_runs]) for m in metric_names},
            "by_lr": per_lr,
        }
        held = best_runs[0].get("selection")
        if held:
            out[name]["selection"] = {"metric": metric, "n": held["n"], **grid[best]}
    return out


def _fmt(x: float) -> str:
    return f"{x:.4f}" if abs(x) < 2 else f"{x:.2f}"


def markdown_report(results: Mapping) -> str:
    """Markdown: one table row per task (metric, best lr, mean ± std), plus the intrinsic curve."""
    kind = results.get("evaluation", "evaluation")
    lines = [f"# {kind} results", "", f"model: `{results.get('model_path', '?')}`"
             + (" (random init baseline)" if results.get("random_init") else ""), ""]
    tasks = results.get("tasks") or {}
    if tasks:
        lines += ["| task | metric | best lr | mean ± std | seeds | other metrics |", "|---|---|---|---|---|---|"]
        for name, t in tasks.items():
            others = ", ".join(
                f"{m} {_fmt(v['mean'])} ± {_fmt(v['std'])}" for m, v in t["metrics"].items() if m != t["metric"]
            )
            lr = f"{t['best_lr']:g}" if t.get("best_lr") is not None else "-"
            lr += f" (epoch {t['best_epoch']:g})" if t.get("best_epoch") is not None else ""
            lines.append(
                f"| {name} | {t['metric']} | {lr} | {_fmt(t['mean'])} ± {_fmt(t['std'])} "
                f"| {len(t.get('seeds', []))} | {others} |"
            )
        lines.append("")
        held = [f"{name} on {t['selection']['n']} training examples held out ({t['selection']['metric']} "
                f"{_fmt(t['selection']['mean'])})" for name, t in tasks.items() if t.get("selection")]
        if held:
            lines += ["lr and epoch chosen on a held-out part of train.tsv, never trained on; dev is reported at that "
                      "choice only: " + "; ".join(held) + ".", ""]
    curve = results.get("curve") or []
    if curve:
        lines += ["| step | checkpoint | MLM acc | MLM perplexity | NSP acc | masked tokens |", "|---|---|---|---|---|---|"]
        for p in curve:
            lines.append(
                f"| {p['step']} | `{Path(p['checkpoint']).name}` | {p['mlm_acc']:.4f} | {p['mlm_perplexity']:.2f} "
                f"| {p['nsp_acc']:.4f} | {p['mlm_count']} |"
            )
        lines.append("")
    return "\n".join(lines)


def write_results(output_dir: str | Path, results: Mapping) -> None:
    """results.json then report.md, each written atomically."""
    out = Path(output_dir)
    write_json_atomic(out / "results.json", results)
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text(markdown_report(results), encoding="utf-8")
