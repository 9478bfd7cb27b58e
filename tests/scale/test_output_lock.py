"""The one-writer output lock itself, in-process (what the hostile battery's CLI cases cannot reach:
re-entry, release, a taken-over lock, a reused pid, races between processes, an unwritable directory).
The lock's refusals through every entry point are cases of the hostile battery (test_hostile.py)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from hostile_cases_safety import _dead_pid, _lock
from scale_support import REPO, base_env

from contracts.common import UserError  # noqa: E402
from contracts.lock import LOCK_NAME, output_lock  # noqa: E402
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)


def test_lock_is_reentrant_and_released(tmp_path):
    d = tmp_path / "out"
    with output_lock(d) as lock:
        holder = json.loads(lock.read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with output_lock(d):  # a job calling another job's run() on the same dir
            pass
        assert lock.is_file()  # the inner block did not release the outer's lock
    assert not d.exists()  # created here, nothing written: no empty leftover either


def test_lock_refused_leaves_no_directory(tmp_path):
    holder = subprocess.Popen(["sleep", "60"])
    try:
        d = tmp_path / "held"
        _lock(d, holder.pid)
        with pytest.raises(UserError, match=f"pid {holder.pid}"):
            with output_lock(d):
                pass
        assert (d / LOCK_NAME).is_file()  # the holder's lock stays
    finally:
        holder.kill()
        holder.wait()


def test_lock_not_released_when_taken_over(tmp_path):
    """A run whose lock was taken over (it was thought dead) must not remove the new holder's lock."""
    d = tmp_path / "out"
    with output_lock(d) as lock:
        lock.write_text(json.dumps({"host": socket.gethostname(), "pid": 1}))  # someone else's now
    assert lock.is_file()


def test_reused_pid_is_stale(tmp_path):
    """A lock naming a live pid with another start time (the pid was reused) is stale."""
    d = tmp_path / "out"
    d.mkdir()
    (d / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getppid(), "start": "1"}))
    with output_lock(d) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()


def _race(d: str, start, tried, won) -> None:
    """One contender: try the lock when all start together; a winner holds it until all have tried."""
    from contracts.lock import acquire, release

    start.wait()
    try:
        path, created = acquire(d)
    except UserError:
        tried.wait()
        return
    with won.get_lock():
        won.value += 1
    tried.wait()
    release(path, created)


@pytest.mark.parametrize("stale", [False, True], ids=["free", "stale-lock"])
def test_lock_race_has_one_winner(tmp_path, stale):
    """Six processes racing for one directory (free, or holding a dead pid's lock to take over): exactly
    one gets it while the others are refused."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    d = tmp_path / "out"
    if stale:
        _lock(d, _dead_pid())
    n = 6
    start, tried, won = ctx.Barrier(n), ctx.Barrier(n), ctx.Value("i", 0)
    procs = [ctx.Process(target=_race, args=(str(d), start, tried, won)) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * n
    assert won.value == 1
    assert not (d / LOCK_NAME).exists()  # the winner released it


def test_lock_on_unwritable_dir_is_one_line(tmp_path):
    """A directory the user cannot write: one line naming the lock, not a PermissionError trace. Run in a
    child that obeys file modes even as root (setpriv drops the DAC-override capabilities)."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    child = ("import sys\nfrom contracts.common import run_main\nfrom contracts.lock import output_lock\n"
             "def go(argv):\n    with output_lock(sys.argv[1]):\n        return 0\n"
             "sys.exit(run_main(go, []))\n")
    cmd = [sys.executable, "-c", child, str(d)]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=base_env(), timeout=HANG_S)
    finally:
        d.chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertflow: error: ") and "cannot create the output lock" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(d.iterdir()) == []  # nothing written
