"""Instance loader: manifest checks, length-binned global batches, elastic exact-resume cursor.

Shapes: B = micro batch, S = padded sequence length (the bin's upper bound), M = masked tokens in the
batch, G = global batch = B x grad_accum_steps x world size (the rows of one optimizer step).

Invariants
- The loader reads the Parquet files the instances job wrote, nothing else: in place on a file system,
  or through a bounded, verified node-local cache of an object store's files (``loader_cache``). Rows
  are decoded a block (one Parquet row group) at a time into a bounded in-memory cache; a rank's memory
  holds the blocks of its current shuffle windows, never the dataset.
- A row's length bin is the one rule of the instances job (``data_jobs.instance_stats.bin_uppers``):
  the job records each file's bin in the manifest, so the loader computes nothing for its files.
- The epoch plan is a pure function of (seed, epoch, dataset, G): every rank computes the same plan.
  Per bin, the blocks are shuffled and taken in windows of about ``SHUFFLE_ROWS`` rows, whose rows are
  shuffled together (the block shuffle of Mosaic Streaming and LDDL: random enough across a corpus
  whose instances are already shuffled within each shard and round, and it reads each block once);
  the bins' batches are then interleaved at random, each bin keeping its order.
  Micro batch k of a global batch is its rows [k*B, (k+1)*B); rank r takes micro batches
  k = a*world + r for a = 0..accum-1. The B-row groups of a step therefore do not depend on how G is
  split into world x accumulation, which is what lets a run resume on another world size (elastic).
- A global batch holds rows of one length bin only (little padding); each bin's tail that does not
  fill a global batch is left out of that epoch (a different tail each epoch, since it is shuffled).
- The cursor (epoch, next global batch, next micro batch within it) is all the state.
- Collation is vectorised over flat values/offsets arrays (no per-row Python); a background thread
  collates the next micro batches (``prefetch``), which never changes what a batch holds.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from bert_core.config import ModelConfig
from bert_core.loader_cache import FileSource
from bert_core.prefetch import Prefetcher
from contracts.common import UserError
from contracts.schema import Manifest
from contracts.storage import LocalLocation, location
from data_jobs.instance_stats import bin_uppers
from data_jobs.ragged import gather_ranges

DEFAULT_BIN_SIZE = 32
SHUFFLE_ROWS = 1 << 16  # rows shuffled together: a window of blocks of about this many rows, per bin
BLOCK_CACHE_BYTES = 1 << 30  # decoded blocks kept per dataset (at least two windows' worth)
OPEN_FILES = 64  # Parquet files a dataset keeps open at once
PLAN_VERSION = 2  # 2: block-window shuffle over the job's own files (1: a whole-dataset shuffle of a decoded copy)
COLUMNS = ["input_ids", "segment_a_len", "masked_positions", "masked_ids", "nsp_label"]


def _positive_int(d, totals: dict, key: str) -> int:
    value = totals[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserError(f"{d}/manifest.json: totals.{key} is {value!r}, not a positive integer (manifest edited?)")
    return value


def _check_vocab_size(d: Path, vocab_size: int, vocab_file: Optional[str]) -> None:
    """A hand-edited totals.vocab_size would size the embedding wrong: an IndexError deep in torch."""
    path = d / vocab_file if vocab_file else None  # relative: to the dataset directory
    if path is None or not path.is_file():
        return  # a moved vocab is reported where the vocab is needed (training and export)
    with open(path, "rb") as fh:
        tokens = sum(1 for line in fh if line.strip())
    if tokens != vocab_size:
        raise UserError(f"{d / 'manifest.json'}: totals.vocab_size is {vocab_size} but {vocab_file} holds "
                        f"{tokens} tokens (manifest edited?)")


@dataclass
class _Block:
    """Rows [first, first + rows) of the dataset: one row group of one file."""

    file: int
    group: int
    first: int
    rows: int


class _Decoded:
    """One block's columns as flat numpy arrays (row i's ids: ids[ids_off[i]:ids_off[i+1]])."""

    def __init__(self, table: pa.Table):
        def ragged(name):
            arr = table.column(name).combine_chunks()
            off = arr.offsets.to_numpy().astype(np.int64)
            return arr.values.slice(off[0], off[-1] - off[0]).to_numpy(zero_copy_only=False), off - off[0]

        self.ids, self.ids_off = ragged("input_ids")
        self.mpos, self.m_off = ragged("masked_positions")
        self.mids, _ = ragged("masked_ids")
        self.sega = table.column("segment_a_len").to_numpy().astype(np.int64)
        self.nsp = table.column("nsp_label").to_numpy().astype(np.int64)
        self.lens = np.diff(self.ids_off)
        self.nbytes = sum(a.nbytes for a in (self.ids, self.ids_off, self.mpos, self.m_off, self.mids, self.sega, self.nsp))


class InstanceDataset:
    """An instances dataset (a directory or an object-store prefix) read block by block."""

    def __init__(self, data_dir: str | Path, verify: str = "size"):
        self.loc = location(data_dir)
        self.dir = Path(data_dir) if isinstance(self.loc, LocalLocation) else Path(str(data_dir))
        self.manifest = Manifest.read(data_dir, kind="instances")
        if verify != "none" and isinstance(self.loc, LocalLocation):  # cached copies are checked when fetched
            problems = self.manifest.verify_files(self.dir, deep=(verify == "deep"))
            if problems:
                raise UserError(f"{self.dir}: {len(problems)} bad file(s): {problems[0]}")
        totals = self.manifest.totals
        for key in ("vocab_size", "max_seq_length", "max_predictions_per_seq"):
            if key not in totals:
                raise UserError(f"{data_dir}/manifest.json: totals lack {key!r}")
        self.vocab_size, self.max_seq_length, self.max_predictions = (
            _positive_int(data_dir, totals, k) for k in ("vocab_size", "max_seq_length", "max_predictions_per_seq"))
        self.vocab_hash = self.manifest.vocab_hash
        self.vocab_file = totals.get("vocab_file")
        if isinstance(self.loc, LocalLocation):
            _check_vocab_size(self.dir, self.vocab_size, self.vocab_file)
        self.bin_size = int(self.manifest.config.get("length_bin_size", DEFAULT_BIN_SIZE))
        self.files = sorted(self.manifest.files, key=lambda f: f.name)
        self.source = FileSource(self.loc, self.manifest.identity())
        self._pq: OrderedDict[int, pq.ParquetFile] = OrderedDict()
        self._cache: OrderedDict[int, _Decoded] = OrderedDict()
        self._cache_bytes = 0
        self._lock = threading.Lock()
        self._index()

    # ---- the index: blocks and each row's bin, from the manifest (the footers only where it is silent)

    def _parquet(self, i: int) -> pq.ParquetFile:
        """File ``i`` opened, the most recently used OPEN_FILES kept open (a dataset of thousands of
        files must not hold a descriptor for each: the default limit is 1,024)."""
        with self._lock:
            if i in self._pq:
                self._pq.move_to_end(i)
                return self._pq[i]
        path = self.source.path(self.files[i])
        try:
            opened = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as err:
            raise UserError(f"{path}: unreadable Parquet: {str(err).splitlines()[0]}") from None
        with self._lock:
            self._pq[i] = opened
            while len(self._pq) > OPEN_FILES:
                self._pq.popitem(last=False)  # closed when no thread reads it any more
        return opened

    def _metadata(self, i: int) -> pq.FileMetaData:
        """File ``i``'s footer, read without keeping the file open."""
        path = self.source.path(self.files[i])
        try:
            return pq.read_metadata(path)
        except (pa.ArrowException, OSError) as err:
            raise UserError(f"{path}: unreadable Parquet: {str(err).splitlines()[0]}") from None

    def _index(self) -> None:
        self.blocks = blocks = []
        bins, first = [], 0
        for i, entry in enumerate(self.files):
            groups = entry.meta.get("row_groups")
            if not (isinstance(groups, list) and sum(groups) == entry.rows):
                md = self._metadata(i)
                groups = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
            if sum(groups) != entry.rows:
                raise UserError(f"{self.dir}/{entry.name}: {sum(groups)} rows, its manifest entry says {entry.rows}")
            upper = entry.meta.get("bin")
            for g, n in enumerate(groups):
                blocks.append(_Block(i, g, first, n))
                if isinstance(upper, int) and 0 < upper <= self.max_seq_length:
                    bins.append(np.full(n, upper, np.int32))  # the job's bin: no row needs reading
                else:  # a file of mixed lengths (not written by the instances job): the one rule per row
                    lens = self._decode(len(blocks) - 1).lens
                    bins.append(bin_uppers(lens, self.bin_size, self.max_seq_length).astype(np.int32))
                first += n
        self.block_first = np.array([b.first for b in blocks] + [first], dtype=np.int64)
        self.bins = np.concatenate(bins) if bins else np.zeros(0, np.int32)
        expected = self.manifest.totals.get("instances")
        if expected is not None and int(expected) != first:
            raise UserError(f"{self.dir}: manifest says {expected} instances, files hold {first}")

    # ---- decoded blocks, bounded

    def _decode(self, b: int) -> _Decoded:
        with self._lock:
            if b in self._cache:
                self._cache.move_to_end(b)
                return self._cache[b]
        block = self.blocks[b]
        path = self.files[block.file].name
        try:
            block_data = _Decoded(self._parquet(block.file).read_row_group(block.group, columns=COLUMNS))
        except (pa.ArrowException, OSError, KeyError) as err:
            raise UserError(f"{self.dir}/{path}: unreadable Parquet: {str(err).splitlines()[0]}") from None
        if len(block_data.lens) and int(block_data.lens.max()) > self.max_seq_length:
            raise UserError(f"{self.dir}: an instance is longer than max_seq_length {self.max_seq_length} ({path})")
        with self._lock:
            self._cache[b] = block_data
            self._cache_bytes += block_data.nbytes
            while self._cache_bytes > BLOCK_CACHE_BYTES and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cache_bytes -= old.nbytes
        return block_data

    @property
    def lengths(self) -> np.ndarray:
        """Every row's length (decodes every block once: for small datasets, e.g. held-out scoring)."""
        if getattr(self, "_lengths", None) is None:
            parts = [self._decode(b).lens for b in range(len(self.blocks))]
            self._lengths = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return self._lengths

    def __len__(self) -> int:
        return int(self.block_first[-1])

    def check_model(
        self,
        config: ModelConfig,
        vocab_hash: Optional[str] = None,
        max_seq_length: Optional[int] = None,
        max_predictions_per_seq: Optional[int] = None,
    ) -> None:
        """Refuse data the model cannot consume (or that was built with another vocab)."""
        where = f"{self.dir / 'manifest.json'}"
        if config.vocab_size != self.vocab_size:
            raise UserError(f"{where}: data vocab_size {self.vocab_size} != model vocab_size {config.vocab_size}")
        if vocab_hash is not None and self.vocab_hash is not None and vocab_hash != self.vocab_hash:
            raise UserError(f"{where}: data vocab_hash {self.vocab_hash} != {vocab_hash} of the initial weights' vocab")
        if self.max_seq_length > config.max_position_embeddings:
            raise UserError(
                f"{where}: max_seq_length {self.max_seq_length} > model max_position_embeddings {config.max_position_embeddings}"
            )
        if max_seq_length is not None and max_seq_length != self.max_seq_length:
            raise UserError(f"{where}: data max_seq_length {self.max_seq_length} != configured {max_seq_length}")
        if max_predictions_per_seq is not None and max_predictions_per_seq != self.max_predictions:
            raise UserError(
                f"{where}: data max_predictions_per_seq {self.max_predictions} != configured {max_predictions_per_seq}"
            )

    def collate(self, rows: np.ndarray, seq_len: int, pad_id: int = 0) -> dict[str, torch.Tensor]:
        """Rows -> padded batch. mlm_positions are flat indices into the B*S tokens (row-major)."""
        rows = np.asarray(rows, dtype=np.int64)
        B, S = len(rows), seq_len
        block_B = np.searchsorted(self.block_first, rows, side="right") - 1
        ids_BS = np.full((B, S), pad_id, dtype=np.int64)
        types_BS = np.zeros((B, S), dtype=bool)
        valid_BS = np.zeros((B, S), dtype=bool)
        nsp_B = np.zeros(B, dtype=np.int64)
        seg_rows, seg_lens, pos_parts, lab_parts = [], [], [], []
        col_S = np.arange(S, dtype=np.int64)
        for b in np.unique(block_B):
            sel = np.flatnonzero(block_B == b)  # positions in the batch of the rows from this block
            d = self._decode(int(b))
            local = rows[sel] - self.block_first[b]
            lens = d.lens[local]
            valid = col_S[None, :] < lens[:, None]
            valid_BS[sel] = valid
            sub = np.full((len(sel), S), pad_id, dtype=np.int64)
            sub[valid] = d.ids[gather_ranges(d.ids_off[local], lens)]
            ids_BS[sel] = sub
            types_BS[sel] = (col_S[None, :] >= d.sega[local][:, None]) & valid
            nsp_B[sel] = d.nsp[local]
            m_lens = d.m_off[local + 1] - d.m_off[local]
            idx = gather_ranges(d.m_off[local], m_lens)
            seg_rows.append(sel)
            seg_lens.append(m_lens)
            pos_parts.append(d.mpos[idx].astype(np.int64))
            lab_parts.append(d.mids[idx].astype(np.int64))
        # the masked tokens were gathered block by block: put their per-row segments back in batch order
        seg_rows_R, seg_lens_R = np.concatenate(seg_rows), np.concatenate(seg_lens)
        order_R = np.argsort(seg_rows_R, kind="stable")
        take_M = gather_ranges((np.cumsum(seg_lens_R) - seg_lens_R)[order_R], seg_lens_R[order_R])
        m_len_B = seg_lens_R[order_R]
        positions_M = np.repeat(np.arange(B, dtype=np.int64) * S, m_len_B) + np.concatenate(pos_parts)[take_M]
        labels_M = np.concatenate(lab_parts)[take_M]
        return {
            "input_ids": torch.from_numpy(ids_BS),
            "token_type_ids": torch.from_numpy(types_BS.astype(np.int64)),
            "attention_mask": torch.from_numpy(valid_BS.astype(np.int64)),
            "mlm_positions": torch.from_numpy(positions_M),
            "mlm_labels": torch.from_numpy(labels_M),
            "nsp_labels": torch.from_numpy(nsp_B),
        }


