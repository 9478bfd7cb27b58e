"""Metrics against hand-computed values; SQuAD against worked examples of the official v1.1 normalization."""
from __future__ import annotations

import math

import pytest

from evaluation import metrics as M


def test_accuracy_f1_mcc_by_hand():
    labels = [1, 1, 1, 0, 0, 0]
    preds = [1, 1, 0, 0, 0, 1]
    # TP=2 FN=1 TN=2 FP=1: acc 4/6, F1 = 2*2/(2*2+1+1) = 2/3, MCC = (2*2-1*1)/sqrt(3*3*3*3) = 1/3
    assert M.glue_metrics("MRPC", preds, labels) == pytest.approx({"accuracy": 4 / 6, "f1": 2 / 3})
    assert M.glue_metrics("CoLA", preds, labels)["mcc"] == pytest.approx(1 / 3)
    assert M.glue_metrics("SST-2", preds, labels) == pytest.approx({"accuracy": 4 / 6})


def test_pearson_spearman_by_hand():
    y = [1.0, 2.0, 3.0, 4.0]
    p = [1.0, 3.0, 2.0, 4.0]
    # Pearson: both have mean 2.5, var sum 5; covariance sum (2.25 + -0.25 + -0.25 + 2.25) = 4 -> 0.8.
    # Spearman: ranks equal the values, so also 0.8.
    out = M.glue_metrics("STS-B", p, y)
    assert out["pearson"] == pytest.approx(0.8) and out["spearman"] == pytest.approx(0.8)
    # A monotone but non-linear prediction: Spearman 1, Pearson < 1.
    out = M.glue_metrics("STS-B", [1.0, 2.0, 4.0, 100.0], y)
    assert out["spearman"] == pytest.approx(1.0) and out["pearson"] < 0.9


@pytest.mark.parametrize(
    "raw,normalized",
    [
        ("The Cat!", "cat"),
        ("  a  dog,   an apple and THE end. ", "dog apple and end"),
        ("theater", "theater"),  # articles are removed only as whole words
        ("Denver Broncos'", "denver broncos"),
        ("1,000", "1000"),  # punctuation removal comes before whitespace fixing
        ("A-an", "aan"),  # "A-an" -> "aan": no word boundary left, not an article
        ("the the", ""),
    ],
)
def test_official_normalization(raw, normalized):
    assert M.normalize_answer(raw) == normalized


def test_squad_f1_and_em_worked_examples():
    assert M.squad_exact_match("the Denver Broncos", "Denver Broncos")
    # pred tokens [denver, broncos, won], gold [broncos]: P=1/3 R=1 F1=0.5
    assert M.squad_f1("Denver Broncos won", "Broncos") == pytest.approx(0.5)
    assert M.squad_f1("a", "the") == 0.0  # both normalize to nothing: no common tokens -> 0
    # Counter intersection counts repeats: pred [x, x, y], gold [x, y, y] -> common 2, P=R=2/3
    assert M.squad_f1("x x y", "x y y") == pytest.approx(2 / 3)


def test_squad_evaluate_max_over_answers_and_missing():
    data = [{"paragraphs": [{"context": "c", "qas": [
        {"id": "q1", "question": "?", "answers": [{"text": "Santa Clara", "answer_start": 0},
                                                  {"text": "Levi's Stadium", "answer_start": 0}]},
        {"id": "q2", "question": "?", "answers": [{"text": "1990s", "answer_start": 0}]},
        {"id": "q3", "question": "?", "answers": [{"text": "x", "answer_start": 0}]},
    ]}]}]
    out = M.squad_evaluate(data, {"q1": "Levi's Stadium.", "q2": "the late 1990s"})
    # q1 exact after normalization; q2 F1: pred [late, 1990s] vs [1990s] = 2/3; q3 missing = 0
    assert out["exact_match"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)
    assert out["unanswered"] == 1


def test_ner_entity_level_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    # gold entities: PER, LOC, ORG; predicted: PER, ORG(wrong), ORG -> 2 correct of 3 each: P=R=F1=2/3
    out = M.ner_metrics(gold, pred)
    assert out["f1"] == pytest.approx(2 / 3) and out["precision"] == pytest.approx(2 / 3)
    assert out["token_accuracy"] == pytest.approx(5 / 6)
    # a partially matched span counts as wrong at entity level
    assert M.ner_metrics([["B-PER", "I-PER"]], [["B-PER", "O"]])["f1"] == 0.0
    assert not math.isnan(M.ner_metrics([["O"]], [["O"]])["f1"])


def test_constant_sts_b_predictions_score_zero_not_nan():
    # A regressor that collapsed to one value (seen: a random-init BERT-tiny on STS-B after one epoch).
    y = [0.0, 1.5, 3.0, 5.0]
    assert M.glue_metrics("STS-B", [2.5] * 4, y) == {"pearson": 0.0, "spearman": 0.0}
    assert M.glue_metrics("STS-B", [1.0, 2.0, 3.0, 4.0], [2.0] * 4) == {"pearson": 0.0, "spearman": 0.0}
