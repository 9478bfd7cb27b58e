"""Training FLOPs and model-FLOPs utilisation (MFU) estimates for BERT.

Counting convention (Kaplan et al. 2020; PaLM appendix B): a matmul with P weights costs 2P FLOPs
per token forward and 4P backward, so 6P for training; attention scores and the weighted sum add
12 * L * S * D per token. Embedding lookups, LayerNorm, softmax, GELU and biases are ignored.
Only FLOPs the model is asked to do count: with logits at masked positions only, the vocabulary
projection costs ``mlm_fraction`` of what a full projection would.
"""
from __future__ import annotations

from bert_core.config import ModelConfig

# Dense peak throughput, no sparsity (vendor data sheets); pass your own figure for other devices.
PEAK_FLOPS = {
    "h100_sxm_bf16": 989e12,
    "h200_bf16": 989e12,
    "a100_bf16": 312e12,
}


def flops_per_token(config: ModelConfig, seq_len: int, mlm_fraction: float = 0.15) -> float:
    """Training (forward + backward) FLOPs per input token of ``BertForPreTraining``.

    ``mlm_fraction``: share of tokens with MLM logits (0.15 with BERT's masking and our
    masked-only head; 1.0 for a head that projects every position onto the vocabulary).
    """
    if seq_len < 1 or not 0.0 <= mlm_fraction <= 1.0:
        raise ValueError(f"need seq_len >= 1 and 0 <= mlm_fraction <= 1, got {seq_len}, {mlm_fraction}")
    D, F, L, V = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    encoder_params = L * (4 * D * D + 2 * D * F)  # Q, K, V, output projection; FFN up and down
    mlm_params = D * D + D * V  # transform dense + tied decoder, at masked positions only
    per_sequence_params = D * D + 2 * D  # pooler + NSP classifier, once per sequence
    attention = 12 * L * seq_len * D
    return 6.0 * (encoder_params + mlm_fraction * mlm_params + per_sequence_params / seq_len) + attention


def mfu(tokens_per_s: float, config: ModelConfig, seq_len: int, peak_flops: float, mlm_fraction: float = 0.15) -> float:
    """Achieved model FLOPs per second as a fraction of the device's peak (0..1)."""
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be positive, got {peak_flops}")
    return tokens_per_s * flops_per_token(config, seq_len, mlm_fraction) / peak_flops


__all__ = ["PEAK_FLOPS", "flops_per_token", "mfu"]
