"""The vectorised ``data_jobs/masking.py`` against Google's loop (``masking_reference.py``) on real text.

masking.py promises the original's output *distribution*, not its random draws: it draws one uniform
key per token (per word with whole-word masking) and takes the smallest keys instead of shuffling, and
one uniform per prediction for 80/10/10 where the original draws one or two. Hence two checks:

1. Coupled, exact. The reference consumes the vectorised run's own draws, each mapped to what Google's
   loop asks for: ``shuffle`` orders the units by their keys (sorting i.i.d. uniform keys gives a
   uniformly random permutation, the law of ``random.shuffle``); the first 80/10/10 draw is the
   prediction's uniform u; the second, drawn only when u >= 0.8, is (u - 0.8) / 0.2, uniform on [0, 1)
   given u >= 0.8; ``randint(0, V - 1)`` is the prediction's ``integers(0, V)``. Each map preserves the
   law of the original's draws, so equal outputs for every coupled draw mean equal output
   distributions. Checked: identical output tokens, positions and labels, instance by instance.
2. Independent draws (``random.Random`` against ``np.random.Generator``): prediction counts, the
   80/10/10 shares and the share of ``##`` pieces among predictions agree within sampling error. This
   does not lean on the argument of check 1.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from data_jobs.masking import KEEP, MASK, RANDOM, mask_batch
from data_jobs.tokenization import vocab_info, wordpiece_tokenizer
from instances_helpers import book_documents, wiki_documents
from masking_reference import create_masked_lm_predictions

pytestmark = pytest.mark.shared_data
SEQ = 128
SETTINGS = [(0.15, 20), (0.5, 80)]  # BERT's rate; a high one where whole words often overshoot the budget


@pytest.fixture(scope="module")
def real_text(shared_data):
    """[CLS] A [SEP] B [SEP] from Wikipedia articles and a novel, tokenized with bert-base-uncased: A two
    sentences, B the next four (every fifth instance: A alone), cut to SEQ tokens by the original's
    random-side truncation, so a segment may start with a ## piece (where whole words cross [SEP])."""
    v = vocab_info(shared_data / "vocab" / "bert-base-uncased-vocab.txt", True)
    tok = wordpiece_tokenizer(v.vocab_file, True)
    docs = wiki_documents(shared_data / "corpus" / "wikipedia_mlperf" / "wiki_00")[:20]
    docs += book_documents(shared_data / "corpus" / "gutenberg" / "pg84_frankenstein.txt", max_chars=150_000)
    side = random.Random(0)
    instances = []
    for doc in docs:
        sents = [e.ids for e in tok.encode_batch(doc, add_special_tokens=False) if e.ids]
        for i in range(0, len(sents) - 2, 2):
            a = [t for s in sents[i:i + 2] for t in s]
            b = [] if i % 10 == 8 else [t for s in sents[i + 2:i + 6] for t in s]
            while len(a) + len(b) > SEQ - 3:
                longer = a if len(a) > len(b) else b
                del longer[0 if side.random() < 0.5 else -1]
            instances.append([v.cls_id, *a, v.sep_id] + ([*b, v.sep_id] if b else []))
    is_cont_V = np.array([t.startswith("##") for t in v.tokens()])
    after_sep = sum(bool(x.count(v.sep_id) == 2 and is_cont_V[x[x.index(v.sep_id) + 1]]) for x in instances)
    assert len(instances) > 1000 and after_sep >= 20, (len(instances), after_sep)
    return v, v.tokens(), instances


class Recording:
    """Wraps np.random.Generator and keeps every array mask_batch draws, in order."""

    def __init__(self, seed: int):
        self.rng, self.randoms, self.ints, self.int_ranges = np.random.default_rng(seed), [], [], []

    def random(self, n):
        self.randoms.append(self.rng.random(n))
        return self.randoms[-1]

    def integers(self, lo, hi, n):
        self.int_ranges.append((lo, hi))
        self.ints.append(self.rng.integers(lo, hi, n))
        return self.ints[-1]


class Coupled:
    """The rng Google's loop calls, fed from the vectorised run's draws for one instance (see check 1)."""

    def __init__(self, keys, calls, vocab_size):
        self.keys, self.calls, self.vocab_size = list(keys), list(calls), vocab_size

    def shuffle(self, units):
        assert len(units) == len(self.keys), "the two disagree on the candidate units"
        units[:] = [units[j] for j in np.argsort(self.keys, kind="stable")]

    def random(self):
        kind, value = self.calls.pop(0)
        assert kind == "random"
        return value

    def randint(self, a, b):
        kind, value = self.calls.pop(0)
        assert kind == "randint" and (a, b) == (0, self.vocab_size - 1)
        return int(value)


def _flat(instances):
    ids_T = np.concatenate([np.asarray(x, dtype=np.int64) for x in instances])
    offsets_N1 = np.r_[0, np.cumsum([len(x) for x in instances])]
    return ids_T, offsets_N1


def _units(tokens, wwm):
    """The original's candidate units (lists of positions), in position order."""
    units = []
    for i, t in enumerate(tokens):
        if t in ("[CLS]", "[SEP]"):
            continue
        if wwm and units and t.startswith("##"):
            units[-1].append(i)
        else:
            units.append([i])
    return units


def _calls(units, keys, chosen, u_of, rid_of):
    """The reference's random()/randint() calls in the order its loop makes them: units by key, the
    chosen positions of each unit in order; per position u, then (u - 0.8) / 0.2, then the random id."""
    calls = []
    for j in np.argsort(keys, kind="stable"):
        for index in units[j]:
            if index in chosen:
                u = u_of[index]
                calls.append(("random", u))
                if u >= 0.8:
                    calls.append(("random", (u - 0.8) / 0.2))
                    if u >= 0.9:
                        calls.append(("randint", rid_of[index]))
    return calls


