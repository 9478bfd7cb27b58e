"""How many instances the range-based pairing of ``data_jobs/instances.py`` makes, against Google's own
loop (``pairing_reference.py``) on the same token lengths.

The two programs draw from different random streams, so their counts differ seed by seed; what must
agree is the law: the expected number of instances, their mean length and the random-next share. A
lost last segment, a missing "put back" of unused sentences, a short target drawn per instance
instead of per document, or an off-by-one in the chunk boundary each move the mean count by several
percent (far outside the tolerances below, which are a few standard errors of the seed-to-seed spread).
"""
from __future__ import annotations

import random
import statistics

import numpy as np
import pytest

from data_jobs.instances import PairParams, ShardContext, TokenizedDocs, round_pairs
from pairing_reference import create_instances_from_document

SEQ = 128
SEEDS = 24


def _documents() -> list[list[int]]:
    """Token counts per sentence of 120 documents: mostly 5-45 tokens, some very long sentences (over
    max_seq_length: truncation), some one-sentence documents (random-next only)."""
    rng = random.Random(7)
    docs = []
    for d in range(120):
        n = 1 if d % 15 == 0 else rng.randint(2, 60)
        docs.append([rng.randint(130, 220) if rng.random() < 0.02 else max(1, int(rng.gauss(24, 12)))
                     for _ in range(n)])
    return docs


def _reference(docs: list[list[int]], seed: int, short_seq_prob: float) -> tuple[int, int, int]:
    """(instances, tokens, random-next) of one pass of Google's loop over every document."""
    rng = random.Random(seed)
    all_documents, k = [], 0
    for d in docs:  # distinct token ids, so nothing depends on token values
        all_documents.append([list(range(k + sum(d[:i]), k + sum(d[:i + 1]))) for i in range(len(d))])
        k += sum(d)
    n = tokens = rnd = 0
    for i in range(len(all_documents)):
        for a, b, is_random_next in create_instances_from_document(all_documents, i, SEQ, short_seq_prob, rng):
            n, tokens, rnd = n + 1, tokens + len(a) + len(b) + 3, rnd + is_random_next
    return n, tokens, rnd


def _ours(docs: list[list[int]], seed: int, short_seq_prob: float) -> tuple[int, int, int]:
    lens = [x for d in docs for x in d]
    sent_off = np.r_[0, np.cumsum(lens)].astype(np.int64)
    doc_off = np.r_[0, np.cumsum([len(d) for d in docs])].astype(np.int64)
    ids = np.zeros(int(sent_off[-1]), np.int32)
    td = TokenizedDocs(ids, sent_off, doc_off, np.arange(len(docs), dtype=np.int64))
    pool = TokenizedDocs(ids, sent_off, doc_off, np.arange(len(docs), dtype=np.int64))  # every document whole
    ctx = ShardContext(td, pool, PairParams(SEQ, short_seq_prob, "nsp"), 0.15, 20, 30522, 1, 2, 3, seed, 0)
    pairs = round_pairs(ctx, 0)[0]
    return len(pairs), sum(p[1] + p[3] + 3 for p in pairs), sum(p[4] for p in pairs)


def _mean_se(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), statistics.stdev(xs) / len(xs) ** 0.5


@pytest.mark.parametrize("short_seq_prob", [0.1, 0.0])
def test_instance_count_length_and_random_next_share_match_the_original(short_seq_prob):
    docs = _documents()
    ref = [_reference(docs, s, short_seq_prob) for s in range(SEEDS)]
    ours = [_ours(docs, s, short_seq_prob) for s in range(SEEDS)]
    assert min(r[0] for r in ref) > 800  # enough instances per pass for the comparison to mean something
    # Per seed: instances, mean tokens per instance, random-next share. Each must agree within 4
    # standard errors of the difference of the means (one pass: ~0.6% for the count, ~0.4% for the
    # length with short targets on, a tenth of that without).
    for name, stat in (("instances", lambda r: r[0]), ("tokens per instance", lambda r: r[1] / r[0]),
                       ("random-next share", lambda r: r[2] / r[0])):
        (m_ref, se_ref), (m_ours, se_ours) = _mean_se(list(map(stat, ref))), _mean_se(list(map(stat, ours)))
        assert abs(m_ours - m_ref) <= 4 * (se_ref ** 2 + se_ours ** 2) ** 0.5, (name, m_ours, m_ref, se_ref, se_ours)
