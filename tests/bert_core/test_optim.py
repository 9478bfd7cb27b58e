"""LAMB (per-layer trust ratio), schedules, parameter groups, batch arithmetic and the generated
DeepSpeed JSON; the refusal of LAMB where DeepSpeed would flatten its tensors."""
from __future__ import annotations

import math

import pytest
import torch

from bert_core.config import preset
from bert_core.model import BertForPreTraining
from bert_core.optim import Lamb, WarmupDecay, make_optimizer, param_groups
from bert_core.train_config import TrainConfig, ds_config
from contracts.common import UserError, build_config

BASE = {"data_dir": "d", "output_dir": "o"}


def _lamb_reference(w, g, lr, b1, b2, eps, wd):
    """One LAMB step from the paper's formulas, written out for a single tensor (first step)."""
    m = (1 - b1) * g
    v = (1 - b2) * g * g
    r = (m / (1 - b1)) / ((v / (1 - b2)).sqrt() + eps) + wd * w
    trust = w.norm() / r.norm()
    return w - lr * trust * r


def test_lamb_first_step_matches_the_formula_per_tensor():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(5, 3) * 3.0)  # two layers with very different norms
    b = torch.nn.Parameter(torch.randn(4) * 0.01)
    ga, gb = torch.randn(5, 3), torch.randn(4)
    a.grad, b.grad = ga.clone(), gb.clone()
    expect_a = _lamb_reference(a.detach().clone(), ga, 0.1, 0.9, 0.999, 1e-6, 0.01)
    expect_b = _lamb_reference(b.detach().clone(), gb, 0.1, 0.9, 0.999, 1e-6, 0.01)
    Lamb([a, b], lr=0.1, weight_decay=0.01).step()
    torch.testing.assert_close(a.detach(), expect_a)
    torch.testing.assert_close(b.detach(), expect_b)


def test_lamb_on_a_flattened_partition_differs():
    """Why LAMB needs the partition layout under ZeRO: the same two tensors flattened into one,
    without it, give another update."""
    torch.manual_seed(1)
    a, b = torch.randn(6) * 5.0, torch.randn(6) * 0.05
    ga, gb = torch.randn(6), torch.randn(6)
    pa, pb = torch.nn.Parameter(a.clone()), torch.nn.Parameter(b.clone())
    pa.grad, pb.grad = ga.clone(), gb.clone()
    Lamb([pa, pb], lr=0.1).step()
    flat = torch.nn.Parameter(torch.cat([a, b]))
    flat.grad = torch.cat([ga, gb])
    Lamb([flat], lr=0.1).step()
    assert not torch.allclose(flat.detach(), torch.cat([pa.detach(), pb.detach()]), atol=1e-4)


def test_lamb_zero_weight_or_update_uses_trust_one():
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    Lamb([p], lr=0.1, weight_decay=0.0).step()
    torch.testing.assert_close(p.detach(), torch.full((3,), -0.1), atol=1e-5, rtol=0)


