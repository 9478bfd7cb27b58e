"""What a Ray Job submission would upload as its runtime env's ``working_dir``, and a one-line refusal
before Ray's own limit turns a forgotten output folder into an HTTP 413 halfway through a submit.

Ray 2.60's rules, read from the installed ``ray/_private/runtime_env/packaging.py`` (``_dir_travel``,
``_get_excludes``, ``get_excludes_from_ignore_files``, ``_zip_files``) and mirrored here:

- the working directory is walked from the top; a path is left out when it matches the runtime env's
  ``excludes`` (gitignore-style "gitwildmatch" patterns, relative to ``working_dir``) or the patterns of
  a ``.gitignore`` or ``.rayignore`` found in ``working_dir`` or any directory below it on the way
  (relative to that file's directory). ``.gitignore`` files are honoured by default; the environment
  variable ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1`` turns that off (``.rayignore`` always applies);
- a left-out directory is not entered; symlinks are followed;
- what remains is zipped without compression and POSTed to the dashboard, which refuses a body over
  100 MiB (``DASHBOARD_CLIENT_MAX_SIZE``) with HTTP 413.

``tests/flows/test_upload_check.py`` checks the file list against the zip Ray itself builds.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from contracts.common import UserError

DEFAULT_LIMIT_MB = 10.0  # far under Ray's 100 MiB: a data job's code is about 2 MB
RAY_LIMIT = "100 MiB"


def _matcher(base: Path, lines: Sequence[str]) -> Callable[[Path], bool]:
    from ray._private.thirdparty.pathspec import PathSpec  # the copy Ray matches with

    spec = PathSpec.from_lines("gitwildmatch", lines)
    return lambda p: spec.match_file(str(p.relative_to(base)))


def _ignore_files(d: Path, include_gitignore: bool) -> list[Callable[[Path], bool]]:
    out = []
    for name in ((".gitignore", ".rayignore") if include_gitignore else (".rayignore",)):
        f = d / name
        if f.is_file():
            out.append(_matcher(d, f.read_text(encoding="utf-8", errors="replace").splitlines()))
    return out


def gitignore_honoured() -> bool:
    """Whether Ray reads ``.gitignore`` files for this process's submissions (its default: yes)."""
    return os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1"


def upload_files(working_dir: str | Path, excludes: Sequence[str] = (),
                 include_gitignore: Optional[bool] = None) -> Iterator[tuple[str, int]]:
    """(path relative to ``working_dir``, bytes) of every file Ray would upload, in walk order."""
    root = Path(working_dir).absolute()
    if include_gitignore is None:
        include_gitignore = gitignore_honoured()
    if root.is_file():  # a .zip working_dir is uploaded as it is
        yield root.name, root.stat().st_size
        return
    stack: list[tuple[Path, list]] = [(root, [_matcher(root, list(excludes))])]
    while stack:
        path, matchers = stack.pop()
        matchers = matchers + _ignore_files(path, include_gitignore)  # as Ray: read before its own check
        if any(m(path) for m in matchers):
            continue
        if path.is_dir():
            stack.extend((child, matchers) for child in sorted(path.iterdir(), reverse=True))
        elif path.is_file():
            yield path.relative_to(root).as_posix(), path.stat().st_size


@dataclass
class UploadSummary:
    working_dir: Path
    total: int = 0
    files: int = 0
    by_entry: dict[str, int] = field(default_factory=dict)  # top-level entry ('out/' for a folder) -> bytes
    largest: tuple[str, int] = ("", 0)


def summarize(working_dir: str | Path, excludes: Sequence[str] = (),
              include_gitignore: Optional[bool] = None) -> UploadSummary:
    root = Path(working_dir).absolute()
    s = UploadSummary(root)
    for rel, size in upload_files(root, excludes, include_gitignore):
        top, _, rest = rel.partition("/")
        key = f"{top}/" if rest else top
        s.by_entry[key] = s.by_entry.get(key, 0) + size
        s.total += size
        s.files += 1
        if size > s.largest[1]:
            s.largest = (rel, size)
    return s


def mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def check_runtime_env(runtime_env: Optional[dict[str, Any]], source: str = "runtime env",
                      limit_mb: float = DEFAULT_LIMIT_MB, cwd: Optional[Path] = None) -> Optional[UploadSummary]:
    """Raise a one-line UserError when ``runtime_env``'s local ``working_dir`` would upload more than
    ``limit_mb``, naming the biggest entries; return the summary otherwise (None when nothing local is
    uploaded). ``source`` names where the runtime env came from (its file, or an option). A relative
    working_dir resolves against ``cwd`` (default: the current directory), as Ray resolves it."""
    if not runtime_env:
        return None
    wd, excludes = runtime_env.get("working_dir"), runtime_env.get("excludes") or []
    if not isinstance(excludes, list) or not all(isinstance(e, str) for e in excludes):
        raise UserError(f"{source}: excludes: expected a list of patterns, got {excludes!r}")
    if wd is None:
        return None
    if not isinstance(wd, str):
        raise UserError(f"{source}: working_dir: expected a path, got {wd!r}")
    if "://" in wd:
        return None  # a remote package (s3://, gs://, https://): nothing is uploaded from here
    path = Path(wd) if Path(wd).is_absolute() else (cwd or Path.cwd()) / wd
    if not path.exists():
        raise UserError(f"{source}: working_dir {wd}: no such directory")
    s = summarize(path, excludes)
    if s.total <= limit_mb * 1e6:
        return s
    big = sorted(s.by_entry.items(), key=lambda kv: -kv[1])
    top = [kv for kv in big[:3] if kv[1] >= s.total / 20] or big[:1]  # the entries that make the bulk
    entries = ", ".join(f"{k} {mb(v)}" for k, v in top)
    where = f"excludes in {source}" if source != "runtime env" and not source.startswith("--") else \
        "the runtime env's excludes"
    raise UserError(
        f"{source}: working_dir {wd} would upload {mb(s.total)} in {s.files} files ({entries}; largest file "
        f"{s.largest[0]} {mb(s.largest[1])}), over the {limit_mb:g} MB bertflow submits (Ray refuses "
        f"{RAY_LIMIT} with HTTP 413); add them to {where} or a .rayignore, or move outputs under runs/")
