"""A real Prefect server: deployments registered by ``bertflow deploy`` and by ``prefect deploy --all``
(prefect.yaml), a run triggered through the REST call the UI's Run button makes, picked up and run
to completion by a real process worker."""
from __future__ import annotations

import httpx
import pytest

from flowtest_support import deployments_by_name
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)


pytestmark = [pytest.mark.prefect, pytest.mark.slow, pytest.mark.shared_data, pytest.mark.ray]


def test_bertflow_deploy_registers_every_deployment(completed_run):
    deps = completed_run["by_bertflow"]
    assert set(deps) == {
        "pretraining-pipeline/default", "prepare-data/default", "pretrain/default", "evaluate/default",
        "pretraining-pipeline/scheduled", "continual-pretraining/scheduled",
    }
    assert deps["prepare-data/default"]["entrypoint"] == "flows.pipeline.prepare_data"
    assert deps["prepare-data/default"]["work_pool_name"] == "bertflow-process"
    sched = deps["pretraining-pipeline/scheduled"]
    assert sched["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
    assert sched["paused"] is False and sched["schedules"][0]["active"] is False  # the schedule ships switched off
    cont = deps["continual-pretraining/scheduled"]
    assert cont["entrypoint"] == "flows.continual.continual_pretraining"
    assert cont["schedules"][0]["schedule"]["cron"] == "0 3 * * *" and cont["schedules"][0]["active"] is False
    assert (cont.get("global_concurrency_limit") or {}).get("limit", cont.get("concurrency_limit")) == 1
    assert cont["parameters"]["config"]["source"] == "runs/snapshots"
    # The typed config is the deployment's form: its schema reaches the server.
    assert "config" in deps["prepare-data/default"]["parameter_openapi_schema"]["properties"]


def test_prefect_deploy_all_accepts_prefect_yaml(completed_run):
    deps = completed_run["by_yaml"]
    assert deps["pretrain/default"]["entrypoint"] == "flows/pipeline.py:pretrain"
    sched = deps["pretraining-pipeline/scheduled"]
    assert sched["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
    assert sched["paused"] is False and sched["schedules"][0]["active"] is False  # the schedule ships switched off
    assert deps["evaluate/default"]["parameters"]["config"]["output_root"] == "runs/prefect"


def test_triggered_run_completes_and_writes_outputs(completed_run):
    from contracts.schema import Manifest
    from flows.config import make_plan

    assert completed_run["state"]["type"] == "COMPLETED", completed_run["worker_log"][-4000:]
    plan = make_plan(completed_run["config"])
    docs = Manifest.read(plan.shard.output_dir)
    assert docs.kind == "documents" and sum(f.rows for f in docs.files) > 0
    assert Manifest.read(plan.vocab.output_dir).kind == "vocab"
    inst = Manifest.read(plan.instances["phase1"].output_dir)
    assert inst.kind == "instances" and inst.config_hash == plan.instances["phase1"].config_hash()
    api = completed_run["api"]
    arts = httpx.post(f"{api}/artifacts/filter", json={"flow_runs": {"id": {"any_": [completed_run["run_id"]]}}}).json()
    assert any(a["key"] == "bertflow-data-stats" and a["type"] == "table" for a in arts)


def test_bertflow_serve_takes_over_a_deployment(completed_run, prefect_server, tmp_path):
    """``bertflow serve`` (re)registers its deployments, with its own config, and polls for their runs."""
    import subprocess
    import time

    from flowtest_support import BIN, stop

    api = prefect_server["api"]
    want = str(tmp_path / "out")
    assert deployments_by_name(api)["evaluate/default"]["parameters"]["config"]["output_root"] != want
    log = tmp_path / "serve.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(BIN / "bertflow"), "serve", "--only", "evaluate/default", "--output-root",
                                 str(tmp_path / "out")], env=prefect_server["env"], cwd=tmp_path,
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + HANG_S
        while deployments_by_name(api)["evaluate/default"]["parameters"]["config"]["output_root"] != want:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        served = deployments_by_name(api)["evaluate/default"]
        assert served["entrypoint"] == "flows.pipeline.evaluate"
        assert served["status"] == "READY"  # a runner is polling for it
    finally:
        stop(proc)


def test_bertflow_serve_resumes_what_a_sigterm_paused(prefect_server, tmp_path):
    """prefect.serve pauses its deployments when SIGTERM stops it; the next ``bertflow serve`` resumes
    them on start (issue 10), so a restarted server's schedules run again."""
    import subprocess
    import time

    from flowtest_support import BIN, stop

    api, name = prefect_server["api"], "prepare-data/default"

    def serve_until(cond, label: str):
        log = tmp_path / f"serve-{label}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen([str(BIN / "bertflow"), "serve", "--only", name, "--output-root",
                                     str(tmp_path / "out")], env=prefect_server["env"], cwd=tmp_path,
                                    stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + HANG_S
            while not cond(deployments_by_name(api).get(name)):
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
        finally:
            stop(proc)  # SIGTERM to the process group, as a service manager stops it
        return log

    serve_until(lambda d: d is not None and d["status"] == "READY", "first")
    # What a serve's graceful shutdown (Ctrl-C, or a SIGTERM where a handler makes it graceful) does:
    # pause every deployment it served. Done here through the API so the test does not depend on it.
    dep_id = deployments_by_name(api)[name]["id"]
    httpx.post(f"{api}/deployments/{dep_id}/pause_deployment").raise_for_status()
    assert deployments_by_name(api)[name]["paused"] is True
    log = serve_until(lambda d: d["paused"] is False and d["status"] == "READY", "second")
    assert name in log.read_text()  # the resume was said, in one line


def test_bertflow_serve_keeps_the_schedule_switch(prefect_server, tmp_path):
    """The nightly schedule ships inactive; once a user switched it on, a (re)started ``bertflow serve``
    re-registers the deployment without switching it off again (and a new one stays off)."""
    import subprocess
    import time

    from flowtest_support import BIN, run_cli, stop

    api, name = prefect_server["api"], "pretraining-pipeline/scheduled"
    want = str(tmp_path / "out")
    run_cli([str(BIN / "bertflow"), "deploy", "--only", name], prefect_server["env"], tmp_path)
    dep = deployments_by_name(api)[name]
    assert [s["active"] for s in dep["schedules"]] == [False]
    # Switched on, as `prefect deployment schedule resume` does it.
    httpx.patch(f"{api}/deployments/{dep['id']}/schedules/{dep['schedules'][0]['id']}",
                json={"active": True}).raise_for_status()
    log = tmp_path / "serve.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(BIN / "bertflow"), "serve", "--only", name, "--output-root", want],
                                env=prefect_server["env"], cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + HANG_S
        while (d := deployments_by_name(api)[name])["parameters"]["config"]["output_root"] != want \
                or d["status"] != "READY":
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        assert d["entrypoint"] == "flows.pipeline.pretraining_pipeline"  # re-registered by serve
        assert [s["active"] for s in d["schedules"]] == [True] and d["paused"] is False
    finally:
        stop(proc)
        # Leave it as shipped: switched off (its scheduled runs go with it).
        d = deployments_by_name(api)[name]
        for s in d["schedules"]:
            httpx.patch(f"{api}/deployments/{d['id']}/schedules/{s['id']}", json={"active": False})
