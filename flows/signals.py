"""SIGTERM while a Prefect flow runs: Prefect's engine swaps SIGTERM's handler for its own, which raises
``TerminationSignal`` so that the run is reported crashed. Wrapped here so that the same signal also starts
``contracts.common.run_main``'s shutdown deadline: a SIGTERM sent to the whole process group (systemd's
default stop) also stops Prefect's temporary API server, and the report would otherwise be retried against
it for minutes. The handler is looked up by name in Prefect's module at every install and comparison, so
the wrapper is what Prefect installs; a Prefect without it leaves things as they are."""
from __future__ import annotations

from contracts.shutdown import stop_asked


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
