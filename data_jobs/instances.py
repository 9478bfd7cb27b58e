"""Static MLM/NSP instances, exactly as Google BERT's ``create_pretraining_data.py`` makes them (no Ray).

Shapes (legend): T = tokens, N = instances, S = sentences, D = documents, M = masked positions.

Call tree (the original's, with the RNG passed in):
  instance_table.round_table(ctx, round)        one dupe round over one shard -> one Arrow table
    round_pairs(ctx, round)                     every document's pairs (here)
    document_pairs(sent_off, key, ...)          create_instances_from_document, without masking
      random_next_b / truncate_pair             random-next segment B, truncate_seq_pair
    masking.mask_batch(...)                     create_masked_lm_predictions, vectorised per round

This module makes the pairs; ``data_jobs.instance_table`` masks them and lays one round out as Arrow.

Random-next segments come from a corpus-wide pool (``pool_sample``: a seeded sample of every shard's
documents, long ones cut to one region plus a tail) that every worker holds.

Tokens are never copied per instance in Python: a document is a run of sentences, and every segment
(A, B, a truncated A or B) is one contiguous range of token ids. Instances are therefore tuples of
ranges, and one numpy gather per round builds all of them.

Randomness: every (seed, shard, round, document) gets its own ``random.Random`` for the segment
decisions, and every (seed, shard, round) its own numpy Generator for the masks, so the output is the
same however shards are spread over workers.
"""
from __future__ import annotations

import hashlib
import itertools
import random
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from data_jobs.chunk_encode import encode_flat


def derive_seed(*parts: object) -> int:
    """A 64-bit seed from any tuple of ints/strings (stable across processes, unlike hash())."""
    blob = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little")


@dataclass
class TokenizedDocs:
    """Documents as flat token ids. Sentence s is ids[sent_off[s]:sent_off[s+1]]; document d holds
    sentences doc_sent_off[d]:doc_sent_off[d+1]. Sentences with no tokens are dropped (as in the
    original); a document left without sentences stays as an empty range so indices stay stable."""

    ids_T: np.ndarray
    sent_off_S1: np.ndarray
    doc_sent_off_D1: np.ndarray
    doc_keys_D: np.ndarray  # corpus-wide unique id per document: (shard << 32) | index in shard
    # random-next pool only: how many leading sentences of each document may start a segment B (the
    # rest is the tail that lets B run on as it would in the whole document); None = all of them
    starts_D: np.ndarray | None = None

    @property
    def num_docs(self) -> int:
        return len(self.doc_sent_off_D1) - 1

    @staticmethod
    def empty() -> "TokenizedDocs":
        z = np.zeros(1, dtype=np.int64)
        return TokenizedDocs(np.zeros(0, np.int32), z, z.copy(), np.zeros(0, np.int64))


def tokenize_documents(tokenizer, documents: Sequence[Sequence[str]], doc_keys: Sequence[int],
                       batch_sentences: int = 16384) -> TokenizedDocs:
    """Tokenize every sentence of the documents once (Rust, batched), keep ids only."""
    flat = list(itertools.chain.from_iterable(documents))
    return tokenize_flat(tokenizer, flat, [len(d) for d in documents], doc_keys, batch_sentences)


def tokenize_flat(tokenizer, sentences: Sequence[str], sents_per_doc: Sequence[int], doc_keys: Sequence[int],
                  batch_sentences: int = 16384) -> TokenizedDocs:
    """tokenize_documents for documents given as one flat sentence list plus sentences per document
    (how Arrow holds them: no nested Python lists to build)."""
    n_docs = len(sents_per_doc)
    sent_doc = np.repeat(np.arange(n_docs), np.asarray(sents_per_doc, dtype=np.int64))
    id_parts, lens = [], []
    for lo in range(0, len(sentences), batch_sentences):
        ids, sent_lens = encode_flat(tokenizer, sentences[lo:lo + batch_sentences])
        id_parts.append(ids)
        lens.append(sent_lens)
    lens_S = np.concatenate(lens) if lens else np.zeros(0, np.int64)
    keep_S = lens_S > 0
    sent_off = np.zeros(int(keep_S.sum()) + 1, dtype=np.int64)
    np.cumsum(lens_S[keep_S], out=sent_off[1:])
    doc_off = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(np.bincount(sent_doc[keep_S], minlength=n_docs), out=doc_off[1:])
    ids_T = np.concatenate(id_parts) if id_parts else np.zeros(0, np.int32)
    return TokenizedDocs(ids_T, sent_off, doc_off, np.asarray(doc_keys, dtype=np.int64))


