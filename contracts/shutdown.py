"""How a command ends when asked to stop (``contracts.common.run_main`` wraps every command in
``bounded_interrupt``): Ctrl-C raises KeyboardInterrupt and SIGTERM raises ``Terminated``, so cleanup runs;
a command still shutting down ``INTERRUPT_GRACE_S`` after the signal exits anyway, and a second Ctrl-C at
once."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from contracts import importhook

# After a stop is asked for (Ctrl-C, or SIGTERM to the training launcher), a command that is still
# shutting down this long after it exits 130 anyway: a flow engine whose Prefect API cannot be reached
# retries reporting the crashed run with backoff for minutes (Prefect's temporary server is kept out of
# the terminal's process group, flows.signals, so it is not the one). Finished stages are kept either way.
INTERRUPT_GRACE_S = float(os.environ.get("BERTFLOW_INTERRUPT_GRACE_S", "60"))
_stop_asked = threading.Event()
_command_over = threading.Event()  # set when the command run by run_main returns: the deadline is off
_in_command = False  # run_main installed its signal handlers (the deadline applies only then)


def stop_asked(signum: int = signal.SIGINT) -> None:
    """Start the shutdown deadline (once per command): ``INTERRUPT_GRACE_S`` seconds from now the process
    exits 128 + ``signum`` unless the command has returned by then. Outside a command run by run_main:
    nothing."""
    if not _in_command or _stop_asked.is_set():
        return
    _stop_asked.set()
    threading.Thread(target=_exit_at_deadline, args=(_command_over, 128 + int(signum)),
                     name="bertflow-stop-deadline", daemon=True).start()


def _exit_at_deadline(over: threading.Event, code: int) -> None:
    if over.wait(INTERRUPT_GRACE_S):
        return
    what = "terminated" if code == 128 + signal.SIGTERM else "interrupted"
    sys.stderr.write(f"bertflow: {what}: still shutting down after {INTERRUPT_GRACE_S:g} s (an unreachable "
                     "Prefect API?); exiting now; rerun the same command to resume\n")
    sys.stderr.flush()
    for pid in descendants(os.getpid()):  # os._exit runs no atexit: stop what this command started
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    os._exit(code)


def _torch_with_signals_deferred(exec_module, module) -> None:
    """Import torch with Ctrl-C and SIGTERM held until it is done. An exception raised by a signal handler
    in the middle of torch's import leaves its C++ half registered, and the next ``import torch`` in that
    process (the cleanup of the stopped command, Prefect's crash report) aborts with SIGABRT or fails on
    duplicate registrations. Held, the signal is sent again once the import machinery has put the finished
    module in ``sys.modules`` (an exception raised inside ``exec_module`` would take it out again), to the
    handler that was there; a second Ctrl-C while held exits at once, as it does otherwise. Only in the
    main thread (the one where Python runs signal handlers): an import elsewhere is not interrupted."""
    sigs = [sig for sig in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(sig) is not None]
    if threading.current_thread() is not threading.main_thread() or not sigs:
        exec_module(module)
        return
    held: list[int] = []

    def hold(signum, frame) -> None:
        if signum == signal.SIGINT and signum in held:  # a second Ctrl-C: leave now
            os._exit(128 + signum)
        held.append(signum)

    saved = {sig: signal.signal(sig, hold) for sig in sigs}
    try:
        exec_module(module)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if held:
            threading.Thread(target=_resend_when_imported, args=(module, held[0]), daemon=True,
                             name="bertflow-held-signal").start()


def _resend_when_imported(module, signum: int) -> None:
    spec = getattr(module, "__spec__", None)
    for _ in range(5000):  # importlib sets _initializing False once sys.modules holds the module
        if not getattr(spec, "_initializing", False):
            break
        time.sleep(0.001)
    os.kill(os.getpid(), signum)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt, so that cleanup (``finally``, ``atexit``: Prefect's
    temporary API server is stopped there) runs before the command exits 143."""


def _on_sigint(signum, frame) -> None:
    if _stop_asked.is_set():  # a second Ctrl-C: leave now
        os._exit(130)
    stop_asked()
    raise KeyboardInterrupt


def _on_sigterm(signum, frame) -> None:
    stop_asked(signum)
    raise Terminated()


@contextmanager
def bounded_interrupt() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt as always, and starts the shutdown deadline; a second one exits at
    once. SIGTERM raises Terminated (a Prefect flow first reports its crash, then sends itself the signal
    again for the handler it found: this one). Only for signals whose handling is the default (not where
    SIGINT is ignored, as in background jobs of a shell) and in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = {sig: handler for sig, default, handler in ((signal.SIGINT, signal.default_int_handler, _on_sigint),
                                                       (signal.SIGTERM, signal.SIG_DFL, _on_sigterm))
            if signal.getsignal(sig) is default}
    global _in_command, _command_over
    saved = {sig: signal.signal(sig, handler) for sig, handler in ours.items()}
    if saved and "torch" not in sys.modules:
        importhook.around("torch", _torch_with_signals_deferred)
    _in_command = _in_command or bool(saved)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if saved:  # the outermost: the command is over (a process that goes on, as a test's, is not ended)
            _command_over.set()
            _command_over, _in_command = threading.Event(), False
            _stop_asked.clear()


def alive(pid: int) -> bool:
    """``pid`` is running (from /proc): not gone, and not a zombie that has stopped but is not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (from /proc): torchrun starts each rank in a session of its
    own, so signalling the launcher's process group misses them (../shared/ENVIRONMENT.md); and a command
    that exits at its deadline stops what it started (Prefect's temporary server: atexit does not run)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out
