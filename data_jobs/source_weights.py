"""Sources by weight inside one instances dataset (``InstancesConfig.source_weights``): Wikipedia twice,
books once, a noisy source half.

A document's source is the input file it came from, named relative to the corpus root as the shard job
records it (``gutenberg/pg11_alice.txt``, ``wikipedia_mlperf/wiki_00``). A key names a source or a folder
above sources (``wikipedia_mlperf``); the longest key that names a document's source gives its weight, and
a document no key names keeps weight 1. Weight ``w`` scales the document's dupe rounds: it takes part in
``floor(w x dupe_factor)`` rounds plus one more with probability ``frac(w x dupe_factor)`` (a draw from the
seed and the document's key, so the same whatever the worker count), each round with fresh masks and
pairs as BERT's dupe rounds have. Weight 0 leaves a source out, also as random-next segments. With every
weight 1 the output is byte for byte that of no weights.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from contracts.common import UserError

OTHER = "(no key)"  # the documents no key names (weight 1), in the per-source counts


def key_of(source: str, weights: Mapping[str, float]) -> str | None:
    """The longest key of ``weights`` that is ``source`` or a folder above it; None where none is."""
    best = None
    for key in weights:
        if (source == key or source.startswith(key + "/")) and (best is None or len(key) > len(best)):
            best = key
    return best


def weight_of(source: str, weights: Mapping[str, float]) -> float:
    key = key_of(source, weights)
    return 1.0 if key is None else float(weights[key])


def document_passes(sources: Sequence[str], doc_keys: Sequence[int], weights: Mapping[str, float],
                    dupe_factor: int, seed: int) -> np.ndarray:
    """Rounds each document takes part in (int64, one per document)."""
    from data_jobs.instances import derive_seed

    out = np.zeros(len(sources), dtype=np.int64)
    for i, (source, key) in enumerate(zip(sources, doc_keys)):
        p = weight_of(source, weights) * dupe_factor
        whole = int(np.floor(p))
        u = derive_seed(seed, "source-weight", int(key)) / 2.0**64
        out[i] = whole + (u < p - whole)
    return out


def counts_by_key(sources: Sequence[str], passes: np.ndarray, weights: Mapping[str, float]) -> dict[str, dict]:
    """Per key (``OTHER`` for documents no key names): documents and document-rounds, so a manifest shows
    the mixture it made."""
    out: dict[str, dict] = {}
    for source, n in zip(sources, passes.tolist()):
        c = out.setdefault(key_of(source, weights) or OTHER, {"documents": 0, "document_rounds": 0})
        c["documents"] += 1
        c["document_rounds"] += n
    return out


def merge_counts(parts: Sequence[Mapping[str, Mapping[str, int]]]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for part in parts:
        for key, c in part.items():
            m = out.setdefault(key, {"documents": 0, "document_rounds": 0})
            for k in m:
                m[k] += int(c.get(k, 0))
    return dict(sorted(out.items()))


def check_keys(weights: Mapping[str, float], sources: Sequence[str], where: str) -> None:
    """A key that names no source of the corpus is a typo: one line naming it and what there is; a
    mixture that leaves every source out makes nothing."""
    for key in weights:
        if not any(s == key or s.startswith(key + "/") for s in sources):
            tops = sorted({s.split("/", 1)[0] for s in sources})
            raise UserError(f"{where}: source_weights key {key!r} names no source of the corpus (its sources are "
                            f"under: {', '.join(tops[:10])}{' ...' if len(tops) > 10 else ''})")
    if sources and all(weight_of(s, weights) == 0 for s in sources):
        raise UserError(f"{where}: source_weights give every source weight 0; nothing to make instances from")
