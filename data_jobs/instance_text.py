"""Instances decoded back to text, for ``bertflow data inspect`` and for eyeballing a dataset.

``decode_examples`` is re-exported by ``data_jobs.instances`` (the documented entry point).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pyarrow.parquet as pq

from contracts.schema import Manifest
from data_jobs.tokenization import read_vocab

LABEL_NAMES = {"nsp": {0: "is next", 1: "random next"}, "sop": {0: "in order", 1: "swapped"},
               "none": {-1: "no sentence task"}}


def format_instance(row: dict, vocab: Sequence[str], sentence_task: str = "nsp") -> str:
    """One instance as text: masked positions shown as ``{shown|label}`` (e.g. ``{[MASK]|cat}``)."""
    labels = dict(zip(row["masked_positions"], row["masked_ids"]))
    words = []
    for pos, tid in enumerate(row["input_ids"]):
        if pos == row["segment_a_len"] and pos < len(row["input_ids"]):
            words.append("|")  # segment boundary marker (token types switch to 1 here)
        shown = vocab[tid] if tid < len(vocab) else f"<{tid}>"
        words.append(f"{{{shown}|{vocab[labels[pos]]}}}" if pos in labels else shown)
    lab = row["nsp_label"]
    name = LABEL_NAMES.get(sentence_task, {}).get(lab, str(lab))
    head = (f"length={len(row['input_ids'])} segment_a_len={row['segment_a_len']} "
            f"predictions={len(labels)} label={lab} ({name})")
    return head + "\n" + " ".join(words)


def decode_examples(dataset_dir, n: int = 3) -> list[str]:
    """The first ``n`` instances of an instances dataset decoded back to text, with [MASK]s shown."""
    d = Path(dataset_dir)
    m = Manifest.read(d, kind="instances")
    vocab = read_vocab(m.totals["vocab_file"])
    task = m.totals.get("sentence_task", "nsp")
    out: list[str] = []
    for entry in m.files:
        if len(out) >= n:
            break
        for batch in pq.ParquetFile(d / entry.name).iter_batches(batch_size=n - len(out)):
            out.extend(format_instance(r, vocab, task) for r in batch.to_pylist())
            break
    return out
