"""The writer lock of an output location, for object stores and file systems alike: a lease.

A lease is one small object, ``.bertflow.lock``, holding ``{"owner", "host", "pid", "start", "argv",
"expires"}``. It is taken by a conditional create (If-None-Match: * on S3, ``os.link`` locally), so of
two writers racing for one location exactly one wins. Its holder renews ``expires`` every third of the
TTL by a compare-and-swap on the version it wrote (If-Match): a holder that stalled past its expiry and
was taken over finds out at its next renewal and stops before it commits anything (``Lease.check``).
A lock is taken over only when it has expired, or when it names a process of this host that is gone (a
``kill -9``'d run on the same machine need not wait for its expiry). Releasing replaces the lock with a
"released" record by the same compare-and-swap, so a holder never overwrites a lock someone else took;
the record is then removed (locally under the directory's flock; on a store if it is still the one
written), so a location is left holding only what the run wrote.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Optional

from contracts.common import UserError
from contracts.storage import LocalLocation, Location

LOCK_NAME = ".bertflow.lock"
DEFAULT_TTL_S = float(os.environ.get("BERTFLOW_LOCK_TTL_S", "120"))


def _start_time(pid: int) -> Optional[str]:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _dead_here(h: dict) -> bool:
    """The holder is a process of this host that no longer runs (or whose pid is now another process)."""
    pid = h.get("pid")
    if h.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):  # OverflowError: no pid at all (an edited lock)
        return False
    now = _start_time(pid)
    return h.get("start") is not None and now is not None and now != h.get("start")


class Lease:
    """A held lock: renewed in the background until released; ``check()`` before committing."""

    def __init__(self, loc: Location, body: dict, etag: str, ttl: float):
        self.loc, self.body, self.etag, self.ttl = loc, body, etag, ttl
        self.lost: Optional[str] = None
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        self._thread = threading.Thread(target=self._renew_loop, daemon=True, name="bertflow-lease")
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            self.renew()

    def renew(self) -> bool:
        with self._mutex:
            if self.lost or self._stop.is_set():
                return not self.lost
            body = {**self.body, "expires": time.time() + self.ttl}
            try:
                etag = self.loc.replace_if(LOCK_NAME, _dump(body), self.etag)
            except (OSError, UserError) as err:  # the store unreachable for a moment: the next try may work
                print(f"bertflow: warning: could not renew the lock {self.loc}/{LOCK_NAME}: {err}", file=sys.stderr)
                return True
            if etag is None:
                self.lost = f"{self.loc}: the output lock was taken over by another run (this run stalled past its expiry)"
                return False
            self.body, self.etag = body, etag
            return True

    def check(self) -> None:
        """Raise if the lease was lost: nothing may be committed by a writer that no longer holds it."""
        if self.lost:
            raise UserError(self.lost)

    def release(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._mutex:
            if self.lost:
                return
            gone = {**self.body, "released": True, "expires": 0}
            etag = self.loc.replace_if(LOCK_NAME, _dump(gone), self.etag)
            if etag is None:
                return
            if isinstance(self.loc, LocalLocation):
                _delete_local_if(self.loc, etag)
            else:
                # No conditional delete on the store: remove the "released" record if it is still ours.
                # Should another run take the location in between, its lease finds its lock gone at the
                # next renewal and it stops before committing: never two writers, at worst one retry.
                meta = self.loc.head(LOCK_NAME)
                if meta is not None and meta.etag == etag:
                    self.loc.delete(LOCK_NAME)


def _delete_local_if(loc: LocalLocation, etag: str) -> None:
    import fcntl

    from contracts.storage import _etag

    path = loc.path(LOCK_NAME)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if path.is_file() and _etag(path) == etag:
            path.unlink()
    finally:
        os.close(fd)


def _dump(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True).encode()


def _describe(h: dict) -> str:
    left = h.get("expires", 0) - time.time() if isinstance(h.get("expires"), (int, float)) else None
    when = f", expires in {left:.0f} s unless renewed" if left is not None and left > 0 else ""
    return f"host {h.get('host', '?')} pid {h.get('pid', '?')}{when}"


def acquire(loc: Location, ttl: float = DEFAULT_TTL_S) -> Lease:
    """Take the lock of ``loc``; one-line UserError naming a live holder. A lock whose content cannot be
    read as a record (a stranger's file, a torn write on a file system) is never guessed at."""
    me = {"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
          "start": _start_time(os.getpid()), "argv": sys.argv[:4]}
    for _ in range(5):  # a holder may release or renew between our reads: look again
        body = {**me, "expires": time.time() + ttl}
        etag = loc.create(LOCK_NAME, _dump(body))
        if etag is not None:
            return Lease(loc, body, etag, ttl)
        meta = loc.head(LOCK_NAME)
        if meta is None:
            continue
        try:
            holder = json.loads(loc.read(LOCK_NAME))
            if not isinstance(holder, dict):
                raise ValueError
        except FileNotFoundError:
            continue
        except (ValueError, RecursionError):
            raise UserError(f"{loc}/{LOCK_NAME}: unreadable output lock (not written by bertflow?); remove it "
                            "if no run is writing here") from None
        free = holder.get("released") or not isinstance(holder.get("expires"), (int, float)) \
            or holder["expires"] < time.time() or _dead_here(holder)
        if not free:
            where = "" if holder.get("host") == me["host"] else " on another host"
            raise UserError(f"{loc}: output in use by another run{where} ({_describe(holder)}, lock {LOCK_NAME})")
        etag = loc.replace_if(LOCK_NAME, _dump(body), meta.etag)
        if etag is not None:
            if not holder.get("released"):
                print(f"bertflow: taking over the expired lock of {_describe(holder)}: {loc}/{LOCK_NAME}",
                      file=sys.stderr)
            return Lease(loc, body, etag, ttl)
    raise UserError(f"{loc}: output lock contended (another run took it while this one looked); retry")
