"""What a fresh process has, recorded when the test session starts (tests/conftest.py imports this
first), for tests that compare work done in this process with the same work in a subprocess."""
import torch

FRESH_TORCH_THREADS = torch.get_num_threads()
