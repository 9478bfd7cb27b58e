"""One fan-out helper for every job that runs a function over many argument tuples.

    results = fan_out(fn, [(a1, b1), (a2, b2), ...], desc="instances", max_in_flight=4)
    with Workers(4, engine="auto") as w:       # several fan-outs on the same workers
        pool = w.map(f, calls_f, desc="pool"); out = w.map(g, calls_g, desc="instances", shared={"pool": pool})

Results come back in input order; at most ``max_in_flight`` calls run at once (memory: one shard per
worker); a tqdm bar counts finished calls; a worker's ``UserError`` (or an ``OSError`` such as a full
disk) comes back as one ``UserError`` line, never as a remote stack dump.

Engines (``engine``):
  ray    Ray tasks (``num_cpus`` each) on the cluster at ``ray_address`` / $RAY_ADDRESS, or on a
         local Ray cluster. What a multi-node job uses.
  local  this machine, no Ray: in-process for one worker, else a pool of fresh processes
         (forkserver: the children never inherit a parent's tokenizers threads, see
         ../shared/ENVIRONMENT.md "tokenizers and fork"). Saves Ray's seconds of start-up.
  auto   ray when an address is given, $RAY_ADDRESS is set (inside ``ray job submit``) or Ray is
         already initialized in this process; local otherwise.
A function's result must not depend on where it runs, so the engine never changes an output.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import types
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterator, Literal, Optional, Sequence

from contracts.common import UserError

from data_jobs.ray_util import WORKER_ENV  # the same worker environment as Ray's workers

Engine = Literal["auto", "local", "ray"]


class _Failed:
    """A worker's one-line error, returned as a value so no engine wraps it in its own traceback."""

    def __init__(self, message: str) -> None:
        self.message = message


def _guarded_call(fn: Callable, where: str, args: tuple, kwargs: dict) -> Any:
    keep_freed_memory()  # every engine runs every call through here, in the worker's process
    try:
        return fn(*args, **kwargs)
    except UserError as err:
        return _Failed(str(err))
    except OSError as err:  # disk full, permission denied: the environment, in one line
        text = err.strerror or (str(err).strip().splitlines() or [type(err).__name__])[-1]
        return _Failed(f"{err.filename or where}: {text}")


def _ray_call(fn: Callable, where: str, args: tuple, keys: tuple, storage: Optional[dict], *values: Any) -> Any:
    # Shared values travel as top-level arguments: Ray resolves only those ObjectRefs.
    if storage is not None:  # a cluster this process started: its workers reach the driver's store
        for k in [k for k in os.environ if k.startswith(STORAGE_ENV_PREFIXES) and k not in storage]:
            del os.environ[k]
        os.environ.update(storage)
    return _guarded_call(fn, where, args, dict(zip(keys, values)))


def resolve_engine(engine: str = "auto", ray_address: Optional[str] = None) -> str:
    """'ray' or 'local' for ``engine`` (see the module docstring for the 'auto' rule)."""
    if engine not in ("auto", "local", "ray"):
        raise UserError(f"engine: {engine!r} is not one of auto, local, ray")
    if engine != "auto":
        return engine
    if ray_address or os.environ.get("RAY_ADDRESS"):
        return "ray"
    ray = sys.modules.get("ray")  # only if something imported it: never pay Ray's import to decide
    return "ray" if ray is not None and ray.is_initialized() else "local"


