"""Free TCP ports for the servers the tests start (a module of its own: conftest files are not importable).

Two bare ``bind(("127.0.0.1", 0))`` calls can return the same port once the first socket is closed, and a
``ray start`` given one port for two of its components refuses to start (seen in CI: the client server and
the runtime-env agent both drew 43847). So a port is never handed out twice by one process.
"""
from __future__ import annotations

import socket

_GIVEN: set[int] = set()


def free_port() -> int:
    """A port free at this moment on 127.0.0.1 that this process has not handed out before."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
