"""CheckpointManager (save / load / latest / purge, atomic COMPLETE marker, RNG restore) and
load_model_from_checkpoint on run dirs, checkpoint dirs and bad paths."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from bert_core.checkpoint import CheckpointManager, load_model_from_checkpoint, read_state
from bert_core.config import preset
from bert_core.engine import TorchEngine, World
from bert_core.model import BertForPreTraining
from bert_core.train_config import TrainConfig
from contracts.common import UserError, build_config

MC = preset("tiny", vocab_size=60)


def _engine(seed: int = 0) -> TorchEngine:
    torch.manual_seed(seed)
    cfg = build_config(TrainConfig, {"data_dir": "d", "output_dir": "o", "max_steps": 10, "lr": 1e-2})
    return TorchEngine(BertForPreTraining(MC), cfg, World(0, 1, 0))


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 60, (4, 16), generator=g)
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
            "mlm_positions": torch.tensor([1, 17, 40, 63]), "mlm_labels": torch.tensor([7, 8, 9, 10]),
            "nsp_labels": torch.tensor([0, 1, 0, 1])}


def _files(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(f"t{i}" for i in range(60)) + "\n")
    return {"model_config.json": MC.model_dump(mode="json"), "vocab.txt": vocab}


def test_save_load_restores_everything(tmp_path):
    eng = _engine()
    eng.step([_batch()])
    mgr = CheckpointManager(tmp_path / "run", keep_last=2)
    path = mgr.save(1, eng, {"step": 1, "engine": "torch", "loader": {"epoch": 0, "index": 1}}, _files(tmp_path))
    after_save = [torch.rand(3), np.random.rand(), random.random()]
    expected = eng.step([_batch()])
    fresh = _engine(seed=123)  # other weights, fresh optimizer and schedule
    state = mgr.load(path, fresh)
    assert state["loader"] == {"epoch": 0, "index": 1}
    assert torch.equal(torch.rand(3), after_save[0]) and np.random.rand() == after_save[1] and random.random() == after_save[2]
    assert fresh.step([_batch()]) == expected  # optimizer moments and lr schedule restored too
    assert fresh.model.cls.predictions.decoder.weight is fresh.model.bert.embeddings.word_embeddings.weight


def test_latest_purge_and_incomplete_dirs(tmp_path):
    eng = _engine()
    mgr = CheckpointManager(tmp_path / "run", keep_last=2)
    for step in (2, 4, 6):
        mgr.save(step, eng, {"step": step, "engine": "torch"}, _files(tmp_path))
    assert [p.name for p in mgr.all()] == ["step_00000004", "step_00000006"]
    # a save killed half-way: a .tmp dir, and a dir without the marker, are never picked up
    (mgr.root / ".tmp-step_00000008" / "engine").mkdir(parents=True)
    (mgr.root / "step_00000010").mkdir()
    assert mgr.latest().name == "step_00000006"
    with pytest.raises(UserError, match="incomplete checkpoint"):
        read_state(mgr.root / "step_00000010")


def test_load_model_from_run_or_checkpoint_dir(tmp_path):
    eng = _engine()
    eng.step([_batch()])
    mgr = CheckpointManager(tmp_path / "run")
    path = mgr.save(1, eng, {"step": 1, "engine": "torch", "zero_stage": 0}, _files(tmp_path))
    for where in (tmp_path / "run", path):
        model, mc, vocab = load_model_from_checkpoint(where)
        assert mc == MC and vocab.name == "vocab.txt" and vocab.is_file()
        ref = eng.model.state_dict()
        assert all(torch.equal(v, ref[k]) for k, v in model.state_dict().items())


def test_bad_checkpoint_paths(tmp_path):
    with pytest.raises(UserError, match="checkpoint not found"):
        load_model_from_checkpoint(tmp_path / "nope")
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    with pytest.raises(UserError, match="holds no complete checkpoint"):
        load_model_from_checkpoint(tmp_path / "empty")
    eng = _engine()
    path = CheckpointManager(tmp_path / "run").save(1, eng, {"step": 1, "engine": "torch"}, _files(tmp_path))
    victim = path / "engine" / "model.pt"
    good = victim.read_bytes()
    victim.write_bytes(good[: len(good) // 2])
    with pytest.raises(UserError, match=f"{victim}: size .* recorded at save"):
        load_model_from_checkpoint(path)
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF  # same size, loads without error: only the checksum tells
    victim.write_bytes(bytes(flipped))
    with pytest.raises(UserError, match=f"{victim}: checksum mismatch"):
        CheckpointManager(tmp_path / "run").load(path, _engine())
    (path / "rng" / "rank_00000.pt").unlink()
    victim.write_bytes(good)
    with pytest.raises(UserError, match="rank_00000.pt: missing from the checkpoint"):
        load_model_from_checkpoint(path)


def test_each_rank_verifies_only_what_it_reads():
    from bert_core.checkpoint import files_read_by, owner_rank

    names = ["trainer_state.json", "rng/rank_00000.pt", "rng/rank_00001.pt", "engine/ds/mp_rank_00_model_states.pt",
             "engine/ds/zero_pp_rank_0_mp_rank_00_optim_states.pt", "engine/ds/zero_pp_rank_1_mp_rank_00_optim_states.pt",
             "engine/ds/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert [owner_rank(n) for n in names] == [None, 0, 1, None, 0, 1, 1]
    assert files_read_by(names, 1) == [names[0], names[2], names[3], names[5], names[6]]
    assert files_read_by(names, 0, same_world=False) == names and files_read_by(names, None) == names


def test_elastic_resume_keeps_the_global_batch_or_refuses():
    from bert_core.train_config import TrainConfig, elastic_config
    from contracts.common import build_config

    base = {"data_dir": "d", "output_dir": "o", "engine": "deepspeed", "micro_batch_size": 4, "grad_accum_steps": 1}
    saved = {"world_size": 4, "loader": {"global_batch_size": 16}}
    cfg = elastic_config(build_config(TrainConfig, base, "t"), saved, 2, "ck")
    assert cfg.grad_accum_steps == 2 and cfg.global_batch(2) == 16
    with pytest.raises(UserError, match="not a multiple of micro_batch_size 4 x world size 3"):
        elastic_config(build_config(TrainConfig, base, "t"), saved, 3, "ck")
    moved = elastic_config(build_config(TrainConfig, {**base, "zero_stage": 2, "precision": "bf16"}, "t"), saved, 2, "ck")
    assert moved.grad_accum_steps == 2  # ZeRO-1/2 state is repartitioned at load (tests/bert_core/test_elastic.py)
    with pytest.raises(UserError, match="needs zero_stage 0, 1 or 2"):
        elastic_config(build_config(TrainConfig, {**base, "zero_stage": 3}, "t"), saved, 2, "ck")
