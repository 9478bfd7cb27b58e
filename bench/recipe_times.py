#!/usr/bin/env python3
"""Where a recipe's wall time went, from what the run left behind: the flow log's task spans and the
GLUE cells' finish times.

- **Stages** (the Prefect log ``bertflow recipe`` printed): each task run from its first line to its
  ``Finished in state`` line (a task name that repeats, e.g. ``data-job-instances`` per phase, is paired
  in order), with the span between the first and the last log line as the whole run.
- **GLUE grids** (``<output_root>/compare/**/cells/*.json``): per grid directory (a row of the comparison,
  a reference row, a learning-curve point) the number of cells and the finish times of the first and the
  last. In process (``use_ray: false``) a grid's cells run after the previous grid's, so the gap between
  two grids' last cells is the later grid's time; on Ray (``evaluation.compare.run_grids``) the grids run
  at once and their spans overlap.

Log timestamps carry no date; the cells' times are printed in the same clock (UTC, ``HH:MM:SS``).

    python bench/recipe_times.py --log RUN.log --output-root runs/cpu-tiny
"""
from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

LINE = re.compile(r"^(\d\d:\d\d:\d\d)\.\d+ \| \w+ +\| (Task run|Flow run) '([^']+)' - (.*)$")


def _seconds(hms: str) -> int:
    h, m, s = (int(x) for x in hms.split(":"))
    return 3600 * h + 60 * m + s


def _span(a: str, b: str) -> str:
    d = (_seconds(b) - _seconds(a)) % 86400  # a run past midnight
    return f"{d // 3600} h {d % 3600 // 60:02d} min {d % 60:02d} s"


def task_spans(log: Path) -> list[tuple[str, str, str]]:
    """(task name, first line's time, finished time) per task run, in the order they finished."""
    open_runs: dict[str, list[str]] = {}
    spans = []
    for line in log.read_text(encoding="utf-8", errors="replace").replace("\r", "\n").splitlines():
        m = LINE.match(line)
        if not m:
            continue
        t, kind, name, msg = m.groups()
        if kind == "Flow run":  # the flows hold the stages: only their task runs are spans
            continue
        starts = open_runs.setdefault(name, [])
        if msg.startswith("Finished in state"):
            if starts:
                spans.append((name, starts.pop(0), t))
        elif not starts or msg.startswith("stage ") and msg.split(":", 1)[0].endswith("running (no output yet)"):
            starts.append(t)
    return spans


def grid_times(root: Path) -> list[tuple[str, int, str, str]]:
    """(grid directory relative to ``root``, cells, first cell finished, last cell finished), by last."""
    grids = []
    for cells in sorted(root.glob("compare/**/cells")):
        times = sorted(p.stat().st_mtime for p in cells.glob("*.json"))
        if times:
            hms = [datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S") for t in (times[0], times[-1])]
            grids.append((str(cells.parent.relative_to(root)), len(times), *hms, times[-1]))
    return [g[:4] for g in sorted(grids, key=lambda g: g[4])]


def report(log: Path, root: Path) -> list[str]:
    text = log.read_text(encoding="utf-8", errors="replace").replace("\r", "\n")
    stamps = [m.group(1) for m in map(LINE.match, text.splitlines()) if m]
    out = []
    if stamps:
        out.append(f"flow log: {stamps[0]} to {stamps[-1]} UTC, {_span(stamps[0], stamps[-1])}")
    out += ["", "stages (task runs, first log line to finished):"]
    out += [f"  {a}-{b}  {_span(a, b):>20}  {name}" for name, a, b in task_spans(log)]
    out += ["", "GLUE grids (cells; first and last cell finished, UTC):"]
    out += [f"  {a}-{b}  {n:4d} cells  {d}" for d, n, a, b in grid_times(root)]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--log", required=True, type=Path, help="what `bertflow recipe` printed")
    p.add_argument("--output-root", required=True, type=Path, help="the recipe's output_root")
    a = p.parse_args(argv)
    for f, what in ((a.log, "log"), (a.output_root, "output root")):
        if not f.exists():
            print(f"recipe_times: error: {f}: {what} not found", file=sys.stderr)
            return 2
    print("\n".join(report(a.log, a.output_root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
