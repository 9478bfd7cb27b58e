"""Parquet instance loader: manifest checks, rank-balanced length-binned batches, exact resume cursor.

Shapes: B = micro batch, S = padded sequence length (the bin's upper bound), M = masked tokens in the
batch, G = B x world (one global micro batch).

Invariants
- The epoch plan is a pure function of (seed, epoch, world size, micro batch, dataset): every rank
  computes the same plan and takes its own B-row slice of each global micro batch, so every rank gets
  exactly the same number of batches whatever the shard sizes, and all ranks of one step share a bin.
- A global micro batch holds rows of one length bin only (little padding); each bin's tail that does
  not fill a global batch is left out of that epoch (a different tail each epoch, since it is shuffled).
- The cursor (epoch, index of the next global batch) is all the state: resuming continues with
  exactly the next batch.
- Collation is vectorised over the Arrow offsets/values buffers (no per-row Python).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import pyarrow.parquet as pq
import torch

from bert_core.config import ModelConfig
from contracts.common import UserError
from contracts.schema import Manifest

DEFAULT_BIN_SIZE = 32


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


def _gather_ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), vectorised."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    shift = np.repeat(starts - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return shift + np.arange(total, dtype=np.int64)


class InstanceDataset:
    """An instances dataset directory, loaded once into flat numpy arrays (uint16 token ids)."""

    def __init__(self, data_dir: str | Path, verify: str = "size"):
        self.dir = Path(data_dir)
        self.manifest = Manifest.read(self.dir, kind="instances")
        problems = self.manifest.verify_files(self.dir, deep=(verify == "deep")) if verify != "none" else []
        if problems:
            raise UserError(f"{self.dir}: {len(problems)} bad file(s): {problems[0]}")
        totals = self.manifest.totals
        for key in ("vocab_size", "max_seq_length", "max_predictions_per_seq"):
            if key not in totals:
                raise UserError(f"{self.dir / 'manifest.json'}: totals lack {key!r}")
        self.vocab_size = int(totals["vocab_size"])
        self.max_seq_length = int(totals["max_seq_length"])
        self.max_predictions = int(totals["max_predictions_per_seq"])
        self.vocab_hash = self.manifest.vocab_hash
        self.vocab_file = totals.get("vocab_file")
        self.bin_size = int(self.manifest.config.get("length_bin_size", DEFAULT_BIN_SIZE))
        self._load()

    def _load(self) -> None:
        cols: dict[str, list] = {k: [] for k in ("input_ids", "segment_a_len", "masked_positions", "masked_ids", "nsp_label")}
        for entry in self.manifest.files:
            try:
                table = pq.read_table(self.dir / entry.name, columns=list(cols), memory_map=True)
            except Exception as err:  # pyarrow raises several types for a damaged file
                raise UserError(f"{self.dir / entry.name}: unreadable Parquet: {str(err).splitlines()[0]}") from None
            for k in cols:
                cols[k].extend(table.column(k).chunks)
        self.input_ids = _Ragged.from_chunks(cols["input_ids"])
        self.masked_positions = _Ragged.from_chunks(cols["masked_positions"])
        self.masked_ids = _Ragged.from_chunks(cols["masked_ids"])
        flat = lambda k, dt: np.concatenate([c.to_numpy(zero_copy_only=False) for c in cols[k]]).astype(dt) if cols[k] else np.zeros(0, dt)
        self.segment_a_len = flat("segment_a_len", np.int64)
        self.nsp_label = flat("nsp_label", np.int64)
        self.lengths = self.input_ids.lengths()
        n = len(self.lengths)
        expected = self.manifest.totals.get("instances")
        if expected is not None and int(expected) != n:
            raise UserError(f"{self.dir}: manifest says {expected} instances, files hold {n}")
        if n and int(self.lengths.max()) > self.max_seq_length:
            raise UserError(f"{self.dir}: an instance is longer than max_seq_length {self.max_seq_length}")
        self.bins = (np.maximum(self.lengths, 1) - 1) // self.bin_size

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
        starts = self.input_ids.offsets[rows]
        lens = self.lengths[rows]
        col_S = np.arange(S, dtype=np.int64)
        valid_BS = col_S[None, :] < lens[:, None]
        idx_BS = np.where(valid_BS, starts[:, None] + col_S[None, :], 0)
        ids_BS = np.where(valid_BS, self.input_ids.values[idx_BS], pad_id).astype(np.int64)
        types_BS = (col_S[None, :] >= self.segment_a_len[rows][:, None]) & valid_BS
        m_starts = self.masked_positions.offsets[rows]
        m_lens = self.masked_positions.lengths()[rows]
        gather_M = _gather_ranges(m_starts, m_lens)
        row_M = np.repeat(np.arange(B, dtype=np.int64) * S, m_lens)
        positions_M = row_M + self.masked_positions.values[gather_M].astype(np.int64)
        labels_M = self.masked_ids.values[gather_M].astype(np.int64)
        return {
            "input_ids": torch.from_numpy(ids_BS),
            "token_type_ids": torch.from_numpy(types_BS.astype(np.int64)),
            "attention_mask": torch.from_numpy(valid_BS.astype(np.int64)),
            "mlm_positions": torch.from_numpy(positions_M),
            "mlm_labels": torch.from_numpy(labels_M),
            "nsp_labels": torch.from_numpy(self.nsp_label[rows]),
        }


class BatchLoader:
    """Endless iterator of this rank's micro batches, epoch after epoch, with a resumable cursor."""

    def __init__(self, dataset: InstanceDataset, micro_batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0, pad_id: int = 0):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.ds, self.B, self.rank, self.world, self.seed, self.pad_id = dataset, micro_batch_size, rank, world_size, seed, pad_id
        self.epoch, self.index = 0, 0
        self._plan_epoch: Optional[int] = None
        self._plan = np.zeros((0, self.B * world_size), np.int64)
        if self.batches_per_epoch() == 0:
            raise UserError(
                f"{dataset.dir}: too few instances ({len(dataset)}) for one global micro batch of "
                f"{self.B * world_size} rows from a single length bin (micro_batch_size x world size)"
            )

    def plan(self, epoch: int) -> np.ndarray:
        """[batches, G] row ids of one epoch: per-bin shuffles cut into G-row batches, then shuffled."""
        if self._plan_epoch == epoch:
            return self._plan
        G = self.B * self.world
        rng = np.random.default_rng([self.seed, epoch])
        chunks = []
        for b in np.unique(self.ds.bins):
            rows = rng.permutation(np.flatnonzero(self.ds.bins == b))
            n = len(rows) // G
            chunks.append(rows[: n * G].reshape(n, G))
        plan = np.concatenate(chunks) if chunks else np.zeros((0, G), np.int64)
        self._plan, self._plan_epoch = plan[rng.permutation(len(plan))], epoch
        return self._plan

    def batches_per_epoch(self) -> int:
        G = self.B * self.world
        return int(sum(int(c) // G for c in np.unique(self.ds.bins, return_counts=True)[1]))

    def pad_length(self, rows: np.ndarray) -> int:
        """The bin's upper bound, so a bin always yields one shape (capped at max_seq_length)."""
        top = (int(self.ds.bins[rows[0]]) + 1) * self.ds.bin_size
        return min(top, self.ds.max_seq_length)

    def next_rows(self) -> np.ndarray:
        plan = self.plan(self.epoch)
        if self.index >= len(plan):
            self.epoch, self.index = self.epoch + 1, 0
            plan = self.plan(self.epoch)
        rows = plan[self.index, self.rank * self.B : (self.rank + 1) * self.B]
        self.index += 1
        return rows

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        rows = self.next_rows()
        return self.ds.collate(rows, self.pad_length(rows), self.pad_id)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "world_size": self.world,
                "micro_batch_size": self.B, "instances": len(self.ds)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self.state_dict()
        for key in ("seed", "world_size", "micro_batch_size", "instances"):
            if state.get(key) != mine[key]:
                raise UserError(
                    f"loader cursor: checkpoint was taken with {key}={state.get(key)}, this run has {mine[key]} "
                    "(the data order would differ; resume with the same data, world size and batch)"
                )
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
