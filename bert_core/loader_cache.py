"""A node-local decoded copy of an instances dataset: flat numpy columns read on demand.

Why: Parquet is compressed and cannot be indexed by row without decoding whole pages, and loading
every column into RAM (the old loader) costs every rank the whole dataset. The columns are decoded
ONCE per node, one record batch at a time, into raw files. Each rank keeps the small per-row index
(offsets, lengths, segment-A lengths, NSP labels: 21 bytes a row) in RAM and reads each row it trains
on as ONE contiguous record with one positioned read (``storage="pread"``, the default): the pages
read stay in the node's page cache, shared by its ranks, and never count in a rank's RSS.
``storage="mmap"`` maps every file instead (kept for comparison: touched pages of a mapping are
file-backed RSS, so a rank's peak RSS grows with the dataset it reads).

Layout of ``CACHE_ROOT/<key>/`` (key = hash of the dataset path and its files' names, sizes,
mtimes and manifest SHA-256, so a rewritten dataset gets a new cache):

    rows.bin    row i's record: its token ids, masked positions, masked ids, all in the token
                dtype (uint16/uint32), starting at element ids_off[i] + 2 * m_off[i]
    ids_off.bin m_off.bin   int64 offsets (N + 1) of the token ids and of the masked tokens
    sega.bin  nsp.bin   lens.bin    segment-A length (uint16), NSP label (int8), length (uint16)
    meta.json           counts and dtypes; written last, so a cache without it is rebuilt

Concurrent builders (the ranks of one node) serialise on an flock; the first builds, the rest open it.
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
from data_jobs.ragged import gather_ranges

FORMAT = 2  # 2: one interleaved record per row (rows.bin) instead of three value files
ENV = "BERTFLOW_LOADER_CACHE"
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


VALUE_FILES = ("rows",)  # read by row ranges; the other files are the per-row index


def open_cache(data_dir: Path, manifest, storage: str = "pread") -> dict[str, Any]:
    """The dataset's columns, building the cache first if needed: every column a read-only memory
    map (``mmap``), or the index columns in RAM and the value columns as ``PreadColumn`` (``pread``)."""
    root = cache_root() / cache_key(data_dir, manifest)
    if not (root / "meta.json").is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        with open(root.parent / f"{root.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per node; the others wait, then open it
            if not (root / "meta.json").is_file():
                _build(data_dir, manifest, root)
    meta = json.loads((root / "meta.json").read_text(encoding="utf-8"))
    arrays: dict[str, Any] = {name: np.zeros(0, np.uint16) for name in ("rows", "sega", "nsp", "lens")}
    for name, (dt, n) in meta["arrays"].items():
        path, dtype = root / f"{name}.bin", np.dtype(dt)
        if n == 0:
            arrays[name] = np.zeros(0, dtype)
        elif storage == "mmap":
            arrays[name] = np.memmap(path, dtype=dtype, mode="r", shape=(n,))
        elif name in VALUE_FILES:
            arrays[name] = PreadColumn(path, dtype, n)
        else:
            arrays[name] = np.fromfile(path, dtype=dtype, count=n)
    return arrays


class PreadColumn:
    """A flat column on disk whose row ranges are read with ``os.pread``: no mapping (nothing of the
    file enters the process's RSS) and no file cursor (a prefetch thread and the caller may read at
    once). One system call per range; joining the returned bytes measured faster than ``preadv``
    into slices of one buffer (fewer Python objects per call)."""

    def __init__(self, path: Path, dtype: np.dtype, n: int):
        self.path, self.dtype, self.n = path, np.dtype(dtype), n
        self.fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.n

    def __del__(self) -> None:
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)
            self.fd = None

    def take(self, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """values[s:s+n] for every (s, n), concatenated (read-only)."""
        size, fd = self.dtype.itemsize, self.fd
        nbytes = (np.asarray(lens, dtype=np.int64) * size).tolist()
        offsets = (np.asarray(starts, dtype=np.int64) * size).tolist()
        data = b"".join([os.pread(fd, count, offset) for offset, count in zip(offsets, nbytes)])
        if len(data) != sum(nbytes):
            raise UserError(f"{self.path}: short read (decoded copy truncated?)")
        return np.frombuffer(data, dtype=self.dtype)


def take_ranges(values, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """values[s:s+n] for every (s, n), concatenated: positioned reads or a gather from an array."""
    if isinstance(values, PreadColumn):
        return values.take(starts, lens)
    return values[gather_ranges(starts, lens)]


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
                for batch in pq.ParquetFile(path).iter_batches(batch_size=65536, columns=[*RAGGED_COLS, *FLAT_COLS]):
                    _append(w, batch, bases)
            except (pa.ArrowException, OSError) as err:  # pyarrow raises several types for a damaged file
                raise UserError(f"{path}: unreadable Parquet: {str(err).splitlines()[0]}") from None
        arrays = w.close()
        write_json_atomic(tmp / "meta.json", {"format": FORMAT, "arrays": arrays})
        os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


RAGGED_COLS = ("input_ids", "masked_positions", "masked_ids")


def list_parts(arr: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets from 0) of a list array; .values ignores a slice's start, so slice by offsets."""
    o = arr.offsets.to_numpy().astype(np.int64)
    vals = arr.values.slice(o[0], o[-1] - o[0]).to_numpy(zero_copy_only=False)
    return vals, o - o[0]


def interleave(ids: np.ndarray, ids_off: np.ndarray, mpos: np.ndarray, mids: np.ndarray,
               m_off: np.ndarray) -> np.ndarray:
    """Rows' records (ids, masked positions, masked ids) back to back, in the token dtype; offsets
    from 0. Row i starts at ids_off[i] + 2 * m_off[i]."""
    n_ids, n_m = np.diff(ids_off), np.diff(m_off)
    starts = ids_off[:-1] + 2 * m_off[:-1]
    out = np.empty(len(ids) + 2 * len(mids), dtype=ids.dtype)
    out[gather_ranges(starts, n_ids)] = ids
    out[gather_ranges(starts + n_ids, n_m)] = mpos  # positions < max_seq_length fit any token dtype
    out[gather_ranges(starts + n_ids + n_m, n_m)] = mids
    return out


def _append(w: _Writer, batch: pa.RecordBatch, bases: dict[str, int]) -> None:
    (ids, ids_off), (mpos, m_off), (mids, _) = (list_parts(batch.column(c)) for c in RAGGED_COLS)
    w.add("rows", interleave(ids, ids_off, mpos, mids.astype(ids.dtype), m_off))
    w.add("lens", np.diff(ids_off).astype(np.uint16))
    for name, off in (("ids_off", ids_off), ("m_off", m_off)):
        w.add(name, off[1:] + bases[name])
        bases[name] += int(off[-1])
    for col, (name, dt) in FLAT_COLS.items():
        w.add(name, batch.column(col).to_numpy(zero_copy_only=False).astype(dt))
