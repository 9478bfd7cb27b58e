"""Instance loader: manifest checks, length-binned global batches, elastic exact-resume cursor.

Shapes: B = micro batch, S = padded sequence length (the bin's upper bound), M = masked tokens in the
batch, G = global batch = B x grad_accum_steps x world size (the rows of one optimizer step).

Invariants
- The epoch plan is a pure function of (seed, epoch, dataset, G): every rank computes the same plan.
  Micro batch k of a global batch is its rows [k*B, (k+1)*B); rank r takes micro batches
  k = a*world + r for a = 0..accum-1. The B-row groups of a step therefore do not depend on how G is
  split into world x accumulation, which is what lets a run resume on another world size (elastic).
- A global batch holds rows of one length bin only (little padding); each bin's tail that does not
  fill a global batch is left out of that epoch (a different tail each epoch, since it is shuffled).
- The cursor (epoch, next global batch, next micro batch within it) is all the state.
- Storage: rows are read with positioned reads from a node-local decoded copy (``loader_cache``), so
  a rank's memory does not grow with the dataset's tokens; only the per-row index (offsets, lengths,
  bins: about 25 bytes a row) and the epoch plan (8 bytes a row) are in RAM. ``storage="mmap"`` maps
  the copy instead and ``storage="memory"`` keeps the old whole-load path (both for comparison).
- Collation is vectorised over flat values/offsets arrays (no per-row Python); a background thread
  collates the next micro batches (``prefetch``), which never changes what a batch holds.
"""
from __future__ import annotations

import mmap
import queue
import threading
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import pyarrow.parquet as pq
import torch

from bert_core.config import ModelConfig
from bert_core.loader_cache import interleave, open_cache, take_ranges
from data_jobs.ragged import gather_ranges
from contracts.common import UserError
from contracts.schema import Manifest

DEFAULT_BIN_SIZE = 32
RELEASE_EVERY = 64  # micro batches between two release_pages() calls (bounded RSS on mmap storage)


