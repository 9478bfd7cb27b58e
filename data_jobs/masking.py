"""Masked-LM predictions for a batch of instances at once, as Google's ``create_masked_lm_predictions``.

Shapes (legend): T = tokens of all instances in the batch, concatenated; N = instances; M = chosen
(masked) positions in the batch; G = candidate words (whole-word masking). ``offsets_N1`` holds N + 1
row starts into the flat arrays.

What is promised: the original's output *distribution*, not its random draws. The original shuffles
each instance's candidates and walks them in that order; here every candidate gets one uniform key and
the smallest keys win, which is the same law (sorted i.i.d. keys are a uniformly random order) and
vectorises: the keys go into an [N, max length] matrix and one row-wise partial sort finds every
instance's ``num_to_predict`` smallest. [CLS] and [SEP] get a key above every draw, so they never win.
Whole-word masking (the original's ``do_whole_word_mask``) draws one key per *word* (a piece plus its
``##`` continuations) and applies the original's greedy rule (stop at the budget, skip a word that
would overshoot it) in a few vectorised passes (``_greedy_fill``), not a loop per instance. The 80/10/10
rule takes one uniform per prediction where the original draws one or two.

Draws, in this order: ``rng.random(T)`` keys (``rng.random(G)`` with whole words), ``rng.random(M)``
for 80/10/10, ``rng.integers(0, vocab_size, M)`` for random replacements. The plain-loop port of the
original in ``tests/data_jobs/masking_reference.py`` is checked against this module on real text,
exactly under coupled draws and in distribution under independent ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Decision codes of the 80/10/10 rule, also the keys of the replacement counts in the manifest.
MASK, RANDOM, KEEP = 0, 1, 2


def num_to_predict(n_tokens_N: np.ndarray, masked_lm_prob: float, max_predictions: int) -> np.ndarray:
    """``min(max_predictions, max(1, round(n_tokens * masked_lm_prob)))`` per instance.

    ``n_tokens`` counts [CLS]/[SEP] too, as the original does; np.rint rounds half to even like
    Python 3's round(), so e.g. 30 tokens at 0.15 (4.5) give 4 predictions in both.
    """
    k = np.rint(n_tokens_N.astype(np.float64) * masked_lm_prob).astype(np.int64)
    return np.minimum(max_predictions, np.maximum(1, k))


@dataclass
class MaskedBatch:
    input_ids_T: np.ndarray  # ids with the replacements applied (what the model sees)
    positions_M: np.ndarray  # position within its instance, sorted within each instance
    labels_M: np.ndarray  # the original ids at those positions
    pred_offsets_N1: np.ndarray  # row starts of each instance's predictions in positions_M
    decisions_M: np.ndarray  # MASK / RANDOM / KEEP per prediction


def _choose_tokens(keys_T, inst_T, pos_T, offsets_N1, k_N) -> np.ndarray:
    """Boolean T mask: each instance's k smallest keys (specials carry key 2.0 and lose).

    Keys go into an [N, max length] matrix (padding 3.0); a row-wise partial sort then finds each
    row's k smallest, which is several times faster than one sort over the flat batch.
    """
    N = len(k_N)
    chosen_T = np.zeros(len(keys_T), dtype=bool)
    kmax = int(k_N.max()) if N else 0
    if kmax == 0:
        return chosen_T
    L = int(np.diff(offsets_N1).max())
    keys_NL = np.full(N * L, 3.0)
    keys_NL[inst_T * L + pos_T] = keys_T  # flat indices: twice as fast as keys_NL[inst_T, pos_T]
    keys_NL = keys_NL.reshape(N, L)
    part_NK = np.argpartition(keys_NL, kmax - 1, axis=1)[:, :kmax] if kmax < L else np.tile(np.arange(L), (N, 1))
    order_NK = np.argsort(np.take_along_axis(keys_NL, part_NK, 1), axis=1)
    pos_NK = np.take_along_axis(part_NK, order_NK, 1)  # each row's kmax smallest, ascending by key
    take_NK = np.arange(pos_NK.shape[1])[None, :] < k_N[:, None]
    rows = np.nonzero(take_NK)[0]
    chosen_T[offsets_N1[rows] + pos_NK[take_NK]] = True
    return chosen_T


def _choose_whole_words(cand_T, is_cont_T, pos_T, inst_T, k_N, rng) -> np.ndarray:
    """Whole-word masking: pick words (a piece and its ## continuations) in random order.

    The original appends a ``##`` piece to the previous candidate word whenever one exists, even
    across the [SEP] between A and B; we keep that quirk. A word that would overshoot the instance's
    budget is skipped (so an instance can end with fewer predictions, as in the original).
    """
    # Position 0 is [CLS] and position 1 the first token of A, so a candidate exists before pos >= 2.
    starts_T = cand_T & ~(is_cont_T & (pos_T >= 2))
    group_T = np.cumsum(starts_T) - 1  # word id of every candidate token
    G = int(starts_T.sum())
    word_inst_G = inst_T[starts_T]
    word_size_G = np.bincount(group_T[cand_T], minlength=G)
    keys_G = rng.random(G)
    order_G = np.argsort(word_inst_G + keys_G * 0.5)  # by instance, then key (one float sort key)
    accepted_S = _greedy_fill(word_inst_G[order_G], word_size_G[order_G], k_N)
    chosen_words = np.zeros(G, dtype=bool)
    chosen_words[order_G[accepted_S]] = True
    chosen_T = np.zeros(len(cand_T), dtype=bool)
    chosen_T[cand_T] = chosen_words[group_T[cand_T]]
    return chosen_T


def _greedy_fill(inst_S: np.ndarray, size_S: np.ndarray, k_N: np.ndarray) -> np.ndarray:
    """The original's loop over words in shuffled order (S = words sorted by instance, then key):
    stop once the budget k is reached, skip a word that would overshoot it, take it otherwise.

    Vectorised: every word whose running total stays within k is taken (one pass); then, for
    instances with budget r left after the first overshoot, each further pass takes the next word of
    size <= r. Passes are few: r only shrinks, and most words are single pieces.
    """
    S, N = len(inst_S), len(k_N)
    first = np.flatnonzero(np.r_[True, inst_S[1:] != inst_S[:-1]]) if S else np.zeros(0, np.int64)
    csum = np.cumsum(size_S)
    run_start = np.repeat(csum[first] - size_S[first], np.diff(np.r_[first, S]))
    taken_S = (csum - run_start) <= k_N[inst_S]  # running totals only grow: a prefix per instance
    left_N = k_N - np.bincount(inst_S, weights=size_S * taken_S, minlength=N).astype(np.int64)
    over = np.flatnonzero(~taken_S)
    ptr_N = np.full(N, S, dtype=np.int64)  # last word looked at
    over_first = over[np.r_[True, inst_S[over[1:]] != inst_S[over[:-1]]]] if len(over) else over
    ptr_N[inst_S[over_first]] = over_first
    rest = over[left_N[inst_S[over]] > 0]
    while len(rest):
        i_rest = inst_S[rest]
        fits = rest[(size_S[rest] <= left_N[i_rest]) & (rest > ptr_N[i_rest])]
        if not len(fits):
            break
        pick = fits[np.r_[True, inst_S[fits[1:]] != inst_S[fits[:-1]]]]  # first fitting word each
        taken_S[pick] = True
        left_N[inst_S[pick]] -= size_S[pick]
        ptr_N[inst_S[pick]] = pick
        i_rest = inst_S[rest]
        rest = rest[(left_N[i_rest] > 0) & (rest > ptr_N[i_rest])]
    return taken_S


def mask_batch(
    ids_T: np.ndarray,
    offsets_N1: np.ndarray,
    special_T: np.ndarray,
    masked_lm_prob: float,
    max_predictions: int,
    vocab_size: int,
    mask_id: int,
    rng: np.random.Generator,
    is_cont_T: np.ndarray | None = None,
) -> MaskedBatch:
    """Choose and replace the masked-LM positions of N instances given as one flat array.

    ``special_T`` marks [CLS]/[SEP] (never chosen). ``is_cont_T`` (``##`` pieces) turns on whole-word
    masking. Replacement: 80% [MASK], 10% a random id drawn from the *whole* vocab (specials and
    [unusedN] included, as the original draws from ``tokenizer.vocab``), 10% unchanged.
    """
    N = len(offsets_N1) - 1
    len_N = np.diff(offsets_N1)
    inst_T = np.repeat(np.arange(N), len_N)
    pos_T = np.arange(len(ids_T)) - np.repeat(offsets_N1[:-1], len_N)
    cand_T = ~special_T
    n_cand_N = np.bincount(inst_T[cand_T], minlength=N)
    # The original stops when it runs out of candidates; only reachable at a high masked_lm_prob.
    k_N = np.minimum(num_to_predict(len_N, masked_lm_prob, max_predictions), n_cand_N)
    if is_cont_T is None:
        keys_T = rng.random(len(ids_T))
        keys_T[special_T] = 2.0
        chosen_T = _choose_tokens(keys_T, inst_T, pos_T, offsets_N1, k_N)
    else:
        chosen_T = _choose_whole_words(cand_T, is_cont_T, pos_T, inst_T, k_N, rng)
    idx_M = np.flatnonzero(chosen_T)  # ascending: grouped by instance, positions sorted
    M = len(idx_M)
    u_M = rng.random(M)
    random_ids_M = rng.integers(0, vocab_size, M)
    decisions_M = np.where(u_M < 0.8, MASK, np.where(u_M < 0.9, KEEP, RANDOM)).astype(np.int8)
    out_T = ids_T.copy()
    labels_M = ids_T[idx_M]
    out_T[idx_M[decisions_M == MASK]] = mask_id
    rnd = decisions_M == RANDOM
    out_T[idx_M[rnd]] = random_ids_M[rnd]
    pred_offsets_N1 = np.zeros(N + 1, dtype=np.int64)
    np.cumsum(np.bincount(inst_T[idx_M], minlength=N), out=pred_offsets_N1[1:])
    return MaskedBatch(out_T, pos_T[idx_M], labels_M, pred_offsets_N1, decisions_M)
