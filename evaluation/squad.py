"""SQuAD v1.1: reader, windowed features (doc stride, max query length), span decoding back to the
original text, ``predictions.json`` in the official format, and the fine-tuning job.

Windows follow the BERT reference ``run_squad.py``: the question (cut to ``max_query_length`` tokens)
plus as much context as fits; the next window starts ``doc_stride`` tokens later; a token seen in
several windows is only predicted from the window where it has the most context on both sides.
Answers are mapped back through the tokenizer's character offsets, so the predicted text is an exact
substring of the context (the official script then normalizes it).

Legend: F features (windows), S max_seq_length.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

from bert_core.losses import best_span
from contracts.common import UserError, atomic_path


@dataclass(frozen=True)
class SquadExample:
    qid: str
    question: str
    context: str
    answers: tuple[str, ...]
    answer_start: int  # char offset of the first answer (training target)


def read_squad(path: str | Path) -> list[dict]:
    """The ``data`` list of a SQuAD JSON file (articles with paragraphs and qas), checked down to every
    answer: a one-line UserError naming the file for anything the jobs could not use."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: SQuAD file not found")
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
        _check_squad(doc)
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 ({err.reason} at byte {err.start})") from None
    except RecursionError:
        raise UserError(f"{path}: not a SQuAD v1.1 file (JSON nested too deeply)") from None
    except ValueError as err:  # json.JSONDecodeError, an integer too long, or what _check_squad found
        raise UserError(f"{path}: not a SQuAD v1.1 file ({str(err).splitlines()[0]})") from None
    return doc["data"]


def _check_squad(doc) -> None:
    """ValueError naming the first place where ``doc`` is not SQuAD v1.1: every question needs a string
    id (unique in the file) and question, and at least one answer whose text sits in its paragraph's
    context at its integer ``answer_start`` (training reads the first answer there)."""
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ValueError("no 'data' list at the top level")
    seen: set[str] = set()
    for ai, article in enumerate(data):
        paras = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paras, list):
            raise ValueError(f"data[{ai}] has no 'paragraphs' list")
        for pi, para in enumerate(paras):
            context, qas = (para.get("context"), para.get("qas")) if isinstance(para, dict) else (None, None)
            if not isinstance(context, str) or not isinstance(qas, list):
                raise ValueError(f"data[{ai}].paragraphs[{pi}] needs a 'context' string and a 'qas' list")
            for qi, qa in enumerate(qas):
                if not isinstance(qa, dict) or not all(isinstance(qa.get(k), str) for k in ("id", "question")):
                    raise ValueError(f"data[{ai}].paragraphs[{pi}].qas[{qi}] needs an 'id' and a 'question' string")
                qid, answers = qa["id"], qa.get("answers")
                if qid in seen:
                    raise ValueError(f"question id {qid[:40]!r} repeats")
                seen.add(qid)
                if not isinstance(answers, list) or not answers:
                    raise ValueError(f"question {qid[:40]!r}: 'answers' is not a non-empty list")
                for a in answers:
                    text, start = (a.get("text"), a.get("answer_start")) if isinstance(a, dict) else (None, None)
                    if not isinstance(text, str) or not text or type(start) is not int:
                        raise ValueError(f"question {qid[:40]!r}: an answer needs a 'text' string and an integer "
                                         "'answer_start'")
                    if start < 0 or context[start : start + len(text)] != text:
                        raise ValueError(f"question {qid[:40]!r}: answer {text[:40]!r} is not in the context at "
                                         f"{start}")


def examples_of(data: Sequence[dict], limit: Optional[int] = None) -> list[SquadExample]:
    out = []
    for article in data:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                if limit is not None and len(out) >= limit:
                    return out
                answers = tuple(a["text"] for a in qa["answers"])
                start = qa["answers"][0]["answer_start"] if qa["answers"] else -1
                out.append(SquadExample(qa["id"], qa["question"], para["context"], answers, start))
    return out


def restrict(data: Sequence[dict], qids: set[str]) -> list[dict]:
    """The dataset with only the questions in ``qids`` (what the official evaluator should count)."""
    out = []
    for article in data:
        paras = [{**p, "qas": [q for q in p["qas"] if q["id"] in qids]} for p in article["paragraphs"]]
        paras = [p for p in paras if p["qas"]]
        if paras:
            out.append({**article, "paragraphs": paras})
    return out


@dataclass
class Window:
    """One feature's bookkeeping: which example, where its context tokens sit, which are max-context."""

    example: int
    doc_offset: int  # position of the first context token in the input ids
    token_spans: list[tuple[int, int]]  # char (start, end) of each context token in this window
    max_context: list[bool]


