"""Running on a cluster (issue 10), where it works: relative paths given to jobs joining an existing Ray
cluster started from another directory land where the user meant, the README's ``ray job submit
--runtime-env ...`` commands succeed, ``bertflow train`` with a launcher stops every rank on SIGTERM;
and the pieces behind them (config paths made absolute, the driver's runtime env, stop_tree). One shared
two-node cluster (token auth on) from tests/scale/conftest.py. Where it must refuse (relative paths that
do not exist, user errors inside a submitted job or a torchrun rank), the cases are in the hostile
battery (test_hostile.py, hostile_cases_cluster.py).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hostile_check import ray_job_submit
from scale_support import REPO, run_cli, write_corpus
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _manifest_files_exist(out: Path) -> None:
    """Every data file the manifest names is beside it (the manifest vouches for nothing elsewhere)."""
    manifest = json.loads((out / "manifest.json").read_text())
    names = [f["name"] for f in manifest.get("files", [])]
    assert names, manifest.keys()
    for name in names:
        assert (out / name).is_file(), f"manifest names {name}, not in {out}"


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    """A user's directory, not the cluster's working directory, holding a small corpus."""
    root = tmp_path_factory.mktemp("user")
    write_corpus(root / "text", files=3, docs_per_file=20, seed=4)
    return root


@pytest.fixture(scope="module")
def rel_datasets(two_node_cluster, user_dir) -> Path:
    """shard, vocab and instances with relative paths only, run from the user's directory while the
    cluster runs elsewhere: the Parquet files must land beside the user's manifests."""
    env, addr = two_node_cluster.env, two_node_cluster.address
    steps = [
        ["-m", "data_jobs.shard_job", "--inputs", "text", "--input-format", "bert", "--output-dir", "reldocs",
         "--num-shards", "3", "--engine", "ray", "--ray-address", addr],
        ["-m", "data_jobs.vocab_job", "--shards-dir", "reldocs", "--output-dir", "relvocab", "--vocab-size", "120",
         "--min-frequency", "1"],
        ["-m", "data_jobs.instances_job", "--shards-dir", "reldocs", "--vocab-dir", "relvocab", "--output-dir",
         "relout", "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--dupe-factor", "2",
         "--engine", "ray", "--ray-address", addr],
    ]
    for args in steps:
        proc = run_cli(args, env, timeout=HANG_S, cwd=user_dir)
        assert proc.returncode == 0, f"{args}\n{proc.stderr[-3000:]}"
    return user_dir


def test_relative_output_dirs_on_a_cluster_started_elsewhere(rel_datasets):
    for name in ("reldocs", "relout"):
        out = rel_datasets / name
        assert list(out.rglob("*.parquet")), f"no Parquet files in the user's {name}"
        _manifest_files_exist(out)
    # Nothing written relative to the cluster's working directory (the repository, the tests' cwd).
    for name in ("reldocs", "relvocab", "relout"):
        assert not (REPO / name).exists()


