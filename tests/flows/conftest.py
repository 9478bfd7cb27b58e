"""Fixtures for the flow tests: one Prefect test harness and one real Prefect server per session.
Everything that starts processes stops exactly those."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from flowtest_support import (
    BIN, REPO, deployments_by_name, free_port, post_api, run_cli, stop, tiny_config, wait_final, wait_http,
)
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)


@pytest.fixture(scope="session")
def corpus_file(shared_data: Path) -> Path:
    """37 Wikipedia articles (1 MB, WikiExtractor format): enough for every stage, seconds each."""
    return shared_data / "corpus" / "wikipedia_mlperf" / "wiki_00"


@pytest.fixture(scope="session")
def sample_text(shared_data: Path) -> Path:
    """Google BERT's sample_text.txt: three documents."""
    return shared_data / "corpus" / "bert_sample" / "sample_text.txt"


@pytest.fixture(scope="session")
def harness():
    """One ephemeral Prefect API for the session (each start costs about 9 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=HANG_S):
        from prefect.settings import PREFECT_API_URL

        yield PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real ``prefect server start`` on 127.0.0.1 and a free port, with its own home and database."""
    home = tmp_path_factory.mktemp("prefect_home")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_API_URL": api,
        "PREFECT_LOGGING_LEVEL": "INFO",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("PREFECT_PROFILES_PATH", None)
    log = home / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        wait_http(f"{api}/health", proc, 120, log)
        yield {"api": api, "ui": f"http://127.0.0.1:{port}", "env": env, "home": home}
    finally:
        stop(proc)


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
    out = run_cli([str(BIN / "bertflow"), "deploy", "--config", str(cfg_file), "--working-dir", str(work)], env, work)
    assert "registered 6 deployments" in out  # this also created the process pool
    # The worker starts now (its start-up overlaps the next deploy) and polls every second.
    log = work / "worker.log"
    with open(log, "wb") as fh:
        worker = subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", "bertflow-process", "--limit", "1"],
            env={**env, "PREFECT_WORKER_QUERY_SECONDS": "1"}, cwd=work, stdout=fh, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        by_bertflow = deployments_by_name(api)
        run_cli([str(BIN / "prefect"), "--no-prompt", "deploy", "--all"], env, REPO)
        by_yaml = deployments_by_name(api)
        dep = by_yaml["prepare-data/default"]
        # The UI's Run button (custom run): POST create_flow_run with the form's parameters.
        r = post_api(f"{api}/deployments/{dep['id']}/create_flow_run",
                     {"parameters": {"config": cfg.model_dump(mode="json")}})
        r.raise_for_status()
        run_id = r.json()["id"]
        state = wait_final(api, run_id, timeout=HANG_S)
    finally:
        stop(worker)
    return {"run_id": run_id, "state": state, "by_bertflow": by_bertflow, "by_yaml": by_yaml, "config": cfg,
            "worker_log": log.read_text(errors="replace"), "seconds": time.monotonic() - t0, "api": api}
