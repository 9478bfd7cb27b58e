"""Optimizers and learning-rate schedules (pure torch; DeepSpeed receives them as client objects).

LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning") scales each parameter tensor's
Adam update by a trust ratio ||w|| / ||update||. That ratio is *per layer*: handed a flattened
partition (what DeepSpeed ZeRO >= 1 or its bf16/fp16 wrappers give an optimizer) it silently becomes
per partition, which is why ``TrainConfig`` refuses those combinations.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn

from bert_core.train_config import TrainConfig


# Google BERT's AdamWeightDecayOptimizer: exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"],
# matched anywhere in a parameter's name (so an LSTM's bias_ih_l0 is excluded too).
NO_DECAY_NAMES = ("LayerNorm", "layer_norm", "bias")


def decays(name: str) -> bool:
    """Whether the parameter called ``name`` gets weight decay: not biases, not LayerNorm."""
    return not any(key in name for key in NO_DECAY_NAMES)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """[decay group, no-decay group] in ``named_parameters`` order; pretraining and fine-tuning share it.

    For every bert_core model this is exactly the split into matrices (decayed) and 1-D tensors
    (biases and LayerNorm, not decayed); tests/bert_core/test_optim.py checks that.
    """
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # a tied Parameter is yielded once
        if p.requires_grad:
            (decay if decays(name) else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


class Lamb(torch.optim.Optimizer):
    """LAMB with bias-corrected Adam moments, decoupled weight decay inside the update, and a
    per-tensor trust ratio ||w|| / ||r + wd*w|| (1 where either norm is 0), as NVIDIA's FusedLAMB."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, max_trust_ratio: float = 10.0):
        if lr <= 0 or eps <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid LAMB hyper-parameters lr={lr} betas={betas} eps={eps}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, max_trust_ratio=max_trust_ratio)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.float()
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                t = float(state["step"])
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat = m / (1 - beta1**t)
                v_hat = v / (1 - beta2**t)
                update = m_hat / (v_hat.sqrt() + group["eps"])
                w = p.float()
                if group["weight_decay"]:
                    update.add_(w, alpha=group["weight_decay"])
                w_norm, u_norm = w.norm(), update.norm()
                trust = torch.where(
                    (w_norm > 0) & (u_norm > 0),
                    (w_norm / u_norm).clamp(max=group["max_trust_ratio"]),
                    torch.ones_like(w_norm),
                )
                p.copy_(w - group["lr"] * trust * update)
        return loss


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    groups = param_groups(model, config.weight_decay)
    if config.optimizer == "lamb":
        return Lamb(groups, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay)
    # foreach=False: the same per-tensor arithmetic on every engine (bitwise-reproducible resumes).
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps,
                             weight_decay=config.weight_decay, foreach=False)


class WarmupDecay:
    """lr multiplier: linear warmup to 1, then linear or polynomial decay to 0 at total_steps.

    A class (not a lambda) so LambdaLR's state_dict can save it in checkpoints."""

    def __init__(self, warmup_steps: int, total_steps: int, schedule: str = "linear", power: float = 1.0):
        self.warmup_steps, self.total_steps, self.schedule, self.power = warmup_steps, total_steps, schedule, power

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        left = max(0.0, 1.0 - (step - self.warmup_steps) / span)
        return left if self.schedule == "linear" else math.pow(left, self.power)


def make_lr_lambda(config: TrainConfig) -> WarmupDecay:
    power = config.poly_power if config.schedule == "poly" else 1.0
    return WarmupDecay(config.warmup_steps(), config.max_steps, config.schedule, power)


def make_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, make_lr_lambda(config))
