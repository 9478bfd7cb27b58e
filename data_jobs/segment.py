"""Sentence splitting of running prose (pure; no model download).

One function, :func:`split_sentences`, used by every reader that sees prose rather than
one-sentence-per-line text. The backend is chosen by measurement (``bench/bench_segment.py``,
figures in ``docs/data-shard.md``); the alternatives stay importable here so the benchmark compares
the exact code paths the pipeline would run.

Text is split per paragraph: a sentence never spans a blank line. Hard-wrapped lines inside a
paragraph are joined with single spaces first, so a line break in a book never ends a sentence.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable

from syntok import segmenter

_WS = re.compile(r"\s+")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")


def normalize_space(text: str) -> str:
    """Collapse every run of whitespace (line breaks included) to one space and strip the ends."""
    return _WS.sub(" ", text).strip()


def _syntok(paragraph: str) -> list[str]:
    out = []
    # syntok keeps each token's offset into the input: slice the original text rather than
    # re-joining tokens, so the sentence is byte-for-byte what the author wrote.
    for para in segmenter.analyze(paragraph):
        for sentence in para:
            if not sentence:
                continue
            start = sentence[0].offset
            end = sentence[-1].offset + len(sentence[-1].value)
            out.append(paragraph[start:end])
    return out


def _blingfire(paragraph: str) -> list[str]:
    import blingfire

    return blingfire.text_to_sentences(paragraph).split("\n")


@lru_cache(maxsize=1)
def _pysbd_segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


def _pysbd(paragraph: str) -> list[str]:
    return _pysbd_segmenter().segment(paragraph)


def _regex(paragraph: str) -> list[str]:
    """Baseline for the benchmark only: split after . ! ? followed by space and a capital."""
    return re.split(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z])", paragraph)


BACKENDS: dict[str, Callable[[str], list[str]]] = {
    "syntok": _syntok,
    "blingfire": _blingfire,
    "pysbd": _pysbd,
    "regex": _regex,
}
# syntok: best exact-sentence F1 on Google's sample, within 0.01 of blingfire on MRPC news sentences,
# and ~35x fewer false splits after "Mr." in a novel; about 6x slower than blingfire, which a Ray job
# spreads over cores (see docs/data-shard.md for the measured table).
DEFAULT_BACKEND = "syntok"


def split_paragraph(paragraph: str, backend: str = DEFAULT_BACKEND) -> list[str]:
    """Sentences of one paragraph (whitespace normalised; empty pieces removed)."""
    text = normalize_space(paragraph)
    if not text:
        return []
    return [s for s in (normalize_space(x) for x in BACKENDS[backend](text)) if s]


def split_sentences(text: str, backend: str = DEFAULT_BACKEND) -> list[str]:
    """Sentences of running prose: paragraphs (blank-line separated) split independently."""
    out: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        out.extend(split_paragraph(paragraph, backend))
    return out