@pytest.mark.parametrize("wwm", [False, True], ids=["token", "whole-word"])
@pytest.mark.parametrize("prob,max_pred", SETTINGS)
def test_vectorised_equals_googles_loop_under_coupled_draws(real_text, wwm, prob, max_pred):
    v, vocab, instances = real_text
    ids_T, offsets_N1 = _flat(instances)
    is_cont_V = np.array([t.startswith("##") for t in vocab])
    rng = Recording(seed=17)
    mb = mask_batch(ids_T, offsets_N1, np.isin(ids_T, [v.cls_id, v.sep_id]), prob, max_pred, v.vocab_size,
                    v.mask_id, rng, is_cont_V[ids_T] if wwm else None)
    keys_all, u_M = rng.randoms
    (rid_M,) = rng.ints
    assert rng.int_ranges == [(0, v.vocab_size)]  # randint(0, V - 1) of the original: the whole vocab
    key_at = 0
    for n, inst in enumerate(instances):
        tokens = [vocab[i] for i in inst]
        units = _units(tokens, wwm)
        if wwm:  # one key per word, words numbered across the whole batch
            keys, key_at = keys_all[key_at:key_at + len(units)], key_at + len(units)
        else:  # one key per token (specials too): the candidates' keys
            keys = keys_all[offsets_N1[n] + np.array([u[0] for u in units], dtype=np.int64)]
        lo, hi = mb.pred_offsets_N1[n], mb.pred_offsets_N1[n + 1]
        positions = mb.positions_M[lo:hi].tolist()
        u_of, rid_of = dict(zip(positions, u_M[lo:hi])), dict(zip(positions, rid_M[lo:hi]))
        coupled = Coupled(keys, _calls(units, keys, set(positions), u_of, rid_of), v.vocab_size)
        out, ref_positions, ref_labels = create_masked_lm_predictions(tokens, prob, max_pred, vocab, coupled, wwm)
        assert not coupled.calls, f"instance {n}: the reference made fewer draws"
        assert ref_positions == positions, f"instance {n}"
        assert ref_labels == [vocab[i] for i in mb.labels_M[lo:hi]], f"instance {n}"
        assert out == [vocab[i] for i in mb.input_ids_T[offsets_N1[n]:offsets_N1[n + 1]]], f"instance {n}"
    assert not wwm or key_at == len(keys_all)


def _shares(decisions, counts_N, cont_share):
    d = np.asarray(decisions)
    return {"n": len(d), "mask": np.mean(d == MASK), "keep": np.mean(d == KEEP), "random": np.mean(d == RANDOM),
            "counts": np.asarray(counts_N), "cont": cont_share}


def _reference_stats(instances, vocab, prob, max_pred, wwm, seed):
    rng = random.Random(seed)
    decisions, counts, cont = [], [], 0
    for inst in instances:
        tokens = [vocab[i] for i in inst]
        out, positions, labels = create_masked_lm_predictions(tokens, prob, max_pred, vocab, rng, wwm)
        for p, label in zip(positions, labels):
            # A random word equal to the original reads as "kept" on both sides, as it would to a model.
            decisions.append(MASK if out[p] == "[MASK]" else KEEP if out[p] == label else RANDOM)
            cont += label.startswith("##")
        counts.append(len(positions))
    return _shares(decisions, counts, cont / len(decisions))


def _vectorised_stats(v, vocab, instances, prob, max_pred, wwm, seed):
    ids_T, offsets_N1 = _flat(instances)
    is_cont_V = np.array([t.startswith("##") for t in vocab])
    mb = mask_batch(ids_T, offsets_N1, np.isin(ids_T, [v.cls_id, v.sep_id]), prob, max_pred, v.vocab_size,
                    v.mask_id, np.random.default_rng(seed), is_cont_V[ids_T] if wwm else None)
    idx_M = offsets_N1[np.repeat(np.arange(len(instances)), np.diff(mb.pred_offsets_N1))] + mb.positions_M
    out_M = mb.input_ids_T[idx_M]
    decisions = np.where(out_M == v.mask_id, MASK, np.where(out_M == mb.labels_M, KEEP, RANDOM))
    return _shares(decisions, np.diff(mb.pred_offsets_N1), float(np.mean(is_cont_V[mb.labels_M])))


@pytest.mark.parametrize("wwm", [False, True], ids=["token", "whole-word"])
def test_same_distributions_as_googles_loop_with_independent_draws(real_text, wwm):
    v, vocab, instances = real_text
    prob, max_pred = SETTINGS[1] if wwm else SETTINGS[0]
    ref = _reference_stats(instances, vocab, prob, max_pred, wwm, seed=1)
    vec = _vectorised_stats(v, vocab, instances, prob, max_pred, wwm, seed=2)
    if not wwm:  # one prediction per chosen token: the counts are no random quantity at all
        assert np.array_equal(ref["counts"], vec["counts"])
    else:  # whole words undershoot the budget at random; mean count per instance within 5 standard errors
        se = np.sqrt(ref["counts"].var() / len(instances) + vec["counts"].var() / len(instances))
        assert abs(ref["counts"].mean() - vec["counts"].mean()) < 5 * se + 1e-9
    for share in ("mask", "keep", "random"):  # binomial shares, 5 standard errors of their difference
        p = ref[share]
        assert abs(ref[share] - vec[share]) < 5 * np.sqrt(p * (1 - p) * (1 / ref["n"] + 1 / vec["n"])), share
    p = ref["cont"]  # ## pieces among predictions: ~3x more with whole words than without
    assert abs(ref["cont"] - vec["cont"]) < 5 * np.sqrt(p * (1 - p) * (1 / ref["n"] + 1 / vec["n"]))
