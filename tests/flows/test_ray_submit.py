"""A data stage submitted as a Ray Job to a real local Ray head (token authentication on, as Ray 2.60
ships it) by the pipeline's own task in a Prefect flow: its output checked, its log lines found in the
Prefect run's log, and later submissions of the same stage attaching to the job instead of starting
another.

The head runs with ``--block`` in its own process group, so stopping it stops exactly the processes
it started (``ray stop`` would stop every Ray cluster on the machine). The client side runs in a
subprocess, so the token mode never leaks into the test process's Ray state.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from flowtest_support import BIN, free_port, stop
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.shared_data]

CLIENT = r"""
import json, sys, threading, time
from pathlib import Path
from prefect import flow
from data_jobs.config import ShardConfig
from flows.ray_jobs import submit_or_attach, _client, job_key
from flows.tasks import DataStage, run_stage

address, corpus, out, cfg_file, hang_s = sys.argv[1:6]
cfg = ShardConfig(inputs=[corpus], output_dir=out, num_shards=2, num_workers=1)

@flow
def shard_via_ray_job():  # the pipeline's own task, as prepare_data calls it
    return run_stage(DataStage("shard", cfg, address, sys.executable))

first = {}
t = threading.Thread(target=lambda: first.update(state=shard_via_ray_job(return_state=True)))
t.start()
client = _client(address)
deadline = time.monotonic() + float(hang_s)  # tests/hang.py's guard, passed in
while not client.list_jobs():  # wait until the flow has submitted, then submit the same stage again
    if not t.is_alive() or time.monotonic() > deadline:
        sys.exit("first submission ended or stalled before its job appeared")
    time.sleep(0.1)
second = submit_or_attach(address, "shard", cfg, Path(cfg_file), python=sys.executable, log=lambda s: None, poll_s=0.2)
t.join()
third = submit_or_attach(address, "shard", cfg, Path(cfg_file), python=sys.executable, log=lambda s: None, poll_s=0.2)
jobs = [j.submission_id for j in client.list_jobs()]
state = first["state"]
print("RESULT " + json.dumps({"flow_ok": state.is_completed(), "flow_run_id": str(state.state_details.flow_run_id),
                              "second": second.__dict__, "third": third.__dict__, "jobs": jobs,
                              "hash": job_key("shard", cfg)}))
"""


@pytest.fixture(scope="module")
def ray_head():
    temp = tempfile.mkdtemp(prefix="rf", dir="/tmp")  # short: Ray's socket paths have a length limit
    port, dash = free_port(), free_port()
    # Every fixed default port (agent 52365, metrics, client server 10001, ...) would collide with
    # another Ray head on the same machine: give each its own free port.
    extra = [f"--{name}={free_port()}" for name in (
        "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
        "runtime-env-agent-port", "ray-client-server-port", "node-manager-port", "object-manager-port")]
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    log = Path(temp) / "head.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
             "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
             f"--temp-dir={temp}", "--disable-usage-stats", *extra],
            env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )
    address = f"http://127.0.0.1:{dash}"
    try:
        _wait_jobs_api(address, proc, env, log)
        yield {"address": address, "env": env}
    finally:
        stop(proc, grace=3)  # the whole group gets SIGKILL after that: nothing of it survives


def _wait_jobs_api(address, proc, env, log):
    """The dashboard answers /api/version only with a token: poll through the SDK in a subprocess."""
    probe = f"from ray.job_submission import JobSubmissionClient as C; C({address!r}).list_jobs()"
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        if subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode == 0:
            return
        time.sleep(1)
    raise TimeoutError(f"Ray jobs API at {address} not up:\n{log.read_text()[-3000:]}")


def _flow_logs(flow_run_id: str) -> list[str]:
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200)
    return [log.message for log in logs]


def test_shard_stage_as_ray_job(ray_head, harness, sample_text, tmp_path):
    from contracts.schema import Manifest
    from flows.ray_jobs import submission_id

    out = tmp_path / "documents"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CLIENT, ray_head["address"], str(sample_text), str(out), str(tmp_path / "job.yaml"), str(HANG_S)],
            env={**ray_head["env"], "PREFECT_API_URL": harness}, capture_output=True, text=True, timeout=HANG_S,
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"client timed out:\n{(err.stdout or b'')[-3000:]!r}\n{(err.stderr or b'')[-3000:]!r}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[7:])
    sid = submission_id("shard", res["hash"])
    assert res["flow_ok"]
    # Submitted again while running, and again when finished: both attach to the same job.
    assert res["second"]["submission_id"] == sid and res["second"]["attached"]
    assert res["third"]["submission_id"] == sid and res["third"]["attached"]
    assert res["jobs"] == [sid]
    assert all(r["status"] == "SUCCEEDED" for r in (res["second"], res["third"]))
    logs = _flow_logs(res["flow_run_id"])
    assert f"submitted ray job {sid}: " in "\n".join(logs)
    # The job's own output (the shard job's summary line) reached the Prefect run's log.
    assert any(m.startswith(f"[{sid}]") and "documents kept" in m for m in logs), logs[-20:]
    manifest = Manifest.read(out)
    assert manifest.kind == "documents" and sum(f.rows for f in manifest.files) == 3
    assert not manifest.verify_files(out)
