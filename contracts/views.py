"""Small inputs read by local-file code (GLUE/SQuAD/CoNLL task data, a vocab file, a Hugging Face model
directory) given as an object-store URI: a node-local copy, named by what the store holds.

    local_view("s3://bucket/glue")            -> /scratch/bertflow-view-<key>/glue/...   (a prefix)
    local_view("s3://bucket/squad/dev.json")  -> /scratch/bertflow-view-<key>/dev.json   (one object)
    local_view("data/glue")                   -> Path("data/glue")                        (local: itself)

The key hashes the URI and every object's name, size and version tag, so a changed object is fetched
anew and the jobs of a node share one copy. The copy is downloaded into a temporary directory (each file
checked against its listed size) and renamed into place whole: a copy that exists is complete. The
``VIEWS_KEEP`` most recently used copies are kept; older ones (only ``bertflow-view-*`` directories,
this module's names) are removed after an hour unused. Whether the copy is the right content is the
readers' business (they read it as they would a local file) and the stage's (its status compares inputs
by content identity).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from contracts.common import UserError
from contracts.storage import Meta, is_uri, location, scratch_root

PREFIX = "bertflow-view-"
VIEWS_KEEP = 8


def _objects(uri: str) -> tuple[str, list[Meta]]:
    """("file", [its meta]) for one object, ("dir", [every object below]) for a prefix."""
    parent, _, name = uri.rstrip("/").rpartition("/")
    if name and not uri.endswith("/") and "://" in parent:
        meta = location(parent).head(name)
        if meta is not None:
            return "file", [meta]
    below = location(uri.rstrip("/")).list()
    if not below:
        raise UserError(f"{uri}: not found (no object and no prefix of that name)")
    return "dir", below


def view_of(root: str | os.PathLike, *parts: str) -> Path:
    """``root/parts`` as a local path: joined for a local root; for an object-store root, this node's copy
    of just that object or prefix (one GLUE task's directory, not every task's)."""
    if not is_uri(root):
        return Path(root).joinpath(*parts)
    return local_view("/".join([str(root).rstrip("/"), *parts]))


def check_exists(uri: str, what: str) -> None:
    """One line naming ``what`` (an option) and ``uri`` when the store holds no object or prefix there."""
    try:
        _objects(uri.rstrip("/"))
    except UserError:
        raise UserError(f"{what}: {uri} not found") from None


def _key(uri: str, kind: str, metas: list[Meta]) -> str:
    return hashlib.sha256(repr((uri, kind, [(m.name, m.size, m.etag) for m in metas])).encode()).hexdigest()


def local_view(path: str | os.PathLike) -> Path:
    """``path`` itself where it is local; else the node-local copy of the object or prefix (see above)."""
    if not is_uri(path):
        return Path(path)
    uri = str(path).rstrip("/")
    kind, metas = _objects(uri)
    key = _key(uri, kind, metas)
    root = scratch_root()
    base = uri.rpartition("/")[2]
    final = root / f"{PREFIX}{key[:24]}" / base

    def fill(dest: Path) -> None:
        if kind == "file":
            location(uri.rpartition("/")[0]).download(base, dest)
            _check_size(dest, metas[0], uri)
            return
        loc = location(uri)
        for m in metas:
            if not inside(m.name):
                raise UserError(f"{uri}/{m.name}: an object name that leaves its prefix cannot be copied")
            (dest / m.name).parent.mkdir(parents=True, exist_ok=True)
            loc.download(m.name, dest / m.name)
            _check_size(dest / m.name, m, f"{uri}/{m.name}")

    if not final.exists():
        fetched_whole(final, fill)
    os.utime(final.parent)
    prune_copies(root, PREFIX, final.parent, VIEWS_KEEP)
    return final


def fetched_whole(final: Path, fill: Callable[[Path], None]) -> None:
    """Make ``final`` (a file or directory alone in its own scratch directory ``final.parent``) appear
    whole: ``fill`` writes it into a fresh temporary directory beside, renamed into place in one step, so
    a copy that exists is complete; one another job of this node put there first is kept."""
    work = Path(tempfile.mkdtemp(prefix="bertflow-fetch-", dir=final.parent.parent))
    try:
        fill(work / final.name)
        try:
            os.rename(work, final.parent)
        except OSError:  # another job of this node put the same copy there first
            if not final.exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prune_copies(root: Path, prefix: str, keep: Path, n: int) -> None:
    """Of the ``prefix*`` directories in ``root`` (one kind of node-local copy, named by this program),
    keep ``keep`` and the ``n - 1`` other most recently used; remove older ones unused for an hour."""
    copies = sorted((p for p in root.glob(f"{prefix}*") if p != keep and p.is_dir()),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for old in copies[n - 1:]:
        if time.time() - old.stat().st_mtime > 3600:
            shutil.rmtree(old, ignore_errors=True)


def inside(rel: str) -> bool:
    """A relative name that stays below its directory or prefix (a listed or hand-edited name cannot
    make us write or delete elsewhere)."""
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def _check_size(local: Path, meta: Meta, uri: str) -> None:
    size = local.stat().st_size
    if size != meta.size:
        raise UserError(f"{uri}: fetched {size} bytes, the store lists {meta.size} (changed while copied? run again)")
