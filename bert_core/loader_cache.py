"""A node-local, memory-mapped copy of an instances dataset: flat numpy columns read on demand.

Why: Parquet is compressed and cannot be indexed by row without decoding whole pages, and loading
every column into RAM (the old loader) costs every rank the whole dataset. The columns are decoded
ONCE per node, one record batch at a time, into raw files; each rank then memory-maps them, so a
rank's anonymous memory does not grow with the dataset and the pages it touches are the rows it
trains on (shared page cache across the ranks of a node).

Layout of ``CACHE_ROOT/<key>/`` (key = hash of the dataset path and its files' names, sizes,
mtimes and manifest SHA-256, so a rewritten dataset gets a new cache):

    ids.bin   ids_off.bin   token ids (uint16/uint32) and int64 row offsets (N + 1)
    mpos.bin  mids.bin  m_off.bin   masked positions (uint16), masked ids, int64 offsets (N + 1)
    sega.bin  nsp.bin   lens.bin    segment-A length (uint16), NSP label (int8), length (uint16)
    meta.json           counts and dtypes; written last, so a cache without it is rebuilt

Concurrent builders (the ranks of one node) serialise on an flock; the first builds, the rest map it.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from contracts.common import UserError, stable_hash, write_json_atomic

FORMAT = 1
ENV = "BERTFLOW_LOADER_CACHE"
LIST_COLS = {"input_ids": ("ids", "ids_off"), "masked_positions": ("mpos", "m_off"), "masked_ids": ("mids", None)}
FLAT_COLS = {"segment_a_len": ("sega", np.uint16), "nsp_label": ("nsp", np.int8)}


def cache_root() -> Path:
    return Path(os.environ.get(ENV) or Path.home() / ".cache" / "bertflow" / "loader")


def cache_key(data_dir: Path, manifest) -> str:
    files = []
    for e in manifest.files:
        try:
            st = (data_dir / e.name).stat()
        except OSError as err:
            raise UserError(f"{data_dir / e.name}: {err.strerror or err}") from None
        files.append([e.name, e.sha256, st.st_size, st.st_mtime_ns])
    return stable_hash({"format": FORMAT, "dir": str(data_dir.resolve()), "files": files})


def open_cache(data_dir: Path, manifest) -> dict[str, np.ndarray]:
    """The dataset's columns as read-only memory maps, building the cache first if needed."""
    root = cache_root() / cache_key(data_dir, manifest)
    if not (root / "meta.json").is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        with open(root.parent / f"{root.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per node; the others wait, then map
            if not (root / "meta.json").is_file():
                _build(data_dir, manifest, root)
    meta = json.loads((root / "meta.json").read_text(encoding="utf-8"))
    arrays = {name: np.zeros(0, np.uint16) for name in ("ids", "mpos", "mids", "sega", "nsp", "lens")}  # empty data
    arrays.update({name: _map(root / f"{name}.bin", np.dtype(dt), n) for name, (dt, n) in meta["arrays"].items()})
    return arrays


def _map(path: Path, dtype: np.dtype, n: int) -> np.ndarray:
    if n == 0:
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))


class _Writer:
    """Appends numpy chunks to raw files and keeps the counts for meta.json."""

    def __init__(self, root: Path):
        self.root, self.files, self.counts, self.dtypes = root, {}, {}, {}

    def add(self, name: str, values: np.ndarray) -> None:
        if name not in self.files:
            self.files[name] = open(self.root / f"{name}.bin", "wb")
            self.counts[name], self.dtypes[name] = 0, values.dtype.str
        self.files[name].write(np.ascontiguousarray(values).tobytes())
        self.counts[name] += len(values)

    def close(self) -> dict[str, Any]:
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()
        return {k: [self.dtypes[k], self.counts[k]] for k in self.files}


def _build(data_dir: Path, manifest, root: Path) -> None:
    tmp = root.parent / f".tmp-{root.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    w = _Writer(tmp)
    bases = {"ids_off": 0, "m_off": 0}
    w.add("ids_off", np.zeros(1, np.int64))
    w.add("m_off", np.zeros(1, np.int64))
    try:
        for entry in manifest.files:
            path = data_dir / entry.name
            try:
                for batch in pq.ParquetFile(path).iter_batches(batch_size=65536, columns=[*LIST_COLS, *FLAT_COLS]):
                    _append(w, batch, bases)
            except (pa.ArrowException, OSError) as err:  # pyarrow raises several types for a damaged file
                raise UserError(f"{path}: unreadable Parquet: {str(err).splitlines()[0]}") from None
        arrays = w.close()
        write_json_atomic(tmp / "meta.json", {"format": FORMAT, "arrays": arrays})
        os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _list_parts(arr: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets from 0) of a list array; .values ignores a slice's start, so slice by offsets."""
    o = arr.offsets.to_numpy().astype(np.int64)
    vals = arr.values.slice(o[0], o[-1] - o[0]).to_numpy(zero_copy_only=False)
    return vals, o - o[0]


def _append(w: _Writer, batch: pa.RecordBatch, bases: dict[str, int]) -> None:
    for col, (vals_name, off_name) in LIST_COLS.items():
        vals, off = _list_parts(batch.column(col))
        w.add(vals_name, vals)
        if off_name is not None:
            w.add(off_name, off[1:] + bases[off_name])
            bases[off_name] += int(off[-1])
            if col == "input_ids":
                w.add("lens", np.diff(off).astype(np.uint16))
    for col, (name, dt) in FLAT_COLS.items():
        w.add(name, batch.column(col).to_numpy(zero_copy_only=False).astype(dt))
