"""Where the loader reads an instances dataset's files from: in place on a file system, or from a
bounded, verified node-local cache of an object store's files.

The loader reads exactly the Parquet files the instances job wrote; nothing is re-encoded. A dataset
on local disk (or a shared file system) is read in place: no copy at all. A dataset on an object store
(``s3://...``) is read through ``CACHE_ROOT/<manifest identity>/<file name>``: each file is downloaded
once per node when a rank first needs it, checked against the size and SHA-256 its manifest records,
and renamed into place only then (a partial or damaged download never lies under its final name). The
cache is keyed by the dataset's manifest identity, not its URI, so a rewritten dataset never reads a
stale file, and is bounded (``BERTFLOW_LOADER_CACHE_MB``, default 20 GB): the least recently used
files of any dataset are removed before a new one is fetched, never a file another rank holds open
(each holder keeps a shared flock on it). A damaged cached file is fetched again, not a traceback.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from contracts.common import UserError, sha256_file
from contracts.schema import FileEntry
from contracts.storage import LocalLocation, Location

ENV, LIMIT_ENV = "BERTFLOW_LOADER_CACHE", "BERTFLOW_LOADER_CACHE_MB"


def cache_root() -> Path:
    return Path(os.environ.get(ENV) or Path.home() / ".cache" / "bertflow" / "loader")


def cache_limit_bytes() -> int:
    return int(float(os.environ.get(LIMIT_ENV, "20000")) * 1e6)


class FileSource:
    """Local paths of a dataset's files: the files themselves, or verified cached copies."""

    def __init__(self, loc: Location, identity: str):
        self.loc, self.identity = loc, identity
        self._held: dict[str, int] = {}  # cached file -> fd holding its shared flock

    def path(self, entry: FileEntry) -> Path:
        if isinstance(self.loc, LocalLocation):
            return self.loc.path(entry.name)
        local = cache_root() / self.identity / entry.name
        if entry.name not in self._held:
            self._held[entry.name] = _fetch(self.loc, entry, local)
        os.utime(local)  # recently used: the last to be evicted
        return local

    def close(self) -> None:
        for fd in self._held.values():
            os.close(fd)
        self._held.clear()

    def __del__(self) -> None:
        self.close()


def _fetch(loc: Location, entry: FileEntry, local: Path) -> int:
    """``local`` holding ``entry``'s verified bytes (downloaded unless a sound copy is there); returns an
    fd holding a shared flock on it, so no other rank's eviction removes it while this rank reads it."""
    local.parent.mkdir(parents=True, exist_ok=True)
    with open(local.with_name(f".{local.name}.lock"), "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # one fetcher per file and node; the others wait, then use it
        if not _sound(local, entry):  # absent, truncated or damaged in place: fetch
            _make_room(entry.bytes)
            tmp = local.with_name(f".tmp-{local.name}")
            loc.download(entry.name, tmp)
            if tmp.stat().st_size != entry.bytes or sha256_file(tmp) != entry.sha256:
                tmp.unlink(missing_ok=True)
                raise UserError(f"{loc}/{entry.name}: size or checksum differs from its manifest (modified on the "
                                "store after the dataset was made?)")
            os.replace(tmp, local)
        fd = os.open(local, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd


def _sound(local: Path, entry: FileEntry) -> bool:
    """The cached copy is the manifest's file: its size and its checksum (a copy damaged in place keeps
    its size, and was once read as data). Hashed once per process and file, when a rank first opens it."""
    return local.is_file() and local.stat().st_size == entry.bytes and sha256_file(local) == entry.sha256


def _make_room(need: int) -> None:
    """Remove least recently used cached files (of any dataset) until ``need`` more bytes fit the limit;
    a file some rank holds (shared flock) is skipped."""
    files = [p for p in cache_root().glob("*/*") if p.is_file() and not p.name.startswith(".")]
    used = sum(p.stat().st_size for p in files)
    for p in sorted(files, key=lambda p: p.stat().st_mtime):
        if used + need <= cache_limit_bytes():
            return
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody reads it now
        except BlockingIOError:
            os.close(fd)
            continue
        size = p.stat().st_size
        p.unlink(missing_ok=True)
        os.close(fd)
        used -= size

