"""The checks a continual firing makes on a new snapshot before it trains on it (flows.continual): too few
new documents, mostly repeats, held-out or training shards left empty, words without order (shuffled text,
word lists), text the vocab cannot read (the share of [UNK]). Each returns the reason a snapshot is
rejected, with its counts, or None."""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from flows.continual import ContinualConfig

WORD = re.compile(r"\w+")


def unknown_rate(instances_dir: str, unk_id: int) -> float:
    """Share of [UNK] among the tokens of an instances dataset (its Parquet files, column input_ids)."""
    import numpy as np
    import pyarrow.parquet as pq

    from contracts.schema import Manifest
    from data_jobs.job_output import local_copy

    m = Manifest.read(instances_dir, kind="instances")
    unk = total = 0
    with local_copy(instances_dir, [(f.name, f.bytes, f.sha256) for f in m.files]) as d:
        for f in m.files:
            ids = pq.read_table(Path(d) / f.name, columns=["input_ids"]).column(0).combine_chunks().values
            values = np.asarray(ids.to_numpy(zero_copy_only=False))
            unk += int((values == unk_id).sum())
            total += len(values)
    return unk / total if total else 0.0


ORDER_WORDS, ORDER_MIN_WORDS = 200_000, 10_000


def word_order(docs_dir: str, docs) -> tuple[float, int]:
    """(how much information word order carries, words looked at) for a documents dataset: 1 - (distinct
    adjacent word pairs within sentences) / (the same count after shuffling those words, seeded). Natural
    text repeats its word pairs ("of the", "it was"), so its pairs are far fewer than its shuffled
    words' (on the shared corpus' books and Wikipedia, 0.12 to 0.30 from 10,000 words on); the same text
    with its words shuffled scores under 0.05. Reads sentences in shard order up to ``ORDER_WORDS`` words."""
    import random

    import pyarrow.parquet as pq

    from data_jobs.job_output import local_copy

    words: list[str] = []
    lengths: list[int] = []
    with local_copy(docs_dir, [(f.name, f.bytes, f.sha256) for f in docs.files]) as d:
        for f in sorted(docs.files, key=lambda f: f.name):
            for batch in pq.ParquetFile(Path(d) / f.name).iter_batches(batch_size=256, columns=["sentences"]):
                for sentence in batch.column(0).flatten().to_pylist():
                    ws = WORD.findall(sentence.lower())
                    if len(ws) > 1:
                        words += ws
                        lengths.append(len(ws))
                if len(words) >= ORDER_WORDS:
                    break
            if len(words) >= ORDER_WORDS:
                break

    def distinct_pairs(ws: list[str]) -> int:
        pairs, at = set(), 0
        for n in lengths:
            pairs.update(zip(ws[at:at + n], ws[at + 1:at + n]))
            at += n
        return len(pairs)

    if not lengths:
        return 0.0, 0
    shuffled = list(words)
    random.Random(0).shuffle(shuffled)
    return 1.0 - distinct_pairs(words) / max(1, distinct_pairs(shuffled)), len(words)


def junk_reason(cfg: ContinualConfig, docs, docs_dir: Optional[str] = None) -> Optional[str]:
    """Why a new snapshot is rejected from its documents alone (before any instances), or None.
    ``docs``: its documents manifest; ``docs_dir``: where it lies (for the word-order check)."""
    t = docs.totals
    read, kept = int(t.get("documents_read", 0)), int(t.get("documents_kept", 0))
    dropped = t.get("dropped", {}) or {}
    repeats = sum(int(dropped.get(k, 0)) for k in ("duplicate", "duplicate_doc_id", "seen_earlier"))
    q = cfg.quality
    if read and repeats / read > q.max_duplicate_fraction:
        return (f"{repeats} of {read} documents are duplicates or earlier snapshots' documents "
                f"({repeats / read:.0%} > quality.max_duplicate_fraction {q.max_duplicate_fraction:.0%})")
    if kept < q.min_documents:
        return (f"only {kept} new documents of {read} read (quality.min_documents {q.min_documents}; dropped: "
                + (", ".join(f"{k} {v}" for k, v in sorted(dropped.items())) or "none") + ")")
    files = sorted(docs.files, key=lambda f: f.name)
    held = sum(f.rows for f in files[len(files) - cfg.heldout_shards:])
    if held == 0 or held == kept:
        part = "held-out" if held == 0 else "training"
        return (f"its {kept} new documents leave the {part} shards empty ({cfg.heldout_shards} of "
                f"{len(files)} shards held out): too few documents to train and score on; use fewer "
                "shard.num_shards or put more documents in a snapshot")
    if docs_dir is not None and q.min_word_order > 0:
        order, n = word_order(docs_dir, docs)
        if n >= ORDER_MIN_WORDS and order < q.min_word_order:
            return (f"its word order carries almost no information ({order:.3f} < quality.min_word_order "
                    f"{q.min_word_order:g}, on {n:,} words): words shuffled, or not running text")
    return None


def unreadable_reason(cfg: ContinualConfig, heldout_dir: str, vocab_manifest) -> Optional[str]:
    """Why a new snapshot is rejected from its held-out instances (text the vocab cannot read), or None."""
    unk_id = (vocab_manifest.totals.get("special_ids") or {}).get("[UNK]")
    if not isinstance(unk_id, int):
        return None
    rate = unknown_rate(heldout_dir, unk_id)
    if rate > cfg.quality.max_unknown_rate:
        return (f"{rate:.1%} of the held-out tokens are [UNK] (quality.max_unknown_rate "
                f"{cfg.quality.max_unknown_rate:.1%}): text the vocab cannot read (another script or language?)")
    return None
