"""Ray Train V2: two TorchTrainer workers on the local Ray cluster run DeepSpeed ZeRO-2 for a few
steps through the same train.run, writing the same run directory torchrun would."""
from __future__ import annotations

import json

import pytest

from bert_core.train_config import TrainConfig
from contracts.common import build_config
from train_helpers import write_dataset

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.deepspeed]


def test_ray_train_two_workers_zero2(ray_local, tmp_path):
    from bert_core.launch import launch
    from bert_core.train_log import read_metrics

    data = write_dataset(tmp_path / "data", n=96, vocab_size=100, max_seq=32)
    config = build_config(TrainConfig, {
        "data_dir": str(data), "output_dir": str(tmp_path / "run"), "engine": "deepspeed", "zero_stage": 2,
        "launcher": "ray", "num_workers": 2, "micro_batch_size": 4, "max_steps": 4, "save_every": 2,
        "log_every": 1, "tensorboard": False, "lr": 1e-3,
    })
    result = launch(config, cpus_per_worker=0.5)
    records = read_metrics(result.metrics_file)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert result.last_checkpoint.name == "step_00000004"
    state = json.loads((result.last_checkpoint / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["zero_stage"] == 2
    assert {p.name for p in (result.last_checkpoint / "rng").iterdir()} == {"rank_00000.pt", "rank_00001.pt"}
    ds = json.loads((result.last_checkpoint / "ds_config.json").read_text())
    assert ds["train_batch_size"] == 8 and ds["zero_optimization"]["stage"] == 2
