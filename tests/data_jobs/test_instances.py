"""Instance making and masking: golden examples worked by hand (with scripted random draws, so every
decision of the original algorithm is visible) and hypothesis property tests of the invariants."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_jobs.instances import (
    PairParams,
    Pool,
    ShardContext,
    TokenizedDocs,
    concat_docs,
    document_pairs,
    truncation_counts,
)
from data_jobs.instance_table import round_table
from data_jobs.masking import KEEP, MASK, RANDOM, mask_batch, num_to_predict


class Scripted:
    """A stand-in for random.Random that returns scripted draws and checks each call's arguments."""

    def __init__(self, *script):
        self.script = list(script)

    def _next(self, kind, *args):
        assert self.script, f"unexpected extra draw {kind}{args}"
        want = self.script.pop(0)
        assert want[0] == kind and tuple(want[1:-1]) == args, f"draw {kind}{args}, script expected {want}"
        return want[-1]

    def random(self):
        return self._next("random")

    def randint(self, a, b):
        return self._next("randint", a, b)

    def getrandbits(self, k):
        return self._next("getrandbits", k)


class ScriptedNumpy:
    """Stand-in for np.random.Generator in mask_batch: scripted arrays for random() and integers()."""

    def __init__(self, randoms, integers):
        self.randoms, self.ints = list(randoms), list(integers)

    def random(self, n):
        out = np.asarray(self.randoms.pop(0), dtype=float)
        assert out.shape == (n,)
        return out

    def integers(self, lo, hi, n):
        out = np.asarray(self.ints.pop(0))
        assert out.shape == (n,) and lo == 0 and (out < hi).all()
        return out


def offsets(lengths, start=0):
    return list(np.r_[start, start + np.cumsum(lengths)])


# ------------------------------------------------------------------ golden: segmenting


def test_golden_actual_next_then_random_next_puts_sentences_back():
    # Sentences of 2, 3, 4, 3, 2 tokens; max_seq_length 12 -> max_num_tokens 9.
    sent_off = offsets([2, 3, 4, 3, 2])  # [0, 2, 5, 9, 12, 14]
    pool = Pool(sent_off=offsets([5, 5, 5], start=100), doc_sent_off=[0, 3], doc_keys=[77], doc_starts=[3])
    rng = Scripted(
        ("random", 0.5),  # not a short target (0.5 >= 0.1): target = 9
        # sentences 0..2 reach 9 tokens: chunk of 3, a_end drawn in [1, 2]
        ("randint", 1, 2, 2),  # A = sentences 0,1 = tokens [0, 5)
        ("random", 0.7),  # >= 0.5: actual next, B = sentence 2 = [5, 9); 5 + 4 = 9 fits
        # sentences 3, 4 (end of document): chunk of 2, a_end must be 1
        ("randint", 1, 1, 1),  # A = sentence 3 = [9, 12)
        ("random", 0.2),  # < 0.5: random next, target_b_length = 9 - 3 = 6
        ("randint", 0, 0, 0),  # pool document 0 (key 77 != ours)
        ("randint", 0, 2, 1),  # random start: pool sentence 1 = [105, 110), 5 < 6 -> also sentence 2
        # A + B = 3 + 10 > 9: B (longer) loses 4 tokens; 4 fair coins, 0b0101 -> 2 from the front
        ("getrandbits", 4, 0b0101),
        # sentence 4 was put back: chunk of 1 at the end -> always random next (no coin drawn)
        ("randint", 0, 0, 0),
        ("randint", 0, 2, 2),  # start at pool sentence 2 = [110, 115): 5 >= 9 - 2 = 7? no; doc ends
    )
    pairs, short = document_pairs(sent_off, 5, pool, PairParams(12, 0.1, "nsp"), rng)
    assert not rng.script and short is False
    assert pairs == [
        (0, 5, 5, 4, 0),
        (9, 3, 107, 6, 1),  # B [105, 115) minus 2 front, 2 back
        (12, 2, 110, 5, 1),
    ]


