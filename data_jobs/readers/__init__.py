"""Readers: raw inputs -> Documents (pure functions, no Ray; streaming, never a whole dump in memory).

    read_documents(config, stats)   every document of config.inputs, in a deterministic order
    expand_inputs(config)           the work units (files, built-in corpus parts) behind config.inputs
    read_unit(unit, config, stats)  the documents of one unit (what one Ray task reads)

Formats (``config.input_format``, or per file with "auto"): bert, books, wikiextractor, mediawiki,
jsonl, parquet; each also ``.gz``/``.bz2``/``.zst`` compressed. Damaged input is skipped and counted
in ``stats`` by reason (or stops the run with ``on_bad_input="fail"``); see docs/data-shard.md.
"""
from __future__ import annotations

import fnmatch
import glob
import os
import posixpath
import re
from pathlib import Path
from typing import Callable, Iterator, Optional

from contracts.common import UserError
from contracts.storage import is_uri
from data_jobs.readers.base import Document, ReadStats, Unit, encodable
from data_jobs.readers.mediawiki import read_mediawiki
from data_jobs.readers.plain import read_bert, read_books
from data_jobs.readers.tabular import read_jsonl, read_parquet
from data_jobs.readers.textio import base_name, probe
from data_jobs.readers.wikiextractor import read_wikiextractor

__all__ = [
    "Document", "ReadStats", "Unit", "READERS", "detect_format", "expand_inputs", "read_documents",
    "read_unit", "read_bert", "read_books", "read_wikiextractor", "read_mediawiki", "read_jsonl",
    "read_parquet",
]


def _read_builtin(path: str, source: str, config, stats: ReadStats) -> Iterator[Document]:
    from data_jobs.builtin_corpus import read_builtin  # imported late: it imports this package

    return read_builtin(path, source, config, stats)


Reader = Callable[[str, str, object, ReadStats], Iterator[Document]]
READERS: dict[str, Reader] = {
    "bert": read_bert,
    "books": read_books,
    "wikiextractor": read_wikiextractor,
    "mediawiki": read_mediawiki,
    "jsonl": read_jsonl,
    "parquet": read_parquet,
    "builtin": _read_builtin,
}
_GLOB_CHARS = re.compile(r"[*?\[]")
_SENTENCE_END = re.compile(r"[.!?:;\"'\u201d\u2019)\]]\s*$")


def detect_format(path: str, head: bytes) -> str:
    """Format of one file from its name (compression suffix ignored), else from its first bytes.

    Plain text is told apart by its line ends: in the BERT format nearly every line ends a sentence;
    in hard-wrapped prose most lines stop mid-sentence.
    """
    name = base_name(path).lower()
    if name.endswith(".parquet") or head.startswith(b"PAR1"):
        return "parquet"
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name.endswith(".xml"):
        return "mediawiki"
    text = head.decode("utf-8", errors="ignore").lstrip("\ufeff \t\r\n")
    if text.startswith(("<mediawiki", "<?xml")):
        return "mediawiki"
    if text.startswith("<doc"):
        return "wikiextractor"
    if text.startswith("{"):
        return "jsonl"
    if "*** START OF" in text.upper():
        return "books"
    lines = [ln for ln in text.replace("\r", "").split("\n")[:-1] if ln.strip()]  # last may be cut off
    if not lines:
        return "books"
    ends = sum(1 for ln in lines if _SENTENCE_END.search(ln))
    return "bert" if ends / len(lines) >= 0.6 else "books"


class _Budget:
    """At most ``limit`` input files in all (``max_input_files``): counted while listing, so ten million
    files are refused after a million are seen, not after all are listed."""

    def __init__(self, limit: int):
        self.limit, self.seen = limit, 0

    def take(self, n: int = 1) -> None:
        self.seen += n
        if self.seen > self.limit:
            raise UserError(f"inputs: more than {self.limit:,} files (max_input_files); the job keeps a record of "
                            "every file, so memory and time grow with their number: pack tiny files into JSONL "
                            "or Parquet (one record per document), or raise max_input_files")


def _files_of(inp: str, budget: Optional[_Budget] = None) -> list[Path]:
    """Files behind one input string (a file, a directory searched recursively, or a glob)."""
    budget = budget or _Budget(10**18)
    if _GLOB_CHARS.search(inp):
        # A directory the pattern matches is read like a directory given by name (never skipped).
        files = [f for p in sorted(glob.glob(inp, recursive=True)) for f in _files_of_path(Path(p), inp, budget)]
        if not files:
            raise UserError(f"{inp}: no files match this pattern")
        return files
    p = Path(inp)
    if not p.exists() and not p.is_symlink():
        raise UserError(f"{inp}: no such file or directory")
    files = _files_of_path(p, inp, budget)
    if not files:
        raise UserError(f"{inp}: directory holds no files")
    return files