def pool_sample(tokenizer, documents: Sequence[Sequence[str]], doc_keys: Sequence[int], region_chars: int,
                tail_tokens: int, rng: random.Random) -> TokenizedDocs:
    """The random-next pool's copy of some documents, each cut to one region of ~region_chars.

    The original draws a random document, then a random start sentence in it, and reads on until
    segment B is long enough. Keeping (and tokenizing) whole long documents such as books in every
    worker's pool would cost too much, so a long document is split into consecutive regions of whole
    sentences, and one region is kept, chosen with probability proportional to its sentence count,
    plus a tail of >= tail_tokens tokens after it. A start drawn uniformly in the region (``starts_D``)
    is then uniform over the document's sentences (marginally over the seed), and B reads on into the
    tail exactly as it would in the whole document.
    """
    items = []
    for doc, key in zip(documents, doc_keys):
        n = len(doc)
        if n == 0:
            continue
        lo, start_hi = 0, n
        if sum(map(len, doc)) > region_chars:
            bounds, chars = [0], 0
            for s in range(n):
                chars += len(doc[s])
                if chars >= region_chars and s + 1 < n:
                    bounds.append(s + 1)
                    chars = 0
            bounds.append(n)
            r = bisect_left(bounds, rng.randint(0, n - 1) + 1) - 1  # region holding a random sentence
            lo, start_hi = bounds[r], bounds[r + 1]
        tail_chars = 8 * tail_tokens
        while True:  # tail: whole sentences until tail_tokens tokens (or the document's end)
            hi, chars = start_hi, 0
            while hi < n and chars < tail_chars:
                chars += len(doc[hi])
                hi += 1
            ids, lens_s = encode_flat(tokenizer, list(doc[lo:hi]))
            if hi == n or int(lens_s[start_hi - lo:].sum()) >= tail_tokens:
                break
            tail_chars *= 2
        kept = lens_s[lens_s > 0]  # sentences without tokens are dropped (they hold no ids)
        n_starts = int(np.count_nonzero(lens_s[:start_hi - lo]))
        if n_starts == 0:
            continue
        items.append(TokenizedDocs(ids, np.r_[0, np.cumsum(kept)].astype(np.int64),
                                   np.array([0, len(kept)], np.int64), np.array([key], np.int64),
                                   np.array([n_starts], np.int64)))
    return concat_docs(items)


def concat_docs(items: Sequence[TokenizedDocs]) -> TokenizedDocs:
    if not items:
        return TokenizedDocs.empty()
    ids, sent, doc, keys, starts = [], [np.zeros(1, np.int64)], [np.zeros(1, np.int64)], [], []
    t_base = s_base = 0
    for it in items:
        ids.append(it.ids_T)
        sent.append(it.sent_off_S1[1:] + t_base)
        doc.append(it.doc_sent_off_D1[1:] + s_base)
        keys.append(it.doc_keys_D)
        starts.append(it.starts_D if it.starts_D is not None else np.diff(it.doc_sent_off_D1))
        t_base += len(it.ids_T)
        s_base += len(it.sent_off_S1) - 1
    return TokenizedDocs(np.concatenate(ids).astype(np.int32), np.concatenate(sent).astype(np.int64),
                         np.concatenate(doc).astype(np.int64), np.concatenate(keys).astype(np.int64),
                         np.concatenate(starts).astype(np.int64))


@dataclass(frozen=True)
class PairParams:
    max_seq_length: int
    short_seq_prob: float
    sentence_task: str

    @property
    def max_num_tokens(self) -> int:
        # Account for [CLS], [SEP], [SEP] (one [SEP] fewer without a second segment).
        return self.max_seq_length - (2 if self.sentence_task == "none" else 3)


@dataclass
class Pool:
    """The random-next pool as plain lists (Python indexing is faster than numpy scalars here)."""

    sent_off: list[int]
    doc_sent_off: list[int]
    doc_keys: list[int]
    doc_starts: list[int]  # sentences of each document that may start a segment B

    @property
    def num_docs(self) -> int:
        return len(self.doc_keys)


# A pair is (a_lo, a_len, b_lo, b_len, label): ranges into the shard context's token array.
Pair = tuple


