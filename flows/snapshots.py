"""Where a continual source's snapshots come from (``ContinualConfig.layout``):

- ``folders``: every sub-folder of the source is a snapshot, in name order (dated folders such as
  2026-12-01); a folder with a firing record is done.
- ``new_files``: the source is one flat folder (or object-store prefix) that files land in. Each firing
  takes the files that no firing record names as one new snapshot: ``<n>-<hash>``, n counting the
  snapshots of this layout decided so far (so names sort in firing order) and the hash naming the files
  (name, size, etag). A file is known by (name, size, etag): one replaced or appended to is new again, and
  the documents it held before are dropped as ``seen_earlier`` by the shard job. A firing that fails writes
  no record: the next firing sees the same files under the same name and resumes, unless more files
  landed meanwhile (then they join the snapshot, under a new name).

Only the top level is read in ``new_files``; sub-folders and hidden files are ignored and said so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from contracts.common import UserError, stable_hash
from contracts.storage import is_uri, location

SNAPSHOT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass
class Pending:
    """A snapshot no firing has decided: its name, the inputs its shard stage reads and, in the
    ``new_files`` layout, the files it holds ([name, size, etag] each, recorded with the firing)."""

    name: str
    inputs: list[str]
    files: Optional[list[list]] = field(default=None)


def inside(out: str, source: str) -> bool:
    """Whether ``out`` is ``source`` or lies under it: two local paths (resolved), or two object-store
    prefixes (``s3://b/corpus-2`` is not under ``s3://b/corpus``)."""
    if is_uri(out) != is_uri(source):
        return False
    if is_uri(out):
        o, s = out.rstrip("/"), source.rstrip("/")
        return o == s or o.startswith(s + "/")
    return Path(out) == Path(source) or Path(source) in Path(out).parents


def _check_dir(source: str) -> None:
    if not is_uri(source):
        d = Path(source)
        if not d.is_dir():
            raise UserError(f"source: {source} is not a directory" if d.exists() else f"source: {source} not found")


def snapshots_in(source: str) -> tuple[list[str], list[str]]:
    """(the snapshot folders under ``source``, in name order; names ignored: files, hidden, odd names)."""
    names: set[str] = set()
    ignored: set[str] = set()
    _check_dir(source)
    if is_uri(source):
        for meta in location(source).list():
            head, sep, _ = meta.name.partition("/")
            (names if sep else ignored).add(head)
    else:
        for p in Path(source).iterdir():
            (names if p.is_dir() else ignored).add(p.name)
    odd = {n for n in names if not SNAPSHOT_NAME.match(n) or n.startswith(".")}
    return sorted(names - odd), sorted(ignored | odd)


def files_in(source: str) -> tuple[list[list], list[str]]:
    """([name, size, etag] of every file at the top of ``source``, by name; what is ignored there:
    sub-folders and hidden files)."""
    _check_dir(source)
    files, ignored = [], set()
    for meta in location(source).list():
        head, sep, _ = meta.name.partition("/")
        if sep or head.startswith("."):
            ignored.add(head)
        else:
            files.append([meta.name, meta.size, meta.etag])
    return files, sorted(ignored)


def pending_new_files(source: str, records: Iterable[dict]) -> tuple[list[Pending], list[str]]:
    """At most one snapshot: the files of ``source`` that no firing record (``records``) names."""
    files, ignored = files_in(source)
    records = [r for r in records if isinstance(r.get("files"), list)]
    known = {tuple(f) for r in records for f in r["files"]}
    new = [f for f in files if tuple(f) not in known]
    if not new:
        return [], ignored
    name = f"{len(records) + 1:05d}-{stable_hash(new)[:8]}"
    return [Pending(name, [f"{source.rstrip('/')}/{f[0]}" for f in new], new)], ignored
