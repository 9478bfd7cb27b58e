"""Training faults and multi-node launch on loopback.

- kill -9 in the middle of writing a checkpoint (two points: engine files half written; everything
  written but the COMPLETE marker): the half-written directory is never picked up, ``--resume`` starts
  from the last complete checkpoint, and losses and weights equal an unbroken run bitwise (dropout on).
  The kill point is made deterministic by a wrapper that pauses the save at that point and signals it
  through a flag file; the test then SIGKILLs the process group (nothing of the product is mocked).
- a damaged checkpoint file (truncated or bytes flipped): refused with one line naming the file.
- ``torchrun --nnodes 2 --nproc_per_node 1`` twice (c10d rendezvous on 127.0.0.1, gloo, DeepSpeed
  ZeRO-2): same losses as one ``torchrun --nproc_per_node 2``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

from scale_support import DS_ARGS, REPO, base_env, flip_bytes, free_port, kill_group, losses, run_cli, truncate_file

sys.path.insert(0, str(REPO / "tests" / "bert_core"))
from train_helpers import write_dataset  # noqa: E402

pytestmark = [pytest.mark.slow]

STEPS, SAVE_EVERY, KILL_STEP = 6, 2, 4
TRAIN = ["--engine", "torch", "--max-steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--log-every", "1",
         "--micro-batch-size", "4", "--lr", "1e-3", "--seed", "9", "--grad-accum-steps", "2"]

# Pauses the save of checkpoint KILL_STEP at KILL_POINT and touches KILL_FLAG, then runs the real CLI.
PAUSING_ENTRY = r"""
import os, sys, time
from pathlib import Path
import torch
import bert_core.checkpoint as ck
step, point, flag = int(os.environ["KILL_STEP"]), os.environ["KILL_POINT"], Path(os.environ["KILL_FLAG"])
tmp_name = ".tmp-step_%08d" % step

def pause():
    flag.touch()
    time.sleep(600)

if point == "engine":      # the first engine file is on disk, the rest of the checkpoint is not
    real_save = torch.save
    def save(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        if tmp_name in str(f):
            pause()
    torch.save = save
else:                      # everything written except the COMPLETE marker
    real_write = ck.write_json_atomic
    def write(path, obj):
        if Path(path).name == ck.MARKER and tmp_name in str(path):
            pause()
        return real_write(path, obj)
    ck.write_json_atomic = write
from bert_core.launch import main
sys.exit(main(sys.argv[1:]))
"""


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _one_error(proc: subprocess.CompletedProcess) -> str:
    errors = [x for x in proc.stderr.splitlines() if x.startswith("bertflow: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("tf") / "data", n=96, vocab_size=100, max_seq=32)


@pytest.fixture(scope="module")
def unbroken(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tf") / "unbroken"
    proc = run_cli(["-m", "bert_core.train", "--data-dir", str(data), "--output-dir", str(out), *TRAIN], base_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("point", ["engine", "marker"])
def test_kill_mid_checkpoint_write_resumes_from_last_complete(point, data, unbroken, tmp_path):
    from bert_core.checkpoint import CheckpointManager, load_model_from_checkpoint

    out, flag = tmp_path / "run", tmp_path / "paused"
    env = base_env(KILL_STEP=str(KILL_STEP), KILL_POINT=point, KILL_FLAG=str(flag))
    cmd = [sys.executable, "-c", PAUSING_ENTRY, "--data-dir", str(data), "--output-dir", str(out), *TRAIN]
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + HANG_S
        while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert flag.exists(), (tmp_path / "killed.log").read_text()[-3000:]
        kill_group(proc, signal.SIGKILL)
    half = out / "checkpoints" / f".tmp-step_{KILL_STEP:08d}"
    assert half.is_dir() and not (half / "COMPLETE").exists()
    assert not (out / "checkpoints" / f"step_{KILL_STEP:08d}").exists()
    assert CheckpointManager(out).latest().name == f"step_{KILL_STEP - SAVE_EVERY:08d}"

    proc = run_cli(["-m", "bert_core.train", "--data-dir", str(data), "--output-dir", str(out), *TRAIN, "--resume"],
                   base_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert losses(out) == losses(unbroken)  # bitwise: floats compared exactly
    assert [r["step"] for r in _metrics(out)] == list(range(1, STEPS + 1))
    wa, wb = (load_model_from_checkpoint(d)[0].state_dict() for d in (unbroken, out))
    import torch

    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not half.exists()  # the next save of that step cleared the debris


@pytest.mark.parametrize("damage", [truncate_file, flip_bytes], ids=["truncated", "flipped"])
def test_corrupt_checkpoint_file_is_refused_naming_it(damage, data, unbroken, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(unbroken, run)
    ckpt = run / "checkpoints" / f"step_{STEPS:08d}"
    victim = ckpt / "engine" / "model.pt"
    damage(victim)
    resume = run_cli(["-m", "bert_core.train", "--data-dir", str(data), "--output-dir", str(run), *TRAIN, "--resume"],
                     base_env())
    line = _one_error(resume)
    assert str(victim) in line, line
    export = run_cli(["-m", "flows.cli", "export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf")], base_env())
    line = _one_error(export)
    assert str(victim) in line, line
    assert not (tmp_path / "hf" / "config.json").exists()


@pytest.mark.deepspeed
def test_torchrun_two_nodes_on_loopback_matches_one_launcher(ds_reference, tmp_path):
    ds, data, env = ["--launcher", "torchrun", *DS_ARGS], ds_reference["data"], base_env()
    two = tmp_path / "two"
    port = free_port()
    procs = []
    for node in range(2):
        log = open(tmp_path / f"node{node}.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
             "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "scale-test",
             "--local_addr", "127.0.0.1", "-m", "bert_core.train", "--data-dir", str(data), "--output-dir", str(two), *ds],
            env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        codes = [p.wait(timeout=HANG_S) for p in procs]
    finally:
        for p in procs:
            kill_group(p, signal.SIGKILL, wait=10)
    logs = "\n".join((tmp_path / f"node{n}.log").read_text()[-2000:] for n in range(2))
    assert codes == [0, 0], logs
    state = json.loads((two / "checkpoints" / "step_00000003" / "trainer_state.json").read_text())
    assert state["world_size"] == 2
    assert {p.name for p in (two / "checkpoints" / "step_00000003" / "rng").iterdir()} == {"rank_00000.pt", "rank_00001.pt"}
    assert losses(two) == losses(ds_reference["run"]) and len(losses(two)) == 3