def _max_context(spans: list[tuple[int, int]], span_i: int, pos: int) -> bool:
    """Is context token ``pos`` best placed in window ``span_i``? (most context on its shorter side)"""
    best_score, best = None, None
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        if pos < start or pos > end:
            continue
        score = min(pos - start, end - pos) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best = score, i
    return best == span_i


def _char_to_tokens(offsets: list[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """First and last context token overlapping the answer's characters [start, end)."""
    first = next((i for i, (s, e) in enumerate(offsets) if e > start), len(offsets) - 1)
    last = max((i for i, (s, e) in enumerate(offsets) if s < end), default=first)
    return first, max(first, last)


def make_features(tok, examples: Sequence[SquadExample], max_seq_length: int, doc_stride: int,
                  max_query_length: int, training: bool):
    """Padded tensors (input_ids/token_type_ids/attention_mask [F, S], and start/end positions [F] when
    training) and the list of :class:`Window` records."""
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    rows, windows, starts, ends = [], [], [], []
    for ei, ex in enumerate(examples):
        q_ids = tok.encode(ex.question, add_special_tokens=False).ids[:max_query_length]
        c = tok.encode(ex.context, add_special_tokens=False)
        max_doc = max_seq_length - len(q_ids) - 3
        if max_doc < 1:
            raise UserError(f"max_query_length {max_query_length} leaves no room for context in {max_seq_length}")
        spans, start = [], 0
        while True:
            length = min(len(c.ids) - start, max_doc)
            spans.append((start, length))
            if start + length >= len(c.ids):
                break
            start += min(length, doc_stride)
        if training:
            a_first, a_last = _char_to_tokens(c.offsets, ex.answer_start, ex.answer_start + len(ex.answers[0]))
        for si, (start, length) in enumerate(spans):
            ids = [cls_id, *q_ids, sep_id, *c.ids[start : start + length], sep_id]
            types = [0] * (len(q_ids) + 2) + [1] * (length + 1)
            doc_offset = len(q_ids) + 2
            rows.append((ids, types))
            windows.append(Window(ei, doc_offset, list(c.offsets[start : start + length]),
                                  [_max_context(spans, si, start + j) for j in range(length)]))
            if training:
                inside = start <= a_first and a_last < start + length
                # An answer cut off by this window: point at [CLS], as the reference code does.
                starts.append(a_first - start + doc_offset if inside else 0)
                ends.append(a_last - start + doc_offset if inside else 0)
    F = len(rows)
    data = {k: torch.zeros(F, max_seq_length, dtype=torch.long) for k in ("input_ids", "token_type_ids", "attention_mask")}
    for i, (ids, types) in enumerate(rows):
        data["input_ids"][i, : len(ids)] = torch.tensor(ids)
        data["token_type_ids"][i, : len(ids)] = torch.tensor(types)
        data["attention_mask"][i, : len(ids)] = 1
    if training:
        data["start_positions"] = torch.tensor(starts, dtype=torch.long)
        data["end_positions"] = torch.tensor(ends, dtype=torch.long)
    return data, windows


def decode_predictions(examples: Sequence[SquadExample], windows: Sequence[Window], start_logits, end_logits,
                       max_answer_length: int) -> dict[str, str]:
    """{question id: answer text}: the best span over all windows of each question (start <= end,
    at most ``max_answer_length`` tokens, inside the context, start and end where they have max context)."""
    best: dict[int, tuple[float, str]] = {}
    for f, w in enumerate(windows):
        s_S, e_S = start_logits[f], end_logits[f]
        allowed_S = torch.zeros(len(s_S), dtype=torch.bool)
        n = min(len(w.token_spans), len(s_S) - w.doc_offset)
        allowed_S[w.doc_offset : w.doc_offset + n] = torch.tensor(w.max_context[:n], dtype=torch.bool)
        s, e, score = best_span(s_S, e_S, max_answer_length, allowed_S)
        if s < 0:
            continue
        ctx = examples[w.example].context
        text = ctx[w.token_spans[s - w.doc_offset][0] : w.token_spans[e - w.doc_offset][1]]
        if w.example not in best or score > best[w.example][0]:
            best[w.example] = (score, text)
    return {ex.qid: best.get(i, (0.0, ""))[1] for i, ex in enumerate(examples)}


def write_predictions(path: str | Path, predictions: dict[str, str]) -> None:
    """``predictions.json`` as the official evaluator reads it: {question id: answer text}."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(predictions, ensure_ascii=False, indent=2, sort_keys=True) + "\n", encoding="utf-8")
