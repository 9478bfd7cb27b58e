"""Optimizers and learning-rate schedules (pure torch; DeepSpeed receives them as client objects).

LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning") scales each parameter tensor's
Adam update by a trust ratio ||w|| / ||update||. That ratio is *per layer*: handed a flattened
partition (what DeepSpeed ZeRO >= 1 gives an optimizer) it would silently become per partition. Under
ZeRO-1/2, ``attach_zero_partitions`` tells LAMB which slices of its flat partition belong to which
parameter; the squared norms of those slices are summed over the ranks (one all-reduce per group),
so the ratio is per layer again. ZeRO-3 stays refused by ``TrainConfig``.
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

        # id(flat ZeRO partition) -> its layout (attach_zero_partitions); empty = per-tensor params
        self.partitions: dict[int, "PartitionLayout"] = {}

    def _update(self, p: torch.Tensor, group: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(fp32 weights, Adam update + decoupled weight decay) of one tensor; moments updated."""
        beta1, beta2 = group["betas"]
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
        return w, update

    @staticmethod
    def _trust(w_sq: torch.Tensor, u_sq: torch.Tensor, max_ratio: float) -> torch.Tensor:
        w_norm, u_norm = w_sq.sqrt(), u_sq.sqrt()
        return torch.where((w_norm > 0) & (u_norm > 0), (w_norm / u_norm).clamp(max=max_ratio), torch.ones_like(w_norm))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                layout = self.partitions.get(id(p))
                if layout is not None:
                    self._step_partition(p, group, layout)
                    continue
                w, update = self._update(p, group)
                w_norm, u_norm = w.norm(), update.norm()
                trust = torch.where(
                    (w_norm > 0) & (u_norm > 0),
                    (w_norm / u_norm).clamp(max=group["max_trust_ratio"]),
                    torch.ones_like(w_norm),
                )
                p.copy_(w - group["lr"] * trust * update)
        return loss

    def _step_partition(self, p: torch.Tensor, group: dict, layout: "PartitionLayout") -> None:
        """One flat ZeRO-1/2 partition: per-parameter squared norms of its slices, summed over the
        ranks holding the other slices (one all-reduce), so the trust ratio is per layer again."""
        import torch.distributed as dist

        w, update = self._update(p, group)
        sq_2P = torch.zeros(2, layout.n_params, dtype=torch.float32, device=p.device)
        for j, off, n in layout.segments:
            sq_2P[0, j] += w.narrow(0, off, n).square().sum()
            sq_2P[1, j] += update.narrow(0, off, n).square().sum()
        if layout.world > 1:
            dist.all_reduce(sq_2P, group=layout.process_group)
        trust_P = self._trust(sq_2P[0], sq_2P[1], group["max_trust_ratio"])
        for j, off, n in layout.segments:  # padding outside every segment keeps update 0 (zero grad and weight)
            update.narrow(0, off, n).mul_(trust_P[j])
        p.copy_(w - group["lr"] * update)


class PartitionLayout:
    """One rank's flat ZeRO-1/2 partition of one param group, decoded once (``zero_partition``):
    the rank holds [start, start + size) of the group's flattened tensors; ``segments`` = [(parameter
    index in the group, offset in the partition, length)] of the parameters' pieces inside it."""

    def __init__(self, n_params: int, segments: list[tuple[int, int, int]], process_group, world: int,
                 rank: int = 0, size: int = 0):
        self.n_params, self.segments, self.process_group, self.world = n_params, segments, process_group, world
        self.rank, self.size, self.start = rank, size, rank * size


def zero_partition(zero_optimizer, i: int) -> PartitionLayout:
    """THE decoding of DeepSpeed ZeRO-1/2's layout of param group ``i`` on this rank (LAMB's per-layer
    trust ratio and the elastic resume both read it from here).

    DeepSpeed flattens each param group (in ``round_robin_bit16_groups`` order, each tensor followed
    by its alignment padding) and gives rank r the slice [r*size, (r+1)*size) as the group's only
    tensor; intersecting the tensors' ranges with that slice recovers the per-parameter pieces."""
    import torch.distributed as dist

    pg = zero_optimizer.real_dp_process_group[i]
    rank, size = dist.get_rank(group=pg), int(zero_optimizer.partition_size[i])
    start, segments, cur = rank * size, [], 0
    metas, pads = zero_optimizer.round_robin_bit16_meta[i], zero_optimizer.round_robin_bit16_padding[i]
    for j, (meta, pad) in enumerate(zip(metas, pads)):
        lo, hi = max(cur, start), min(cur + meta.numel(), start + size)
        if lo < hi:
            segments.append((j, lo - start, hi - lo))
        cur += meta.numel() + pad
    return PartitionLayout(len(metas), segments, pg, dist.get_world_size(group=pg), rank, size)


def attach_zero_partitions(lamb: Lamb, zero_optimizer) -> None:
    """Give LAMB the parameter layout of DeepSpeed ZeRO-1/2's flat fp32 partitions."""
    lamb.partitions = {id(flat): zero_partition(zero_optimizer, i)
                       for i, flat in enumerate(zero_optimizer.single_partition_of_fp32_groups)}


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
