"""Committed result files carry no absolute path of the machine that made them (bench/relative_paths.py)."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# An absolute path at the start of a string: after a quote, a backtick, a space, "(", "=" or a line start.
ABSOLUTE = re.compile(r"(?:^|(?<=[\"'`\s(=]))/(?:work|tmp|home|root|Users|scratch|mnt|data)/[^\"'`\s)]*", re.M)


def _tool():
    spec = importlib.util.spec_from_file_location("relative_paths", REPO / "bench" / "relative_paths.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_committed_report_names_a_machine_path():
    """Reports and result JSON (raw logs and benchmark printouts keep the command lines they recorded)."""
    found = []
    for root in ("docs/results", "bench/results"):
        for f in sorted((REPO / root).rglob("*")):
            if f.suffix in (".json", ".md") and f.is_file():
                found += [f"{f.relative_to(REPO)}: {m}" for m in ABSOLUTE.findall(f.read_text(encoding="utf-8"))]
    assert not found, "absolute paths (rewrite with bench/relative_paths.py):\n" + "\n".join(found[:20])


def test_paths_become_relative_to_the_run_folder(tmp_path):
    report = tmp_path / "comparison.json"
    report.write_text(json.dumps({
        "model_path": "/work/main/runs/x/export", "glue_dir": "/work/runs16/cpu-tiny/glue",
        "root": "/work/main", "other": "/workshop/a", "inner": "a/work/main/b", "url": "s3://b/work/main/c"}))
    md = tmp_path / "comparison.md"
    md.write_text("- pretrained: `/work/main/runs/x`\n(/work/main/y) and /work/main/z\n")
    assert _tool().main(["--root", "/work/main", str(report), str(md)]) == 0
    got = json.loads(report.read_text())
    assert got == {"model_path": "runs/x/export", "glue_dir": "../runs16/cpu-tiny/glue", "root": ".",
                   "other": "/workshop/a", "inner": "a/work/main/b", "url": "s3://b/work/main/c"}
    assert md.read_text() == "- pretrained: `runs/x`\n(y) and z\n"
    assert not ABSOLUTE.findall(report.read_text() + md.read_text())
