"""Test helpers for the trainer tests: small, valid instances datasets written from random tokens.

The layout follows contracts.schema (instances_schema + Manifest with kind "instances"), so the
loader sees exactly what the instances job writes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from contracts.common import stable_hash
from contracts.schema import Manifest, file_entry, instances_schema
from data_jobs.tokenization import vocab_hash

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_vocab(path: Path, vocab_size: int) -> Path:
    tokens = SPECIAL + [f"w{i}" for i in range(vocab_size - len(SPECIAL))]
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


def make_rows(n: int, vocab_size: int, max_seq: int, max_pred: int, rng: np.random.Generator, min_len: int = 8):
    """Random but structurally valid instances: [CLS] A [SEP] B [SEP], sorted unique masked positions."""
    rows = []
    for _ in range(n):
        length = int(rng.integers(min_len, max_seq + 1))
        ids = rng.integers(5, vocab_size, size=length).astype(np.int64)
        a_len = int(rng.integers(2, length - 2))
        ids[0], ids[a_len - 1], ids[-1] = 2, 3, 3
        candidates = np.array([i for i in range(1, length - 1) if i != a_len - 1])
        k = int(min(max_pred, max(1, round(0.15 * length)), len(candidates)))
        pos = np.sort(rng.choice(candidates, size=k, replace=False))
        orig = ids[pos].copy()
        ids[pos] = 4
        rows.append({"input_ids": ids.tolist(), "segment_a_len": a_len, "masked_positions": pos.tolist(),
                     "masked_ids": orig.tolist(), "nsp_label": int(rng.integers(0, 2))})
    return rows


def write_dataset(out: Path, n: int = 64, vocab_size: int = 100, max_seq: int = 32, max_pred: int = 5,
                  seed: int = 0, file_sizes: list[int] | None = None, bin_size: int = 8) -> Path:
    """An instances dataset dir; ``file_sizes`` makes shards uneven (default: 3 uneven files)."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = make_rows(n, vocab_size, max_seq, max_pred, rng)
    sizes = file_sizes or [n // 2, n // 3, n - n // 2 - n // 3]
    assert sum(sizes) == n
    schema = instances_schema(vocab_size)
    entries, start = [], 0
    for i, size in enumerate(sizes):
        part = rows[start : start + size]
        start += size
        table = pa.Table.from_pylist(part, schema=schema)
        path = out / f"instances-{i:05d}.parquet"
        pq.write_table(table, path, compression="zstd")
        entries.append(file_entry(path, len(part), shard=i, bin=0))
    vocab = write_vocab(out / "vocab.txt", vocab_size)
    config = {"max_seq_length": max_seq, "max_predictions_per_seq": max_pred, "length_bin_size": bin_size, "seed": seed}
    Manifest(
        kind="instances", config=config, config_hash=stable_hash(config), vocab_hash=vocab_hash(vocab),
        files=entries,
        totals={"instances": n, "vocab_size": vocab_size, "vocab_file": "vocab.txt", "lowercase": True,
                "max_seq_length": max_seq, "max_predictions_per_seq": max_pred, "sentence_task": "nsp"},
    ).write(out)
    return out
