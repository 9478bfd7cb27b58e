"""The one seeding function and the one device choice (bert_core.runtime), and the one test for a
Hugging Face directory (bert_core.checkpoint.is_hf_dir), shared by training and evaluation."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from bert_core.checkpoint import MARKER, is_hf_dir
from hang import HANG_S
from bert_core.runtime import device_for, seed_all


def _draws():
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_seed_all_fixes_python_numpy_and_torch():
    seed_all(7)
    a = _draws()
    seed_all(7)
    assert _draws() == a
    seed_all(8)
    assert _draws() != a
    seed_all(2**40 + 7)  # seeds beyond NumPy's 32 bits are folded, not refused
    assert np.random.get_state()[1][0] == np.random.RandomState(7).get_state()[1][0]


def test_device_for_uses_a_gpu_only_when_wanted_and_visible():
    assert device_for(use_gpu=False) == torch.device("cpu")
    expected = torch.device("cuda", 1) if torch.cuda.is_available() else torch.device("cpu")
    assert device_for(1) == expected


def test_one_hf_directory_test_for_training_checkpoints_and_evaluation(tmp_path):
    from evaluation.config import IntrinsicConfig
    from evaluation.modeling import model_format

    hf, run, ckpt = tmp_path / "hf", tmp_path / "run", tmp_path / "ckpt"
    for d in (hf, run / "checkpoints", ckpt):
        d.mkdir(parents=True)
    (hf / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (run / "config.json").write_text("{}")
    (ckpt / "config.json").write_text("{}")
    (ckpt / MARKER).write_text("{}")
    assert [is_hf_dir(p) for p in (hf, run, ckpt)] == [True, False, False]
    fmt = [model_format(IntrinsicConfig(model_path=str(p), output_dir="o", instances_dir="i")) for p in (hf, run, ckpt)]
    assert fmt == ["hf", "checkpoint", "checkpoint"]


def test_stale_deepspeed_build_lock_is_named(tmp_path, capsys):
    """A JIT-build lock left by a killed build hangs every later DeepSpeed run silently (torch's lock
    records no owner): the engine names a lock older than STALE_LOCK_S before it starts; a fresh one
    (a build in progress) and a missing folder are left unmentioned."""
    import os

    from bert_core.engine import STALE_LOCK_S, warn_stale_build_locks

    assert warn_stale_build_locks(tmp_path / "absent") == []
    old, fresh = tmp_path / "deepspeed_shm_comm" / "lock", tmp_path / "cpu_adam" / "lock"
    for lock in (old, fresh):
        lock.parent.mkdir()
        lock.touch()
    now = fresh.stat().st_mtime + 1
    os.utime(old, (now - STALE_LOCK_S - 60, now - STALE_LOCK_S - 60))
    assert warn_stale_build_locks(tmp_path, now=now) == [old]
    err = capsys.readouterr().err
    assert str(old) in err and str(fresh) not in err and err.count("\n") == 1


def test_jit_builds_use_the_environments_own_ninja(tmp_path):
    """Two ninjas (the environment's and the system's) do not read each other's build log, so DeepSpeed's
    shm op was rebuilt from scratch (20-30 s) whenever a launch with the other PATH had built it last: the
    engine puts the interpreter's bin directory first where it holds ninja, as activating it does."""
    import os

    from bert_core.engine import own_ninja_first

    env_bin, other = tmp_path / "venv" / "bin", tmp_path / "bare" / "bin"
    for d in (env_bin, other):
        d.mkdir(parents=True)
    (env_bin / "ninja").touch()
    sep = os.pathsep
    assert own_ninja_first(f"/usr/bin{sep}{env_bin}{sep}/bin", str(env_bin / "python")) == sep.join(
        [str(env_bin), "/usr/bin", "/bin"])  # moved first, not repeated
    assert own_ninja_first(f"/usr/bin{sep}/bin", str(other / "python")) == f"/usr/bin{sep}/bin"  # no ninja there
    assert own_ninja_first("", str(env_bin / "python")) == str(env_bin)


@pytest.mark.deepspeed
def test_deepspeed_on_cpu_builds_no_op(tmp_path):
    """A DeepSpeed run on CPU in a fresh environment compiles nothing: the shm all-reduce op DeepSpeed's
    process group would JIT-build (20-30 s of g++) serves inference only. The run trains and finishes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from train_helpers import write_dataset

    data = write_dataset(tmp_path / "data", n=32, vocab_size=100, max_seq=32)
    ext = tmp_path / "torch_extensions"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-m", "bert_core.train", "--engine", "deepspeed", "--data-dir", str(data),
                           "--output-dir", str(tmp_path / "run"), "--max-steps", "2", "--micro-batch-size", "2", "--log-every", "1"],
                          env=env, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2
    assert not ext.exists() or not any(ext.iterdir()), sorted(ext.rglob("*"))
    assert "built successfully" not in proc.stdout + proc.stderr
