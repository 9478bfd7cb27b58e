"""data_jobs.fanout: input order, bounded workers, one-line errors, the engine rule, on both engines."""
from __future__ import annotations

import operator
import os
import subprocess
import sys
import threading
import time

import pytest

from contracts.common import UserError
from data_jobs.fanout import fan_out, resolve_engine
from data_jobs.tokenization import read_vocab
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)


def square_after(x: int, delay: float) -> tuple[int, int]:
    time.sleep(delay)  # later inputs finish first: the results must still come back in input order
    return x * x, os.getpid()


def plus_shared(x: int, base: int = 0) -> int:
    return base + x


def fails_on(x: int, bad: int, kind: str) -> int:
    if x == bad:
        if kind == "user":
            raise UserError(f"input {x}: is bad")
        raise PermissionError(13, "Permission denied", f"/no/such/{x}")
    return x


@pytest.mark.parametrize("workers", [1, 2])
def test_local_results_in_input_order_on_at_most_max_in_flight_processes(workers):
    calls = [(x, 0.05 * (5 - x)) for x in range(5)]
    out = fan_out(square_after, calls, desc="t", max_in_flight=workers, engine="local")
    assert [r for r, _ in out] == [x * x for x in range(5)]
    pids = {pid for _, pid in out}
    if workers == 1:
        assert pids == {os.getpid()}  # in-process: no pool to start
    else:  # this process is one of the workers, the pool's process the other
        assert len(pids) == 2 and os.getpid() in pids
    assert fan_out(plus_shared, [(1,), (2,)], desc="t", max_in_flight=workers, engine="local",
                   shared={"base": 10}) == [11, 12]


@pytest.mark.parametrize("workers", [1, 2])
def test_local_worker_errors_come_back_as_one_user_error_line(workers):
    with pytest.raises(UserError) as err:
        fan_out(fails_on, [(x, 3, "user") for x in range(6)], desc="t", max_in_flight=workers, engine="local")
    assert str(err.value) == "input 3: is bad"
    with pytest.raises(UserError) as err:
        fan_out(fails_on, [(x, 1, "os") for x in range(3)], desc="t", max_in_flight=workers, engine="local")
    assert str(err.value) == "/no/such/1: Permission denied"


def test_engine_rule(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("sys.modules", {k: v for k, v in __import__("sys").modules.items() if k != "ray"})
    assert resolve_engine("auto") == "local"
    assert resolve_engine("auto", "ray://head:10001") == "ray"
    assert resolve_engine("local", "ray://head:10001") == "local"
    assert resolve_engine("ray") == "ray"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # as set inside `ray job submit`
    assert resolve_engine("auto") == "ray"
    with pytest.raises(UserError, match="engine"):
        resolve_engine("spark")


@pytest.mark.ray
def test_ray_engine_order_shared_values_and_one_line_error(ray_local, tmp_path):
    # Ray workers cannot import this test module: use functions of installed modules.
    calls = [(x, x + 1) for x in range(6)]
    assert fan_out(operator.mul, calls, desc="t", max_in_flight=2, engine="ray") == [x * (x + 1) for x in range(6)]
    assert resolve_engine("auto") == "ray"  # Ray already initialized in this process
    assert fan_out(int, [("11",), ("101",)], desc="t", max_in_flight=2, engine="ray", shared={"base": 2}) == [3, 5]
    missing = tmp_path / "missing.txt"
    with pytest.raises(UserError) as err:
        fan_out(read_vocab, [(str(missing),)], desc="t", max_in_flight=2, engine="ray")
    assert str(err.value) == f"{missing}: vocab file not found"



def test_when_submitted_fires_once_the_calls_are_queued_not_when_they_end(ray_local, tmp_path):
    """``when_submitted`` (evaluation.compare.run_grids queues grids costliest first with it): the callback
    runs while the calls are still queued or running (here they wait for the file the callback writes),
    once per block, and for a block that queued nothing when it ends."""
    from data_jobs.fanout import when_submitted

    flag, fired = tmp_path / "queued", []

    def queued() -> None:
        fired.append(1)
        flag.touch()

    wait = ["bash", "-c", f"until [ -e '{flag}' ]; do sleep 0.05; done"]
    with when_submitted(queued):
        assert fan_out(subprocess.check_call, [(wait,), (wait,)], desc="t", max_in_flight=2, engine="ray",
                       shared={"timeout": HANG_S}) == [0, 0]
        assert fired == [1]
    assert fired == [1]
    with when_submitted(queued):
        pass
    assert fired == [1, 1]


def test_local_pool_forks_only_from_a_single_threaded_process():
    """fork skips the workers' interpreter start and imports, but copies only the forking thread: with
    another thread alive (Prefect's, Ray's, Arrow's pools) the workers come from a fork server instead."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        parents = fan_out(os.getppid, [()] * 4, desc="t", max_in_flight=2, engine="local")
    finally:
        stop.set()
    assert len(set(parents)) == 2 and os.getpid() not in parents  # ours (for our calls) and the server
    script = ("import os; from data_jobs.fanout import fan_out; "
              "print(os.getpid() in fan_out(os.getppid, [()] * 4, desc='t', max_in_flight=2, engine='local'))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_S)
    assert done.stdout.strip() == "True", done.stderr  # single-threaded: its worker is its own child
