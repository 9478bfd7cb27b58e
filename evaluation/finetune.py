"""The generic fine-tuning loop shared by GLUE, SQuAD and NER: AdamW over bert_core's parameter groups,
bert_core's linear warmup then linear decay, gradient clipping, shuffled mini-batches from a seeded
generator, and batched prediction.

Data is a dict of equally long tensors (``input_ids`` [N, S] and friends, labels [N] or [N, S]).
Each batch is cut to its longest real sequence first: on CPU most GLUE sentences are far shorter than
max_seq_length, and attention cost grows with the square of the padded length.

Legend: N examples, B batch, S sequence length.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from bert_core.optim import WarmupDecay, param_groups
from evaluation.config import FinetuneOptions

Batch = dict[str, torch.Tensor]


def trim_batch(batch: Batch) -> Batch:
    """Drop padding columns beyond the longest sequence of the batch (every [B, S, ...] tensor)."""
    mask_BS = batch["attention_mask"]
    length = int(mask_BS.sum(dim=1).max().item())
    width = mask_BS.shape[1]
    return {k: (v[:, :length] if v.dim() >= 2 and v.shape[1] == width else v) for k, v in batch.items()}


def _take(data: Batch, idx: torch.Tensor, device: torch.device) -> Batch:
    return {k: v.to(device) for k, v in trim_batch({k: v[idx] for k, v in data.items()}).items()}


def autocast(precision: str, device: torch.device):
    """The forward passes' context: bf16 autocast (weights, gradients, optimizer state and the losses stay
    fp32: ``bert_core.losses`` casts logits up) or nothing for fp32."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW with the BERT fine-tuning betas and eps over pretraining's parameter groups (no weight
    decay on biases and LayerNorm: ``bert_core.optim.param_groups``)."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=(0.9, 0.999), eps=1e-6)


def linear_schedule(opt: torch.optim.Optimizer, warmup_steps: int, total_steps: int):
    """Pretraining's schedule (``bert_core.optim.WarmupDecay``): linear warmup, then linear decay to 0."""
    return torch.optim.lr_scheduler.LambdaLR(opt, WarmupDecay(warmup_steps, total_steps))


def total_steps(n: int, batch_size: int, epochs: float, max_steps: Optional[int]) -> int:
    return max_steps or max(1, math.ceil(math.ceil(n / batch_size) * epochs))


def _shuffled_batches(n: int, batch_size: int, gen: torch.Generator):
    """Index batches forever, a fresh permutation every epoch (the last batch of an epoch may be short)."""
    while True:
        order = torch.randperm(n, generator=gen)
        for lo in range(0, n, batch_size):
            yield order[lo : lo + batch_size]


def fit(
    model: torch.nn.Module,
    data: Batch,
    loss_fn: Callable[[torch.nn.Module, Batch], torch.Tensor],
    opts: FinetuneOptions,
    lr: float,
    seed: int,
    device: torch.device,
    progress: bool = False,
    epochs: Optional[float] = None,
    optimizer: Optional[torch.optim.Optimizer] = None,
    at_epoch: Optional[Callable[[float], None]] = None,
) -> dict:
    """Train ``model`` in place; returns steps, seconds and the mean loss of the last 10% of steps.

    ``at_epoch(epoch)``: called at the end of every whole epoch and after the last step (a fraction of an
    epoch there), with the model as it is then; training goes on in train mode afterwards. It does not
    change the training: the batches come from their own generator, and scoring draws no random numbers."""
    n = len(next(iter(data.values())))
    steps = total_steps(n, opts.batch_size, epochs or opts.epochs, None if epochs else opts.max_steps)
    opt = optimizer or make_optimizer(model, lr, opts.weight_decay)
    sched = linear_schedule(opt, int(opts.warmup_proportion * steps), steps)
    gen = torch.Generator().manual_seed(seed)
    model.to(device).train()
    losses: list[float] = []
    start = time.perf_counter()
    batches = _shuffled_batches(n, opts.batch_size, gen)
    per_epoch = math.ceil(n / opts.batch_size)
    for step in tqdm(range(steps), desc=f"fine-tune lr={lr:g} seed={seed}", disable=not progress, leave=False):
        idx = next(batches)
        with autocast(opts.precision, device):
            loss = loss_fn(model, _take(data, idx, device))
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {loss.item()} at step {step} (lr {lr:g} too high?)")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opts.max_grad_norm)
        opt.step()
        sched.step()
        losses.append(float(loss.item()))
        if at_epoch is not None and ((step + 1) % per_epoch == 0 or step + 1 == steps):
            scoring = time.perf_counter()
            at_epoch(round((step + 1) / per_epoch, 4))
            model.train()
            start += time.perf_counter() - scoring  # train_seconds: training only
    tail = losses[-max(1, len(losses) // 10) :]
    return {"steps": steps, "train_seconds": time.perf_counter() - start, "final_loss": float(np.mean(tail))}


@torch.no_grad()
def predict(
    model: torch.nn.Module,
    data: Batch,
    forward_fn: Callable[[torch.nn.Module, Batch], torch.Tensor | tuple],
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
) -> list[torch.Tensor]:
    """Run ``forward_fn`` over ``data`` in order; returns the outputs per batch on the CPU (a tuple of
    outputs becomes a list of tuples). Batches are trimmed, so [B, S] outputs differ in S."""
    model.to(device).eval()
    n = len(next(iter(data.values())))
    outs = []
    for lo in range(0, n, batch_size):
        with autocast(precision, device):
            out = forward_fn(model, _take(data, torch.arange(lo, min(n, lo + batch_size)), device))
        outs.append(tuple(o.float().cpu() for o in out) if isinstance(out, tuple) else out.float().cpu())
    return outs


def forward_inputs(batch: Batch) -> dict:
    """The keyword arguments every bert_core head takes."""
    return {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
