"""Metrics exactly as the benchmarks define them. Pure functions of predictions and gold labels.

GLUE: Matthews correlation (CoLA), Pearson/Spearman (STS-B), F1 + accuracy (MRPC, QQP), accuracy
elsewhere, all from scipy / scikit-learn. SQuAD v1.1: exact match and token F1 after the official
``evaluate-v1.1.py`` normalization, reproduced line for line. NER: entity-level F1 from seqeval.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Mapping, Sequence

import numpy as np
from scipy.stats import pearsonr, spearmanr
from seqeval import metrics as seqeval
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

# Which metric selects the learning rate (the one the BERT paper reports for the task).
PRIMARY_METRIC = {
    "CoLA": "mcc",
    "SST-2": "accuracy",
    "MRPC": "f1",
    "STS-B": "spearman",
    "QQP": "f1",
    "MNLI-m": "accuracy",
    "MNLI-mm": "accuracy",
    "QNLI": "accuracy",
    "RTE": "accuracy",
    "WNLI": "accuracy",
}


def glue_metrics(task: str, preds: Sequence, labels: Sequence) -> dict[str, float]:
    """The GLUE metrics of ``task`` (a dev-set name such as "MNLI-m"); preds/labels are ints or floats."""
    if len(preds) != len(labels) or not len(labels):
        raise ValueError(f"{task}: {len(preds)} predictions for {len(labels)} labels")
    if task == "STS-B":
        p, y = np.asarray(preds, dtype=np.float64), np.asarray(labels, dtype=np.float64)
        if np.ptp(p) == 0 or np.ptp(y) == 0:
            # A regressor that collapsed to one value carries no ranking: correlation 0 (scipy would give
            # NaN, which would poison the lr choice and every average), as sklearn's MCC does for a
            # constant classifier.
            return {"pearson": 0.0, "spearman": 0.0}
        return {"pearson": float(pearsonr(p, y)[0]), "spearman": float(spearmanr(p, y)[0])}
    out = {"accuracy": float(accuracy_score(labels, preds))}
    if task == "CoLA":
        out["mcc"] = float(matthews_corrcoef(labels, preds))
    if task in ("MRPC", "QQP"):
        out["f1"] = float(f1_score(labels, preds, pos_label=1, zero_division=0))
    return out


# --- SQuAD v1.1: the official evaluate-v1.1.py, unchanged in behaviour -----------------------------


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (official v1.1 order)."""

    def remove_articles(text: str) -> str:
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text: str) -> str:
        return " ".join(text.split())

    def remove_punc(text: str) -> str:
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def squad_f1(prediction: str, ground_truth: str) -> float:
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def squad_exact_match(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def _max_over_ground_truths(metric_fn, prediction: str, ground_truths: Sequence[str]) -> float:
    return max(metric_fn(prediction, gt) for gt in ground_truths)


def squad_evaluate(dataset: Sequence[Mapping], predictions: Mapping[str, str]) -> dict[str, float]:
    """Official v1.1 ``evaluate(dataset, predictions)``: ``dataset`` is the file's ``data`` list.

    A question missing from ``predictions`` scores 0 (the official script prints a message; we count them).
    """
    f1 = exact_match = total = 0.0
    missing = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    missing += 1
                    continue
                ground_truths = [a["text"] for a in qa["answers"]]
                prediction = predictions[qa["id"]]
                exact_match += _max_over_ground_truths(squad_exact_match, prediction, ground_truths)
                f1 += _max_over_ground_truths(squad_f1, prediction, ground_truths)
    if not total:
        raise ValueError("SQuAD dataset has no questions")
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total, "unanswered": missing}


# --- NER ------------------------------------------------------------------------------------------


def ner_metrics(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level precision/recall/F1 (conlleval semantics, as seqeval's default mode)."""
    return {
        "f1": float(seqeval.f1_score(gold, pred, zero_division=0)),
        "precision": float(seqeval.precision_score(gold, pred, zero_division=0)),
        "recall": float(seqeval.recall_score(gold, pred, zero_division=0)),
        "token_accuracy": float(seqeval.accuracy_score(gold, pred)),
    }
