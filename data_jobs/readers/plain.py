"""Plain text: the BERT format (one sentence per line, blank line between documents) and running prose
(books: hard-wrapped lines, paragraphs separated by blank lines, sentence-split; one file = one document).

Both strip a Project Gutenberg licence header/footer, a UTF-8 BOM and CRLF line ends.
"""
from __future__ import annotations

from typing import Iterator

from data_jobs.readers.base import Document, ReadStats
from data_jobs.readers.textio import ENDS_STREAM, BadLine, BookBreak, iter_lines, strip_gutenberg_lines
from data_jobs.segment import normalize_space, split_paragraph


def read_bert(path: str, source: str, config, stats: ReadStats) -> Iterator[Document]:
    """BERT's own pretraining-text format. doc_id = ``<source>#<document index in the file>``.

    The index counts damaged documents too, so one bad document never renumbers the ones after it.
    """
    index = 0
    sentences: list[str] = []
    bad: str | None = None
    for line in strip_gutenberg_lines(iter_lines(path, config.max_line_bytes)):
        if isinstance(line, BookBreak):
            line = ""  # the next book starts a new document
        if isinstance(line, BadLine):
            bad = bad or line.reason
            if line.reason not in ENDS_STREAM:
                continue
            line = ""  # a truncated stream ends the document in progress
        text = normalize_space(line)
        if text:
            sentences.append(text)
            continue
        if sentences or bad:
            if bad:
                stats.bad_document(path, bad, f"document {index}")
            else:
                yield Document(f"{source}#{index}", source, sentences)
            index += 1
            sentences, bad = [], None
    if bad:  # a damaged last document (no blank line after it) is dropped and counted like any other
        stats.bad_document(path, bad, f"document {index}")
    elif sentences:
        yield Document(f"{source}#{index}", source, sentences)


def read_books(path: str, source: str, config, stats: ReadStats) -> Iterator[Document]:
    """Running prose: each book is one document (a file is one book, or several Gutenberg books
    concatenated: ``<source>#0``, ``#1``...), split into sentences per paragraph.

    A damaged line drops its whole book: a document with a hole in it would give NSP false neighbours.
    """
    index, sentences, paragraph = 0, [], []
    bad: str | None = None
    for line in strip_gutenberg_lines(iter_lines(path, config.max_line_bytes)):
        if isinstance(line, BadLine):
            bad = bad or line.reason
            if line.reason in ENDS_STREAM:
                break
            continue
        if isinstance(line, BookBreak):
            yield from _book(path, source, index, sentences, paragraph, bad, config, stats)
            index, sentences, paragraph, bad = index + 1, [], [], None
            continue
        if line.strip():
            paragraph.append(line)
        elif paragraph:
            sentences.extend(split_paragraph(" ".join(paragraph), config.sentence_splitter))
            paragraph = []
    yield from _book(path, source, index, sentences, paragraph, bad, config, stats)


def _book(path, source, index, sentences, paragraph, bad, config, stats) -> Iterator[Document]:
    if bad:
        stats.bad_document(path, bad, f"book {index}" if index else "")
        return
    if paragraph:
        sentences = sentences + split_paragraph(" ".join(paragraph), config.sentence_splitter)
    if sentences:
        yield Document(f"{source}#{index}", source, sentences)
    else:
        stats.drop("no_text")
