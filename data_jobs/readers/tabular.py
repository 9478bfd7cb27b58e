"""JSONL and Parquet with a text column (name configurable), as Hugging Face datasets exports them.

The text is running prose: paragraphs split at blank lines, then into sentences. doc_id =
``<source>#<id column value>`` when ``id_column`` is set, else ``<source>#<row index>``.
A missing text column is a configuration mistake, not damaged data: it stops the run.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from contracts.common import UserError
from data_jobs.readers.base import Document, ReadStats, encodable
from data_jobs.readers.textio import COMPRESSIONS, STREAM_ERRORS, BadLine, CompressionBomb, iter_lines, open_binary
from data_jobs.segment import split_sentences


def _document(record_id: Any, text: Any, source: str, config, stats: ReadStats, path: str, where: str):
    if not isinstance(text, str):
        stats.bad_document(path, "missing_text", where)
        return None
    if config.id_column and record_id is None:
        stats.bad_document(path, "missing_id", where)
        return None
    # JSON may spell a lone surrogate ("\\udc80"): valid JSON, but no UTF-8 for Parquet to hold.
    for column, value in (("text", text), ("id", str(record_id))):
        if not encodable(value):
            stats.bad_document(path, "bad_surrogate", f"{where}, {column}")
            return None
    sentences = split_sentences(text, config.sentence_splitter)
    if not sentences:
        stats.drop("no_text")
        return None
    return Document(f"{source}#{record_id}", source, sentences)


def read_jsonl(path: str, source: str, config, stats: ReadStats) -> Iterator[Document]:
    checked = False
    for lineno, line in enumerate(iter_lines(path, config.max_line_bytes), start=1):
        if isinstance(line, BadLine):
            stats.bad_document(path, line.reason, f"line {lineno}")
            continue
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            stats.bad_document(path, "bad_json", f"line {lineno}: {err}")
            continue
        except RecursionError:  # a record nested thousands deep: damaged, not a crash
            stats.bad_document(path, "bad_json", f"line {lineno}: nested too deeply")
            continue
        if not isinstance(record, dict):
            stats.bad_document(path, "bad_json", f"line {lineno}: not an object")
            continue
        if not checked:
            # Judge the column names on the first good record: a wrong --text-column would otherwise
            # drop every record one by one.
            for col in filter(None, (config.text_column, config.id_column)):
                if col not in record:
                    raise UserError(
                        f"{path}: no key {col!r} in the first record (keys: {', '.join(sorted(record)[:20])}); "
                        "set --text-column/--id-column"
                    )
            checked = True
        rid = record.get(config.id_column) if config.id_column else lineno - 1
        doc = _document(rid, record.get(config.text_column), source, config, stats, path, f"line {lineno}")
        if doc is not None:
            yield doc


_BAD = object()  # a value already counted as damaged


def _decode(value, path: str, row: int, stats: ReadStats):
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        stats.bad_document(path, "invalid_utf8", f"row {row}")
        return _BAD


def read_parquet(path: str, source: str, config, stats: ReadStats) -> Iterator[Document]:
    if path.endswith(COMPRESSIONS):
        # Parquet needs random access: an externally compressed file is unpacked to a temporary file
        # (disk, not memory), then read like any other.
        with tempfile.TemporaryDirectory(prefix="bertflow-parquet-") as tmp:
            plain = os.path.join(tmp, "data.parquet")
            try:
                with open_binary(path) as src, open(plain, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            except STREAM_ERRORS as err:
                stats.bad_file(path, "compression_bomb" if isinstance(err, CompressionBomb) else "truncated",
                               type(err).__name__)
                return
            yield from _read_parquet_file(plain, path, source, config, stats)
        return
    yield from _read_parquet_file(path, path, source, config, stats)


def _read_parquet_file(local: str, path: str, source: str, config, stats: ReadStats) -> Iterator[Document]:
    try:
        pf = pq.ParquetFile(local)
    except (pa.ArrowException, OSError) as err:
        stats.bad_file(path, "corrupt_parquet", str(err).splitlines()[0] if str(err) else "")
        return
    names = pf.schema_arrow.names
    columns = [c for c in (config.text_column, config.id_column) if c]
    for col in columns:
        if col not in names:
            raise UserError(
                f"{path}: no column {col!r} (columns: {', '.join(names[:20])}); set --text-column/--id-column"
            )
    kind = pf.schema_arrow.field(config.text_column).type
    is_bytes = pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
    if not (is_bytes or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        # Numbers or lists in the text column: a wrong --text-column, not damaged rows (each would be dropped).
        raise UserError(f"{path}: column {config.text_column!r} holds {kind}, not text; set --text-column")
    row = 0
    # Row batches, never the whole file: memory is one batch of documents.
    for batch in pf.iter_batches(batch_size=256, columns=columns):
        texts = batch.column(config.text_column).to_pylist()
        if is_bytes:  # some writers store UTF-8 text as binary: decoded here, bad bytes counted
            texts = [_decode(t, path, row + k, stats) for k, t in enumerate(texts)]
        ids = batch.column(config.id_column).to_pylist() if config.id_column else range(row, row + len(texts))
        for rid, text in zip(ids, texts):
            if text is _BAD:
                row += 1
                continue
            doc = _document(rid, text, source, config, stats, path, f"row {row}")
            row += 1
            if doc is not None:
                yield doc