class _Ragged:
    """A list column as (values, offsets) numpy arrays; row i = values[offsets[i]:offsets[i+1]]."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        self.values, self.offsets = values, offsets

    @classmethod
    def from_chunks(cls, chunks: list) -> "_Ragged":
        vals, offs, base = [], [np.zeros(1, np.int64)], 0
        for arr in chunks:
            o = arr.offsets.to_numpy().astype(np.int64)
            # .values ignores a slice's start: take exactly the referenced range.
            vals.append(arr.values.slice(o[0], o[-1] - o[0]).to_numpy(zero_copy_only=False))
            offs.append(o[1:] - o[0] + base)
            base += int(o[-1] - o[0])
        values = np.concatenate(vals) if vals else np.zeros(0, np.uint16)
        return cls(values, np.concatenate(offs))

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def _positive_int(d: Path, totals: dict, key: str) -> int:
    value = totals[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserError(f"{d / 'manifest.json'}: totals.{key} is {value!r}, not a positive integer (manifest edited?)")
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


class InstanceDataset:
    """An instances dataset directory as flat columns (read on demand, mapped or loaded: ``storage``)."""

    def __init__(self, data_dir: str | Path, verify: str = "size", storage: str = "pread"):
        self.dir = Path(data_dir)
        self.manifest = Manifest.read(self.dir, kind="instances")
        problems = self.manifest.verify_files(self.dir, deep=(verify == "deep")) if verify != "none" else []
        if problems:
            raise UserError(f"{self.dir}: {len(problems)} bad file(s): {problems[0]}")
        totals = self.manifest.totals
        for key in ("vocab_size", "max_seq_length", "max_predictions_per_seq"):
            if key not in totals:
                raise UserError(f"{self.dir / 'manifest.json'}: totals lack {key!r}")
        self.vocab_size, self.max_seq_length, self.max_predictions = (
            _positive_int(self.dir, totals, k) for k in ("vocab_size", "max_seq_length", "max_predictions_per_seq"))
        self.vocab_hash = self.manifest.vocab_hash
        self.vocab_file = totals.get("vocab_file")
        _check_vocab_size(self.dir, self.vocab_size, self.vocab_file)
        self.bin_size = int(self.manifest.config.get("length_bin_size", DEFAULT_BIN_SIZE))
        if storage not in ("pread", "mmap", "memory"):
            raise ValueError(f"storage {storage!r}: choose pread, mmap or memory")
        self.storage = storage
        self._load() if storage == "memory" else self._open(storage)
        self._check_index()

    def _open(self, storage: str) -> None:
        """Columns of the node-local decoded copy (built on first use), read or memory-mapped."""
        maps = open_cache(self.dir, self.manifest, storage)
        self._maps = [m for m in maps.values() if isinstance(m, np.memmap)]  # for release_pages
        a = {k: m if not isinstance(m, np.ndarray) else np.asarray(m) for k, m in maps.items()}  # no memmap overhead
        self.rows, self.ids_off, self.m_off = a["rows"], a["ids_off"], a["m_off"]
        self.segment_a_len, self.nsp_label = a["sega"], a["nsp"]
        self.lengths = a["lens"]

    def _load(self) -> None:
        """The old path: every column of every file concatenated in RAM (kept for comparison)."""
        cols: dict[str, list] = {k: [] for k in ("input_ids", "segment_a_len", "masked_positions", "masked_ids", "nsp_label")}
        for entry in self.manifest.files:
            try:
                table = pq.read_table(self.dir / entry.name, columns=list(cols), memory_map=True)
            except Exception as err:  # pyarrow raises several types for a damaged file
                raise UserError(f"{self.dir / entry.name}: unreadable Parquet: {str(err).splitlines()[0]}") from None
            for k in cols:
                cols[k].extend(table.column(k).chunks)
        ids, mpos, mids = (_Ragged.from_chunks(cols[k]) for k in ("input_ids", "masked_positions", "masked_ids"))
        self.ids_off, self.m_off = ids.offsets, mpos.offsets
        self.rows = interleave(ids.values, ids.offsets, mpos.values, mids.values.astype(ids.values.dtype), mpos.offsets)
        flat = lambda k, dt: np.concatenate([c.to_numpy(zero_copy_only=False) for c in cols[k]]).astype(dt) if cols[k] else np.zeros(0, dt)
        self.segment_a_len = flat("segment_a_len", np.int64)
        self.nsp_label = flat("nsp_label", np.int64)
        self.lengths = ids.lengths()

    def _check_index(self) -> None:
        n = len(self.lengths)
        expected = self.manifest.totals.get("instances")
        if expected is not None and int(expected) != n:
            raise UserError(f"{self.dir}: manifest says {expected} instances, files hold {n}")
        if n and int(self.lengths.max()) > self.max_seq_length:
            raise UserError(f"{self.dir}: an instance is longer than max_seq_length {self.max_seq_length}")
        self.bins = ((np.maximum(self.lengths, 1).astype(np.int64) - 1) // self.bin_size).astype(np.int16)

    def release_pages(self) -> None:
        """Unmap the pages read so far from this process (they stay in the node's page cache, shared):
        random reads over an epoch would otherwise leave every touched page in the rank's RSS."""
        for m in getattr(self, "_maps", ()):
            if m._mmap is not None:
                m._mmap.madvise(mmap.MADV_DONTNEED)

    def __len__(self) -> int:
        return len(self.lengths)

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
        ids_starts = np.asarray(self.ids_off[rows], dtype=np.int64)
        lens = np.asarray(self.lengths[rows], dtype=np.int64)
        m_starts = np.asarray(self.m_off[rows], dtype=np.int64)
        m_lens = np.asarray(self.m_off[rows + 1], dtype=np.int64) - m_starts
        # one contiguous read per row (its record: ids, masked positions, masked ids), then split
        rec_lens = lens + 2 * m_lens
        recs = take_ranges(self.rows, ids_starts + 2 * m_starts, rec_lens)
        at = np.cumsum(rec_lens) - rec_lens
        col_S = np.arange(S, dtype=np.int64)
        valid_BS = col_S[None, :] < lens[:, None]
        ids_BS = np.full((B, S), pad_id, dtype=np.int64)
        ids_BS[valid_BS] = recs[gather_ranges(at, lens)]
        types_BS = (col_S[None, :] >= np.asarray(self.segment_a_len[rows], dtype=np.int64)[:, None]) & valid_BS
        row_M = np.repeat(np.arange(B, dtype=np.int64) * S, m_lens)
        positions_M = row_M + recs[gather_ranges(at + lens, m_lens)].astype(np.int64)
        labels_M = recs[gather_ranges(at + lens + m_lens, m_lens)].astype(np.int64)
        return {
            "input_ids": torch.from_numpy(ids_BS),
            "token_type_ids": torch.from_numpy(types_BS.astype(np.int64)),
            "attention_mask": torch.from_numpy(valid_BS.astype(np.int64)),
            "mlm_positions": torch.from_numpy(positions_M),
            "mlm_labels": torch.from_numpy(labels_M),
            "nsp_labels": torch.from_numpy(np.asarray(self.nsp_label[rows], dtype=np.int64)),
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
        self._collated = 0
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
            chunks = []
            for b in np.unique(self.ds.bins):
                rows = rng.permutation(np.flatnonzero(self.ds.bins == b))
                n = len(rows) // G
                chunks.append(rows[: n * G].reshape(n, G))
            plan = np.concatenate(chunks) if chunks else np.zeros((0, G), np.int64)
            self._plans = {k: v for k, v in self._plans.items() if k >= epoch - 1}  # keep two epochs at most
            self._plans[epoch] = plan[rng.permutation(len(plan))]
            return self._plans[epoch]

    def batches_per_epoch(self) -> int:
        """Global batches (optimizer steps) per epoch."""
        return int(sum(int(c) // self.G for c in np.unique(self.ds.bins, return_counts=True)[1]))

    def pad_length(self, rows: np.ndarray) -> int:
        """The bin's upper bound, so a bin always yields one shape (capped at max_seq_length)."""
        top = (int(self.ds.bins[rows[0]]) + 1) * self.ds.bin_size
        return min(top, self.ds.max_seq_length)

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
        self._collated += 1
        if self._collated % RELEASE_EVERY == 0:
            self.ds.release_pages()
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
            self._prefetcher = _Prefetcher(self._batch_at, self._advance, pos, self._prefetch_depth)
        return self._prefetcher.get()

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.stop()
            self._prefetcher = None

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "micro": self.micro, "seed": self.seed,
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
        for key in ("seed", "global_batch_size", "micro_batch_size", "instances"):
            if state.get(key) != mine[key]:
                raise UserError(
                    f"loader cursor: checkpoint was taken with {key}={state.get(key)}, this run has {mine[key]} "
                    "(the data order would differ; resume with the same data, global and micro batch)"
                )
        self.close()
        self.epoch, self.index, self.micro = int(state["epoch"]), int(state["index"]), int(state.get("micro", 0))


class _Prefetcher:
    """A daemon thread collating the micro batches after ``pos`` into a bounded queue, in order."""

    def __init__(self, make, advance, pos, depth: int):
        self.next_pos, self._advance = pos, advance
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(make, advance, pos), daemon=True, name="bert-loader")
        self._thread.start()

    def _run(self, make, advance, pos) -> None:
        while not self._stop.is_set():
            try:
                item = (pos, make(pos))
            except BaseException as err:  # handed to the consumer, raised there
                item = (pos, err)
            while not self._stop.is_set():
                try:
                    self._q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item[1], BaseException):
                return
            pos = advance(pos)

    def get(self) -> dict[str, torch.Tensor]:
        pos, batch = self._q.get()
        assert pos == self.next_pos, (pos, self.next_pos)
        if isinstance(batch, BaseException):
            raise batch
        self.next_pos = self._advance(pos)
        return batch

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
