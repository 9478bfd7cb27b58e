"""Losses and span decoding as pure functions of tensors (no modules, no state).

Shape legend: B batch, S sequence, M masked positions in the batch, V vocabulary, C classes.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

NO_SENTENCE_TASK = -1  # nsp label of an instance without a sentence task (ignored by the NSP loss)


class LossOutput(NamedTuple):
    loss: torch.Tensor  # mlm_loss + nsp_loss: what the optimizer minimises
    mlm_loss: torch.Tensor  # mean cross-entropy over the masked positions
    nsp_loss: torch.Tensor  # mean 2-way cross-entropy over sentence-task rows (0 if none)
    mlm_acc: torch.Tensor  # fraction of masked positions predicted right (no grad)
    nsp_acc: torch.Tensor  # fraction of sentence-task rows predicted right (no grad; 0 if none)
    mlm_count: torch.Tensor  # number of masked positions M (int64), to weight averages across steps


def pretraining_loss(
    mlm_logits_MV: torch.Tensor,
    nsp_logits_B2: torch.Tensor,
    mlm_labels_M: torch.Tensor,
    nsp_labels_B: torch.Tensor,
) -> LossOutput:
    """MLM cross-entropy over the masked positions plus NSP (or SOP) cross-entropy.

    The mean is per masked token over the batch, not per sequence then averaged: a sequence with
    20 predictions weighs 20 times one with a single prediction, as in the original BERT.
    Softmax is computed in fp32 even under bf16 autocast: a 30k-way log-sum-exp in bf16 loses
    about two digits of the loss.
    """
    mlm_logits_MV = mlm_logits_MV.float()
    nsp_logits_B2 = nsp_logits_B2.float()
    mlm_count = torch.tensor(mlm_labels_M.numel(), dtype=torch.long, device=mlm_labels_M.device)
    if mlm_labels_M.numel():
        mlm_loss = F.cross_entropy(mlm_logits_MV, mlm_labels_M)
    else:
        mlm_loss = mlm_logits_MV.sum() * 0.0  # keeps the graph connected for DDP/ZeRO hooks
    # Masked mean rather than ignore_index: stays 0 (not NaN) when no row has a sentence task,
    # and needs no host sync to find out.
    has_nsp_B = nsp_labels_B != NO_SENTENCE_TASK
    nll_B = F.cross_entropy(nsp_logits_B2, nsp_labels_B.clamp(min=0), reduction="none")
    nsp_loss = (nll_B * has_nsp_B).sum() / has_nsp_B.sum().clamp(min=1)
    with torch.no_grad():
        mlm_acc = _accuracy(mlm_logits_MV.argmax(-1), mlm_labels_M, torch.ones_like(mlm_labels_M, dtype=torch.bool))
        nsp_acc = _accuracy(nsp_logits_B2.argmax(-1), nsp_labels_B, has_nsp_B)
    return LossOutput(mlm_loss + nsp_loss, mlm_loss, nsp_loss, mlm_acc, nsp_acc, mlm_count)


def _accuracy(pred: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    n = valid.sum()
    hits = ((pred == labels) & valid).sum()
    return hits.float() / n.clamp(min=1).float()


def classification_loss(logits_BC: torch.Tensor, labels_B: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over C classes; mean-squared error when C == 1 (regression, e.g. STS-B)."""
    logits_BC = logits_BC.float()
    if logits_BC.shape[-1] == 1:
        return F.mse_loss(logits_BC.squeeze(-1), labels_B.float())
    return F.cross_entropy(logits_BC, labels_B.long())


def span_loss(
    start_logits_BS: torch.Tensor,
    end_logits_BS: torch.Tensor,
    start_B: torch.Tensor,
    end_B: torch.Tensor,
) -> torch.Tensor:
    """SQuAD loss: mean of the start and end cross-entropies over sequence positions.

    Positions outside the sequence are clamped to S and ignored (an answer truncated away by the
    document window contributes nothing), as in the BERT reference code.
    """
    S = start_logits_BS.shape[1]
    start_B = start_B.clamp(0, S)
    end_B = end_B.clamp(0, S)
    start = F.cross_entropy(start_logits_BS.float(), start_B, ignore_index=S)
    end = F.cross_entropy(end_logits_BS.float(), end_B, ignore_index=S)
    return (start + end) / 2


def token_classification_loss(
    logits_BSC: torch.Tensor, labels_BS: torch.Tensor, ignore_index: int = -100
) -> torch.Tensor:
    """Per-token cross-entropy averaged over labelled tokens (sub-word continuations and padding
    carry ``ignore_index``)."""
    C = logits_BSC.shape[-1]
    return F.cross_entropy(logits_BSC.float().reshape(-1, C), labels_BS.reshape(-1), ignore_index=ignore_index)


def best_span(
    start_logits_S: torch.Tensor,
    end_logits_S: torch.Tensor,
    max_answer_length: int,
    allowed_mask_S: torch.Tensor | None = None,
) -> tuple[int, int, float]:
    """The (start, end) maximising start_logit + end_logit with start <= end < start + max_len.

    ``allowed_mask_S`` marks positions that may begin or end an answer (context tokens in the
    document window; excludes the question and [CLS]/[SEP]). Exhaustive over the S x S band,
    vectorised: S <= 512 makes this a 256k-element tensor, cheaper than a top-k heuristic in Python.
    Returns (-1, -1, -inf) when no position is allowed.
    """
    if max_answer_length < 1:
        raise ValueError(f"max_answer_length must be >= 1, got {max_answer_length}")
    start_S = start_logits_S.float()
    end_S = end_logits_S.float()
    S = start_S.shape[0]
    score_SS = start_S[:, None] + end_S[None, :]  # [start, end]
    idx_S = torch.arange(S, device=start_S.device)
    length_SS = idx_S[None, :] - idx_S[:, None]  # end - start
    valid_SS = (length_SS >= 0) & (length_SS < max_answer_length)
    if allowed_mask_S is not None:
        ok_S = allowed_mask_S.to(torch.bool)
        valid_SS &= ok_S[:, None] & ok_S[None, :]
    score_SS = score_SS.masked_fill(~valid_SS, float("-inf"))
    flat = int(score_SS.argmax())
    best = float(score_SS.view(-1)[flat])
    if best == float("-inf"):
        return -1, -1, best
    return flat // S, flat % S, best
