"""DeepSpeed ZeRO 2 and 3 with 2 real ranks on CPU (gloo), started by torchrun as subprocesses.

Per stage: an unbroken run; a run killed with SIGKILL (torchrun and both ranks) between checkpoints;
its ``--resume``. The resumed trajectory must equal the unbroken one bitwise (dropout on: the RNG
states in the checkpoint matter). The ZeRO-3 run is consolidated and exported to transformers.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from train_helpers import write_dataset
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]

STEPS, SAVE_EVERY, KILL_AFTER = 30, 5, 5  # kill once checkpoint 10 exists and step 11+ is logged
ENV = {**os.environ, "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache/torch_extensions")),
       "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(data: Path, out: Path, stage: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_port()),
            "-m", "bert_core.train", "--data-dir", str(data), "--output-dir", str(out), "--engine", "deepspeed",
            "--zero-stage", str(stage), "--launcher", "torchrun", "--max-steps", str(STEPS), "--save-every",
            str(SAVE_EVERY), "--log-every", "1", "--micro-batch-size", "4", "--lr", "1e-3", "--seed", "7", *extra]


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, env=ENV, stdout=fh, stderr=subprocess.STDOUT, timeout=HANG_S)
    assert proc.returncode == 0, log.read_text()[-3000:]


def _metrics(run_dir: Path) -> list[dict]:
    p = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.is_file() else []


def _kill_tree(pid: int) -> list:
    """SIGKILL torchrun and every rank. torchrun starts each rank in a session of its own, so killing
    torchrun's process group alone would leave the ranks running (and writing the run dir)."""
    root = psutil.Process(pid)
    procs = root.children(recursive=True) + [root]
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    return procs


def _kill_mid_run(cmd: list[str], run_dir: Path, log: Path) -> int:
    """Start the run, SIGKILL torchrun and its ranks once step KILL_AFTER is checkpointed and the
    next step ran; returns the last logged step before the kill."""
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=ENV, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + HANG_S
        ckpt = run_dir / "checkpoints" / f"step_{KILL_AFTER:08d}" / "COMPLETE"
        while time.monotonic() < deadline and proc.poll() is None:
            if ckpt.is_file() and any(r["step"] > KILL_AFTER for r in _metrics(run_dir)):
                killed = _kill_tree(proc.pid)
                break
            time.sleep(0.01)
        proc.wait(timeout=HANG_S)
    assert proc.returncode == -signal.SIGKILL, f"run was not killed mid-run (rc {proc.returncode}):\n{log.read_text()[-2000:]}"
    psutil.wait_procs(killed, timeout=HANG_S)
    assert len(killed) >= 3 and not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in killed)
    return max(r["step"] for r in _metrics(run_dir))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("ds_data") / "instances", n=240, vocab_size=100, max_seq=32, max_pred=5)


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def zero_runs(request, data, tmp_path_factory) -> dict:
    stage, tmp = request.param, tmp_path_factory.mktemp(f"zero{request.param}")
    unbroken, broken = tmp / "unbroken", tmp / "broken"
    _run(_cmd(data, unbroken, stage), tmp / "unbroken.log")
    killed_at = _kill_mid_run(_cmd(data, broken, stage), broken, tmp / "killed.log")
    _run(_cmd(data, broken, stage, "--resume"), tmp / "resume.log")
    return {"stage": stage, "unbroken": unbroken, "broken": broken, "killed_at": killed_at, "tmp": tmp}


def test_resume_after_kill_is_bitwise_equal(zero_runs):
    assert KILL_AFTER < zero_runs["killed_at"] < STEPS
    a, b = _metrics(zero_runs["unbroken"]), _metrics(zero_runs["broken"])
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    keys = ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr", "grad_norm")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    assert a[-1]["loss"] < a[0]["loss"]  # it trains, so equality is not vacuous


def test_checkpoint_holds_ds_config_rng_and_cursor(zero_runs):
    ckpts = sorted((zero_runs["broken"] / "checkpoints").glob("step_*"))
    assert [c.name for c in ckpts] == [f"step_{s:08d}" for s in (20, 25, 30)]  # keep_last 3
    last = ckpts[-1]
    ds = json.loads((last / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == zero_runs["stage"]
    assert ds["train_batch_size"] == 4 * 1 * 2
    assert {p.name for p in (last / "rng").iterdir()} == {"rank_00000.pt", "rank_00001.pt"}
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["step"] == STEPS and state["loader"]["world_size"] == 2
    assert (last / "vocab.txt").is_file() and not list((zero_runs["broken"] / "checkpoints").glob(".tmp-*"))


def test_zero_checkpoint_consolidates_and_exports_to_transformers(zero_runs):
    transformers = pytest.importorskip("transformers")
    from bert_core.checkpoint import load_model_from_checkpoint
    from bert_core.export import export_checkpoint

    model, mc, _ = load_model_from_checkpoint(zero_runs["unbroken"])
    out = export_checkpoint(zero_runs["unbroken"], zero_runs["tmp"] / f"hf{zero_runs['stage']}")
    hf, info = transformers.BertForPreTraining.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    model.eval(), hf.eval()
    ids = torch.randint(5, mc.vocab_size, (2, 16))
    types, mask = torch.zeros_like(ids), torch.ones_like(ids)
    ours = model(ids, types, mask)
    theirs = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    torch.testing.assert_close(ours.mlm_logits, theirs.prediction_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.nsp_logits_B2, theirs.seq_relationship_logits, atol=1e-5, rtol=1e-5)
    # the consolidated weights are the trained ones, not the initial ones
    from bert_core.model import BertForPreTraining

    torch.manual_seed(7)
    fresh = BertForPreTraining(mc).state_dict()
    trained = model.state_dict()
    assert not torch.equal(fresh["bert.encoder.layer.0.attention.self.query.weight"], trained["bert.encoder.layer.0.attention.self.query.weight"])


def test_lamb_bf16_zero0_keeps_per_layer_tensors(data, tmp_path):
    """LAMB under DeepSpeed (stage 0, bf16): the engine checks DeepSpeed handed the client LAMB
    per-layer fp32 tensors (its unfused bf16 wrapper), then trains; one local rank, gloo."""
    out = tmp_path / "lamb"
    cmd = [sys.executable, "-m", "bert_core.train", "--data-dir", str(data), "--output-dir", str(out),
           "--engine", "deepspeed", "--zero-stage", "0", "--optimizer", "lamb", "--precision", "bf16",
           "--max-steps", "3", "--save-every", "3", "--log-every", "1", "--micro-batch-size", "4", "--lr", "1e-2"]
    _run(cmd, tmp_path / "lamb.log")
    records = _metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3] and all(r["loss"] == r["loss"] for r in records)
    assert json.loads((out / "checkpoints" / "step_00000003" / "ds_config.json").read_text())["bf16"]["enabled"]
