"""Stopping a process worker, as docs/flows.md ("Stopping a worker") describes it, against the session's
real ``prefect server start``: a SIGTERM to a worker that is running a flow run stops it within
seconds and kills the run's process, which the server keeps showing as Running; the documented
rerun then skips the finished stages and resumes training from its last checkpoint. A SIGINT stops
an idle worker as quickly. The worker and rerun commands are read from docs/flows.md and run as
written."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import httpx
import pytest
import yaml

from flowtest_support import BIN, REPO, deployments_by_name, run_cli, stop, tiny_config, wait_final
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

pytestmark = [pytest.mark.prefect, pytest.mark.slow, pytest.mark.shared_data]

FLOWS_MD = (REPO / "docs" / "flows.md").read_text()
# What the docs promise about the time a stop takes; measured 1-3 s (docs/flows.md), the bound
# leaves room for a loaded machine while still failing on a worker that waits for its run.
STOP_WITHIN_S = HANG_S  # it stops (the reported bug: never); how fast is printed, not asserted


def _doc_command(pattern: str) -> str:
    section = FLOWS_MD[FLOWS_MD.index("### Stopping a worker"):]
    return re.search(rf"`({pattern})`", section).group(1)


def _start_worker(cmd: str, env: dict, cwd, log):
    with open(log, "ab") as fh:
        proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], env={**env, "PREFECT_WORKER_QUERY_SECONDS": "1"},
                                cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + HANG_S
    while log.read_text(errors="replace").count("started!") < _start_worker.count + 1:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.3)
    _start_worker.count += 1
    return proc


_start_worker.count = 0


def _stopped_within(proc: subprocess.Popen, sig: int) -> float:
    t0 = time.monotonic()
    os.kill(proc.pid, sig)  # the worker's own pid, as `kill PID` or a service manager sends it
    try:
        proc.wait(STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"worker still running {STOP_WITHIN_S} s after {signal.Signals(sig).name}")
    return time.monotonic() - t0


def _run_id(stdout: str) -> str:
    return re.search(r"UUID: ([0-9a-f-]{36})", stdout).group(1)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stopping_a_worker_mid_run_and_continuing(prefect_server, tmp_path, corpus_file):
    api, env = prefect_server["api"], prefect_server["env"]
    worker_cmd = _doc_command(r"prefect worker start --pool bertflow-process")
    rerun_cmd = _doc_command(r"prefect deployment run pretraining-pipeline/default")

    # The pipeline deployment with a config whose training runs long enough to be caught mid-way.
    cfg = tiny_config(tmp_path / "out", corpus_file, max_steps=200, intrinsic=False)
    data = cfg.model_dump(mode="json")
    data["phases"][0]["train"]["save_every"] = 10
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(data))
    run_cli([str(BIN / "bertflow"), "deploy", "--config", str(tmp_path / "pipeline.yaml"), "--working-dir",
             str(tmp_path), "--only", "pretraining-pipeline/default"], env, tmp_path)
    assert deployments_by_name(api)["pretraining-pipeline/default"]["parameters"]["config"]["output_root"] == str(
        tmp_path / "out")
    out = tmp_path / "out"
    log = tmp_path / "worker.log"
    first = None
    worker = _start_worker(worker_cmd, env, tmp_path, log)
    try:
        first = _run_id(run_cli(["bash", "-c", rerun_cmd], env, tmp_path))
        # Caught mid-training: a checkpoint exists and the run is Running.
        deadline = time.monotonic() + HANG_S
        while not list(out.glob("runs/phase1-*/checkpoints/step_*")):
            run = httpx.get(f"{api}/flow_runs/{first}").json()
            assert run["state"]["type"] in ("SCHEDULED", "PENDING", "RUNNING"), (run["state"], log.read_text()[-3000:])
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.3)
        run = httpx.get(f"{api}/flow_runs/{first}").json()
        assert run["state"]["type"] == "RUNNING"
        engine_pid = int(str(run["infrastructure_pid"]).rsplit(":", 1)[-1])
        assert _pid_alive(engine_pid)
        # What the docs offer to see whether a run is still going (a wide terminal: rich cuts columns).
        listed = run_cli(["bash", "-c", _doc_command(r"prefect flow-run ls")], {**env, "COLUMNS": "250"}, tmp_path)
        assert any(first in line and "RUNNING" in line for line in listed.splitlines()), listed

        took = _stopped_within(worker, signal.SIGTERM)
        assert worker.returncode == 0, log.read_text(errors="replace")[-3000:]
        # The run's process went with the worker; the server was told nothing, so it keeps the run
        # Running (no end time) with no process behind it.
        deadline = time.monotonic() + HANG_S
        while _pid_alive(engine_pid):
            assert time.monotonic() < deadline, f"flow run process {engine_pid} outlived its worker"
            time.sleep(0.2)
        time.sleep(2)  # no process is left that could report the run: nothing changes it later
        run = httpx.get(f"{api}/flow_runs/{first}").json()
        assert run["state"]["type"] == "RUNNING" and run["end_time"] is None, run["state"]
        done_before = sorted(p.name for p in out.glob("runs/phase1-*/checkpoints/step_*"))
        assert "step_00000200" not in done_before

        # Continue: a worker again, the deployment run again.
        worker = _start_worker(worker_cmd, env, tmp_path, log)
        second = _run_id(run_cli(["bash", "-c", rerun_cmd], env, tmp_path))
        state = wait_final(api, second, timeout=HANG_S)
        text = log.read_text(errors="replace")
        assert state["type"] == "COMPLETED", text[-4000:]
        after_rerun = text[text.index(second):] if second in text else text
        for stage in ("shard", "vocab", "instances"):
            assert f"stage {stage}: skipped (complete)" in after_rerun, after_rerun[-4000:]
        resumed = re.search(r"stage train:phase1: resuming \(resumable from (step_\d+)\)", after_rerun)
        assert resumed and resumed.group(1) in done_before, after_rerun[-4000:]
        assert list(out.glob("runs/phase1-*/checkpoints/step_00000200")), "training did not reach its last step"
        # The interrupted run is still shown Running: nothing on the server ends it by itself.
        assert httpx.get(f"{api}/flow_runs/{first}").json()["state"]["type"] == "RUNNING"

        # An idle worker stops on SIGINT (Ctrl-C) as quickly.
        took_idle = _stopped_within(worker, signal.SIGINT)
        assert worker.returncode == 0
        print(f"worker stopped {took:.1f} s after SIGTERM mid-run, {took_idle:.1f} s after SIGINT idle")
    finally:
        stop(worker)
        if first:  # the interrupted run would stay Running on the session's server
            httpx.delete(f"{api}/flow_runs/{first}")


def _background_worker(cmd: str, env: dict, cwd, log):
    """``cmd`` started as a script starts it in the background (``cmd &`` in a non-interactive shell:
    SIGINT ignored); returns (the shell, the worker's pid) once the worker is up."""
    shell = subprocess.Popen(["bash", "-c", f"{cmd} > {log} 2>&1 & echo $!; wait $!; echo rc=$? >> {log}"],
                             env={**env, "PREFECT_WORKER_QUERY_SECONDS": "1"}, cwd=cwd, stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    pid = int(shell.stdout.readline())
    deadline = time.monotonic() + HANG_S
    while not (log.is_file() and "started!" in log.read_text(errors="replace")):
        assert shell.poll() is None, log.read_text(errors="replace")[-3000:] if log.is_file() else ""
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:] if log.is_file() else ""
        time.sleep(0.3)
    return shell, pid


def test_worker_started_in_the_background_of_a_script(prefect_server, tmp_path):
    """The reported hang: ``prefect worker start`` launched with ``&`` from a script ignores the first
    SIGTERM and SIGKILLs itself on the second; ``bertflow worker`` launched the same way stops on one."""
    env = prefect_server["env"]
    prefect_cmd = _doc_command(r"prefect worker start --pool bertflow-process")
    ours = _doc_command(r"bertflow worker")

    log = tmp_path / "prefect-worker.log"
    shell, pid = _background_worker(prefect_cmd, env, tmp_path, log)
    try:
        os.kill(pid, signal.SIGTERM)
        time.sleep(5)  # the signal is ignored, not slow (ours stops in 1-3 s): it would never stop
        assert shell.poll() is None and _pid_alive(pid), log.read_text(errors="replace")[-2000:]
        os.kill(pid, signal.SIGTERM)  # the second one
        shell.wait(STOP_WITHIN_S)
        assert "rc=137" in log.read_text(), log.read_text(errors="replace")[-2000:]  # SIGKILLed
    finally:
        stop(shell)

    log = tmp_path / "bertflow-worker.log"
    shell, pid = _background_worker(ours, env, tmp_path, log)
    try:
        os.kill(pid, signal.SIGTERM)
        shell.wait(STOP_WITHIN_S)
        assert "rc=0" in log.read_text(), log.read_text(errors="replace")[-2000:]
        assert "stopped!" in log.read_text()
    finally:
        stop(shell)