def test_schedules():
    lin = WarmupDecay(warmup_steps=4, total_steps=12, schedule="linear")
    assert [lin(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lin(8) == 0.5 and lin(12) == 0.0 and lin(20) == 0.0
    poly = WarmupDecay(warmup_steps=0, total_steps=10, schedule="poly", power=0.5)
    assert poly(0) == 1.0 and math.isclose(poly(5), math.sqrt(0.5))


def test_no_weight_decay_on_biases_and_layernorm():
    model = BertForPreTraining(preset("tiny", vocab_size=50))
    decay, no_decay = param_groups(model, 0.01)
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    n = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n == model.num_parameters()  # the tied matrix once
    cfg = build_config(TrainConfig, {**BASE, "optimizer": "lamb"})
    assert isinstance(make_optimizer(model, cfg), Lamb)


@pytest.mark.parametrize("extra", [{"engine": "deepspeed", "zero_stage": 3, "precision": "bf16"},
                                   {"engine": "deepspeed", "zero_stage": 3}])
def test_lamb_is_refused_where_deepspeed_flattens_tensors(extra):
    with pytest.raises(UserError, match="lamb needs per-layer trust ratios"):
        build_config(TrainConfig, {**BASE, "optimizer": "lamb", **extra})


def test_lamb_on_a_described_partition_equals_per_tensor_lamb():
    """A flat partition [a | padding | b] whose layout is attached steps exactly like LAMB on a and b
    (one rank: the all-reduce is skipped; the 2-rank case is tests/bert_core/test_lamb_zero.py)."""
    from bert_core.optim import PartitionLayout

    torch.manual_seed(1)
    a, b = torch.randn(6) * 5.0, torch.randn(5) * 0.05
    ga, gb = torch.randn(6), torch.randn(5)
    pa, pb = torch.nn.Parameter(a.clone()), torch.nn.Parameter(b.clone())
    ref = Lamb([pa, pb], lr=0.1)
    flat = torch.nn.Parameter(torch.cat([a, torch.zeros(3), b]))
    lamb = Lamb([flat], lr=0.1)
    lamb.partitions[id(flat)] = PartitionLayout(2, [(0, 0, 6), (1, 9, 5)], None, 1)
    for step in range(3):
        pa.grad, pb.grad = ga * (step + 1), gb / (step + 1)
        flat.grad = torch.cat([pa.grad, torch.zeros(3), pb.grad])
        ref.step(), lamb.step()
    torch.testing.assert_close(flat.detach()[:6], pa.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(flat.detach()[9:], pb.detach(), atol=1e-6, rtol=1e-6)
    assert flat.detach()[6:9].eq(0).all()  # padding stays zero


def test_lamb_is_allowed_with_per_layer_tensors():
    build_config(TrainConfig, {**BASE, "optimizer": "lamb", "engine": "deepspeed", "zero_stage": 1})
    build_config(TrainConfig, {**BASE, "optimizer": "lamb", "engine": "deepspeed", "zero_stage": 2, "precision": "bf16"})
    build_config(TrainConfig, {**BASE, "optimizer": "lamb", "engine": "deepspeed", "zero_stage": 0})
    build_config(TrainConfig, {**BASE, "optimizer": "lamb", "engine": "deepspeed", "precision": "bf16"})
    build_config(TrainConfig, {**BASE, "optimizer": "lamb", "engine": "torch", "precision": "bf16"})
    build_config(TrainConfig, {**BASE, "optimizer": "adamw", "engine": "deepspeed", "zero_stage": 3, "precision": "bf16"})


def test_batch_arithmetic_is_checked_once():
    cfg = build_config(TrainConfig, {**BASE, "micro_batch_size": 8, "grad_accum_steps": 2, "global_batch_size": 64})
    assert cfg.global_batch(4) == 64
    with pytest.raises(UserError, match=r"global_batch_size: 64 != .* x world size 2 = 32; grad_accum_steps 4 would match"):
        cfg.global_batch(2)
    with pytest.raises(UserError, match="world size 3 = 48$"):
        cfg.global_batch(3)


def test_unknown_key_and_bad_values_are_one_line_errors():
    with pytest.raises(UserError, match="lrr: unknown key"):
        build_config(TrainConfig, {**BASE, "lrr": 1.0})
    with pytest.raises(UserError, match="unknown model preset"):
        build_config(TrainConfig, {**BASE, "model": "huge"})
    with pytest.raises(UserError, match="zero_stage needs engine deepspeed"):
        build_config(TrainConfig, {**BASE, "zero_stage": 2})


def test_ds_config_is_generated_from_the_config():
    cfg = build_config(TrainConfig, {**BASE, "engine": "deepspeed", "zero_stage": 3, "precision": "bf16",
                                     "micro_batch_size": 4, "grad_accum_steps": 3, "clip_grad_norm": 0.5})
    ds = ds_config(cfg, world_size=2)
    assert ds["train_batch_size"] == 24 and ds["train_micro_batch_size_per_gpu"] == 4
    assert ds["gradient_accumulation_steps"] == 3 and ds["gradient_clipping"] == 0.5
    assert ds["zero_optimization"]["stage"] == 3 and ds["bf16"]["enabled"] and not ds["fp16"]["enabled"]
    assert ds["zero_allow_untested_optimizer"] and "optimizer" not in ds  # client optimizer


def test_resume_hash_ignores_launch_fields_only():
    a = build_config(TrainConfig, BASE)
    assert a.resume_hash() == build_config(TrainConfig, {**BASE, "log_every": 3, "save_every": 7}).resume_hash()
    assert a.resume_hash() != build_config(TrainConfig, {**BASE, "lr": 3e-4}).resume_hash()


def test_cluster_deepspeed_files_match_their_generator():
    """cluster/deepspeed is generated from TrainConfig; a hand edit (or a config change) shows here."""
    from pathlib import Path

    from bert_core.cluster_configs import WORLD, generate
    from contracts.common import load_config

    root = Path(__file__).resolve().parents[2] / "cluster" / "deepspeed"
    for name, text in generate().items():
        assert (root / name).read_text() == text, f"{name} is stale: python -m bert_core.cluster_configs"
    phase1 = load_config(TrainConfig, root / "bert_large_phase1_seq128.yaml")
    assert phase1.global_batch(WORLD) == 65536 and phase1.build_model_config(30522).num_hidden_layers == 24


@pytest.mark.parametrize("head", ["BertForPreTraining", "BertForSequenceClassification",
                                  "BertForQuestionAnswering", "BertForTokenClassification"])
def test_no_decay_by_name_is_the_matrix_vector_split_for_every_bert_model(head):
    """The one rule (Google's, by name) gives pretraining the same groups, in the same order, as the
    rank rule it replaced, so training curves stay bitwise the same; fine-tuning heads share it."""
    from bert_core import heads

    config = preset("tiny", vocab_size=50)
    kwargs = {} if head in ("BertForPreTraining", "BertForQuestionAnswering") else {"num_labels": 3}
    model = BertForPreTraining(config) if head == "BertForPreTraining" else getattr(heads, head)(config, **kwargs)
    decay, no_decay = param_groups(model, 0.01)
    params = [p for _, p in model.named_parameters()]
    assert [id(p) for p in decay["params"]] == [id(p) for p in params if p.ndim >= 2]
    assert [id(p) for p in no_decay["params"]] == [id(p) for p in params if p.ndim < 2]
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)


def test_no_decay_rule_matches_names_anywhere_like_google_bert():
    from bert_core.optim import decays

    assert decays("bert.encoder.layer.0.intermediate.dense.weight")
    assert not decays("bert.encoder.layer.0.output.LayerNorm.weight")
    assert not decays("cls.predictions.bias") and not decays("lstm.bias_ih_l0")  # "bias" anywhere
    assert not decays("tagger.layer_norm.weight")