class BatchLoader:
    """Endless iterator of this rank's micro batches, epoch after epoch, with a resumable cursor."""

    def __init__(self, dataset: InstanceDataset, micro_batch_size: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0, pad_id: int = 0, grad_accum_steps: int = 1, prefetch: int = 0):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.ds, self.B, self.rank, self.world, self.seed, self.pad_id = dataset, micro_batch_size, rank, world_size, seed, pad_id
        self.accum = grad_accum_steps
        self.G = micro_batch_size * grad_accum_steps * world_size  # the one global batch of a step
        self.epoch, self.index, self.micro = 0, 0, 0
        self._plans: dict[int, np.ndarray] = {}
        self._plan_lock = threading.Lock()
        self._prefetch_depth, self._prefetcher = prefetch, None
        if self.batches_per_epoch() == 0:
            raise UserError(
                f"{dataset.dir}: too few instances ({len(dataset)}) for one global batch of "
                f"{self.G} rows from a single length bin (micro_batch_size x grad_accum_steps x world size)"
            )

    def plan(self, epoch: int) -> np.ndarray:
        """[batches, G] row ids of one epoch: per-bin shuffles cut into G-row batches, then shuffled."""
        with self._plan_lock:  # the prefetch thread and the caller share the cache
            if epoch in self._plans:
                return self._plans[epoch]
            G = self.G
            rng = np.random.default_rng([self.seed, epoch])
            per_bin = [self._bin_batches(rows, rng) for rows in self._bin_rows()]
            # the bins' batches interleaved at random, each bin's in its order (its windows read in turn)
            label = np.repeat(np.arange(len(per_bin)), [len(x) for x in per_bin])
            label = label[rng.permutation(len(label))]
            plan = np.zeros((len(label), G), np.int64)
            for i, batches in enumerate(per_bin):
                plan[label == i] = batches
            self._plans = {k: v for k, v in self._plans.items() if k >= epoch - 1}  # keep two epochs at most
            self._plans[epoch] = plan
            return self._plans[epoch]

    def _bin_rows(self) -> list[np.ndarray]:
        return [np.flatnonzero(self.ds.bins == b) for b in np.unique(self.ds.bins)]

    def _bin_batches(self, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """[n, G] batches of one bin's rows (ascending, so grouped by block): its blocks in a shuffled order,
        taken in windows of about SHUFFLE_ROWS rows whose rows are shuffled together."""
        block_R = np.searchsorted(self.ds.block_first, rows, side="right") - 1
        blocks, inverse = np.unique(block_R, return_inverse=True)
        rank = np.empty(len(blocks), np.int64)
        rank[rng.permutation(len(blocks))] = np.arange(len(blocks))
        per_window = max(1, int(round(SHUFFLE_ROWS * len(blocks) / max(len(rows), 1))))
        window_R = rank[inverse] // per_window
        rows = rows[np.lexsort((rng.random(len(rows)), window_R))]
        n = len(rows) // self.G
        return rows[: n * self.G].reshape(n, self.G)

    def batches_per_epoch(self) -> int:
        """Global batches (optimizer steps) per epoch."""
        return int(sum(int(c) // self.G for c in np.unique(self.ds.bins, return_counts=True)[1]))

    def pad_length(self, rows: np.ndarray) -> int:
        """The bin's upper bound, so a bin always yields one shape (capped at max_seq_length)."""
        return int(self.ds.bins[rows[0]])  # data_jobs.instance_stats.bin_uppers: capped at max_seq_length

    def _step(self, pos: tuple[int, int, int]) -> tuple[int, int, int]:
        """The position after ``pos``; (epoch, batches, 0) at the end of an epoch, as saved cursors say."""
        epoch, index, micro = pos
        return (epoch, index, micro + 1) if micro + 1 < self.accum else (epoch, index + 1, 0)

    def _norm(self, pos: tuple[int, int, int]) -> tuple[int, int, int]:
        epoch, index, _ = pos
        return (epoch + 1, 0, 0) if index >= len(self.plan(epoch)) else pos

    def _advance(self, pos: tuple[int, int, int]) -> tuple[int, int, int]:
        return self._norm(self._step(pos))

    def _rows_at(self, pos: tuple[int, int, int]) -> np.ndarray:
        epoch, index, micro = self._norm(pos)
        k = micro * self.world + self.rank
        return self.plan(epoch)[index, k * self.B : (k + 1) * self.B]

    def _batch_at(self, pos: tuple[int, int, int]) -> dict[str, torch.Tensor]:
        rows = self._rows_at(pos)
        return self.ds.collate(rows, self.pad_length(rows), self.pad_id)

    def next_rows(self) -> np.ndarray:
        pos = self._norm((self.epoch, self.index, self.micro))
        rows = self._rows_at(pos)
        self.epoch, self.index, self.micro = self._step(pos)
        return rows

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        pos = self._norm((self.epoch, self.index, self.micro))
        batch = self._prefetched(pos) if self._prefetch_depth > 0 else self._batch_at(pos)
        self.epoch, self.index, self.micro = self._step(pos)
        return batch

    def _prefetched(self, pos: tuple[int, int, int]) -> dict[str, torch.Tensor]:
        """The batch at ``pos`` from the background thread (restarted if the cursor moved under it)."""
        if self._prefetcher is None or self._prefetcher.next_pos != pos:
            self.close()
            self._prefetcher = Prefetcher(self._batch_at, self._advance, pos, self._prefetch_depth)
        return self._prefetcher.get()

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.stop()
            self._prefetcher = None

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "micro": self.micro, "seed": self.seed, "plan": PLAN_VERSION,
                "global_batch_size": self.G, "micro_batch_size": self.B, "instances": len(self.ds),
                "world_size": self.world}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the cursor; another world size is fine if the global and micro batch are the same."""
        state = dict(state)
        if "global_batch_size" not in state:  # cursors before elastic resume: one micro batch a step
            state["global_batch_size"] = int(state.get("world_size", 0)) * int(state.get("micro_batch_size", 0))
            if self.accum != 1:
                state["global_batch_size"] = None  # its index counted micro batches: cannot map it
        mine = self.state_dict()
        if state.get("plan", 1) != PLAN_VERSION:
            raise UserError(f"loader cursor: checkpoint was taken by an older loader whose data order differs (plan "
                            f"{state.get('plan', 1)}, this one {PLAN_VERSION}); its rows cannot be continued exactly: "
                            "start a new run from its weights with init_from")
        for key in ("seed", "global_batch_size", "micro_batch_size", "instances"):
            if state.get(key) != mine[key]:
                raise UserError(
                    f"loader cursor: checkpoint was taken with {key}={state.get(key)}, this run has {mine[key]} "
                    "(the data order would differ; resume with the same data, global and micro batch)"
                )
        self.close()
        self.epoch, self.index, self.micro = int(state["epoch"]), int(state["index"]), int(state.get("micro", 0))