class Workers:
    """Where fan-outs run: Ray tasks or this machine's processes (see the module docstring). Reuse one
    across the fan-outs of a job, so local worker processes (and what they cache, such as a
    tokenizer) are started once. ``preload``: modules the local fork server imports once for all
    workers (each fan-out's function module is added)."""

    def __init__(self, max_in_flight: int = 1, *, num_cpus: float = 1, num_gpus: float = 0, engine: str = "auto",
                 ray_address: Optional[str] = None, preload: Sequence[str] = ()) -> None:
        self.limit = max(1, int(max_in_flight))
        self.kind = resolve_engine(engine, ray_address)
        self.num_cpus, self.num_gpus, self.ray_address, self.preload = num_cpus, num_gpus, ray_address, list(preload)
        self._executor: Optional[ProcessPoolExecutor] = None

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def map(self, fn: Callable, calls: Sequence[tuple], *, desc: str, shared: Optional[dict] = None,
            max_retries: int = 0, where: Optional[str] = None, unit: str = "task") -> list:
        """``[fn(*args, **shared) for args in calls]``, at most ``max_in_flight`` at once, in input order.

        ``shared``: keyword arguments every call receives (Ray puts each into the object store once).
        ``where``: names the place in an OSError message that carries no file name (an output dir).
        ``max_retries``: Ray only (a task on a lost node is rerun; local workers die with the job).
        """
        from tqdm import tqdm

        calls = [tuple(c) for c in calls]
        limit = min(self.limit, len(calls) or 1)
        where, shared = where or desc, shared or {}
        # The local pool starts before the progress bar (whose monitor thread would rule out fork).
        pool = self._pool(fn) if self.kind == "local" and limit > 1 else None
        with tqdm(total=len(calls), desc=desc, unit=unit, disable=None, file=sys.stderr) as bar:
            if self.kind == "ray":
                return _run_ray(fn, calls, limit, (self.num_cpus, self.num_gpus), self.ray_address, shared, max_retries,
                                where, bar)
            if pool is None:
                return _run_here(fn, calls, shared, where, bar)
            return _run_pool(pool, fn, calls, limit, shared, where, bar)

    def _pool(self, fn: Callable) -> ProcessPoolExecutor:
        """``max_in_flight - 1`` worker processes: this process is the last worker (``_run_pool``).

        Forked from this process when it runs no other Python thread (no import to repeat, no
        interpreter to start; a fork copies only the forking thread, so another thread's held lock
        would stay held in the child); else from a fork server, a clean interpreter that imports
        ``preload`` once."""
        if self._executor is None:
            if _single_threaded():
                ctx = multiprocessing.get_context("fork")
            else:
                ctx = multiprocessing.get_context("forkserver")
                ctx.set_forkserver_preload(self.preload + ([fn.__module__] if fn.__module__ != "__main__" else []))
            self._executor = ProcessPoolExecutor(self.limit - 1, mp_context=ctx, initializer=_set_worker_env,
                                                 initargs=(_storage_env(),))
            # Start the workers now, from this thread (fork copies only the forking thread; the pool
            # forks all its processes on the first submit, a fork server's start on the first too).
            with _bare_main(fn):
                self._executor.submit(int)
        return self._executor


def _single_threaded() -> bool:
    """True if this process runs no other Python thread (Prefect's, Ray's, a progress bar's monitor):
    then fork is safe. The native pools every driver has (OpenBLAS's, Arrow's jemalloc, tokenizers'
    Rayon) register their own at-fork handlers."""
    return threading.active_count() == 1


def fan_out(fn: Callable, calls: Sequence[tuple], *, desc: str, max_in_flight: int = 1, num_cpus: float = 1,
            num_gpus: float = 0, engine: str = "auto", ray_address: Optional[str] = None,
            shared: Optional[dict] = None, max_retries: int = 0, where: Optional[str] = None,
            unit: str = "task") -> list:
    """One fan-out on its own workers: ``Workers(...).map(fn, calls, ...)`` (see Workers.map).
    ``num_gpus`` is what each Ray task declares (the local engine has no GPU scheduling)."""
    with Workers(max_in_flight, num_cpus=num_cpus, num_gpus=num_gpus, engine=engine,
                 ray_address=ray_address) as workers:
        return workers.map(fn, calls, desc=desc, shared=shared, max_retries=max_retries, where=where, unit=unit)


def _check(result: Any) -> Any:
    if isinstance(result, _Failed):
        raise UserError(result.message)
    return result


def _run_here(fn, calls, shared, where, bar) -> list:
    """One worker: every call in this process, in order; the first failure raises."""
    results: list = [None] * len(calls)
    order = iter(range(len(calls)))

    def done(i: int, result: Any) -> None:
        results[i] = _check(result)
        bar.update(1)

    _work_here(fn, calls, shared, where, lambda: next(order, None), done)
    return results


def _work_here(fn, calls, shared, where, take: Callable[[], Optional[int]], done: Callable[[int, Any], None]) -> None:
    """This process as a worker: runs ``calls[take()]`` until ``take()`` is None, with the tokenizer on
    one thread as in a worker process (one worker means one core), the caller's environment restored
    afterwards."""
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        while (i := take()) is not None:
            done(i, _guarded_call(fn, where, calls[i], shared))
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def _set_worker_env(storage_env: Optional[dict] = None) -> None:
    os.environ.update(WORKER_ENV)
    os.environ.update(storage_env or {})


STORAGE_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "BERTFLOW_SCRATCH")


def _storage_env() -> dict[str, str]:
    """This process's object-store settings (credentials, endpoint, scratch), as they are now: a fork
    server started earlier in this process holds the environment of that moment, and its workers
    must reach the same store as the driver (contracts.storage reads these variables)."""
    return {k: v for k, v in os.environ.items() if k.startswith(STORAGE_ENV_PREFIXES)}


_MALLOC_TUNED = False


