"""Ctrl-C ends a command, at the latest ``BERTFLOW_INTERRUPT_GRACE_S`` after it: the terminal sends SIGINT to
its whole process group, and a shutdown that hangs (a flow reporting its crash to an API server that is
gone retries for minutes) is cut off there. Prefect's temporary API server is kept out of that group
(flows.signals), so a pipeline ends by itself. Each case is a real process group signalled as a terminal
does."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from contracts.shutdown import alive, descendants

REPO = Path(__file__).resolve().parents[2]

# fn: a child in the same process group (dies of the group's SIGINT), then, interrupted, a shutdown that
# hangs as Prefect's retries to a dead server do (or returns at once with HANG=0).
PROGRAM = r"""
import os, subprocess, sys, time
from contracts.common import run_main

def fn(argv):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:  # "ready" inside: a signal the moment it is read lands in the except clause, not before it
        print("ready", flush=True)
        time.sleep(600)
    except KeyboardInterrupt:
        time.sleep(float(os.environ["HANG"]))
        raise
    return 0

sys.exit(run_main(fn))
"""


def _start(cmd: list[str], grace: float, **env) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "BERTFLOW_INTERRUPT_GRACE_S": str(grace), **env},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal, whatever ran us


def _interrupt_and_wait(proc: subprocess.Popen, times: int = 1, limit: float = 120) -> tuple[float, str]:
    t0 = time.monotonic()
    for _ in range(times):
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.5)
    _, err = proc.communicate(timeout=limit)
    return time.monotonic() - t0, err


def _ready(proc: subprocess.Popen) -> None:
    assert proc.stdout.readline().strip() == "ready"


def test_a_hanging_shutdown_ends_at_the_deadline_with_one_line():
    proc = _start([sys.executable, "-c", PROGRAM], grace=2, HANG="600")
    _ready(proc)
    took, err = _interrupt_and_wait(proc)
    assert proc.returncode == 130
    assert "still shutting down after 2 s" in err and "rerun the same command to resume" in err
    assert took >= 1.9  # not before the deadline: a shutdown that ends in time is left alone (next test)


def test_a_shutdown_in_time_is_the_usual_interrupted_line_and_a_second_ctrl_c_leaves_at_once():
    proc = _start([sys.executable, "-c", PROGRAM], grace=600, HANG="0")
    _ready(proc)
    _, err = _interrupt_and_wait(proc)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "bertflow: interrupted"
    proc = _start([sys.executable, "-c", PROGRAM], grace=600, HANG="600")
    _ready(proc)
    took, err = _interrupt_and_wait(proc, times=2, limit=60)
    assert proc.returncode == 130 and "still shutting down" not in err


def test_sigterm_raises_terminated_so_cleanup_runs_and_exits_143():
    proc = _start([sys.executable, "-c", PROGRAM.replace("time.sleep(float(os.environ[\"HANG\"]))",
                                                         "print('cleanup ran', flush=True)")], grace=600, HANG="0")
    _ready(proc)
    proc.send_signal(signal.SIGTERM)  # the command alone, as `kill PID`, docker stop or a scheduler do
    proc.wait(timeout=60)
    os.killpg(proc.pid, signal.SIGKILL)  # its sleeping child holds the pipes open
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "cleanup ran" in out and "bertflow: terminated (SIGTERM)" in err


# A stop signal sent in the middle of torch's import (when torch.nn is imported, well inside it); then the
# cleanup imports torch again, as a stopped command's cleanup or Prefect's crash report may.
TORCH_PROGRAM = r"""
import importlib.abc, os, signal, sys
from contracts.common import run_main

class SignalMidImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torch.nn":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), int(os.environ["SIG"]))
        return None

def fn(argv):
    sys.meta_path.insert(0, SignalMidImport())
    try:
        import torch
        import time; time.sleep(30)  # the held signal arrives here, just after the import
    finally:
        import torch
        print("cleanup imported torch", torch.ones(2).sum().item(), flush=True)
    return 0

sys.exit(run_main(fn))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_during_torchs_import_is_handled_after_it_not_by_an_abort(sig):
    """Raised inside torch's import, the stop left torch half-registered, and the next import aborted the
    process (SIGABRT: "cannot initialize type GradBucket", seen once as rc -6 in CI when a SIGTERM reached
    a pipeline while its launcher imported torch). The signal is held until the import is done."""
    proc = subprocess.run([sys.executable, "-c", TORCH_PROGRAM], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO), "SIG": str(int(sig))})
    assert proc.returncode == 128 + sig, proc.stderr[-2000:]
    assert "cleanup imported torch 2.0" in proc.stdout, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines()[-1].startswith("bertflow: "), proc.stderr