def _files_of_path(p: Path, inp: str, budget: _Budget) -> list[Path]:
    """Files of one existing path; symlinked files and directories are followed (each directory once)."""
    if p.is_file():
        budget.take()
        return [p]
    if not p.is_dir():
        raise UserError(f"{_shown(p)}: broken symbolic link or not a regular file")

    def unreadable(err: OSError) -> None:
        # rglob silently skips a directory it may not list: the corpus would shrink without a word.
        raise UserError(f"{_shown(err.filename)}: cannot read directory: {err.strerror}")

    files, seen = [], set()
    for root, dirs, names in os.walk(p, onerror=unreadable, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:  # a symlink loop, or two links to one directory
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # hidden directories skipped
        for n in sorted(names):
            f = Path(root, n)
            if n.startswith("."):
                continue
            if not f.is_file():
                raise UserError(f"{_shown(f)}: broken symbolic link or not a regular file")
            budget.take()
            files.append(f)
    return files


def _shown(p) -> str:
    return str(p).encode("utf-8", "backslashreplace").decode("utf-8")


def expand_inputs(config) -> list[Unit]:
    """The units behind ``config.inputs``, sorted by source name; each file appears once.

    ``source`` (the prefix of every doc_id) is the path relative to the common parent of all input
    files, so doc_ids do not change when the corpus directory is moved or mounted elsewhere.
    """
    from data_jobs.builtin_corpus import units as builtin_units

    units: list[Unit] = []
    files: dict[str, Path] = {}
    objects: set[str] = set()
    budget = _Budget(getattr(config, "max_input_files", 10**18))
    for inp in config.inputs:
        if inp.startswith("builtin:"):
            units += builtin_units(inp)
            continue
        if is_uri(inp):
            found = _objects_of(inp)
            budget.take(len(found))
            objects.update(found)
            continue
        for f in _files_of(inp, budget):
            files.setdefault(os.path.realpath(f), f)
    if files:
        real = sorted(files)
        root = os.path.commonpath([os.path.dirname(r) for r in real])
        for r in real:
            units.append(Unit(r, Path(os.path.relpath(r, root)).as_posix(), config.input_format))
    if objects:  # named like local files: relative to the objects' common parent
        keys = sorted(u.split("://", 1)[1] for u in objects)
        root = posixpath.commonpath([posixpath.dirname(k) for k in keys])
        scheme = next(iter(objects)).split("://", 1)[0]
        units += [Unit(f"{scheme}://{k}", posixpath.relpath(k, root), config.input_format) for k in keys]
    seen: set[str] = set()
    out = []
    for u in sorted(units, key=lambda u: u.source):
        if u.source not in seen:
            seen.add(u.source)
            out.append(u)
    return out


def _objects_of(inp: str) -> list[str]:
    """The objects behind an object-store input (``s3://bucket/prefix``, or a glob such as
    ``s3://bucket/corpus/*.txt.gz``), as URIs; hidden names skipped."""
    from contracts.storage import location

    glob_at = _GLOB_CHARS.search(inp)
    base = inp[: glob_at.start()].rsplit("/", 1)[0] if glob_at else inp.rstrip("/")
    names = [m.name for m in location(base).list() if not any(p.startswith(".") for p in m.name.split("/"))]
    if glob_at:
        names = [n for n in names if fnmatch.fnmatchcase(f"{base}/{n}", inp)]
        if not names:
            raise UserError(f"{inp}: no objects match this pattern")
    elif not names:  # one object named in full
        parent, name = base.rsplit("/", 1)
        if location(parent).head(name) is None:
            raise UserError(f"{inp}: no such object or prefix")
        return [base]
    return [f"{base}/{n}" for n in names]


def read_unit(unit: Unit, config, stats: ReadStats) -> Iterator[Document]:
    """Documents of one unit that pass ``min_sentences``; everything else is counted in ``stats``."""
    fmt = unit.fmt
    if not encodable(unit.path):
        # Its doc_ids could not be written to Parquet/JSON: skipped and counted, never a traceback.
        stats.bad_file(unit.path, "file_name_not_utf8", "rename it")
        return
    if fmt != "builtin":
        problem, head = probe(unit.path) if not unit.path.endswith(".parquet") else (None, b"")
        if problem == "binary" and (fmt == "parquet" or head.startswith(b"PAR1")):
            problem = None
        if problem:
            stats.bad_file(unit.path, problem)
            return
        if fmt == "auto":
            fmt = detect_format(unit.path, head)
    skipped = sum(stats.files_skipped.values())
    for doc in READERS[fmt](unit.path, unit.source, config, stats):
        if len(doc.sentences) < config.min_sentences:
            stats.drop("too_few_sentences")
            continue
        stats.kept += 1
        yield doc
    # Each file is counted once: read, or skipped as a whole (a reader may skip it only once it looked
    # inside: a WikiExtractor file without <doc>, an unreadable Parquet file).
    if sum(stats.files_skipped.values()) == skipped:
        stats.files_read += 1


def read_documents(config, stats: ReadStats | None = None) -> Iterator[Document]:
    """Every document of ``config.inputs`` (single process; the shard job spreads units over Ray)."""
    stats = stats if stats is not None else ReadStats(strict=config.on_bad_input == "fail")
    for unit in expand_inputs(config):
        yield from read_unit(unit, config, stats)
