"""Sentence splitting: paragraph handling, abbreviations, exact text, quality on the BERT sample."""
from __future__ import annotations

from collections import Counter

import pytest

from data_jobs.segment import BACKENDS, DEFAULT_BACKEND, split_paragraph, split_sentences


def test_paragraphs_never_merge_and_wrapped_lines_join():
    text = "First para line one\nstill the first sentence. Second one!\n\n  \nNew paragraph without end"
    assert split_sentences(text) == [
        "First para line one still the first sentence.",
        "Second one!",
        "New paragraph without end",
    ]


def test_abbreviations_and_quotes_stay_whole():
    got = split_sentences('Mr. Darcy bowed to Mrs. Bennet. "Is it late?" she asked. It was 3.5 p.m. exactly.')
    assert got[0] == "Mr. Darcy bowed to Mrs. Bennet."
    assert "Mr." not in got and "Mrs." not in got


def test_text_is_kept_verbatim_apart_from_whitespace():
    text = "Ünïcödé — “quotes” (brackets) and 10,000 numbers. Второе предложение."
    assert " ".join(split_sentences(text)) == text


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_splits_and_handles_empty(backend):
    assert split_paragraph("", backend) == [] and split_paragraph(" \n ", backend) == []
    assert split_paragraph("One here. Two there.", backend) == ["One here.", "Two there."]


@pytest.mark.shared_data
def test_default_backend_quality_on_bert_sample(shared_data):
    """Google's sample is one sentence per line: re-splitting each joined document must mostly agree."""
    text = (shared_data / "corpus/bert_sample/sample_text.txt").read_text(encoding="utf-8")
    tp = n_ref = n_pred = 0
    for doc in text.split("\n\n"):
        ref = [s.strip() for s in doc.strip().split("\n") if s.strip()]
        pred = split_paragraph(" ".join(ref), DEFAULT_BACKEND)
        tp += sum((Counter(ref) & Counter(pred)).values())
        n_ref, n_pred = n_ref + len(ref), n_pred + len(pred)
    assert tp / n_ref >= 0.65 and tp / n_pred >= 0.65, (tp, n_ref, n_pred)
