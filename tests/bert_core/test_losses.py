"""Losses on hand-made tensors with values computed by hand (ln of simple fractions)."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_core.losses import (
    best_span,
    classification_loss,
    pretraining_loss,
    span_loss,
    token_classification_loss,
)

LN3 = math.log(3.0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/bert_core/conftest.py



def close(t: torch.Tensor, value: float) -> bool:
    return abs(float(t.detach()) - value) < 1e-6


def test_pretraining_loss_by_hand():
    # MLM: row 0 uniform over 3 (label 2, argmax picks 0: wrong) -> ln 3;
    #      row 1 softmax (1/5, 3/5, 1/5), label 1 (right) -> ln(5/3).   mean = ln(5) / 2
    mlm_logits = torch.tensor([[0.0, 0.0, 0.0], [0.0, LN3, 0.0]], requires_grad=True)
    mlm_labels = torch.tensor([2, 1])
    # NSP: row 0 p(1) = 4/5 (right) -> ln 1.25; row 1 p(1) = 1/5 (wrong) -> ln 5; row 2 ignored.
    ln4 = math.log(4.0)
    nsp_logits = torch.tensor([[0.0, ln4], [ln4, 0.0], [50.0, 0.0]], requires_grad=True)
    nsp_labels = torch.tensor([1, 1, -1])
    out = pretraining_loss(mlm_logits, nsp_logits, mlm_labels, nsp_labels)
    assert close(out.mlm_loss, math.log(5) / 2)
    assert close(out.nsp_loss, math.log(2.5))  # (ln 1.25 + ln 5) / 2
    assert close(out.loss, math.log(5) / 2 + math.log(2.5))
    assert close(out.mlm_acc, 0.5) and close(out.nsp_acc, 0.5)
    assert int(out.mlm_count) == 2
    out.loss.backward()
    assert torch.all(nsp_logits.grad[2] == 0)  # the ignored row gets no gradient


def test_no_sentence_task_and_no_masks_give_zero_not_nan():
    mlm_logits = torch.zeros(0, 5, requires_grad=True)
    nsp_logits = torch.randn(2, 2, requires_grad=True)
    out = pretraining_loss(mlm_logits, nsp_logits, torch.zeros(0, dtype=torch.long), torch.tensor([-1, -1]))
    assert close(out.nsp_loss, 0.0) and close(out.mlm_loss, 0.0) and close(out.nsp_acc, 0.0)
    out.loss.backward()
    assert torch.all(nsp_logits.grad == 0)


def test_pretraining_loss_is_fp32_under_bf16_logits():
    logits = torch.randn(4, 30, dtype=torch.bfloat16)
    out = pretraining_loss(logits, torch.zeros(2, 2, dtype=torch.bfloat16), torch.arange(4), torch.tensor([0, 1]))
    assert out.loss.dtype == torch.float32
    assert close(out.nsp_loss, math.log(2))


def test_classification_loss_ce_and_mse():
    assert close(classification_loss(torch.tensor([[0.0, LN3]]), torch.tensor([1])), math.log(4 / 3))
    # one label = regression (STS-B): ((1-0)^2 + (3-1)^2) / 2
    assert close(classification_loss(torch.tensor([[1.0], [3.0]]), torch.tensor([0.0, 1.0])), 2.5)


def test_span_loss_by_hand_and_out_of_window_answers_ignored():
    start = torch.tensor([[0.0, 0.0, 0.0], [9.0, 0.0, 0.0]])
    end = torch.tensor([[0.0, math.log(2), 0.0], [0.0, 0.0, 9.0]])
    # row 0: start ln 3, end p = 2/4 -> ln 2; row 1's answer (position 7) lies outside the window.
    loss = span_loss(start, end, torch.tensor([1, 7]), torch.tensor([1, 7]))
    assert close(loss, (LN3 + math.log(2)) / 2)


def test_token_classification_loss_skips_ignored_tokens():
    logits = torch.tensor([[[0.0, 0.0], [0.0, LN3], [5.0, -5.0]]])
    labels = torch.tensor([[0, 1, -100]])
    assert close(token_classification_loss(logits, labels), (math.log(2) + math.log(4 / 3)) / 2)


def test_best_span_by_hand():
    start = torch.tensor([1.0, 5.0, 0.0, 2.0])
    end = torch.tensor([0.0, 1.0, 4.0, 3.0])
    assert best_span(start, end, 2) == (1, 2, 9.0)
    assert best_span(start, end, 1) == (1, 1, 6.0)
    assert best_span(start, end, 2, torch.tensor([1, 1, 0, 1]))[:2] == (1, 1)
    # The unconstrained maximum (start 2, end 0) is backwards: never returned.
    assert best_span(torch.tensor([0.0, 0.0, 10.0]), torch.tensor([10.0, 0.0, 1.0]), 3) == (2, 2, 11.0)
    assert best_span(start, end, 2, torch.zeros(4))[:2] == (-1, -1)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-5, 5), min_size=1, max_size=9).flatmap(
        lambda s: st.tuples(st.just(s), st.lists(st.integers(-5, 5), min_size=len(s), max_size=len(s)),
                            st.lists(st.booleans(), min_size=len(s), max_size=len(s)), st.integers(1, 4))
    )
)
def test_best_span_equals_brute_force(case):
    start, end, allowed, max_len = case
    best = max(
        ((start[i] + end[j], i, j) for i in range(len(start)) for j in range(i, min(len(start), i + max_len))
         if allowed[i] and allowed[j]),
        default=None,
        key=lambda t: t[0],
    )
    s, e, score = best_span(torch.tensor(start, dtype=torch.float), torch.tensor(end, dtype=torch.float),
                            max_len, torch.tensor(allowed))
    if best is None:
        assert (s, e) == (-1, -1)
    else:
        assert score == best[0] and 0 <= e - s < max_len and allowed[s] and allowed[e]
        assert start[s] + end[e] == best[0]
