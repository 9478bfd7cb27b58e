"""How a Prefect flow of bertflow ends when asked to stop, on Prefect's temporary API server.

- ``deadline_on_prefect_sigterm``: Prefect's engine swaps SIGTERM's handler for its own, which raises
  ``TerminationSignal`` so that the run is reported crashed. Wrapped here so that the same signal also starts
  ``contracts.common.run_main``'s shutdown deadline. The handler is looked up by name in Prefect's module at
  every install and comparison, so the wrapper is what Prefect installs; a Prefect without it leaves things
  as they are.
- ``temporary_server_outlives_group_signals``: Ctrl-C reaches every process of the terminal's process group,
  and so does a SIGTERM to the whole group (systemd's default stop). Prefect starts its temporary API server
  as a child in that group, so the server died with the signal and the flow then retried reporting its crash
  to it for minutes, until the deadline. The server now starts in a session of its own, which the group's
  signal does not reach: the flow reports the crash and the command ends by itself; atexit stops the server
  as before. A guard in the server's process stops it (uvicorn's own SIGTERM stop) as soon as the command
  that started it is gone, however it went (SIGKILL included), so a server is never left behind."""
from __future__ import annotations

import os
import sys

from contracts import importhook
from contracts.shutdown import stop_asked

# Runs in the server's process in place of `python -m uvicorn ...`: argv[1] is the pid of the command that
# started it; the rest is Prefect's uvicorn command line.
_GUARD = r"""
import os, runpy, signal, sys, threading, time
parent = int(sys.argv.pop(1))

def watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful stop
    time.sleep(10)
    os._exit(1)

threading.Thread(target=watch, name="bertflow-server-guard", daemon=True).start()
sys.argv[0] = "uvicorn"
runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)
"""
_SERVER_MODULE = "prefect.server.api.server"
_SERVER_APP = _SERVER_MODULE + ":create_app"


def deadline_on_prefect_sigterm() -> None:
    try:
        from prefect.utilities import engine
    except ImportError:  # pragma: no cover - Prefect is a dependency of every flow module
        return
    original = getattr(engine, "_prefect_sigterm_handler", None)
    if original is None or getattr(original, "_bertflow", False):
        return

    def handler(signum, *args):
        stop_asked(signum)
        return original(signum, *args)

    handler._bertflow = True
    engine._prefect_sigterm_handler = handler


class _ServerSubprocess:
    """Prefect's server module's ``subprocess``: everything as the real module, except that the temporary
    server's ``python -m uvicorn`` runs under ``_GUARD`` in a session of its own. Any other command, or a
    server command of a shape this does not know, is started as Prefect asks."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def Popen(self, args=None, *rest, **kwargs):  # noqa: N802 - the name Prefect calls
        argv = list(args) if isinstance(args, (list, tuple)) else None
        if argv and argv[1:3] == ["-m", "uvicorn"] and _SERVER_APP in argv and not rest:
            args = [argv[0], "-c", _GUARD, str(os.getpid()), *argv[3:]]
            kwargs.setdefault("start_new_session", True)
        return self._real.Popen(args, *rest, **kwargs)


def _patch(server) -> None:
    current = getattr(server, "subprocess", None)
    if current is not None and not isinstance(current, _ServerSubprocess) and hasattr(server, "SubprocessASGIServer"):
        server.subprocess = _ServerSubprocess(current)


def _exec_and_patch(exec_module, module) -> None:
    exec_module(module)
    _patch(module)


def temporary_server_outlives_group_signals() -> None:
    """Patches Prefect's server module now if it is loaded, else when something first imports it (Prefect
    does so only to start its temporary server): importing it here, in every command, would cost about a
    second for nothing."""
    if _SERVER_MODULE in sys.modules:
        _patch(sys.modules[_SERVER_MODULE])
    else:
        importhook.around(_SERVER_MODULE, _exec_and_patch)


def install() -> None:
    """Both, once per process (each is idempotent): called where the flow modules are imported."""
    deadline_on_prefect_sigterm()
    temporary_server_outlives_group_signals()