def truncation_counts(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """How many tokens truncate_seq_pair removes from A and from B, in closed form.

    The original removes one token at a time from the longer segment (B on ties) until the pair fits:
    first the longer side down to the other's length, then alternately B, A, B, ...
    """
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0
    ta = tb = 0
    if len_a > len_b:
        ta = min(excess, len_a - len_b)
    else:
        tb = min(excess, len_b - len_a)
    rest = excess - ta - tb
    return ta + rest // 2, tb + (rest + 1) // 2


def _trim(lo: int, hi: int, count: int, rng: random.Random) -> tuple[int, int]:
    # "We want to sometimes truncate from the front and sometimes from the back to add more
    # randomness and avoid biases": each removed token is a fair coin, so the number taken from the
    # front is the number of ones in `count` random bits.
    if count <= 0:
        return lo, hi
    front = rng.getrandbits(count).bit_count()
    return lo + front, hi - (count - front)


def truncate_pair(a: tuple[int, int], b: tuple[int, int], max_num_tokens: int, rng: random.Random):
    ta, tb = truncation_counts(a[1] - a[0], b[1] - b[0], max_num_tokens)
    return _trim(a[0], a[1], ta, rng), _trim(b[0], b[1], tb, rng)


def _randint(rng: random.Random, a: int, b: int) -> int:
    """``rng.randint(a, b)`` for a <= b, the same draw: randint is randrange(a, b + 1), which is
    ``a + rng._randbelow(b - a + 1)`` after two layers of argument checks that cost more than the
    draw in this hot loop (``_randbelow`` of width 0 would never return: callers ensure a <= b).
    Any other generator (the tests' scripted one) is asked for randint itself."""
    if type(rng) is random.Random:
        return a + rng._randbelow(b - a + 1)
    return rng.randint(a, b)


def random_next_b(pool: Pool, doc_key: int, target_b_length: int, rng: random.Random) -> tuple[int, int]:
    """Segment B of a random-next pair: sentences from a random start in another document."""
    # This should rarely go for more than one iteration for large corpora. However, just to be
    # careful, we try to make sure that the random document is not the same as the document we're
    # processing.
    for _ in range(10):
        r = _randint(rng, 0, pool.num_docs - 1)
        if pool.doc_keys[r] != doc_key:
            break
    s_lo, s_hi = pool.doc_sent_off[r], pool.doc_sent_off[r + 1]
    start = _randint(rng, s_lo, s_lo + pool.doc_starts[r] - 1)
    lo = pool.sent_off[start]
    hi = lo
    for j in range(start, s_hi):
        hi = pool.sent_off[j + 1]
        if hi - lo >= target_b_length:
            break
    return lo, hi


def document_pairs(sent_off: Sequence[int], doc_key: int, pool: Pool | None, p: PairParams,
                   rng: random.Random) -> tuple[list[Pair], bool]:
    """create_instances_from_document: segment pairs of one document; returns (pairs, short target).

    ``sent_off`` are the token offsets of the document's sentences (len = sentences + 1).
    """
    max_num_tokens = p.max_num_tokens
    # We *usually* want to fill up the entire sequence since we are padding to max_seq_length anyway,
    # so short sequences are generally wasted computation. However, we *sometimes* (short_seq_prob of
    # the time) want shorter sequences to minimize the mismatch between pre-training and fine-tuning.
    # The target is a rough target; max_seq_length is the hard limit. As in the original, it is drawn
    # once per document and dupe round.
    target = max_num_tokens
    short = rng.random() < p.short_seq_prob
    if short:
        target = _randint(rng, 2, max_num_tokens)
    # We DON'T just concatenate all of the tokens from a document into a long sequence and choose an
    # arbitrary split point because this would make the next sentence prediction task too easy.
    # Instead, we split the input into segments "A" and "B" at actual sentence boundaries.
    pairs: list[Pair] = []
    n_sent = len(sent_off) - 1
    chunk_start = 0
    while chunk_start < n_sent:
        # The original adds sentences to the chunk until it reaches the target or the document ends;
        # the sentence where that happens is found by bisection on the token offsets instead.
        i = bisect_left(sent_off, sent_off[chunk_start] + target, chunk_start + 1) - 1
        i = min(i, n_sent - 1)
        pair, unused = _chunk_pair(sent_off, chunk_start, i + 1, doc_key, pool, p, target, rng)
        if pair is not None:
            pairs.append(pair)
        # We didn't actually use the unused segments, so we "put them back" so they don't go to
        # waste (only random-next pairs leave some).
        chunk_start = i - unused + 1
    return pairs, short


def _chunk_pair(sent_off, c_lo: int, c_hi: int, doc_key: int, pool: Pool | None, p: PairParams,
                target: int, rng: random.Random) -> tuple[Pair | None, int]:
    """One instance from the chunk of sentences [c_lo, c_hi); returns (pair, unused sentences)."""
    n_chunk = c_hi - c_lo
    if p.sentence_task == "none":
        (lo, hi), _ = truncate_pair((sent_off[c_lo], sent_off[c_hi]), (0, 0), p.max_num_tokens, rng)
        return (lo, hi - lo, 0, 0, -1), 0
    # a_end is how many sentences of the chunk go into the A (first) segment.
    a_end = 1 if n_chunk == 1 else _randint(rng, 1, n_chunk - 1)
    a = (sent_off[c_lo], sent_off[c_lo + a_end])
    unused = 0
    if p.sentence_task == "nsp":
        if n_chunk == 1 or rng.random() < 0.5:
            label = 1  # random next
            b = random_next_b(pool, doc_key, target - (a[1] - a[0]), rng)
            unused = n_chunk - a_end
        else:
            label = 0
            b = (a[1], sent_off[c_hi])
    else:  # sop: two consecutive segments of this document, swapped half of the time
        if n_chunk == 1:
            # One sentence alone: split it at a random token (ALBERT falls back to a random
            # document here, which would leak NSP into SOP); a 1-token sentence gives no pair.
            lo, hi = a
            if hi - lo < 2:
                return None, 0
            cut = _randint(rng, lo + 1, hi - 1)
            a, b = (lo, cut), (cut, hi)
        else:
            b = (a[1], sent_off[c_hi])
        label = 0
        if rng.random() < 0.5:
            a, b, label = b, a, 1
    a, b = truncate_pair(a, b, p.max_num_tokens, rng)
    assert a[1] > a[0] and b[1] > b[0]
    return (a[0], a[1] - a[0], b[0], b[1] - b[0], label), unused


@dataclass
class ShardContext:
    """Everything one worker needs for one shard: its tokens, the pool, the vocab constants."""

    docs: TokenizedDocs
    pool_docs: TokenizedDocs | None
    params: PairParams
    masked_lm_prob: float
    max_predictions: int
    vocab_size: int
    cls_id: int
    sep_id: int
    mask_id: int
    seed: int
    shard: int
    is_cont_V: np.ndarray | None = None  # whole-word masking: True for ## pieces
    passes_D: np.ndarray | None = None  # source weights: rounds each document takes part in (None: every round)
    all_ids_T: np.ndarray = field(init=False)
    pool: Pool | None = field(init=False)
    special_base: int = field(init=False)

    def __post_init__(self) -> None:
        # One token array: shard tokens, then pool tokens, then [CLS] and [SEP]; every range of
        # every instance points into it, and an index >= special_base marks a special token.
        pool_ids = self.pool_docs.ids_T if self.pool_docs is not None else np.zeros(0, np.int32)
        base = len(self.docs.ids_T)
        self.all_ids_T = np.concatenate([self.docs.ids_T, pool_ids, [self.cls_id, self.sep_id]]).astype(np.int32)
        self.special_base = base + len(pool_ids)
        self.pool = None
        if self.pool_docs is not None and self.pool_docs.num_docs:
            pd = self.pool_docs
            starts = pd.starts_D if pd.starts_D is not None else np.diff(pd.doc_sent_off_D1)
            self.pool = Pool((pd.sent_off_S1 + base).tolist(), pd.doc_sent_off_D1.tolist(),
                             pd.doc_keys_D.tolist(), starts.tolist())
        if self.params.sentence_task == "nsp" and self.pool is None:
            raise ValueError("sentence_task nsp needs a non-empty random-next pool")


def round_pairs(ctx: ShardContext, round_index: int) -> tuple[list[Pair], int, int, int]:
    """Pairs of every document of the shard for one dupe round; also (docs, short docs, short pairs)."""
    d = ctx.docs
    sent_off = d.sent_off_S1.tolist()
    doc_off = d.doc_sent_off_D1.tolist()
    keys = d.doc_keys_D.tolist()
    passes = None if ctx.passes_D is None else ctx.passes_D.tolist()
    pairs: list[Pair] = []
    n_docs = n_short = n_short_pairs = 0
    for doc in range(d.num_docs):
        s_lo, s_hi = doc_off[doc], doc_off[doc + 1]
        if s_hi == s_lo or (passes is not None and round_index >= passes[doc]):
            continue
        rng = random.Random(derive_seed(ctx.seed, ctx.shard, round_index, doc))
        got, short = document_pairs(sent_off[s_lo:s_hi + 1], keys[doc], ctx.pool, ctx.params, rng)
        pairs.extend(got)
        n_docs += 1
        n_short += short
        n_short_pairs += len(got) if short else 0
    return pairs, n_docs, n_short, n_short_pairs


# Reading instances back as text lives beside this module; re-exported as part of its API.
from data_jobs.instance_text import decode_examples, format_instance  # noqa: E402,F401
