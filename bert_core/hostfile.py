"""DeepSpeed hostfile checks, done before a multi-node launch rather than after a launcher hangs on ssh.

Format (DeepSpeed's): one node per line, ``<hostname> slots=<n>``; ``#`` starts a comment. Every
host must resolve (a typo'd or retired node otherwise surfaces as a pdsh/ssh timeout minutes later).
"""
from __future__ import annotations

import re
import socket
from pathlib import Path

from contracts.common import UserError

_LINE = re.compile(r"^(?P<host>\S+)\s+slots=(?P<slots>\d+)$")


def read_hostfile(path: str | Path, resolve: bool = True) -> list[tuple[str, int]]:
    """[(host, slots)] of a DeepSpeed hostfile; UserError naming the file and line for any problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{p}: hostfile not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{p}: cannot read hostfile: {getattr(err, 'strerror', None) or err}") from None
    hosts: list[tuple[str, int]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if m is None:
            raise UserError(f"{p}: line {number}: expected '<host> slots=<n>', got {line!r}")
        host, slots = m["host"], int(m["slots"])
        if slots < 1:
            raise UserError(f"{p}: line {number}: slots must be >= 1 for host {host!r}")
        if any(h == host for h, _ in hosts):
            raise UserError(f"{p}: line {number}: host {host!r} listed twice")
        if resolve:
            try:
                socket.getaddrinfo(host, None)
            except (socket.gaierror, UnicodeError):
                raise UserError(f"{p}: line {number}: unknown host {host!r} (does not resolve)") from None
        hosts.append((host, slots))
    if not hosts:
        raise UserError(f"{p}: hostfile lists no hosts")
    return hosts
