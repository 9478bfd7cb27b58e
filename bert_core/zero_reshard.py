"""Elastic resume for DeepSpeed ZeRO-1/2: optimizer state saved by N ranks, loaded on M ranks.

DeepSpeed refuses this (``load_checkpoint`` raises when the data-parallel world size changed). Its
ZeRO-1/2 layout makes the repartition exact and cheap, so we do it in memory at load:

- each param group is flattened (tensors in ``round_robin_bit16_groups`` order, each followed by its
  parameter-alignment padding, all zero here) and padded at the end to a multiple of
  2 x world size; rank r owns the slice [r*P, (r+1)*P) of it, P = padded size / world;
- each rank's optimizer file holds its fp32 master slice with the end padding stripped
  (``single_partition_of_fp32_groups``) and the torch optimizer's state of that slice WITH the
  padding (``base_optimizer_state``: exp_avg, exp_avg_sq as 1-D tensors of P elements);
  ``group_paddings`` says how much of each rank's slice is padding.

So the unpadded group is the concatenation of every old rank's unpadded slice; padding it for the
new world size and cutting the new rank's slice gives exactly the tensors an unbroken run on M ranks
would hold (values are copied, never recomputed: bit-identical state). The module weights, the lr
schedule (its step comes from the restored scheduler state), the engine counters and the client
state are loaded by DeepSpeed itself with ``load_optimizer_states=False``.

Every rank reads every old rank's optimizer file (3 fp32 copies of the model in all): fine for BERT
sizes; a sharded read would be the next step for models whose optimizer state does not fit one host.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from bert_core.optim import zero_partition

OPTIM_FILE = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt")


def optim_files(tag_dir: Path) -> list[Path]:
    """The per-rank ZeRO optimizer files of a checkpoint tag, in rank order (empty at ZeRO-0)."""
    found = {int(m.group(1)): p for p in tag_dir.iterdir() if (m := OPTIM_FILE.fullmatch(p.name))}
    return [found[r] for r in sorted(found)]


def saved_world_size(tag_dir: Path) -> int:
    return len(optim_files(tag_dir))


def _unpad(t: torch.Tensor, padding: int) -> torch.Tensor:
    t = t.reshape(-1)
    return t[: t.numel() - padding]


def _reslice(pieces: list[torch.Tensor], size: int, rank: int) -> torch.Tensor:
    """The new rank's slice of size ``size`` of the unpadded group ``cat(pieces)``, zero-padded."""
    whole = torch.cat(pieces)
    out = torch.zeros(size, dtype=whole.dtype)
    lo, hi = rank * size, min((rank + 1) * size, whole.numel())
    if hi > lo:
        out[: hi - lo] = whole[lo:hi]
    return out


def load_resharded(engine, load_dir: Path, tag: str) -> tuple[Any, dict[str, Any]]:
    """``engine.load_checkpoint`` for a ZeRO-1/2 checkpoint written with another world size."""
    from deepspeed.checkpoint.constants import (BASE_OPTIMIZER_STATE, GROUP_PADDINGS, OPTIMIZER_STATE_DICT,
                                                PARAM_ALIGNMENT_PADDINGS, SINGLE_PARTITION_OF_FP32_GROUPS)

    zero = engine.optimizer
    saved = [torch.load(p, map_location="cpu", weights_only=False)[OPTIMIZER_STATE_DICT]
             for p in optim_files(Path(load_dir) / tag)]
    if not saved:
        raise ValueError(f"{Path(load_dir) / tag}: no ZeRO optimizer files")
    base = saved[0][BASE_OPTIMIZER_STATE]
    if not isinstance(base, dict) or any(PARAM_ALIGNMENT_PADDINGS in sd and sd[PARAM_ALIGNMENT_PADDINGS] !=
                                         zero.round_robin_bit16_padding for sd in saved):
        raise ValueError("ZeRO checkpoint layout not supported for another world size "
                         "(elastic_checkpoint or parameter_alignment changed)")
    # module weights, lr scheduler, engine counters, client state; fp32 masters refreshed from the module
    path, client_state = engine.load_checkpoint(str(load_dir), tag=tag, load_optimizer_states=False,
                                                load_lr_scheduler_states=True)
    state: dict[str, Any] = {"state": {}, "param_groups": base["param_groups"]}
    for i, flat in enumerate(zero.single_partition_of_fp32_groups):
        layout = zero_partition(zero, i)
        rank, size = layout.rank, layout.size
        if flat.numel() != size:
            raise ValueError(f"ZeRO partition of group {i} holds {flat.numel()} values, its layout says {size}")
        pads = [sd[GROUP_PADDINGS][i] for sd in saved]
        masters = [sd[SINGLE_PARTITION_OF_FP32_GROUPS][i].reshape(-1) for sd in saved]  # stored unpadded
        flat.data.copy_(_reslice(masters, size, rank))
        entry = {}
        for key, value in base["state"].get(i, {}).items():
            parts = [sd[BASE_OPTIMIZER_STATE]["state"][i][key] for sd in saved]
            sliced = torch.is_tensor(value) and value.dim() == 1 and all(p.numel() == m.numel() + pad
                                                    for p, m, pad in zip(parts, masters, pads))
            entry[key] = _reslice([_unpad(p, pad) for p, pad in zip(parts, pads)], size, rank) if sliced else value
        state["state"][i] = entry
    zero.optimizer.load_state_dict(state)
    zero._link_all_hp_params()
    return path, client_state
