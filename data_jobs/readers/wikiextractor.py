"""WikiExtractor output, the raw input of NVIDIA's and MLPerf's BERT Wikipedia preprocessing:

    <doc id="12" url="https://en.wikipedia.org/wiki?curid=12" title="Anarchism">
    Anarchism
    <paragraph, one per line>
    </doc>

The first line repeats the title and is dropped (a title is not a sentence). Each paragraph line is
sentence-split. doc_id = ``<source>#<wiki page id>``.
"""
from __future__ import annotations

import html
import re
from typing import Iterator

from data_jobs.readers.base import Document, ReadStats
from data_jobs.readers.textio import ENDS_STREAM, BadLine, iter_lines
from data_jobs.segment import split_paragraph

_DOC_START = re.compile(r"^<doc\b([^>]*)>\s*$")
_ATTR = re.compile(r'(\w+)="([^"]*)"')


def read_wikiextractor(path: str, source: str, config, stats: ReadStats) -> Iterator[Document]:
    attrs: dict[str, str] | None = None  # None = between documents
    sentences: list[str] = []
    bad: str | None = None
    first_line = True
    seen_doc = outside = False  # outside: inside a run of text between documents
    outside_runs: list[int] = []  # first line of each run of text outside <doc>...</doc>
    for lineno, line in enumerate(iter_lines(path, config.max_line_bytes), start=1):
        if isinstance(line, BadLine):
            if attrs is not None or line.reason in ENDS_STREAM:
                bad = line.reason if line.reason in ENDS_STREAM else bad or line.reason
            if line.reason in ENDS_STREAM:
                break
            continue
        m = _DOC_START.match(line)
        if m and attrs is not None:
            # An unclosed <doc>: never merged into the next article (nor its tag kept as a sentence).
            stats.bad_document(path, "unclosed_doc", f"doc id={_key(attrs)}")
        if m:
            attrs = {k: html.unescape(v) for k, v in _ATTR.findall(m.group(1))}
            sentences, bad, first_line, seen_doc, outside = [], None, True, True, False
            continue
        if attrs is None:
            if line.strip() and not outside:
                outside_runs.append(lineno)
            outside = outside or bool(line.strip())
            continue
        if line.strip() == "</doc>":
            if bad:
                stats.bad_document(path, bad, f"doc id={_key(attrs)}")
            elif not sentences:
                stats.drop("no_text")
            else:
                yield Document(f"{source}#{_key(attrs)}", source, sentences)
            attrs, bad = None, None  # counted: never again as "truncated" at the end of the file
            continue
        if first_line and line.strip():
            first_line = False
            if line.strip() == attrs.get("title", "").strip():
                continue
        if line.strip():
            sentences.extend(split_paragraph(line, config.sentence_splitter))
    if attrs is not None or bad:
        # The file ended inside a <doc>: a cut-off file, the partial article is not kept.
        why = "compression_bomb" if bad == "compression_bomb" else "truncated"
        stats.bad_document(path, why, "stops inside a <doc>" if why != "truncated" else "ends inside a <doc>")
    if not seen_doc and outside_runs:
        # Plain text read as WikiExtractor output: a whole file of text, not one document in it.
        stats.bad_file(path, "no_documents")
        return
    for lineno in outside_runs:
        stats.bad_document(path, "text_outside_doc", f"line {lineno}")


def _key(attrs: dict[str, str]) -> str:
    return attrs.get("id") or attrs.get("title") or "?"
