"""FLOPs/MFU estimates: hand-computed for a small config, and consistent with the model's weights."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from bert_core.config import preset
from bert_core.flops import flops_per_token, mfu
from bert_core.model import BertForPreTraining


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/bert_core/conftest.py



def test_flops_by_hand():
    c = preset("tiny", vocab_size=100)  # L=2, D=64, F=256
    encoder = 2 * (4 * 64 * 64 + 2 * 64 * 256)  # 98,304 matmul weights
    mlm = 64 * 64 + 64 * 100
    pooler_nsp = 64 * 64 + 2 * 64
    attention = 12 * 2 * 16 * 64
    expected = 6 * (encoder + 0.25 * mlm + pooler_nsp / 16) + attention
    assert flops_per_token(c, 16, mlm_fraction=0.25) == pytest.approx(expected)


def test_flops_count_the_models_matmul_weights():
    """6 x (every Linear weight, tied decoder included) = the estimate at full MLM, no attention term."""
    c = preset("tiny", vocab_size=100)
    with torch.device("meta"):
        model = BertForPreTraining(c)
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    seq = 32
    attention = 12 * c.num_hidden_layers * seq * c.hidden_size
    pooler_nsp = c.hidden_size * c.hidden_size + 2 * c.hidden_size  # once per sequence, not per token
    per_token_weights = weights - pooler_nsp + pooler_nsp / seq
    assert flops_per_token(c, seq, mlm_fraction=1.0) == pytest.approx(6 * per_token_weights + attention)


def test_mfu():
    c = preset("base")
    f = flops_per_token(c, 128)
    assert mfu(1000.0, c, 128, peak_flops=f * 4000.0) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        mfu(1.0, c, 128, peak_flops=0)
