"""One dupe round of one shard as an Arrow table: the pairs of ``instances.round_pairs``, masked
(``masking.mask_batch``), optionally grouped by length bin, in ``contracts.schema.instances_schema``.

Shapes (legend): T = tokens, N = instances, M = masked positions. Every instance is five ranges into
``ShardContext.all_ids_T`` ([CLS], A, [SEP], B, [SEP]); one numpy gather builds them all, and Arrow
gets the numpy buffers without a copy.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from contracts.schema import instances_schema
from data_jobs.instance_stats import add_counts, bin_uppers, new_stats
from data_jobs.instances import ShardContext, derive_seed, round_pairs
from data_jobs.masking import KEEP, MASK, RANDOM, mask_batch
from data_jobs.ragged import gather_ranges as _gather_ranges


def _arrow(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """Zero-copy numpy -> Arrow (pa.array() would import pandas, 0.4 s in every fresh worker)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])


def round_table(ctx: ShardContext, round_index: int, bin_size: int = 0) -> tuple[pa.Table, np.ndarray, dict]:
    """All instances of one shard for one dupe round: (Arrow table in ``instances_schema``, lengths_N,
    stats). With ``bin_size``, rows are grouped by length bin (stably: each bin keeps the round's
    order), so every bin is one contiguous slice of the table (see ``bin_slices``)."""
    pairs, n_docs, n_short, n_short_pairs = round_pairs(ctx, round_index)
    rng = np.random.Generator(np.random.PCG64(derive_seed(ctx.seed, ctx.shard, round_index, "mask")))
    N = len(pairs)
    # The original shuffles all instances; we shuffle within the round (the loader shuffles across).
    arr = np.asarray(pairs, dtype=np.int64).reshape(N, 5)[rng.permutation(N)]
    a_lo, a_len, b_lo, b_len, label = arr.T
    has_b = (b_len > 0).astype(np.int64)
    cls_at, sep_at = ctx.special_base, ctx.special_base + 1
    # Five ranges per instance: [CLS], A, [SEP], B, [SEP] (B and its [SEP] empty without a B).
    starts_N5 = np.stack([np.full(N, cls_at), a_lo, np.full(N, sep_at), b_lo, np.full(N, sep_at)], 1)
    lens_N5 = np.stack([np.ones(N, np.int64), a_len, np.ones(N, np.int64), b_len, has_b], 1)
    idx_T = _gather_ranges(starts_N5.ravel(), lens_N5.ravel())
    ids_T = ctx.all_ids_T[idx_T]
    len_N = lens_N5.sum(1)
    offsets_N1 = _offsets(len_N)
    is_cont_T = ctx.is_cont_V[ids_T] if ctx.is_cont_V is not None else None
    mb = mask_batch(ids_T, offsets_N1, idx_T >= ctx.special_base, ctx.masked_lm_prob,
                    ctx.max_predictions, ctx.vocab_size, ctx.mask_id, rng, is_cont_T)
    stats = _round_stats(N, n_docs, n_short, n_short_pairs, len_N, label, mb)
    out_ids_T, positions_M, labels_M, pred_offsets_N1 = mb.input_ids_T, mb.positions_M, mb.labels_M, mb.pred_offsets_N1
    if bin_size:  # after masking: the masks were drawn in the round's order
        order_N = np.argsort(bin_uppers(len_N, bin_size, ctx.params.max_seq_length), kind="stable")
        out_ids_T = out_ids_T[_gather_ranges(offsets_N1[:-1][order_N], len_N[order_N])]
        pred_idx_M = _gather_ranges(pred_offsets_N1[:-1][order_N], np.diff(pred_offsets_N1)[order_N])
        positions_M, labels_M = positions_M[pred_idx_M], labels_M[pred_idx_M]
        len_N, a_len, label = len_N[order_N], a_len[order_N], label[order_N]
        offsets_N1, pred_offsets_N1 = _offsets(len_N), _offsets(np.diff(pred_offsets_N1)[order_N])
    schema = instances_schema(ctx.vocab_size)
    tok = schema.field("input_ids").type.value_type
    np_tok = np.uint16 if tok == pa.uint16() else np.uint32
    off32, poff32 = _arrow(offsets_N1.astype(np.int32), pa.int32()), _arrow(pred_offsets_N1.astype(np.int32), pa.int32())
    table = pa.Table.from_arrays([
        pa.ListArray.from_arrays(off32, _arrow(out_ids_T.astype(np_tok), tok)),
        _arrow((a_len + 2).astype(np.uint16), pa.uint16()),
        pa.ListArray.from_arrays(poff32, _arrow(positions_M.astype(np.uint16), pa.uint16())),
        pa.ListArray.from_arrays(poff32, _arrow(labels_M.astype(np_tok), tok)),
        _arrow(label.astype(np.int8), pa.int8()),
    ], schema=schema)
    return table, len_N, stats


def _offsets(len_N: np.ndarray) -> np.ndarray:
    offsets_N1 = np.zeros(len(len_N) + 1, dtype=np.int64)
    np.cumsum(len_N, out=offsets_N1[1:])
    return offsets_N1


def bin_slices(len_N: np.ndarray, bin_size: int, max_seq_length: int) -> list[tuple[int, int, int]]:
    """(bin upper, first row, rows) of every bin of a table that ``round_table`` grouped by bin."""
    uppers, firsts, counts = np.unique(bin_uppers(len_N, bin_size, max_seq_length), return_index=True,
                                       return_counts=True)
    return list(zip(uppers.tolist(), firsts.tolist(), counts.tolist()))


def _round_stats(N, n_docs, n_short, n_short_pairs, len_N, label, mb) -> dict:
    stats = new_stats()
    stats.update(instances=N, doc_rounds=n_docs, short_target_doc_rounds=n_short,
                 short_target_instances=n_short_pairs, tokens=int(len_N.sum()))
    add_counts(stats["length"], len_N)
    add_counts(stats["nsp_label"], label)
    add_counts(stats["predictions"], np.diff(mb.pred_offsets_N1))
    dec = np.bincount(mb.decisions_M, minlength=3)
    stats["replacements"] = {"mask": int(dec[MASK]), "random": int(dec[RANDOM]), "keep": int(dec[KEEP])}
    return stats
