"""How much the generator-based hostile tests (issue 24) try, and how much of the readers they reach.

    .venv/bin/python bench/fuzz_report.py [--examples 300] [--out FILE]

Runs each reader property of the fuzz suite on its own, in long mode (BERTFLOW_FUZZ=long, random seeds)
with ``--examples`` generated cases, under coverage.py (branch coverage of the corpus readers in
data_jobs/readers/ and of the GLUE/SQuAD/CoNLL readers in evaluation/), and prints per property: the
outcome, the CPU time of its process tree (pytest's start-up and collection included: a few seconds), and
cases per CPU-minute; then line and branch coverage per reader module over all of them together. Nothing is compared against a baseline: these are counts,
not speeds of the product.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROPERTIES = [  # (format, pytest node id)
    ("bert (plain text)", "tests/data_jobs/test_fuzz_readers.py::test_bert_plain_text"),
    ("books (prose, Gutenberg)", "tests/data_jobs/test_fuzz_formats.py::test_books"),
    ("WikiExtractor", "tests/data_jobs/test_fuzz_readers.py::test_wikiextractor"),
    ("MediaWiki XML", "tests/data_jobs/test_fuzz_readers.py::test_mediawiki"),
    ("JSONL", "tests/data_jobs/test_fuzz_readers.py::test_jsonl"),
    ("Parquet", "tests/data_jobs/test_fuzz_formats.py::test_parquet"),
    ("any bytes, any format", "tests/data_jobs/test_fuzz_readers.py::test_any_bytes_any_format"),
    ("GLUE TSV", "tests/evaluation/test_fuzz_eval_readers.py::test_glue_tsv"),
    ("SQuAD JSON", "tests/evaluation/test_fuzz_eval_readers.py::test_squad_json"),
    ("CoNLL", "tests/evaluation/test_fuzz_eval_readers.py::test_conll"),
    ("shard job (files, dirs)", "tests/data_jobs/test_fuzz_shard.py::test_shard_job_conserves_documents"),
]
SOURCES = "data_jobs.readers,evaluation"
REPORTED = "*/data_jobs/readers/*,*/evaluation/glue.py,*/evaluation/squad.py,*/evaluation/ner.py,*/evaluation/text.py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=300, help="generated cases per property (default 300)")
    ap.add_argument("--out", help="also write the report to this file")
    args = ap.parse_args()
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    data = Path(tempfile.mkdtemp(prefix="fuzz-cov-"))
    env = {**os.environ, "BERTFLOW_FUZZ": "long", "BERTFLOW_FUZZ_EXAMPLES": str(args.examples),
           "COVERAGE_FILE": str(data / ".coverage")}
    load = os.getloadavg()
    say(f"fuzz_report {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores; "
        f"{args.examples} generated cases per property, random seeds (long mode); load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    say(f"{'format':26s} {'outcome':8s} {'CPU s':>7s} {'cases/CPU-min':>14s}")
    failed = 0
    for name, node in PROPERTIES:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, "-m", "coverage", "run", "--branch", "--parallel-mode",
                               f"--source={SOURCES}", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "--no-header", node], cwd=REPO, env=env, capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        ok = proc.returncode == 0
        failed += not ok
        say(f"{name:26s} {'pass' if ok else 'FAIL':8s} {cpu:7.1f} {args.examples / (cpu / 60):14.0f}")
        if not ok:
            say("  " + "\n  ".join(proc.stdout.strip().splitlines()[-6:]))
    subprocess.run([sys.executable, "-m", "coverage", "combine", "-q"], cwd=REPO, env=env, check=True)
    report = subprocess.run([sys.executable, "-m", "coverage", "report", "--skip-empty", f"--include={REPORTED}"],
                            cwd=REPO, env=env,
                            capture_output=True, text=True, check=True).stdout
    say("coverage of the readers over all the properties above (coverage.py, line and branch):")
    say("  " + "\n  ".join(report.strip().splitlines()))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
