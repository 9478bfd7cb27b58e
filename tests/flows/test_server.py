"""A real Prefect server: deployments registered by ``bertflow deploy`` and by ``prefect deploy --all``
(prefect.yaml), a run triggered through the REST call the UI's Run button makes, picked up and run
to completion by a real process worker."""
from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from flowtest_support import BIN, REPO, stop, tiny_config

pytestmark = [pytest.mark.prefect, pytest.mark.slow, pytest.mark.shared_data, pytest.mark.ray]


def _cli(args, env, cwd, timeout=180):
    proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _deployments(api: str) -> dict[str, dict]:
    r = httpx.post(f"{api}/deployments/filter", json={"limit": 50})
    r.raise_for_status()
    flows = {f["id"]: f["name"] for f in httpx.post(f"{api}/flows/filter", json={}).json()}
    return {f"{flows[d['flow_id']]}/{d['name']}": d for d in r.json()}


@pytest.fixture(scope="session")
def completed_run(prefect_server, tmp_path_factory, corpus_file):
    """Deploy, trigger prepare-data like the UI does, let a worker run it; shared with the UI test."""
    import yaml

    api, env = prefect_server["api"], prefect_server["env"]
    work = tmp_path_factory.mktemp("served")
    cfg = tiny_config(work / "out", corpus_file, intrinsic=False)
    cfg_file = work / "pipeline.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    t0 = time.monotonic()
    out = _cli([str(BIN / "bertflow"), "deploy", "--config", str(cfg_file), "--working-dir", str(work)], env, work)
    assert "registered 5 deployments" in out
    by_bertflow = _deployments(api)
    _cli([str(BIN / "prefect"), "--no-prompt", "deploy", "--all"], env, REPO)
    by_yaml = _deployments(api)
    dep = by_yaml["prepare-data/default"]
    # The UI's Run button (custom run): POST create_flow_run with the form's parameters.
    r = httpx.post(f"{api}/deployments/{dep['id']}/create_flow_run",
                   json={"parameters": {"config": cfg.model_dump(mode="json")}})
    r.raise_for_status()
    run_id = r.json()["id"]
    log = work / "worker.log"
    with open(log, "wb") as fh:
        worker = subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", "bertflow-process", "--limit", "1"],
            env=env, cwd=work, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        state = _wait_final(api, run_id, timeout=240)
    finally:
        stop(worker)
    return {"run_id": run_id, "state": state, "by_bertflow": by_bertflow, "by_yaml": by_yaml, "config": cfg,
            "worker_log": log.read_text(errors="replace"), "seconds": time.monotonic() - t0, "api": api}


def _wait_final(api: str, run_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = httpx.get(f"{api}/flow_runs/{run_id}").json()
        if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run["state"]
        time.sleep(1.0)
    raise TimeoutError(f"flow run {run_id} not finished after {timeout} s")


def test_bertflow_deploy_registers_every_deployment(completed_run):
    deps = completed_run["by_bertflow"]
    assert set(deps) == {
        "pretraining-pipeline/default", "prepare-data/default", "pretrain/default", "evaluate/default",
        "pretraining-pipeline/scheduled",
    }
    assert deps["prepare-data/default"]["entrypoint"] == "flows.pipeline.prepare_data"
    assert deps["prepare-data/default"]["work_pool_name"] == "bertflow-process"
    sched = deps["pretraining-pipeline/scheduled"]
    assert sched["paused"] is True and sched["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
    # The typed config is the deployment's form: its schema reaches the server.
    assert "config" in deps["prepare-data/default"]["parameter_openapi_schema"]["properties"]


def test_prefect_deploy_all_accepts_prefect_yaml(completed_run):
    deps = completed_run["by_yaml"]
    assert deps["pretrain/default"]["entrypoint"] == "flows/pipeline.py:pretrain"
    sched = deps["pretraining-pipeline/scheduled"]
    assert sched["paused"] is True and sched["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
    assert deps["evaluate/default"]["parameters"]["config"]["output_root"] == "runs/prefect"


def test_triggered_run_completes_and_writes_outputs(completed_run):
    from data_jobs.schema import Manifest
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