def _submit(cluster, entry: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    """The README's command: `ray job submit --runtime-env cluster/ray/runtime_env.yaml -- python -m ...`."""
    return subprocess.run(ray_job_submit(f"http://127.0.0.1:{cluster.dashboard_port}", entry), env=cluster.env,
                          cwd=cwd, capture_output=True, text=True, timeout=HANG_S)


@pytest.mark.parametrize("job", ["shard", "instances"])
def test_readme_ray_job_submit_with_runtime_env(two_node_cluster, rel_datasets, tmp_path, job):
    """The two jobs whose ray.init used to conflict with the job's runtime env (issue 10)."""
    docs, vocab = rel_datasets / "reldocs", rel_datasets / "relvocab"
    if job == "shard":
        entry = ["-m", "data_jobs.shard_job", "--inputs", str(rel_datasets / "text"), "--input-format", "bert",
                 "--output-dir", str(tmp_path / "out"), "--num-shards", "2"]
    else:
        entry = ["-m", "data_jobs.instances_job", "--shards-dir", str(docs), "--vocab-dir", str(vocab),
                 "--output-dir", str(tmp_path / "out"), "--max-seq-length", "32", "--dupe-factor", "1"]
    proc = _submit(two_node_cluster, entry)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert "Failed to merge" not in text
    assert "succeeded" in text
    _manifest_files_exist(tmp_path / "out")


# ---------------------------------------------------------------- bertflow train with a launcher

def _tree(root: int) -> list[int]:
    from bert_core.launch import _descendants

    return _descendants(root)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    import sys

    sys.path.insert(0, str(REPO / "tests" / "bert_core"))
    from train_helpers import write_dataset

    return write_dataset(tmp_path_factory.mktemp("tiny") / "data", n=64, vocab_size=100, max_seq=32)


TRAIN = ["-m", "bert_core.launch", "--launcher", "torchrun", "--num-workers", "2", "--engine", "deepspeed",
         "--zero-stage", "1", "--micro-batch-size", "2", "--log-every", "1"]


@pytest.mark.deepspeed
def test_sigterm_to_bertflow_train_stops_every_rank(tiny_data, tmp_path):
    import os
    import signal
    import sys
    import time

    from scale_support import base_env

    cmd = [sys.executable, *TRAIN, "--data-dir", str(tiny_data), "--output-dir", str(tmp_path / "run"),
           "--max-steps", "100000", "--save-every", "100000"]
    proc = subprocess.Popen(cmd, env=base_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline, ranks = time.monotonic() + HANG_S, []
        # Wait until both ranks train (a metrics row is logged), as a user would press Ctrl-C mid-run.
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = tmp_path / "run" / "metrics.jsonl"
            if metrics.exists() and metrics.read_text().strip():
                ranks = _tree(proc.pid)
                break
            time.sleep(1)
        assert proc.poll() is None and ranks, "training never started"
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "every rank stopped" in out
    time.sleep(1)
    alive = [p for p in ranks if Path(f"/proc/{p}").exists()
             and b"bert_core" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert not alive, f"ranks still running: {alive}"


# ---------------------------------------------------------------- no cluster needed

@pytest.mark.parametrize("model,fields,resolved", [
    ("ShardConfig", {"inputs": ["text"], "output_dir": "out"}, ["inputs", "output_dir"]),
    ("ShardConfig", {"inputs": ["a/*.txt", "builtin:python-docs"], "output_dir": "../x"}, ["output_dir"]),
    ("VocabConfig", {"shards_dir": "docs", "output_dir": "v"}, ["shards_dir", "output_dir"]),
    ("VocabConfig", {"vocab_file": "~/vocab.txt", "output_dir": "./v"}, ["vocab_file", "output_dir"]),
    ("InstancesConfig", {"shards_dir": "d", "vocab_dir": "v", "output_dir": "relout"},
     ["shards_dir", "vocab_dir", "output_dir"]),
    ("InstancesConfig", {"shards_dir": "a/../d", "vocab_dir": "~/v", "output_dir": "o/"},
     ["shards_dir", "vocab_dir", "output_dir"]),
])
def test_config_paths_are_absolute_before_any_task(model, fields, resolved, tmp_path, monkeypatch):
    """A config read anywhere (CLI, flow, YAML) holds absolute paths, so a Ray task on a cluster started
    from another directory writes where the user meant; built-in corpora stay as they are."""
    import os

    from data_jobs import config

    monkeypatch.chdir(tmp_path)
    cfg = getattr(config, model)(**fields)
    for name in resolved:
        value = getattr(cfg, name)
        for v in value if isinstance(value, list) else [value]:
            if not v.startswith("builtin:"):
                assert os.path.isabs(v) and "~" not in v and "/../" not in v, (name, v)
                assert v.startswith(str(tmp_path.parent)) or v.startswith(os.path.expanduser("~"))
    if "builtin:python-docs" in fields.get("inputs", []):
        assert "builtin:python-docs" in cfg.inputs


@pytest.mark.parametrize("job_env,expected", [
    (None, {"TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS", "RAY_USAGE_STATS_ENABLED"}),
    ({"runtime_env": {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1",
                                   "RAY_USAGE_STATS_ENABLED": "0"}}}, set()),
    ({"runtime_env": {"env_vars": {"RAYON_NUM_THREADS": "4"}}}, {"TOKENIZERS_PARALLELISM", "RAY_USAGE_STATS_ENABLED"}),
    ({"runtime_env": {"working_dir": "gcs://x.zip"}}, {"TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS",
                                                      "RAY_USAGE_STATS_ENABLED"}),
    ("not json", {"TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS", "RAY_USAGE_STATS_ENABLED"}),
])
def test_driver_runtime_env_never_conflicts_with_the_jobs(job_env, expected, monkeypatch):
    """ray.init inside `ray job submit` may not name a variable the job's runtime env names (Ray: 'Failed
    to merge the Job's runtime env ... because of a conflict'): the job's value wins."""
    from data_jobs.ray_util import driver_runtime_env

    if job_env is None:
        monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    else:
        monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", job_env if isinstance(job_env, str) else json.dumps(job_env))
    assert set(driver_runtime_env().get("env_vars", {})) == expected


CHILD_IN_OWN_SESSION = r"""
import subprocess, sys, time
# Like torchrun: the 'rank' runs in a session of its own, so the parent's process group misses it.
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print("ready", flush=True)
time.sleep(600)
"""


def test_stop_tree_stops_ranks_in_their_own_sessions():
    """launch.stop_tree: the launcher and every process below it, whatever its session."""
    import sys
    import time

    from bert_core.launch import _alive, _descendants, stop_tree

    proc = subprocess.Popen([sys.executable, "-c", CHILD_IN_OWN_SESSION], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + HANG_S
        while not _descendants(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        ranks = _descendants(proc.pid)
        assert ranks
        stop_tree(proc, grace_s=10)
        assert proc.poll() is not None
        assert not any(_alive(p) for p in ranks)
    finally:
        if proc.poll() is None:
            proc.kill()
