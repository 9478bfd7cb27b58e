"""Tiny task data written by tests that need a real fine-tuning run but no shared data."""
from __future__ import annotations

from pathlib import Path

WORDS = ["good", "bad", "fine", "poor", "great", "awful"]
POSITIVE = {"good", "fine", "great"}


def write_tiny_sst2(glue_dir: Path, noun: str = "movie") -> Path:
    """``glue_dir/SST-2/{train,dev}.tsv``: 32 and 16 one-word-sentiment sentences; returns ``glue_dir``."""
    task = glue_dir / "SST-2"
    task.mkdir(parents=True)
    for name, n in (("train.tsv", 32), ("dev.tsv", 16)):
        rows = [f"the {WORDS[i % 6]} {noun}\t{int(WORDS[i % 6] in POSITIVE)}" for i in range(n)]
        (task / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return glue_dir
