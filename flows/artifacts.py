"""What a pipeline run shows in the Prefect UI: data statistics, training metrics, the loss curve,
evaluation results and a summary with the output paths. Pure formatting lives here so it is testable
without Prefect; ``publish_*`` functions create the artifacts (they need a flow or task run context).
"""
from __future__ import annotations

import base64
import io
import json
import math
from pathlib import Path
from typing import Any, Iterable

from matplotlib.figure import Figure

from bert_core.train_log import read_metrics  # noqa: F401  (art.read_metrics: the one metrics.jsonl reader)
from contracts.common import atomic_path

# Prefect artifact keys: lowercase letters, digits and dashes only.
KEY_DATA, KEY_TRAIN, KEY_LOSS, KEY_EVAL, KEY_SUMMARY = (
    "bertflow-data-stats",
    "bertflow-train-metrics",
    "bertflow-loss-curve",
    "bertflow-eval-results",
    "bertflow-summary",
)


def loss_series(rows: Iterable[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """{metric name: [(step, value)]} for every finite numeric field whose name mentions 'loss'.

    Rows carrying a ``phase`` get it as a prefix: each phase counts its steps from 1 again."""
    series: dict[str, list[tuple[float, float]]] = {}
    for i, row in enumerate(rows):
        step = row.get("step", i)
        prefix = f"{row['phase']} " if "phase" in row else ""
        for key, value in row.items():
            if "loss" in key and isinstance(value, (int, float)) and math.isfinite(value):
                series.setdefault(prefix + key, []).append((float(step), float(value)))
    return series


def plot_loss_png(series: dict[str, list[tuple[float, float]]], out: str | Path, title: str = "") -> Path:
    """Write the loss curve(s) as a PNG (matplotlib, no display needed)."""
    fig = Figure(figsize=(6, 3.5), dpi=100)  # no pyplot: no global backend, nothing to close
    ax = fig.subplots()
    for name, points in sorted(series.items()):
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, label=name, linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title or "pretraining loss")
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    with atomic_path(out) as tmp:
        tmp.write_bytes(buf.getvalue())
    return Path(out)


def data_url(png: str | Path) -> str:
    """The PNG inlined as a data: URL, so the UI shows it without serving files from the worker."""
    return "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode("ascii")


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)[:200]
    return value


def stats_rows(manifests: dict[str, Any]) -> list[dict[str, Any]]:
    """One table row per dataset: stage, directory, files, rows, and its totals/stats flattened."""
    rows = []
    for stage, (directory, manifest) in manifests.items():
        row = {"stage": stage, "directory": str(directory), "files": len(manifest.files)}
        row["rows"] = sum(f.rows for f in manifest.files)
        for key, value in {**manifest.totals, **manifest.stats}.items():
            row[key] = _cell(value)
        rows.append(row)
    return rows


def metrics_rows(rows: list[dict[str, Any]], max_rows: int = 50) -> list[dict[str, Any]]:
    """At most ``max_rows`` evenly spaced metric records (always including the last)."""
    if len(rows) > max_rows:
        stride = math.ceil(len(rows) / max_rows)
        rows = rows[::stride] + ([rows[-1]] if (len(rows) - 1) % stride else [])
    return [{k: _cell(v) for k, v in r.items()} for r in rows]


def eval_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Flatten {task: {metric: value}} (nesting allowed) into rows of task / metric / value; the
    evaluations' echoed ``config`` sections are left out (they are settings, not results)."""
    out = []

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for key, value in sorted(obj.items()):
                if key == "config":
                    continue
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
            task, _, metric = prefix.partition(".")
            out.append({"task": task, "metric": metric or task, "value": _cell(obj)})

    walk("", results)
    return out


def summary_markdown(title: str, paths: dict[str, Any], notes: Iterable[str] = ()) -> str:
    lines = [f"# {title}", "", "| output | path |", "|---|---|"]
    lines += [f"| {name} | `{path}` |" for name, path in paths.items() if path]
    notes = list(notes)
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


# --- Prefect side -------------------------------------------------------------------------------


def publish_table(key: str, rows: list[dict[str, Any]], description: str) -> None:
    from prefect.artifacts import create_table_artifact

    if rows:
        create_table_artifact(rows, key=key, description=description)


def publish_loss_curve(png: Path, description: str) -> None:
    from prefect.artifacts import create_image_artifact

    create_image_artifact(data_url(png), key=KEY_LOSS, description=description)


def publish_markdown(key: str, markdown: str, description: str) -> None:
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(markdown, key=key, description=description)
