"""Readers for the standard GLUE TSV files of all nine tasks, and the GLUE submission writer.

Pure Python (no torch). The files are read as GLUE's own ``download_glue_data.py`` left them:
tab-separated with quoting disabled (MRPC and others hold unbalanced ``"``), some with a UTF-8
byte-order mark (MRPC), CoLA train/dev without a header (CoLA dev without a final newline).
Every row must have as many columns as the header (or 4 for header-less CoLA); otherwise the file
and line are named in a :class:`UserError`. Columns are found by header name, not position, because
MNLI train (12 columns) and dev (16 columns) differ.
"""
from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

from contracts.common import UserError, atomic_path
from evaluation.config import GLUE_TASKS

Label = Union[int, float]


@dataclass(frozen=True)
class TaskSpec:
    """Where a task's columns are and what its labels mean."""

    name: str
    text_a: str  # header name of the first sentence
    text_b: Optional[str]  # second sentence (None: single-sentence task)
    label: str  # header name of the label column
    labels: Optional[tuple[str, ...]]  # label strings in id order; None = regression
    dev_files: dict[str, str]  # evaluation name -> file ("MNLI-m" -> dev_matched.tsv)
    test_files: dict[str, str]  # submission name -> file
    test_text_a: Optional[str] = None  # test header names where they differ from train/dev
    test_text_b: Optional[str] = None
    test_index: str = "index"
    no_header_columns: Optional[dict[str, int]] = field(default=None)  # CoLA: name -> column position

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)


_NLI3 = ("contradiction", "entailment", "neutral")
_NLI2 = ("entailment", "not_entailment")

TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in [
        TaskSpec("CoLA", "sentence", None, "label", ("0", "1"), {"CoLA": "dev.tsv"}, {"CoLA": "test.tsv"},
                 no_header_columns={"source": 0, "label": 1, "author_mark": 2, "sentence": 3}),
        TaskSpec("SST-2", "sentence", None, "label", ("0", "1"), {"SST-2": "dev.tsv"}, {"SST-2": "test.tsv"}),
        TaskSpec("MRPC", "#1 String", "#2 String", "Quality", ("0", "1"), {"MRPC": "dev.tsv"}, {"MRPC": "test.tsv"}),
        TaskSpec("STS-B", "sentence1", "sentence2", "score", None, {"STS-B": "dev.tsv"}, {"STS-B": "test.tsv"}),
        TaskSpec("QQP", "question1", "question2", "is_duplicate", ("0", "1"), {"QQP": "dev.tsv"}, {"QQP": "test.tsv"},
                 test_index="id"),
        TaskSpec("MNLI", "sentence1", "sentence2", "gold_label", _NLI3,
                 {"MNLI-m": "dev_matched.tsv", "MNLI-mm": "dev_mismatched.tsv"},
                 {"MNLI-m": "test_matched.tsv", "MNLI-mm": "test_mismatched.tsv"}),
        TaskSpec("QNLI", "question", "sentence", "label", _NLI2, {"QNLI": "dev.tsv"}, {"QNLI": "test.tsv"}),
        TaskSpec("RTE", "sentence1", "sentence2", "label", _NLI2, {"RTE": "dev.tsv"}, {"RTE": "test.tsv"}),
        TaskSpec("WNLI", "sentence1", "sentence2", "label", ("0", "1"), {"WNLI": "dev.tsv"}, {"WNLI": "test.tsv"}),
    ]
}
assert tuple(TASKS) == GLUE_TASKS


@dataclass(frozen=True)
class Example:
    """One GLUE row: ``label`` is a class id, a float (STS-B) or None (test set); ``guid`` = file:line."""

    guid: str
    text_a: str
    text_b: Optional[str]
    label: Optional[Label]
    index: Optional[str] = None  # test rows: the id the submission must echo


def get_task(name: str) -> TaskSpec:
    """Look a task up case-insensitively ("sst-2", "SST2", "mnli")."""
    key = name.replace("-", "").lower()
    for spec in TASKS.values():
        if spec.name.replace("-", "").lower() == key:
            return spec
    raise UserError(f"unknown GLUE task {name!r}; choose from {', '.join(TASKS)}")