def keep_freed_memory() -> None:
    """Let glibc's malloc keep freed memory for reuse in this process (idempotent; a no-op without
    glibc). A worker allocates and frees arrays of several MB every round; by default each one is a
    fresh mmap whose pages the kernel zeroes on first touch (83k page faults, 0.5 s of system time on
    a 5 MB instances job with one worker; 32k and 0.27 s with this). Peak RSS grows ~5 %."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: blocks below 32 MB come from the heap
    mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD: keep up to 256 MB of freed heap instead of returning it


@contextmanager
def _bare_main(fn: Callable) -> Iterator[None]:
    """Start workers without re-importing the driver's main module: multiprocessing would run it in
    every new worker (for `bertflow`, the whole CLI with Prefect: seconds each). Only a function
    defined in __main__ needs it."""
    main = sys.modules.get("__main__")
    if fn.__module__ == "__main__" or main is None:
        yield
        return
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _run_pool(ex: ProcessPoolExecutor, fn, calls, limit, shared, where, bar) -> list:
    """Calls on ``limit`` workers: the pool's ``limit - 1`` processes and this process, each taking the
    next call in input order whenever it is free (a feeder thread keeps the pool busy while this
    thread works). The first failure stops the fan-out: no new call starts, the running ones finish,
    then it is raised (a worker's UserError as one line, a dead worker process as its own error)."""
    results: list = [None] * len(calls)
    state: dict[str, Any] = {"next": 0, "failure": None}
    lock = threading.Lock()

    def take() -> Optional[int]:
        with lock:
            if state["failure"] is not None or state["next"] >= len(calls):
                return None
            state["next"] += 1
            return state["next"] - 1

    def done(i: int, result: Any) -> None:
        with lock:
            if i >= 0:
                results[i] = result
            if isinstance(result, (_Failed, BaseException)) and state["failure"] is None:
                state["failure"] = result
            bar.update(1)

    feeder = threading.Thread(target=_feed_pool, args=(ex, fn, calls, limit - 1, shared, where, take, done),
                              name="fanout-feeder", daemon=True)
    feeder.start()
    try:
        _work_here(fn, calls, shared, where, take, done)
    except BaseException as err:  # Ctrl-C here: the feeder starts nothing more
        done(-1, err)
        raise
    feeder.join()
    failure = state["failure"]
    if isinstance(failure, BaseException):
        raise failure
    return [_check(r) for r in results]


def _feed_pool(ex: ProcessPoolExecutor, fn, calls, slots: int, shared, where, take, done) -> None:
    """Keep ``slots`` calls running on the pool, reporting each result (or the error of a worker
    process that died) to ``done``."""
    pending: dict[Future, int] = {}
    try:
        while True:
            while len(pending) < slots and (i := take()) is not None:
                with _bare_main(fn):  # submit may start a worker process
                    pending[ex.submit(_guarded_call, fn, where, calls[i], shared)] = i
            if not pending:
                return
            finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for fut in sorted(finished, key=pending.__getitem__):
                i = pending.pop(fut)
                try:
                    result = fut.result()
                except BaseException as err:  # BrokenProcessPool, an unpicklable result
                    result = err
                done(i, result)
    except BaseException as err:
        done(-1, err)
    finally:
        for fut in pending:
            fut.cancel()


_thread = threading.local()


@contextmanager
def when_submitted(callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback()`` once a Ray fan-out of this thread has queued its first calls (all of them, up to
    ``max_in_flight``), and at the latest when the block ends. A caller that starts several fan-outs from
    threads (``evaluation.compare.run_grids``) queues them in the order it wants, since Ray starts queued
    tasks about first come, first served."""
    _thread.submitted = callback
    try:
        yield
    finally:
        if _thread.__dict__.pop("submitted", None) is not None:  # no fan-out called it
            callback()


def _notify_submitted() -> None:
    callback = _thread.__dict__.pop("submitted", None)
    if callback is not None:
        callback()


def _run_ray(fn, calls, limit, resources, ray_address, shared, max_retries, where, bar) -> list:
    import ray

    from data_jobs.ray_util import ensure_ray

    ensure_ray(ray_address)
    # Named after the function, not the wrapper: the dashboard and state API show what ran where.
    num_cpus, num_gpus = resources
    remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=max_retries)(_ray_call).options(
        name=getattr(fn, "__name__", "task"))
    keys = tuple(shared)
    refs = [ray.put(shared[k]) for k in keys]
    # A local cluster's workers were started with the environment of that moment (a test session's, a
    # notebook's): each task takes this process's object-store settings as they are now, as local
    # processes do. A cluster at an address keeps its own (its nodes' credentials, the runtime env).
    storage = None if (ray_address or os.environ.get("RAY_ADDRESS")) else _storage_env()
    results: list = [None] * len(calls)
    pending: dict = {}
    nxt = 0
    while nxt < len(calls) or pending:
        while nxt < len(calls) and len(pending) < limit:
            pending[remote.remote(fn, where, calls[nxt], keys, storage, *refs)] = nxt
            nxt += 1
        _notify_submitted()
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            results[pending.pop(ref)] = _check(_ray_get(ray, ref, where))
            bar.update(1)
    return results


def _ray_get(ray, ref, where: str) -> Any:
    """ray.get; an error raised outside the guarded call (a worker killed, unpicklable result) stays
    a Ray error, but a UserError cause still becomes one line."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, UserError):
            raise UserError(str(cause)) from None
        raise