def test_the_deadline_is_off_once_the_command_returns_in_process(monkeypatch):
    """run_main called in a process that goes on (a test, a notebook): an interrupt handled by the command
    does not end the process later."""
    from contracts import shutdown
    from contracts.common import run_main

    def fn(argv):
        shutdown.stop_asked()  # as the SIGINT handler does
        raise KeyboardInterrupt

    monkeypatch.setattr(shutdown, "INTERRUPT_GRACE_S", 0.2)
    assert run_main(fn) == 130
    time.sleep(0.6)  # past the deadline: this process is still here


@pytest.fixture(scope="module")
def interrupted_pipeline(tmp_path_factory) -> Path:
    """One pipeline config and output root for the three cases: the first prepares the data and is stopped
    while training; each later one reruns it (the data stages done, the stopped training run again), as a
    user does after a stop, and is stopped while training in turn."""
    from flows.config import demo_config

    root = tmp_path_factory.mktemp("interrupted")
    cfg = demo_config(str(root / "out"), max_steps=1_000_000).model_dump(mode="json")
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _server_pids(root: int) -> list[int]:
    """Prefect's temporary API server below ``root`` (in a session of its own: flows.signals)."""
    found = []
    for pid in descendants(root):
        try:
            if b"prefect.server.api.server:create_app" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c to the group", "sigterm to the command", "sigterm to the group"])
def test_a_pipeline_on_the_temporary_prefect_server_ends_and_leaves_nothing_running(interrupted_pipeline, tmp_path, how):
    """The real case: `bertflow pipeline` with no PREFECT_API_URL (Prefect's temporary server is its
    child), stopped while training: by Ctrl-C (the whole process group), by SIGTERM to the command alone
    (Prefect reports the crash, then re-sends itself the signal), or to the whole group (systemd's stop;
    Prefect's own SIGTERM handler, wrapped by flows.signals, starts the deadline). The server runs in a
    session of its own, so the group's signal does not reach it: in every case the flow reports its crash
    and the command ends by itself, not at the deadline (once, the server died with the group and the
    command waited out the whole deadline). Every process of its group is gone afterwards, and so is the
    server."""
    path = interrupted_pipeline
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    log = tmp_path / "log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "bertflow"), "pipeline", "--config", str(path)],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**env, "PYTHONPATH": str(REPO), "BERTFLOW_INTERRUPT_GRACE_S": "60"},
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 600
        # Training has started: its progress bar, not the stage line "stage train:<phase>: running" printed
        # before the launcher imports torch. (A stop during that import is the case of
        # test_a_stop_during_torchs_import_is_handled_after_it_not_by_an_abort.)
        while not re.search(r"train:\s+\d+%", log.read_text(errors="replace")):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(1)
        servers += _server_pids(proc.pid)
        assert len(servers) == 1 and os.getsid(servers[0]) == servers[0] != os.getsid(proc.pid), servers
        if how == "ctrl-c to the group":
            os.killpg(proc.pid, signal.SIGINT)
        elif how == "sigterm to the group":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        assert proc.returncode == (130 if how.startswith("ctrl-c") else 143), log.read_text()[-2000:]
        # ended by itself: the crash reported to a server still up, not cut off at the deadline
        assert "still shutting down" not in log.read_text(errors="replace"), log.read_text()[-2000:]
        for _ in range(60):  # helpers that outlive it a moment (a fork server reads its parent's exit) then go
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                if not any(alive(pid) for pid in servers):
                    break
            time.sleep(1)
        else:
            left = subprocess.run(["ps", "-o", "pid,stat,etime,args", "-g", str(proc.pid), "-p", str(servers[0])],
                                  capture_output=True, text=True).stdout
            pytest.fail(f"processes of the interrupted command (its group, its server) are still running 60 s later:\n{left}")
    finally:  # a failed case leaves nothing running: the training command, its group, its server
        _kill(servers)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)


def test_the_temporary_server_goes_when_the_command_that_started_it_is_killed(tmp_path):
    """SIGKILL leaves no atexit to stop Prefect's temporary server, and its own session keeps the group's
    signals from it: the guard it runs under (flows.signals) stops it once its parent is gone."""
    code = ("import os, time, flows.tasks\n"
            "from prefect.server.api.server import SubprocessASGIServer\n"
            "s = SubprocessASGIServer(); s.start()\n"
            "print(s.server_process.pid, flush=True); time.sleep(600)\n")  # the pid alone on a line
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            start_new_session=True, env={**env, "PYTHONPATH": str(REPO)})
    servers: list[int] = []
    try:
        line = proc.stdout.readline()
        while line and not line.strip().isdigit():  # Prefect's "Starting temporary server" lines go first
            line = proc.stdout.readline()
        servers.append(int(line))
        server = servers[0]
        assert os.getsid(server) == server != os.getsid(proc.pid)  # out of reach of the command's group
        proc.kill()
        proc.wait(timeout=60)
        for _ in range(120):
            if not alive(server):
                break
            time.sleep(0.5)
        else:
            pytest.fail("Prefect's temporary server outlived the command that started it by 60 s")
    finally:
        _kill(servers)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