def read_tsv(path: Path, header: bool = True, ncols: Optional[int] = None) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Split a GLUE TSV: (header, [(line number, cells)]). No quoting; BOM and CRLF tolerated."""
    return _split_tsv(path, _read_bytes(path), header, ncols)


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise UserError(f"{path}: task file not found")
    return path.read_bytes()


def _split_tsv(path: Path, data: bytes, header: bool = True,
               ncols: Optional[int] = None) -> tuple[list[str], list[tuple[int, list[str]]]]:
    try:
        text = data.decode("utf-8-sig")  # -sig drops MRPC's byte-order mark
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 ({err.reason} at byte {err.start})") from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as a text-mode read
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # final newline (CoLA dev has none, which is fine too)
    names: list[str] = []
    if header:
        if not lines:
            raise UserError(f"{path}: empty file, expected a header line")
        names = lines[0].rstrip("\r").split("\t")
        ncols = len(names)
    rows = []
    for lineno, line in enumerate(lines[1:] if header else lines, start=2 if header else 1):
        cells = line.rstrip("\r").split("\t")
        if ncols is not None and len(cells) != ncols:
            raise UserError(f"{path}:{lineno}: expected {ncols} tab-separated columns, found {len(cells)}")
        rows.append((lineno, cells))
    return names, rows


def _column(path: Path, names: Sequence[str], name: str) -> int:
    if name not in names:
        raise UserError(f"{path}: header has no column {name!r} (found: {', '.join(names)})")
    return names.index(name)


def _parse_label(spec: TaskSpec, raw: str, where: str) -> Label:
    if spec.labels is None:
        try:
            score = float(raw)
        except ValueError:
            raise UserError(f"{where}: score {raw!r} is not a number") from None
        if not math.isfinite(score):  # "nan" and "inf" parse as floats, and would poison the correlations
            raise UserError(f"{where}: score {raw!r} is not a finite number")
        return score
    if raw not in spec.labels:
        raise UserError(f"{where}: label {raw!r} is not one of {', '.join(spec.labels)}")
    return spec.labels.index(raw)


def read_examples(spec: TaskSpec, path: Path, limit: Optional[int] = None) -> list[Example]:
    """Labelled examples of a train or dev file (the first ``limit``; a bad label past them is not read).

    A file's content is parsed once per process (``_parsed``): a comparison's every cell, and the checks
    before them, read the same task files (SST-2's training file has 67,349 rows)."""
    examples, bad = _parsed(spec, path)
    if bad is not None and (limit is None or bad[0] < limit):
        raise UserError(bad[1])
    out = examples[:limit]  # a new list: a caller's changes never reach the cache
    if not out:
        raise UserError(f"{path}: no examples")
    return out


def _parse_all(spec: TaskSpec, path: Path, data: bytes) -> tuple[list[Example], Optional[tuple[int, str]]]:
    """Every row's example up to the first bad label, and that label's (row index, message)."""
    if spec.no_header_columns:
        _, rows = _split_tsv(path, data, header=False, ncols=len(spec.no_header_columns))
        names = list(spec.no_header_columns)
    else:
        names, rows = _split_tsv(path, data)
    ia = _column(path, names, spec.text_a)
    ib = _column(path, names, spec.text_b) if spec.text_b else None
    il = _column(path, names, spec.label)
    out = []
    for i, (lineno, cells) in enumerate(rows):
        where = f"{path}:{lineno}"
        try:
            label = _parse_label(spec, cells[il], where)
        except UserError as err:
            return out, (i, str(err))
        out.append(Example(where, cells[ia], cells[ib] if ib is not None else None, label))
    return out, None


# (task, path, SHA-256 of the file's bytes) -> (_parse_all's result, the file's size), most recent last. Keyed by content,
# not by modification time: a file edited between two reads is parsed again, however fast the edit (the
# hash costs milliseconds; splitting and labelling the rows is what takes time). An error (a missing
# file, a row with the wrong column count) is raised each time and never kept. Bounded by the files'
# bytes: every task but QQP's and MNLI's training files (41 and 80 MB, whose fine-tuning outweighs a
# read many times over) fits.
_PARSED: "OrderedDict[tuple[str, str, str], tuple[tuple[list[Example], Optional[tuple[int, str]]], int]]" = OrderedDict()
_PARSED_BYTES = 48 << 20  # the kept files' sizes together (parsed, they take a few times more memory)
_PARSED_LOCK = threading.Lock()


def _parsed(spec: TaskSpec, path: Path) -> tuple[list[Example], Optional[tuple[int, str]]]:
    data = _read_bytes(path)
    key = (spec.name, str(path), hashlib.sha256(data).hexdigest())
    with _PARSED_LOCK:
        hit = _PARSED.get(key)
        if hit is not None:
            _PARSED.move_to_end(key)
            return hit[0]
    result = _parse_all(spec, path, data)
    if len(data) <= _PARSED_BYTES // 4:
        with _PARSED_LOCK:
            _PARSED[key] = (result, len(data))  # with the file's size, which bounds the cache
            while sum(size for _, size in _PARSED.values()) > _PARSED_BYTES:
                _PARSED.popitem(last=False)
    return result


def read_test_examples(spec: TaskSpec, path: Path, limit: Optional[int] = None) -> list[Example]:
    """Unlabelled test rows (all test files have a header with an index column)."""
    names, rows = read_tsv(path)
    ia = _column(path, names, spec.test_text_a or spec.text_a)
    tb = spec.test_text_b or spec.text_b
    ib = _column(path, names, tb) if tb else None
    ix = _column(path, names, spec.test_index)
    if not rows:  # a header alone would make an empty submission that looks finished
        raise UserError(f"{path}: no examples")
    return [
        Example(f"{path}:{n}", c[ia], c[ib] if ib is not None else None, None, index=c[ix]) for n, c in rows[:limit]
    ]


def label_string(spec: TaskSpec, pred: Label) -> str:
    """A prediction as the submission server expects it (label name, or the STS-B score)."""
    if spec.labels is None:
        return f"{min(5.0, max(0.0, float(pred))):.3f}"
    return spec.labels[int(pred)]


def write_submission(path: Path, spec: TaskSpec, examples: Sequence[Example], preds: Sequence[Label]) -> None:
    """``index<TAB>prediction`` with a header, one row per test example, written atomically."""
    if len(examples) != len(preds):
        raise ValueError(f"{len(preds)} predictions for {len(examples)} test examples")
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write("index\tprediction\n")
            for ex, p in zip(examples, preds):
                f.write(f"{ex.index}\t{label_string(spec, p)}\n")
