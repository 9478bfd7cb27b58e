"""Reading document shards in instances workers: the sentences of a shard (or of some of its rows) as
one flat list plus the sentences per document, straight from Arrow's buffers.

A fresh worker pays for every module it imports: ``pq.read_table`` imports ``pyarrow.dataset`` (and
pandas with it), ``Table.take``, ``ListArray.flatten`` and ``pyarrow.compute`` more, ``Array.to_numpy``
pandas: about 0.3 CPU-s together, more than reading a 1 MB shard. This module uses none of them.
"""
from __future__ import annotations

import numpy as np

from contracts.common import UserError


def read_documents(path: str, rows: list[int] | None = None) -> list[list[str]]:
    """The documents (or the given rows) of a shard as lists of sentences."""
    sentences, per_doc = read_flat(path, rows)
    offs = np.zeros(len(per_doc) + 1, dtype=np.int64)
    np.cumsum(per_doc, out=offs[1:])
    return [sentences[lo:hi] for lo, hi in zip(offs[:-1].tolist(), offs[1:].tolist())]


def read_flat(path: str, rows: list[int] | None = None) -> tuple[list[str], list[int]]:
    """All sentences of a shard (or of the given rows, in that order) as one list, and the sentences
    per document: Arrow's own layout, several times cheaper than nested Python lists. A null sentence
    or document reads as empty."""
    import pyarrow.parquet as pq

    try:
        col = pq.ParquetFile(path).read(columns=["sentences"]).column("sentences").combine_chunks()
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise UserError(f"{path}: cannot read document shard: {str(err).splitlines()[0]}") from None
    if len(col) == 0:
        return [], []
    # Offsets and values straight from the buffers: ListArray.flatten imports pyarrow.compute and
    # Array.to_numpy pandas.
    offs_N1 = np.frombuffer(col.buffers()[1], dtype=np.int32)[col.offset:col.offset + len(col) + 1].astype(np.int64)
    per_doc_N = np.diff(offs_N1)
    if col.null_count:
        per_doc_N *= _valid(col)
    if rows is None and not col.null_count:
        sentences = col.values.slice(int(offs_N1[0]), int(offs_N1[-1] - offs_N1[0])).to_pylist()
    else:
        rows = range(len(col)) if rows is None else rows
        lo_N, n_N = offs_N1.tolist(), per_doc_N.tolist()
        sentences = [s for r in rows for s in col.values.slice(lo_N[r], n_N[r]).to_pylist()]
        per_doc_N = per_doc_N[np.asarray(rows, dtype=np.int64)]
    if None in sentences:
        sentences = ["" if s is None else s for s in sentences]
    return sentences, per_doc_N.tolist()


def read_sources(path: str) -> list[str]:
    """The ``source`` of every document of a shard, in row order."""
    import pyarrow.parquet as pq

    try:
        col = pq.ParquetFile(path).read(columns=["source"]).column("source")
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise UserError(f"{path}: cannot read document shard: {str(err).splitlines()[0]}") from None
    return [s or "" for s in col.to_pylist()]


def _valid(arr) -> np.ndarray:
    """Arrow validity bitmap as 0/1 per slot (no pyarrow.compute)."""
    bitmap = arr.buffers()[0]
    if bitmap is None:
        return np.ones(len(arr), dtype=np.int64)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[arr.offset:arr.offset + len(arr)].astype(np.int64)
