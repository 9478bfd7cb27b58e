"""Training with its run directory on a real S3 server (moto, 127.0.0.1): DeepSpeed ZeRO-1 bf16 on 2 gloo
ranks writes each checkpoint to node-local scratch, every rank uploads its files and rank 0 the COMPLETE
marker last (bert_core.remote_run). One unbroken local run and one run to s3:// (the same losses), then
the s3 run's last checkpoint made incomplete (its marker removed, as by a kill during its upload) and
the run resumed from s3:// on ONE rank with a new, empty scratch: it skips the checkpoint without a
marker, pulls the previous complete one, reshards it (bert_core.zero_reshard) and continues with the
unbroken run's losses (the tolerance of test_elastic.py). Keep-last deletes only objects a marker
names. Launches: three training runs and three refused ones; the runs are shared by every test here.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_deepspeed import ENV, _port, _run  # noqa: F401  (the ZeRO tests' launcher helpers)
from test_elastic import KEYS, REL_TOL, _max_rel
from train_helpers import write_dataset

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]

STEPS, SAVE, KEEP = 6, 2, 2  # checkpoints 2, 4, 6; keep-last 2 purges step 2 on the store
STRANGER = b"someone else's notes\n"


def _cmd(data: Path, out: str, ranks: int, accum: int, *extra: str) -> list[str]:
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port", str(_port())]
    return [*launch, "-m", "bert_core.train", "--data-dir", str(data), "--output-dir", out, "--engine", "deepspeed",
            "--zero-stage", "1", "--precision", "bf16", "--optimizer", "adamw", "--launcher", "torchrun",
            "--max-steps", str(STEPS), "--save-every", str(SAVE), "--keep-last", str(KEEP), "--log-every", "1",
            "--micro-batch-size", "4", "--grad-accum-steps", str(accum), "--lr", "1e-3", "--seed", "11",
            "--dropout", "0", "--global-batch-size", "8", *extra]


def _records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def s3(s3_server):
    """This process pointed at the server; a fresh bucket."""
    mp = pytest.MonkeyPatch()
    for k, v in s3_server.env().items():
        mp.setenv(k, v)
    yield f"s3://{s3_server.new_bucket()}"
    mp.undo()


@pytest.fixture(scope="module")
def runs(s3, s3_server, tmp_path_factory):
    from contracts.storage import location

    tmp = tmp_path_factory.mktemp("train_s3")
    data = write_dataset(tmp / "data", n=240, vocab_size=100, max_seq=32, max_pred=5, bin_size=32)
    local, uri = tmp / "local", f"{s3}/run"
    _run(_cmd(data, str(local), 2, 1), tmp / "local.log")
    env = {**ENV, **s3_server.env(), "BERTFLOW_SCRATCH": str(tmp / "scratch1")}
    with open(tmp / "s3.log", "w") as fh:
        assert subprocess.run(_cmd(data, uri, 2, 1), env=env, stdout=fh, stderr=subprocess.STDOUT).returncode == 0, \
            (tmp / "s3.log").read_text()[-3000:]
    loc = location(uri)
    after_first = {m.name: m for m in loc.list()}
    metrics_first = loc.read("metrics.jsonl").decode()
    inventory = json.loads(loc.read(f"checkpoints/step_{STEPS - SAVE:08d}/COMPLETE"))["files"]
    mirror_left = any((tmp / "scratch1").iterdir())
    # The last checkpoint's upload cut short: its files are there, its marker is not.
    loc.delete(f"checkpoints/step_{STEPS:08d}/COMPLETE")
    loc.write(f"checkpoints/step_{STEPS - SAVE:08d}/notes.txt", STRANGER)  # not named by any marker
    # ... and the killed run's lease left behind, unexpired, naming a process of this host that is gone.
    gone = subprocess.Popen(["true"])
    gone.wait()
    loc.write(".bertflow.lock", json.dumps({"owner": "killed", "host": socket.gethostname(), "pid": gone.pid,
                                            "start": "0", "argv": [], "expires": time.time() + 600}).encode())
    env = {**env, "BERTFLOW_SCRATCH": str(tmp / "scratch2")}  # a replaced node: nothing local
    with open(tmp / "resume.log", "w") as fh:
        proc = subprocess.run(_cmd(data, uri, 1, 1, "--resume", "--keep-last", "1"), env=env, stdout=fh,
                              stderr=subprocess.STDOUT)
    assert proc.returncode == 0, (tmp / "resume.log").read_text()[-3000:]
    return {"data": data, "uri": uri, "local": local, "first": after_first, "metrics_first": metrics_first, "inventory": inventory,
            "mirror_left": mirror_left, "resume_log": (tmp / "resume.log").read_text(), "tmp": tmp}


def test_run_to_s3_has_the_local_runs_losses_and_only_its_own_objects(runs):
    local = _records((runs["local"] / "metrics.jsonl").read_text())
    remote = _records(runs["metrics_first"])
    assert [r["step"] for r in remote] == list(range(1, STEPS + 1))
    assert _max_rel(remote, local) == 0.0  # the same launch, the same bits: only where the files went differs
    names = set(runs["first"])
    assert {"train_config.json", "metrics.jsonl"} <= names and ".bertflow.lock" not in names  # lease released
    steps = {n.split("/")[1] for n in names if n.startswith("checkpoints/")}
    assert steps == {f"step_{s:08d}" for s in (4, 6)}  # keep-last 2: step 2's objects deleted
    # Every rank's files went up: the shards of both ranks and both RNG states, each named by the marker.
    inv = runs["inventory"]
    assert {"rng/rank_00000.pt", "rng/rank_00001.pt", "trainer_state.json"} <= set(inv)
    assert sum("zero_pp_rank_1" in k for k in inv) >= 1 and sum("zero_pp_rank_0" in k for k in inv) >= 1
    assert {f"checkpoints/step_{4:08d}/{k}" for k in inv} | {f"checkpoints/step_{4:08d}/COMPLETE"} == \
        {n for n in names if n.startswith(f"checkpoints/step_{4:08d}/")}
    assert not runs["mirror_left"]  # the node-local mirror is scratch: removed at the end


def test_resume_from_s3_on_one_rank_skips_the_unmarked_checkpoint_and_continues_the_run(runs):
    from contracts.storage import location

    log, uri = runs["resume_log"], runs["uri"]
    assert f"bertflow: skipping {uri}/checkpoints/step_{STEPS:08d}: no COMPLETE marker" in log
    assert f"bertflow: pulled {uri}/checkpoints/step_{STEPS - SAVE:08d}" in log
    assert "bertflow: taking over the expired lock of host" in log  # the killed run's lease: its pid is gone
    loc = location(uri)
    unbroken = _records((runs["local"] / "metrics.jsonl").read_text())
    resumed = _records(loc.read("metrics.jsonl").decode())
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    cut = STEPS - SAVE
    print(f"max relative difference after the resume: {_max_rel(resumed[cut:], unbroken[cut:]):.3e}")
    assert _max_rel(resumed[cut:], unbroken[cut:]) <= REL_TOL
    assert all(r["tokens_seen"] == u["tokens_seen"] for r, u in zip(resumed, unbroken))
    state = json.loads(loc.read(f"checkpoints/step_{STEPS:08d}/trainer_state.json"))
    assert state["step"] == STEPS and state["world_size"] == 1
    # keep-last 1 deleted step 4's own objects, and nothing a marker did not name.
    left = [m.name for m in loc.list(f"checkpoints/step_{cut:08d}")]
    assert left == [f"checkpoints/step_{cut:08d}/notes.txt"]
    assert loc.read(left[0]) == STRANGER
    assert not any((runs["tmp"] / "scratch2").iterdir())
    # The flows' question, asked of the store: this config's run, every step checkpointed.
    from bert_core.stage import status
    from bert_core.train_config import TrainConfig
    from contracts.common import build_config

    config = build_config(TrainConfig, json.loads(loc.read("train_config.json"))["config"], "train_config.json")
    assert config.output_dir == uri and status(config).done


def _refused(runs, s3_server, uri: str, *extra: str) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "bert_core.train", "--data-dir", str(runs["data"]), "--output-dir", uri,
           "--engine", "torch", "--launcher", "local", "--max-steps", "2", "--micro-batch-size", "4", *extra]
    env = {**ENV, **s3_server.env(), "BERTFLOW_SCRATCH": str(runs["tmp"] / "scratch3")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    return proc.returncode, proc.stderr


def test_a_prefix_holding_someone_elses_object_or_a_run_is_refused_untouched(runs, s3, s3_server):
    from contracts.storage import location

    theirs = location(f"{s3}/theirs")
    theirs.write("notes.txt", STRANGER)
    rc, err = _refused(runs, s3_server, f"{s3}/theirs")
    assert rc == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("bertflow: error:")]
    assert len(lines) == 1 and f"{s3}/theirs" in lines[0] and "notes.txt" in lines[0], err
    assert [m.name for m in theirs.list()] == ["notes.txt"] and theirs.read("notes.txt") == STRANGER
    before = {m.name: m.etag for m in location(runs["uri"]).list()}
    rc, err = _refused(runs, s3_server, runs["uri"])  # a run is there: --resume, or another prefix
    assert rc == 2 and "already holds a run" in err and "Traceback" not in err, err
    assert {m.name: m.etag for m in location(runs["uri"]).list()} == before


def test_a_prefix_whose_lease_another_run_holds_is_refused(runs, s3, s3_server):
    """The prefix's writer lock is the lease of contracts.lease: a live holder elsewhere keeps it."""
    import time

    from contracts.storage import location

    busy = location(f"{s3}/busy")
    lock = json.dumps({"owner": "other", "host": "another-host", "pid": 1, "start": None, "argv": [],
                       "expires": time.time() + 600}).encode()
    busy.write(".bertflow.lock", lock)
    rc, err = _refused(runs, s3_server, f"{s3}/busy")
    assert rc == 2 and "output in use by another run on another host" in err and "Traceback" not in err, err
    assert [m.name for m in busy.list()] == [".bertflow.lock"] and busy.read(".bertflow.lock") == lock
