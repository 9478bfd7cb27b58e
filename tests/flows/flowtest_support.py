"""Helpers shared by the flow tests (a module of its own: conftest files are not importable)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from free_ports import free_port  # noqa: E402,F401  (one port never handed out twice)
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)


def tiny_config(root: Path, corpus: Path, max_steps: int = 6, intrinsic: bool = True, two_phases: bool = False):
    """A pipeline that runs in seconds: a small real corpus, a small vocab, the tiny model."""
    from flows.config import PipelineConfig

    data = {
        "output_root": str(root),
        "shard": {"inputs": [str(corpus)], "num_shards": 2, "num_workers": 2},
        "vocab": {"vocab_size": 400, "min_frequency": 1},
        "phases": [
            {
                "name": "phase1",
                "instances": {"max_seq_length": 32, "max_predictions_per_seq": 5, "dupe_factor": 1, "num_workers": 2},
                "train": {
                    "model": "tiny", "max_steps": max_steps, "micro_batch_size": 4, "save_every": 2, "log_every": 1,
                    "tensorboard": False, "max_seq_length": 32, "dropout": 0.0,
                },
            }
        ]
        + ([{
            "name": "phase2",  # longer sequences, from phase1's weights, as in the BERT paper
            "instances": {"max_seq_length": 64, "max_predictions_per_seq": 8, "dupe_factor": 1, "num_workers": 2},
            "train": {"model": "tiny", "max_steps": 3, "micro_batch_size": 4, "save_every": 3, "log_every": 1,
                      "tensorboard": False, "max_seq_length": 64, "dropout": 0.0},
        }] if two_phases else []),
        "evaluation": {"intrinsic": {"batch_size": 8, "max_batches": 2, "use_ray": False, "show_progress": False}}
        if intrinsic else {},
        "orchestration": {"retries": 2, "retry_delay_s": [0.5, 1.0], "train_retries": 1},
    }
    return PipelineConfig.model_validate(data)


def wait_http(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} not up after {timeout} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen, grace: float = 15) -> None:
    """Stop a process we started (and its process group, which holds its children)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def run_cli(args, env, cwd, timeout=HANG_S):
    proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def post_api(url: str, payload: dict, attempts: int = 5) -> httpx.Response:
    """POST to the Prefect API, retrying what the server marks retryable (503: a database busy under load),
    as Prefect's own client does; any other answer is returned as it came."""
    for i in range(attempts):
        r = httpx.post(url, json=payload)
        if r.status_code != 503 or i == attempts - 1:
            return r
        time.sleep(0.5 * 2 ** i)
    return r


def deployments_by_name(api: str) -> dict[str, dict]:
    r = httpx.post(f"{api}/deployments/filter", json={"limit": 50})
    r.raise_for_status()
    flows = {f["id"]: f["name"] for f in httpx.post(f"{api}/flows/filter", json={}).json()}
    return {f"{flows[d['flow_id']]}/{d['name']}": d for d in r.json()}


def wait_final(api: str, run_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = httpx.get(f"{api}/flow_runs/{run_id}").json()
        if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run["state"]
        time.sleep(1.0)
    raise TimeoutError(f"flow run {run_id} not finished after {timeout} s")


def flow_logs(flow_run_id) -> list[str]:
    """Every log message of a flow run, read from the API after this process's log worker has shipped
    what it holds (logs travel asynchronously: read too early, a busy machine shows none yet)."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=HANG_S)
    out: list[str] = []
    with get_client(sync_client=True) as client:
        while True:  # the API returns at most 200 per call
            page = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                    limit=200, offset=len(out))
            out += [l.message for l in page]
            if len(page) < 200:
                return out
