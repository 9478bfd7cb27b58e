"""Where a process computes and how it seeds its random generators: one home for both decisions,
shared by pretraining (``bert_core.train``, ``bert_core.engine``) and evaluation.
"""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (torch seeds every device too)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # NumPy's legacy seed takes 32 bits only
    torch.manual_seed(seed)


def device_for(local_rank: int = 0, use_gpu: bool = True) -> torch.device:
    """``cuda:<local_rank>`` where a GPU is wanted and visible, else the CPU.

    Under Ray or a launcher each process sees only its own GPUs, so a local rank (0 in a Ray task)
    is an index into what this process was given.
    """
    if use_gpu and torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
