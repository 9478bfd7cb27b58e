"""Hostile cases "on a cluster" (issue 10): relative paths given to jobs joining an existing Ray cluster
started from another directory, the README's ``ray job submit --runtime-env ...`` commands, and user
errors inside a submitted job. One shared two-node cluster (token auth on) from tests/scale/conftest.py.

Each case asserts the exit code, the one ``bertflow: error:`` line (or the files where the user
expects them), no traceback, and nothing that looks finished where it should not.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scale_support import BIN, REPO, run_cli, write_corpus

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _one_error_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, f"rc {proc.returncode}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x.startswith("bertflow: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


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
        proc = run_cli(args, env, timeout=240, cwd=user_dir)
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


@pytest.mark.parametrize("flag,value,needle", [
    ("--shards-dir", "no_such_docs", "no_such_docs"),
    ("--vocab-dir", "no_such_vocab", "no_such_vocab"),
])
def test_relative_missing_input_on_a_cluster_is_one_line(two_node_cluster, rel_datasets, flag, value, needle):
    args = {"--shards-dir": "reldocs", "--vocab-dir": "relvocab"}
    args[flag] = value
    proc = run_cli(["-m", "data_jobs.instances_job", *sum(([k, v] for k, v in args.items()), []),
                    "--output-dir", "relout_missing", "--engine", "ray", "--ray-address", two_node_cluster.address],
                   two_node_cluster.env, timeout=180, cwd=rel_datasets)
    line = _one_error_line(proc, needle)
    assert str(rel_datasets) in line  # the absolute path the user's relative one meant
    assert not (rel_datasets / "relout_missing" / "manifest.json").exists()


def test_relative_input_glob_with_no_match_is_one_line(two_node_cluster, rel_datasets):
    proc = run_cli(["-m", "data_jobs.shard_job", "--inputs", "nothing/*.txt", "--output-dir", "relnone",
                    "--engine", "ray", "--ray-address", two_node_cluster.address],
                   two_node_cluster.env, timeout=180, cwd=rel_datasets)
    _one_error_line(proc)
    assert not (rel_datasets / "relnone" / "manifest.json").exists()


def _submit(cluster, entry: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    """The README's command: `ray job submit --runtime-env cluster/ray/runtime_env.yaml -- python -m ...`."""
    cmd = [str(BIN / "ray"), "job", "submit", "--address", f"http://127.0.0.1:{cluster.dashboard_port}",
           "--runtime-env", "cluster/ray/runtime_env.yaml", "--", "python", *entry]
    return subprocess.run(cmd, env=cluster.env, cwd=cwd, capture_output=True, text=True, timeout=300)


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


def test_ray_job_submit_user_error_is_one_line(two_node_cluster, tmp_path):
    """A user error inside a submitted job: the job fails, its log holds the one line, no traceback."""
    proc = _submit(two_node_cluster, ["-m", "data_jobs.instances_job", "--shards-dir", str(tmp_path / "gone"),
                                      "--vocab-dir", str(tmp_path / "gone2"), "--output-dir", str(tmp_path / "o")])
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    # Ray prints the job's log twice (tailed, then in the status message): one distinct line.
    lines = {x for x in text.splitlines() if "bertflow: error:" in x}
    assert len(lines) == 1 and "gone" in lines.pop(), text[-3000:]
    assert not (tmp_path / "o" / "manifest.json").exists()


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
def test_torchrun_rank_user_error_is_one_line_exit_2(tmp_path):
    from scale_support import base_env

    proc = run_cli([*TRAIN, "--data-dir", str(tmp_path / "no_data"), "--output-dir", str(tmp_path / "run"),
                    "--max-steps", "2"], base_env(), timeout=420)
    _one_error_line(proc, "no_data")
    assert "ChildFailedError" not in proc.stderr + proc.stdout


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
        deadline, ranks = time.monotonic() + 400, []
        # Wait until both ranks train (a metrics row is logged), as a user would press Ctrl-C mid-run.
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = tmp_path / "run" / "metrics.jsonl"
            if metrics.exists() and metrics.read_text().strip():
                ranks = _tree(proc.pid)
                break
            time.sleep(1)
        assert proc.poll() is None and ranks, "training never started"
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
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


@pytest.mark.parametrize("job,args", [
    ("shard_job", ["--inputs", "no_such_corpus", "--output-dir", "o1"]),
    ("shard_job", ["--inputs", "no_such/*.txt", "--output-dir", "o2"]),
    ("vocab_job", ["--shards-dir", "no_such_docs", "--output-dir", "o3"]),
    ("vocab_job", ["--vocab-file", "no_such_vocab.txt", "--output-dir", "o4"]),
    ("instances_job", ["--shards-dir", "no_such_docs", "--vocab-dir", "no_such_vocab", "--output-dir", "o5"]),
])
def test_relative_missing_inputs_local_engine_one_line(job, args, tmp_path):
    """The same relative inputs without Ray: the line names the absolute path the relative one meant."""
    from scale_support import base_env

    proc = run_cli(["-m", f"data_jobs.{job}", *args, "--engine", "local"] if job != "vocab_job"
                   else ["-m", f"data_jobs.{job}", *args], base_env(), timeout=120, cwd=tmp_path)
    line = _one_error_line(proc, "no_such")
    assert str(tmp_path) in line
    assert not any(tmp_path.rglob("manifest.json"))


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
        deadline = time.monotonic() + 30
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
