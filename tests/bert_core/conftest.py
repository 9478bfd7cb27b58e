"""Fixtures shared by the bert_core tests."""
from __future__ import annotations

import pytest


@pytest.fixture
def one_torch_thread():
    """Tiny models gain nothing from 2 threads, and on a loaded machine OpenMP's spinning threads
    made a 15-step run take 20 s instead of 0.2 s."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