def test_golden_short_target_sop_swap_and_single_sentence_split():
    sent_off = offsets([4, 6])  # [0, 4, 10]
    rng = Scripted(
        ("random", 0.05),  # < short_seq_prob: short target
        ("randint", 2, 5, 3),  # target 3 (max_num_tokens = 8 - 3 = 5)
        # sentence 0 (4 tokens) alone reaches 3: single-sentence chunk, split at a random token
        ("randint", 1, 3, 1),  # A = [0, 1), B = [1, 4)
        ("random", 0.3),  # < 0.5: swapped -> A = [1, 4), B = [0, 1), label 1
        # sentence 1 (6 tokens), last: split at token 5 -> [4, 9) + [9, 10), then truncated
        ("randint", 5, 9, 9),
        ("random", 0.9),  # in order
        ("getrandbits", 1, 1),  # 5 + 1 > 5: A loses 1 token, from the front
    )
    pairs, short = document_pairs(sent_off, 1, None, PairParams(8, 0.1, "sop"), rng)
    assert not rng.script and short is True
    assert pairs == [(1, 3, 0, 1, 1), (5, 4, 9, 1, 0)]


def test_golden_no_sentence_task_truncates_single_segment():
    sent_off = offsets([3, 4, 5, 2])  # max_seq_length 10 -> max_num_tokens 8 (one [SEP] only)
    rng = Scripted(("random", 0.99), ("getrandbits", 4, 0b1110))  # 12 tokens -> 8: 3 front, 1 back
    pairs, _ = document_pairs(sent_off, 0, None, PairParams(10, 0.1, "none"), rng)
    assert not rng.script
    assert pairs == [(3, 8, 0, 0, -1), (12, 2, 0, 0, -1)]


def _simulated_truncation(la, lb, max_num):
    """The original's loop, literally."""
    ta = tb = 0
    while la + lb > max_num:
        if la > lb:
            la, ta = la - 1, ta + 1
        else:
            lb, tb = lb - 1, tb + 1
    return ta, tb


@given(st.integers(1, 300), st.integers(0, 300), st.integers(1, 200))
def test_truncation_counts_equal_the_original_loop(la, lb, max_num):
    assert truncation_counts(la, lb, max_num) == _simulated_truncation(la, lb, max_num)


# ------------------------------------------------------------------ golden: masking


def test_num_to_predict_rounds_like_python3():
    n = np.array([3, 5, 10, 30, 128, 512])
    assert num_to_predict(n, 0.15, 20).tolist() == [max(1, min(20, round(x * 0.15))) for x in n.tolist()]
    assert num_to_predict(n, 0.15, 20).tolist() == [1, 1, 2, 4, 19, 20]  # 1.5 -> 2, 4.5 -> 4


def test_golden_masking_80_10_10():
    # [CLS] a b c d [SEP] e f [SEP]; 9 tokens at 0.3 -> round(2.7) = 3 predictions
    ids = np.array([1, 10, 11, 12, 13, 2, 14, 15, 2])
    special = np.isin(ids, [1, 2])
    keys = [0.9, 0.5, 0.1, 0.7, 0.3, 0.0, 0.2, 0.8, 0.0]  # specials' keys are ignored
    # smallest candidate keys: b (0.1), e (0.2), d (0.3) -> positions 2, 6, 4; reported sorted
    rng = ScriptedNumpy([keys, [0.85, 0.1, 0.95]], [[7, 8, 42]])
    mb = mask_batch(ids, np.array([0, 9]), special, 0.3, 20, 50, 3, rng)
    assert mb.positions_M.tolist() == [2, 4, 6]
    assert mb.labels_M.tolist() == [11, 13, 14]
    assert mb.decisions_M.tolist() == [KEEP, MASK, RANDOM]
    assert mb.input_ids_T.tolist() == [1, 10, 11, 12, 3, 2, 42, 15, 2]
    assert mb.pred_offsets_N1.tolist() == [0, 3]


def test_golden_whole_word_masking_skips_words_over_budget():
    # [CLS] un ##believ ##able dog [SEP] run ##s [SEP]: words {1,2,3} {4} {6,7}; 9 * 0.5 = 4.5 -> 4
    ids = np.array([1, 20, 21, 22, 23, 2, 24, 25, 2])
    is_cont = np.isin(ids, [21, 22, 25])
    rng = ScriptedNumpy([[0.3, 0.9, 0.1], [0.1, 0.1, 0.1]], [[0, 0, 0]])
    mb = mask_batch(ids, np.array([0, 9]), np.isin(ids, [1, 2]), 0.5, 20, 50, 3, rng, is_cont)
    # word order by key: {6,7} (2 so far), {1,2,3} would make 5 > 4 -> skipped, {4} -> 3. Ends at 3 < 4,
    # exactly as the original's greedy rule does.
    assert mb.positions_M.tolist() == [4, 6, 7]
    assert mb.input_ids_T.tolist() == [1, 20, 21, 22, 3, 2, 3, 3, 2]


