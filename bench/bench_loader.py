"""Loader throughput: sequences/s of bert_core.loader (vectorised collation from Arrow buffers) against
a naive per-row Python collation of the same Parquet rows, measured in the same run.

    .venv/bin/python bench/bench_loader.py [--rows 100000] [--seq 128] [--batch 256]

Aim: >= 40,000 sequences/s per process at seq 128.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from bert_core.loader import BatchLoader, InstanceDataset
from contracts.common import stable_hash
from contracts.schema import Manifest, file_entry, instances_schema


def _list(lengths: np.ndarray, values: np.ndarray, typ) -> pa.Array:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=typ))


def make_dataset(out: Path, rows: int, seq: int, files: int = 4, vocab: int = 30522) -> Path:
    """Random instances with BERT's length profile: 90 % full length, 10 % short."""
    rng = np.random.default_rng(0)
    schema, entries = instances_schema(vocab), []
    for f in range(files):
        n = rows // files
        lens = np.where(rng.random(n) < 0.9, seq, rng.integers(16, seq + 1, n))
        ids = rng.integers(5, vocab, int(lens.sum())).astype(np.uint16)
        n_mask = np.minimum(20, np.maximum(1, (lens * 0.15).astype(int)))
        pos = np.concatenate([np.sort(rng.choice(np.arange(1, l - 1), k, replace=False)) for l, k in zip(lens, n_mask)])
        table = pa.Table.from_arrays(
            [_list(lens, ids, pa.uint16()), pa.array((lens // 2).astype(np.uint16)),
             _list(n_mask, pos.astype(np.uint16), pa.uint16()), _list(n_mask, rng.integers(5, vocab, int(n_mask.sum())).astype(np.uint16), pa.uint16()),
             pa.array(rng.integers(0, 2, n).astype(np.int8))], schema=schema)
        path = out / f"part-{f:05d}.parquet"
        pq.write_table(table, path, compression="zstd")
        entries.append(file_entry(path, n, shard=f))
    cfg = {"max_seq_length": seq, "length_bin_size": 32}
    Manifest(kind="instances", config=cfg, config_hash=stable_hash(cfg), vocab_hash="bench", files=entries,
             totals={"instances": rows // files * files, "vocab_size": vocab, "max_seq_length": seq,
                     "max_predictions_per_seq": 20}).write(out)
    return out


def naive_batches(rows: list[dict], batch: int, seq: int, limit: int):
    """Baseline: rows as Python dicts, padded one by one (what a per-row Dataset + collate_fn does)."""
    order = np.random.default_rng(0).permutation(len(rows))
    for b in range(limit):
        sel = [rows[i] for i in order[b * batch : (b + 1) * batch]]
        ids, types, mask, pos, labels = [], [], [], [], []
        for i, r in enumerate(sel):
            n = len(r["input_ids"])
            ids.append(r["input_ids"] + [0] * (seq - n))
            types.append([0] * r["segment_a_len"] + [1] * (n - r["segment_a_len"]) + [0] * (seq - n))
            mask.append([1] * n + [0] * (seq - n))
            pos += [i * seq + p for p in r["masked_positions"]]
            labels += r["masked_ids"]
        yield {"input_ids": torch.tensor(ids), "token_type_ids": torch.tensor(types), "attention_mask": torch.tensor(mask),
               "mlm_positions": torch.tensor(pos), "mlm_labels": torch.tensor(labels),
               "nsp_labels": torch.tensor([r["nsp_label"] for r in sel])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        data = make_dataset(Path(tmp), args.rows, args.seq)
        t = time.perf_counter()
        ds = InstanceDataset(data)
        load_s = time.perf_counter() - t
        loader = BatchLoader(ds, args.batch, seed=0)
        n_batches = loader.batches_per_epoch()
        t = time.perf_counter()
        seqs = sum(next(loader)["input_ids"].shape[0] for _ in range(n_batches))
        ours = seqs / (time.perf_counter() - t)
        limit = max(1, min(n_batches, 40))
        rows = [r for f in sorted(data.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]  # not timed
        t = time.perf_counter()
        base_seqs = sum(b["input_ids"].shape[0] for b in naive_batches(rows, args.batch, args.seq, limit))
        naive = base_seqs / (time.perf_counter() - t)
    print(f"rows {args.rows:,}  seq {args.seq}  batch {args.batch}  (dataset load {load_s:.2f} s)")
    print(f"bert_core.loader      {ours:12,.0f} seq/s")
    print(f"naive per-row Python  {naive:12,.0f} seq/s")
    print(f"ratio                 {ours / naive:12.1f}x   (aim: >= 40,000 seq/s per process)")


if __name__ == "__main__":
    main()
