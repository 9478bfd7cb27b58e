"""One writer per output directory: a lock file naming the holder's host and pid.

Two scheduled runs writing one directory once left a manifest vouching for files the other had
overwritten, and both exited 0. Every job that writes an output directory (shard, vocab, instances,
train, export, eval) holds ``output_lock(dir)`` while it writes; a second writer gets one line and exit 2.

The lock is a file created with O_EXCL (atomic on local file systems and NFSv3+), holding JSON
``{"host", "pid", "start", "argv"}``. A holder killed with SIGKILL leaves it behind: on the same host a
lock whose pid is gone (or whose pid now belongs to another process, by its start time) is stale and
taken over; a lock of another host is never guessed at, the line names it so a person can remove it.
Takeovers on one host are serialised by flock on the directory itself, so two runs finding the same
stale lock cannot both take it.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from contracts.common import UserError

LOCK_NAME = ".bertflow.lock"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (None if no such process or not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22, counted after the parenthesised command name (which may itself hold spaces).
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    except OverflowError:
        return True  # no pid at all (an edited lock): unknown, never taken over as stale
    now = _start_time(pid)
    return start is None or now is None or now == start  # a reused pid is another process


def _holder(path: Path) -> dict | None:
    try:
        h = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError):
        return {}  # half-written by a holder killed at that instant: treated as unknown, not stale
    return h if isinstance(h, dict) else {}  # a list or a scalar: not a holder record, unknown too


def _describe(h: dict) -> str:
    return f"host {h.get('host', '?')} pid {h.get('pid', '?')}"


def _try_create(path: Path, me: dict) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    except OSError as e:  # read-only or full file system, no permission
        raise UserError(f"{path}: cannot create the output lock: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(me))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:  # a full disk: no half-written lock left to block the next run
        path.unlink(missing_ok=True)
        raise UserError(f"{path}: cannot write the output lock: {e.strerror}") from None
    return True


def acquire(out: str | os.PathLike) -> tuple[Path, bool]:
    """Take the lock of directory ``out`` (created if missing); UserError naming a live holder.
    Returns the lock's path and whether the directory was created here."""
    d = Path(out)
    created = not d.exists()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{d}: cannot create output directory: {e.strerror}") from None
    if not d.is_dir():
        raise UserError(f"{d}: not a directory")
    path = d / LOCK_NAME
    host = socket.gethostname()
    me = {"host": host, "pid": os.getpid(), "start": _start_time(os.getpid()), "argv": sys.argv[:4]}
    if _try_create(path, me):
        return path, created
    dir_fd = os.open(d, os.O_RDONLY)
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX)
        h = _holder(path)
        if h is None and _try_create(path, me):  # released meanwhile
            return path, created
        h = h or {}
        if h.get("host") == host and isinstance(h.get("pid"), int) and not _alive(h["pid"], h.get("start")):
            path.unlink(missing_ok=True)  # stale: its holder died without releasing it
            if _try_create(path, me):
                print(f"bertflow: taking over the stale lock of dead {_describe(h)}: {path}", file=sys.stderr)
                return path, created
            h = _holder(path) or {}
    finally:
        os.close(dir_fd)  # closing releases the flock
    where = "" if h.get("host") == host else " (another host: remove the file if that run is gone)"
    raise UserError(f"{d}: output directory in use by another run ({_describe(h)}, lock {path}){where}")


def release(path: Path, created: bool = False) -> None:
    """Remove the lock if it is still ours (never another run's that took over a lock we lost), and
    the directory if this run created it and refused before writing anything (no empty leftovers)."""
    h = _holder(path)
    if h and h.get("pid") == os.getpid() and h.get("host") == socket.gethostname():
        path.unlink(missing_ok=True)
    if created:
        try:
            path.parent.rmdir()
        except OSError:
            pass  # not empty: the job wrote its output


def others(out: str | os.PathLike) -> list[Path]:
    """The entries of ``out`` other than the lock (what an ownership check looks at)."""
    d = Path(out)
    return [p for p in d.iterdir() if p.name != LOCK_NAME] if d.is_dir() else []


@contextmanager
def output_lock(out: str | os.PathLike) -> Iterator[Path]:
    """Hold the one-writer lock of ``out`` for the block (re-entrant within one process)."""
    key = str(Path(out).resolve())
    if key in _HELD:
        yield _HELD[key]
        return
    path, created = acquire(out)
    _HELD[key] = path
    try:
        yield path
    finally:
        del _HELD[key]
        release(path, created)


_HELD: dict[str, Path] = {}