def test_whole_word_continuation_after_sep_joins_previous_word_like_the_original():
    ids = np.array([1, 30, 2, 31, 32, 2])  # [CLS] dog [SEP] ##s cat [SEP] -> words {1,3} {4}
    is_cont = np.isin(ids, [31])
    rng = ScriptedNumpy([[0.1, 0.2], [0.5, 0.5]], [[0, 0]])
    mb = mask_batch(ids, np.array([0, 6]), np.isin(ids, [1, 2]), 0.4, 20, 50, 3, rng, is_cont)
    assert mb.positions_M.tolist() == [1, 3]  # round(6 * 0.4) = 2: the word {1, 3}


# ------------------------------------------------------------------ properties of whole rounds

VOCAB = 4000
IS_CONT = np.arange(VOCAB) % 5 == 0  # every fifth id plays a "##" piece
CLS, SEP, MASK_ID = 1, 2, 3


def _docs(lengths_per_doc, shard=0) -> TokenizedDocs:
    """Documents whose token ids are their global positions + 10, so every token is traceable."""
    sent = [s for doc in lengths_per_doc for s in doc]
    ids = (np.arange(sum(sent)) + 10).astype(np.int32)
    return TokenizedDocs(ids, np.r_[0, np.cumsum(sent)].astype(np.int64),
                         np.r_[0, np.cumsum([len(d) for d in lengths_per_doc])].astype(np.int64),
                         np.array([(shard << 32) | i for i in range(len(lengths_per_doc))], dtype=np.int64))


documents = st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=8), min_size=2, max_size=6)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    docs=documents,
    max_seq=st.integers(8, 64),
    task=st.sampled_from(["nsp", "sop", "none"]),
    prob=st.floats(0.05, 0.9),
    max_pred=st.integers(1, 30),
    wwm=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_round_invariants(docs, max_seq, task, prob, max_pred, wwm, seed):
    if sum(map(sum, docs)) + 10 >= VOCAB:
        return
    td = _docs(docs)
    pool = concat_docs([td])  # the shard is its own pool here
    ctx = ShardContext(td, pool, PairParams(max_seq, 0.3, task), prob, max_pred, VOCAB, CLS, SEP, MASK_ID,
                       seed, 0, IS_CONT if wwm else None)
    table, len_N, stats = round_table(ctx, 0)
    corpus = td.ids_T.tolist()
    doc_tok = td.sent_off_S1[td.doc_sent_off_D1]
    doc_of = lambda tok: int(np.searchsorted(doc_tok, tok - 10, side="right"))
    assert stats["instances"] == table.num_rows == len(len_N)
    for row in table.to_pylist():
        ids, a_len = row["input_ids"], row["segment_a_len"]
        pos, labels = row["masked_positions"], row["masked_ids"]
        n = len(ids)
        assert 5 - (task == "none") * 2 <= n <= max_seq
        assert ids[0] == CLS and ids[a_len - 1] == SEP and ids[-1] == SEP
        assert a_len == n if task == "none" else 3 <= a_len <= n - 2
        assert row["nsp_label"] in ({-1} if task == "none" else {0, 1})
        # positions unique and sorted, never on [CLS]/[SEP], labels are the original tokens
        assert pos == sorted(set(pos)) and all(p not in (0, a_len - 1, n - 1) for p in pos)
        n_cand = n - (2 if task == "none" else 3)
        k = min(max_pred, max(1, round(n * prob)), n_cand)
        assert len(pos) == k if not wwm else len(pos) <= k  # whole words may undershoot (original)
        orig = list(ids)
        for p, lab in zip(pos, labels):
            orig[p] = lab
        assert all(orig[i] == ids[i] for i in range(n) if i not in set(pos))
        if wwm:  # a word is masked whole: a piece is masked iff its neighbours in the word are
            cand = [i for i in range(1, n - 1) if i != a_len - 1]
            masked = set(pos)
            for prev, cur in zip(cand, cand[1:]):
                if IS_CONT[orig[cur]]:
                    assert (prev in masked) == (cur in masked)
        a = orig[1:a_len - 1]
        b = orig[a_len:-1]
        assert CLS not in a + b and SEP not in a + b and len(a) >= 1
        # segments are runs of real document text (ids = position + 10); truncation may cut a gap
        # between A and B, but an in-order pair stays in one document with B after A
        for seg in (a, b) if b else (a,):
            assert seg == list(range(seg[0], seg[0] + len(seg))) and seg[-1] - 10 < len(corpus)
        if task != "none" and (row["nsp_label"] == 0 or task == "sop"):
            first, second = (a, b) if row["nsp_label"] == 0 else (b, a)
            assert first[-1] < second[0] and doc_of(first[0]) == doc_of(second[-1])


