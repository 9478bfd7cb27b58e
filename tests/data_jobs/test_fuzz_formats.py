"""Generated hostile inputs for the two readers tests/data_jobs/test_fuzz_readers.py does not generate
(issue 24): running prose (``books``: Project Gutenberg headers and footers, several books in one file,
damaged lines) and Parquet tables (text as string or binary, nulls, bad UTF-8, several row groups, an
id column), each plain, gzip/bz2/zstd-compressed and truncated. Same invariants: no exception but a
one-line UserError, and conservation: every book or row is read once and kept or counted under a reason.
Settings: tests/fuzz_settings.py."""
from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import strategies as st

from contracts.common import UserError
from fuzz_settings import fuzz
from test_fuzz_readers import BAD_LINES, CODECS, SENTENCE, TRUNCATION, conserved, read

START = b"*** START OF THE PROJECT GUTENBERG EBOOK %d ***"
END = b"*** END OF THE PROJECT GUTENBERG EBOOK %d ***"
LINE = st.one_of(SENTENCE.map(str.encode), SENTENCE.map(str.encode), BAD_LINES)
PARAGRAPH = st.lists(LINE, min_size=1, max_size=4)
BOOK = st.lists(PARAGRAPH, min_size=0, max_size=4)


def books_file(books, gutenberg: bool, crlf: bool) -> bytes:
    """``books`` as one file: bare prose (one book: paragraphs joined) or each book wrapped in Project
    Gutenberg START/END markers with licence text around them (then each is one document)."""
    nl = b"\r\n" if crlf else b"\n"
    out = []
    for i, paragraphs in enumerate(books):
        if gutenberg:
            out += [b"The Project Gutenberg licence header.", b"", START % i, b""]
        out += [nl.join(p) + nl for p in paragraphs]
        if gutenberg:
            out += [b"", END % i, b"Licence footer text.", b""]
    return nl.join(out) + nl


@given(books=st.lists(BOOK, min_size=1, max_size=3), gutenberg=st.booleans(), crlf=st.booleans(), codec=CODECS,
       cut=TRUNCATION)
@fuzz(300)
def test_books(tmp_path_factory, books, gutenberg, crlf, codec, cut):
    if not gutenberg:
        books = [[p for b in books for p in b]]  # without markers the whole file is one book
    data = books_file(books, gutenberg, crlf)
    _, stats = read(tmp_path_factory.mktemp("books"), "book.txt", data, codec, "books", cut)
    conserved(stats, len(books), cut)


CELL = st.one_of(SENTENCE, st.none(), st.just(""), st.just("   "), st.text(max_size=30))
BINARY_CELL = st.one_of(SENTENCE.map(str.encode), st.none(), BAD_LINES)


def parquet_bytes(texts: list, binary: bool, ids: bool, row_group: int) -> bytes:
    columns = {"text": pa.array(texts, type=pa.binary() if binary else pa.string())}
    if ids:
        columns["id"] = pa.array([f"r{i}" for i in range(len(texts))])
    out = io.BytesIO()
    pq.write_table(pa.table(columns), out, row_group_size=max(1, row_group))
    return out.getvalue()


@given(data=st.data(), binary=st.booleans(), ids=st.booleans(), row_group=st.integers(1, 5), codec=CODECS,
       cut=TRUNCATION)
@fuzz(300)
def test_parquet(tmp_path_factory, data, binary, ids, row_group, codec, cut):
    texts = data.draw(st.lists(BINARY_CELL if binary else CELL, max_size=12))
    blob = parquet_bytes(texts, binary, ids, row_group)
    kw = {"id_column": "id"} if ids else {}
    try:
        _, stats = read(tmp_path_factory.mktemp("pq"), "table.parquet", blob, codec, "parquet", cut, **kw)
    except UserError as err:
        assert "\n" not in str(err) and "table.parquet" in str(err), err
        return
    if stats.files_skipped:  # a cut table (its footer gone) or a cut archive: the whole file, counted once
        assert cut is not None, stats.to_dict()
    conserved(stats, len(texts), cut)
