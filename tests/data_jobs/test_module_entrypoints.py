"""`python -m data_jobs.<job>` is how `ray job submit` runs the jobs: Ray must be able to pickle the
remote functions of a job started as __main__ (a worker cannot import "__main__")."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.schema import Manifest
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.shared_data]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_S)


def test_jobs_run_as_modules(tmp_path, shared_data, bert_uncased_vocab):
    repo = Path(__file__).resolve().parents[2]
    sample = shared_data / "corpus" / "bert_sample" / "sample_text.txt"
    steps = [
        ["data_jobs.shard_job", "--input", str(sample), "--output-dir", str(tmp_path / "docs"),
         "--num-shards", "3", "--num-workers", "1"],
        ["data_jobs.vocab_job", "--vocab-file", str(bert_uncased_vocab), "--output-dir", str(tmp_path / "vocab")],
        ["data_jobs.instances_job", "--shards-dir", str(tmp_path / "docs"), "--vocab-dir", str(tmp_path / "vocab"),
         "--output-dir", str(tmp_path / "inst"), "--num-workers", "1", "--dupe-factor", "2",
         "--max-seq-length", "64"],
    ]
    for args in steps:
        proc = _run(args, repo)
        assert proc.returncode == 0, f"{args[0]} failed:\n{proc.stderr[-3000:]}"
    manifest = Manifest.read(tmp_path / "inst")
    assert manifest.kind == "instances"
    assert manifest.totals["instances"] > 0
    assert not manifest.verify_files(tmp_path / "inst")