def test_dupe_rounds_differ_and_repeat_exactly():
    td = _docs([[12, 9, 15, 7, 11, 20], [8, 8, 8, 8], [30, 2, 5]])
    mk = lambda seed: ShardContext(td, concat_docs([td]), PairParams(32, 0.1, "nsp"), 0.15, 5, VOCAB,
                                   CLS, SEP, MASK_ID, seed, 3)
    t0, _, _ = round_table(mk(1), 0)
    assert round_table(mk(1), 0)[0].equals(t0)  # same (seed, shard, round): same bytes
    assert not round_table(mk(1), 1)[0].equals(t0)  # a fresh mask each dupe round
    assert not round_table(mk(2), 0)[0].equals(t0)


def test_random_next_avoids_own_document_when_pool_has_others():
    td = _docs([[5] * 6, [5] * 6])  # document 0 = ids 10..39, document 1 = ids 40..69
    ctx = ShardContext(td, concat_docs([td]), PairParams(16, 0.0, "nsp"), 0.15, 5, VOCAB, CLS, SEP, MASK_ID, 0, 0)
    table, _, _ = round_table(ctx, 0)
    n_random = 0
    for row in table.to_pylist():
        orig = list(row["input_ids"])
        for p, lab in zip(row["masked_positions"], row["masked_ids"]):
            orig[p] = lab
        a_doc = {(t - 10) // 30 for t in orig[1:row["segment_a_len"] - 1]}
        b_doc = {(t - 10) // 30 for t in orig[row["segment_a_len"]:-1]}
        assert len(a_doc) == len(b_doc) == 1
        assert (a_doc == b_doc) == (row["nsp_label"] == 0)
        n_random += row["nsp_label"]
    assert n_random >= 2


def test_nsp_without_pool_is_rejected():
    with pytest.raises(ValueError):
        ShardContext(_docs([[3, 3]]), None, PairParams(16, 0.1, "nsp"), 0.15, 5, VOCAB, CLS, SEP, MASK_ID, 0, 0)


def test_replacement_draws_come_from_whole_vocab():
    rng = np.random.Generator(np.random.PCG64(0))
    ids = np.tile(np.r_[CLS, np.full(60, 500), SEP], 200)
    off = np.arange(0, len(ids) + 1, 62)
    mb = mask_batch(ids, off, np.isin(ids, [CLS, SEP]), 0.5, 30, VOCAB, MASK_ID, rng)
    rnd = mb.input_ids_T[np.repeat(off[:-1], np.diff(mb.pred_offsets_N1)) + mb.positions_M][
        mb.decisions_M == RANDOM]
    assert rnd.min() < 100 and rnd.max() > VOCAB - 100  # specials and [unused] included, as the original
    frac = np.bincount(mb.decisions_M, minlength=3) / len(mb.decisions_M)
    assert abs(frac[MASK] - 0.8) < 0.02 and abs(frac[KEEP] - 0.1) < 0.02 and abs(frac[RANDOM] - 0.1) < 0.02


class _IdTokenizer:
    """Sentence "i x x x" -> 4 tokens, all with id i (so every token names its sentence)."""

    def encode_batch_fast(self, texts, add_special_tokens=False):
        from types import SimpleNamespace

        return [SimpleNamespace(ids=[int(t.split()[0])] * len(t.split())) for t in texts]


def test_pool_regions_make_random_starts_uniform_and_leave_a_tail():
    from data_jobs.instances import pool_sample

    doc = [f"{i} x x x" for i in range(100)] + ["100 x"]  # 101 sentences of 4 (last: 2) tokens
    counts = np.zeros(101, int)
    rng_pick = random.Random(0)
    for seed in range(1500):
        pool = pool_sample(_IdTokenizer(), [doc], [5], 60, 10, random.Random(seed))
        assert pool.num_docs == 1 and pool.doc_keys_D.tolist() == [5]
        n_start, so = int(pool.starts_D[0]), pool.sent_off_S1
        tail = int(so[-1] - so[n_start])
        first = int(pool.ids_T[so[0]])
        assert tail >= 10 or first + pool.doc_sent_off_D1[1] - 1 >= 100  # a tail, or the document's end
        start = rng_pick.randint(0, n_start - 1)  # how random_next_b draws
        counts[first + start] += 1
    # uniform over the 101 sentences: about 15 each
    assert counts.min() >= 3 and counts.max() <= 35, counts
    short = pool_sample(_IdTokenizer(), [doc[:3], []], [1, 2], 60, 10, random.Random(0))
    assert short.num_docs == 1 and short.starts_D.tolist() == [3]  # short documents enter whole


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4)), max_size=60), st.lists(st.integers(1, 8), min_size=6,
                                                                                         max_size=6))
