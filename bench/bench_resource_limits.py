"""Hostile sizes against ordinary ones of the same bytes (issue 24's resource limits), each pair
interleaved, whole process trees (bench/treemeter.py), the shard job with local workers:

  line   one 1 GiB line (no newline)                vs 1 GiB of ordinary lines (documents of 10 sentences)
  files  N tiny files (one 2-sentence document each) vs one file holding the same N documents

Prints wall, CPU and peak RSS of both and their ratios (hostile / ordinary), and what the job reported:
the 1 GiB line dropped as ``line_too_long`` (bounded by --max-line-bytes), every tiny file's document
kept. Figures are ratios within this run; never against a remembered constant.

    .venv/bin/python bench/bench_resource_limits.py [--gib 1] [--files 100000] [--rounds 1] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from treemeter import emit, run_tree  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
SENT = "The quick brown fox jumps over the lazy dog near the river bank today."  # 70 bytes + newline


def write_long_line(path: Path, size: int) -> None:
    chunk = (SENT + " ").encode() * (1 << 14)
    with open(path, "wb") as fh:
        left = size
        while left > 0:
            fh.write(chunk[:left])
            left -= len(chunk)


def write_lines(path: Path, size: int) -> None:
    doc = ((SENT + "\n") * 10 + "\n").encode()
    with open(path, "wb") as fh:
        for _ in range(size // len(doc)):
            fh.write(doc)


def write_tiny(root: Path, n: int) -> None:
    root.mkdir(parents=True)
    for i in range(n):
        sub = root / f"{i // 1000:04d}"
        if i % 1000 == 0:
            sub.mkdir()
        (sub / f"{i:07d}.txt").write_text(f"Document {i} begins here.\nIt ends here.\n", encoding="utf-8")


def write_one(path: Path, n: int) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(f"Document {i} begins here.\nIt ends here.\n\n")


def shard(inputs: Path, out: Path) -> dict:
    cmd = [PY, "-m", "data_jobs.shard_job", "--inputs", str(inputs), "--output-dir", str(out), "--input-format",
           "bert", "--engine", "local", "--num-workers", "2", "--num-shards", "4", "--no-dedup"]
    r = run_tree(cmd, cwd=str(REPO))
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    totals = json.loads((out / "manifest.json").read_text())["totals"]
    shutil.rmtree(out)
    return {"wall_s": r.wall_s, "cpu_s": r.cpu_s, "peak_rss_mb": r.peak_rss_mb, "kept": totals["documents_kept"],
            "dropped": totals["dropped"], "skipped": totals["files_skipped"], "files_read": totals["files_read"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="size of the long line and of its ordinary twin")
    p.add_argument("--files", type=int, default=100_000, help="how many tiny files")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", help="also write the report here")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-limits-"))
    lines = [f"bench_resource_limits: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{args.gib:g} GiB line, {args.files:,} tiny files, {args.rounds} round(s), load "
             f"{open('/proc/loadavg').read().split()[0]}"]
    try:
        size = int(args.gib * (1 << 30))
        (work / "long").mkdir()
        (work / "ordinary").mkdir()
        write_long_line(work / "long" / "line.txt", size)
        write_lines(work / "ordinary" / "lines.txt", size)
        write_tiny(work / "tiny", args.files)
        (work / "one").mkdir()
        write_one(work / "one" / "all.txt", args.files)
        results: dict[str, list[dict]] = {"long": [], "ordinary": [], "tiny": [], "one": []}
        for r in range(args.rounds):  # alternate which of a pair goes first
            pairs = [("long", "ordinary"), ("tiny", "one")]
            for a, b in pairs:
                for name in ((a, b) if r % 2 == 0 else (b, a)):
                    results[name].append(shard(work / name, work / f"out-{name}"))
        for hostile, plain in (("long", "ordinary"), ("tiny", "one")):
            h, o = results[hostile][-1], results[plain][-1]
            lines.append(f"{hostile:>8}: wall {h['wall_s']:.1f} s, CPU {h['cpu_s']:.1f} s, peak RSS {h['peak_rss_mb']:.0f} MB; "
                         f"kept {h['kept']}, dropped {h['dropped']}, files read {h['files_read']}")
            lines.append(f"{plain:>8}: wall {o['wall_s']:.1f} s, CPU {o['cpu_s']:.1f} s, peak RSS {o['peak_rss_mb']:.0f} MB; "
                         f"kept {o['kept']}, dropped {o['dropped']}, files read {o['files_read']}")
            lines.append(f"   ratio {hostile}/{plain}: wall {h['wall_s'] / o['wall_s']:.2f}, CPU {h['cpu_s'] / o['cpu_s']:.2f}, "
                         f"peak RSS {h['peak_rss_mb'] / o['peak_rss_mb']:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
