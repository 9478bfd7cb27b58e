"""kill -9 of the data jobs at each stage, and corrupted Parquet shards.

Each job runs as its CLI (``bertflow data <job>``) in a subprocess joining the test cluster; the
test watches the output directory for the first file a stage writes and SIGKILLs the job right then.
The rerun must give byte-identical files and exactly the documents of an unbroken run (none lost,
none doubled). A damaged shard (truncated, or bytes flipped at the same size) must be named by a
checksum error and recomputed by the rerun of the shard job.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from scale_support import REPO, flip_bytes, run_cli, tree_bytes, truncate_file, write_corpus
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

NUM_SHARDS = 6
INSTANCE_FLAGS = ["--max-seq-length", "32", "--max-predictions-per-seq", "5", "--dupe-factor", "4",
                  "--random-pool-docs", "40", "--seed", "5", "--num-workers", "2"]


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


def _shard_cmd(cluster, corpus: Path, out: Path) -> list[str]:
    return ["-m", "data_jobs.shard_job", "--input", str(corpus), "--format", "bert", "--output-dir", str(out),
            "--num-shards", str(NUM_SHARDS), "--num-workers", "2", "--ray-address", cluster.address]


def _instances_cmd(cluster, docs: Path, vocab: Path, out: Path) -> list[str]:
    return ["-m", "flows.cli", "data", "instances", "--shards-dir", str(docs), "--vocab-dir", str(vocab),
            "--output-dir", str(out), "--ray-address", cluster.address, *INSTANCE_FLAGS]


def _doc_ids(d: Path) -> list[str]:
    return [i for p in sorted(d.glob("shard-*.parquet")) for i in pq.read_table(p, columns=["doc_id"])["doc_id"].to_pylist()]


def _kill_when(cmd: list[str], env: dict, watch: Path, pattern: str, log: Path, timeout: float = HANG_S) -> bool:
    """Run ``cmd``; SIGKILL it the moment a file matching ``pattern`` appears under ``watch``.
    Returns True if it was killed (False: it finished first, so the kill point was missed)."""
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, *cmd], env=env, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if watch.is_dir() and next(watch.glob(pattern), None) is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.005)
        proc.wait(HANG_S)
    return proc.returncode == -signal.SIGKILL


@pytest.fixture(scope="module")
def unbroken(two_node_cluster, tmp_path_factory) -> dict:
    """Shard, vocab and instances runs never interrupted: the reference outputs."""
    cluster, root = two_node_cluster, tmp_path_factory.mktemp("unbroken")
    corpus = write_corpus(root / "corpus", files=4, docs_per_file=40, seed=1)
    # A document repeated across files: dedup must still drop exactly one copy after a kill.
    (root / "corpus" / "part99.txt").write_text((root / "corpus" / "part00.txt").read_text().split("\n\n")[0] + "\n")
    _ok(run_cli(_shard_cmd(cluster, corpus, root / "docs"), cluster.env))
    _ok(run_cli(["-m", "data_jobs.vocab_job", "--shards-dir", str(root / "docs"), "--output-dir", str(root / "vocab"),
                 "--vocab-size", "120", "--min-frequency", "1"], cluster.env))
    _ok(run_cli(_instances_cmd(cluster, root / "docs", root / "vocab", root / "inst"), cluster.env))
    return {"corpus": corpus, "docs": root / "docs", "vocab": root / "vocab", "inst": root / "inst"}


# stage -> file the stage writes first (under the output dir)
SHARD_STAGES = {"read": ".work/parts/*/*.parquet", "dedup": ".work/drops/*.parquet", "merge": "shard-*.parquet"}


@pytest.mark.parametrize("stage", list(SHARD_STAGES))
def test_shard_job_killed_at_each_stage_reruns_identically(stage, two_node_cluster, unbroken, tmp_path):
    cluster, out = two_node_cluster, tmp_path / "docs"
    killed = _kill_when(_shard_cmd(cluster, unbroken["corpus"], out), cluster.env, out, SHARD_STAGES[stage],
                        tmp_path / "killed.log")
    assert killed, f"the job finished before the {stage} stage could be interrupted"
    assert not (out / "manifest.json").exists(), "a killed run left a manifest"
    _ok(run_cli(_shard_cmd(cluster, unbroken["corpus"], out), cluster.env))
    assert tree_bytes(out) == tree_bytes(unbroken["docs"])
    ids, ref = _doc_ids(out), _doc_ids(unbroken["docs"])
    assert len(ids) == len(set(ids)) == len(ref) and set(ids) == set(ref)  # none lost, none doubled
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (out, unbroken["docs"]))
    assert a["totals"] == b["totals"] and a["totals"]["dropped"].get("duplicate") == 1
    assert not (out / ".work").exists()


@pytest.mark.parametrize("pattern", ["part-*-len*.parquet", "part-*.done.json"], ids=["first-part", "first-shard-done"])
def test_instances_job_killed_midway_reruns_identically(pattern, two_node_cluster, unbroken, tmp_path):
    cluster, out = two_node_cluster, tmp_path / "inst"
    cmd = _instances_cmd(cluster, unbroken["docs"], unbroken["vocab"], out)
    assert _kill_when(cmd, cluster.env, out, pattern, tmp_path / "killed.log"), "the job finished before the kill"
    assert not (out / "manifest.json").exists()
    _ok(run_cli(cmd, cluster.env))
    assert tree_bytes(out) == tree_bytes(unbroken["inst"])
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (out, unbroken["inst"]))
    assert a["files"] == b["files"] and a["totals"] == b["totals"]


@pytest.mark.parametrize("damage", [truncate_file, flip_bytes], ids=["truncated", "flipped"])
def test_corrupt_shard_is_named_refused_and_recomputed(damage, two_node_cluster, unbroken, tmp_path):
    import shutil

    cluster, docs = two_node_cluster, tmp_path / "docs"
    shutil.copytree(unbroken["docs"], docs)
    victim = docs / "shard-00002.parquet"
    damage(victim)
    # 1. inspect --verify names the file, one line, exit non-zero
    proc = run_cli(["-m", "data_jobs.inspect", str(docs), "--verify", "-n", "0"], cluster.env)
    errors = [x for x in proc.stderr.splitlines() if x.startswith("bertflow: error:")]
    assert proc.returncode != 0 and len(errors) == 1 and str(victim) in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    # 2. the downstream job refuses it, naming it, and writes nothing that looks finished
    inst = tmp_path / "inst"
    proc = run_cli(_instances_cmd(cluster, docs, unbroken["vocab"], inst), cluster.env)
    errors = [x for x in proc.stderr.splitlines() if x.startswith("bertflow: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and str(victim) in errors[0], proc.stderr[-3000:]
    assert not (inst / "manifest.json").exists()
    # 3. rerunning the shard job recomputes exactly that shard
    intact = {p.name: p.stat().st_mtime_ns for p in docs.glob("shard-*.parquet") if p != victim}
    _ok(run_cli(_shard_cmd(cluster, unbroken["corpus"], docs), cluster.env))
    assert tree_bytes(docs) == tree_bytes(unbroken["docs"])
    assert {p.name: p.stat().st_mtime_ns for p in docs.glob("shard-*.parquet") if p != victim} == intact