def test_vectorised_whole_word_greedy_equals_the_original_loop(words, budgets):
    from data_jobs.masking import _greedy_fill

    words = sorted(words, key=lambda w: w[0])  # (instance, size) in shuffled order within instance
    inst = np.array([w[0] for w in words], dtype=np.int64)
    size = np.array([w[1] for w in words], dtype=np.int64)
    k = np.array(budgets, dtype=np.int64)
    expected = []
    totals = [0] * len(k)
    for i, s in words:  # the original: break at the budget, skip words that would overshoot it
        ok = not (totals[i] >= k[i] or totals[i] + s > k[i])
        totals[i] += s if ok else 0
        expected.append(ok)
    assert _greedy_fill(inst, size, k).tolist() == expected


def test_golden_end_to_end_with_a_tiny_vocab(tmp_path):
    """Text -> tokens -> one instance, with settings that leave no choice: no sentence task, no short
    targets, a document shorter than the target, and a masking rate that takes every candidate."""
    from data_jobs.instances import tokenize_documents
    from data_jobs.tokenization import vocab_info, wordpiece_tokenizer
    from instances_helpers import write_tiny_vocab

    words = ["the", "cat", "sat", "on", "mat", "un", "##aff", "##able", "."]
    path = write_tiny_vocab(tmp_path / "vocab.txt", words)  # ids: specials 0-4, then 5.. in this order
    v = vocab_info(path, lowercase=True)
    doc = ["The cat sat on the mat.", "", "Unaffable!"]  # "" and "!" -> dropped / [UNK]
    td = tokenize_documents(wordpiece_tokenizer(path, True), [doc], [0])
    assert td.ids_T.tolist() == [5, 6, 7, 8, 5, 9, 13, 10, 11, 12, 1] and td.sent_off_S1.tolist() == [0, 7, 11]
    ctx = ShardContext(td, None, PairParams(64, 0.0, "none"), 0.99, 30, v.vocab_size, v.cls_id, v.sep_id,
                       v.mask_id, 0, 0)
    table, len_N, stats = round_table(ctx, 0)
    (row,) = table.to_pylist()
    # [CLS] the cat sat on the mat . un ##aff ##able [UNK] [SEP]: 13 tokens, round(12.87) = 13 > 11
    # candidates, so all 11 are predicted; labels are exactly the text's tokens
    assert len(row["input_ids"]) == 13 and row["segment_a_len"] == 13 and row["nsp_label"] == -1
    assert row["input_ids"][0] == v.cls_id and row["input_ids"][-1] == v.sep_id
    assert row["masked_positions"] == list(range(1, 12))
    assert row["masked_ids"] == [5, 6, 7, 8, 5, 9, 13, 10, 11, 12, 1]
    assert stats["predictions"] == {"11": 1} and sum(stats["replacements"].values()) == 11
